"""``python -m tamrun.compare``: the runs of a store as a table in the terminal, with the decisive
columns of the MLflow UI's view (`tamrun.tracking.ui_view`) and the link that opens them there.

`select` picks the runs (the last N, a sweep's jobs, or an MLflow filter, checked for unknown metrics),
`table` lays them out, `__main__` is the command line.
"""
