"""Tracking: the MLflow run lifecycle, parameter flattening and plot artifacts."""
