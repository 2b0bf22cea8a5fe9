"""A sweep's life: the Hydra callback, its end, its failed and lost jobs, its jobs in forked workers or Ray tasks."""
