"""Solvers (batched Cholesky, batched preconditioned CG) and the dispatcher that feeds them."""
