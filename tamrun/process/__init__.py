"""The process's edge: its Hydra folder and files, its log, the import pause, a refused write, how it ended."""
