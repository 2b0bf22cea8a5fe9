"""A Ray cluster: joining it, what each task carries (`env`), what a node can hold (`resources`)."""
