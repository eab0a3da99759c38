"""Continuous solvers (x_t -> x_{t-1} steppers) written as drop-in diffusers schedulers.

    from samplers.solvers import get_solver, solver_from_pipeline
"""
from samplers.solvers.registry import SOLVERS, SolverSpec, get_sample_fn, get_solver, solver_from_pipeline

__all__ = ["SOLVERS", "SolverSpec", "get_sample_fn", "get_solver", "solver_from_pipeline"]
