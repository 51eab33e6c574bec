"""Scaling made visible: predicted parallel run times from the real code on a virtual cluster.

The virtual cluster itself is a communication concern and lives in
:mod:`refbraid.parallel.virtual` (with the trace in :mod:`refbraid.parallel.trace` and the
timeline figure in :mod:`refbraid.parallel.plots`). This package drives it with MGRIT solves
and with networks, so it sits above :mod:`refbraid.mgrit`, :mod:`refbraid.layer_parallel` and
:mod:`refbraid.training`; nothing below imports it.

================  ==================================================================
module            job
================  ==================================================================
schedule.py       MGRIT solves on P virtual ranks: with arithmetic, or cost-only (a
                  stand-in problem with the same schedule, for N and P in the 10⁵/10³)
virtual_step.py   the layer-parallel gradient (forward solve, λ[N] broadcast, state
                  rows, adjoint solve) on P virtual ranks; arithmetic or cost-only
virtual_training  the whole distributed training-step gradient (DistributedGradient,
.py               the MPI program, D × Q ranks) on the virtual cluster; the
                  ``refbraid scale`` training-step table
================  ==================================================================
"""

from .schedule import (
    cost_only_problem,
    replay_settings,
    simulate_schedule,
    simulate_solve,
    whole_solution,
)
from .virtual_step import assemble_gradient, simulate_gradient, simulate_gradient_schedule
from .virtual_training import simulate_distributed_gradient

__all__ = [
    "assemble_gradient",
    "cost_only_problem",
    "replay_settings",
    "simulate_distributed_gradient",
    "simulate_gradient",
    "simulate_gradient_schedule",
    "simulate_schedule",
    "simulate_solve",
    "whole_solution",
]
