"""What the machine lets a run use: memory limits, GPU memory, threads, where tensors live, the byte budget."""
