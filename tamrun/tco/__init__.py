"""Right-sizing and cost: machine classes (config group ``tco``), the plan per class, the time model."""
