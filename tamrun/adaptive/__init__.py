"""Adaptive mode: sliding-window refits over the test period, windows x groups batched (docs/adaptive.md)."""
