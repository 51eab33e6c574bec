"""MGRIT solves on the virtual cluster: with arithmetic, or as a cost-only schedule.

Arithmetic mode (:func:`simulate_solve`) runs :func:`refbraid.mgrit.solve` unchanged on P
virtual ranks (:func:`refbraid.parallel.virtual.simulate`): the solution is the one-process
solution bit for bit, and the clocks predict the time.

Cost-only mode (:func:`simulate_schedule`) runs the SAME solver code on a stand-in problem::

    u0 = 0 ∈ ℝ¹,      Φ(u; a → b) = u,      g = 0

Every step application, message and reduction happens exactly as in the real solve (the
schedule depends on N, the settings, P and the layout, never on the values), so the clocks
are exactly those of the real solve — at the cost of bookkeeping on a 1-element state. Two
things the values would decide are fixed instead:

* the number of cycles: tolerances are switched off and ``iterations`` cycles are run (pass
  the real solve's ``result.iterations``; :func:`replay_settings`);
* message sizes: the stand-in state is 8 bytes; every array in a message is charged
  ``state_bytes / 8`` times its size, i.e. ``state_bytes`` per state (:func:`state_sizeof`).

With equal costs, the two modes give the same ``wall_time`` (tests/test_virtual_cluster.py).

The stand-in has a batched step (:mod:`refbraid.mgrit.batched`), so its F-sweeps record their
step boxes sweep by sweep, as a real problem with a batched step does (the dense network on
NumPy); a problem without one makes the same boxes interval by interval. The order of the
boxes inside a sweep is all that differs: every clock, message and ``wall_time`` is the same.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..mgrit import MGRITSettings, Problem, as_problem, build_hierarchy, solve
from ..parallel.layout import Layout, partition
from ..parallel.trace import payload_bytes
from ..parallel.virtual import CostModel, VirtualRun, simulate

#: Bytes of the cost-only stand-in state (one float64).
STAND_IN_BYTES = 8


def identity_step(u, start: int, stop: int):
    """The stand-in step ``Φ(u; start → stop) = u`` (no arithmetic)."""
    return u


def identity_steps(U, starts, stops):
    """The stand-in step on k intervals at once: ``U`` (no arithmetic)."""
    return U


def cost_only_problem(n_steps: int, direction: str = "forward") -> Problem:
    """The stand-in problem of the module docstring over ``n_steps`` steps (g given as zeros,
    so no rank builds it point by point; batched, module docstring)."""
    return Problem(identity_step, np.zeros(1), n_steps, g=np.zeros((int(n_steps) + 1, 1)),
                   direction=direction, batched_step=identity_steps)


def replay_settings(settings: MGRITSettings, iterations: int | None = None) -> MGRITSettings:
    """``settings`` with the tolerances off and ``max_iter = iterations`` (default: its own
    ``max_iter``): the cycle count a cost-only run replays."""
    if not isinstance(settings, MGRITSettings):
        raise TypeError(f"`settings` must be an MGRITSettings, got {type(settings).__name__}.")
    n = settings.max_iter if iterations is None else iterations
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"`iterations` must be an integer >= 0, got {iterations!r}.")
    return settings.replace(abs_tol=None, rel_tol=None, max_iter=int(n))


def state_sizeof(state_bytes: int):
    """``sizeof`` for cost-only runs: arrays charged as ``state_bytes`` per stand-in state."""
    if isinstance(state_bytes, bool) or not isinstance(state_bytes, (int, np.integer)) \
            or state_bytes < 0:
        raise ValueError(f"`state_bytes` must be an integer >= 0, got {state_bytes!r}.")
    return partial(payload_bytes, array_scale=int(state_bytes) / STAND_IN_BYTES)


def simulate_solve(problem, settings: MGRITSettings, size: int, costs: CostModel = 1.0,
                   alpha: float = 0.0, beta: float = 0.0,
                   layout: Layout | None = None) -> VirtualRun:
    """:func:`refbraid.mgrit.solve` on ``size`` virtual ranks (arithmetic mode).

    ``results[r]`` is rank r's :class:`~refbraid.mgrit.MGRITResult` (its block of the
    solution); :func:`whole_solution` puts the blocks together.
    """
    problem = as_problem(problem)
    return simulate(lambda comm: solve(problem, settings, comm=comm, layout=layout), size,
                    costs, alpha, beta)


def simulate_schedule(n_steps: int, settings: MGRITSettings, size: int,
                      costs: CostModel = 1.0, alpha: float = 0.0, beta: float = 0.0,
                      state_bytes: int = STAND_IN_BYTES, direction: str = "forward",
                      iterations: int | None = None,
                      layout: Layout | None = None) -> VirtualRun:
    """Cost-only MGRIT solve (module docstring): the schedule and clocks of a real solve of
    ``n_steps`` steps whose states are ``state_bytes`` bytes, running ``iterations`` cycles.
    ``results[r]`` is rank r's (stand-in) :class:`~refbraid.mgrit.MGRITResult`."""
    problem = cost_only_problem(n_steps, direction)
    replay = replay_settings(settings, iterations)
    if layout is None:  # once here rather than on every rank
        hierarchy = build_hierarchy(n_steps, replay.cfactors, replay.min_coarse)
        layout = partition(hierarchy.coarsest.points, n_steps, size)
    return simulate(lambda comm: solve(problem, replay, comm=comm, layout=layout), size,
                    costs, alpha, beta, sizeof=state_sizeof(state_bytes))


def whole_solution(run: VirtualRun) -> np.ndarray:
    """The trajectory ``(N + 1, *S)`` in fine order from the ranks' blocks of a simulated solve
    (assembled here, outside the simulation: no gather is charged)."""
    idx = np.concatenate([r.fine_indices for r in run.results])
    full = np.concatenate([r.solution for r in run.results], axis=0)
    return full[np.argsort(idx, kind="stable")]
