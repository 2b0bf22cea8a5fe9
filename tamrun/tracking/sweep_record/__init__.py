"""What the store keeps of a sweep: its files and identity, run names, summary, and a job's held writes."""
