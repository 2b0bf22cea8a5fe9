"""The device a run computes on (`DeviceManager`), its memory timeline and the run's memory report."""
