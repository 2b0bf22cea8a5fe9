"""The fit and its result: the solver dispatcher, GCV, the fitted model and its prediction, evaluation, intervals, progress."""
