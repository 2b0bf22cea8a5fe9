"""Effects: one module per kind; each maps a feature column to a design block and a penalty."""
