"""A run's artifacts: its data as dataset inputs, tables (Parquet or CSV), its plots."""
