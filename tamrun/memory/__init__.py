"""Memory: byte formulas and the waterfall oracle, the OOM guard, size units."""
