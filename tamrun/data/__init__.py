"""Data: load (embedded default or a user file), derived columns, split by time, batch by group."""
