"""Solvers: batched Cholesky, the dual form, batched preconditioned CG, and the systems they solve."""
