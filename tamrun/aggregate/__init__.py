"""``mode=aggregate``: experts' day-ahead forecasts combined online (docs/adaptive.md)."""
