"""Memory: byte formulas, the waterfall oracle, the OOM guard and the tensor meter."""
