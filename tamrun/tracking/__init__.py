"""Tracking: the MLflow run's lifecycle and params, its store (`store/`), artifacts (`artifacts/`) and a
sweep's record (`sweep_record/`); the logged model."""
