"""The course's exercises: one check per exercise, printing PASS or what is wrong.

Each lesson ends with an exercise cell: write a function (or choose settings), then call its
check, e.g. ``exercises.check_dense_step_adjoint(my_dense_step_adjoint)``. A check prints one
line and returns a :class:`~refbraid.lessons.checking.Verdict` (truthy on PASS); it never
raises on the student's behalf: a NotImplementedError reads "TODO", any other exception or
wrong number a FAIL saying which index, how large the error, and often why. Reference
solutions: ``refbraid.lessons.solutions`` (same names without ``check_``).

======  ========================================  =================================================
lesson  check                                     oracle
======  ========================================  =================================================
00      :func:`check_euler_steps`                 the closed form (1 + hλ)ⁿ y0
01      :func:`check_resnet_forward`              refbraid.forward on a DenseStep network
02      :func:`check_dense_step_adjoint`          dot-product test + DenseStep.adjoint
03      :func:`check_f_relaxation`                refbraid.mgrit.relax.f_relax
04      :func:`check_two_level_factor`            refbraid.mgrit.theory.propagator_norm
05      :func:`check_gradient_settings`           measured gradient error and step count
06      :func:`check_block_starts`                refbraid.parallel.layout.partition
07      :func:`check_layernorm_adjoint`           dot-product test + LayerNorm.adjoint
08      :func:`check_implicit_gru_step`           GRUCell(scheme="implicit")
09      :func:`check_allreduce_time`              refbraid.scaling.predict.ring_allreduce
10      :func:`check_restrict_average`            refbraid.mgrit.spatial.restrict
10      :func:`check_restrict_average_transpose`  dot-product test + spatial.restrict_adjoint
11      :func:`check_bias_noise_ratio`            refbraid.bias_control.bias_and_noise
12      :func:`check_halo_adjoint`                dot-product test + SpatialHalo on simulated ranks
12      :func:`check_stale_merge`                 refbraid.distributed.daso.stale_merge
13      :func:`check_gradient_errors`             refbraid.interop.compare.gradient_errors
13      :func:`check_xbraid_report`               refbraid.interop.xbraid.xbraid_stats
======  ========================================  =================================================
"""

from __future__ import annotations

from collections.abc import Callable

from . import solutions
from .checking import Verdict
from .exercises_bias import check_bias_noise_ratio
from .exercises_interop import check_gradient_errors, check_xbraid_report
from .exercises_layers import (
    check_dense_step_adjoint,
    check_euler_steps,
    check_implicit_gru_step,
    check_layernorm_adjoint,
    check_resnet_forward,
)
from .exercises_mgrit import check_f_relaxation, check_gradient_settings, check_two_level_factor
from .exercises_parallel import check_allreduce_time, check_block_starts, check_stale_merge
from .exercises_space import (
    check_halo_adjoint,
    check_restrict_average,
    check_restrict_average_transpose,
)

#: lesson number → its exercises' checks (each named ``check_<solution name>``)
EXERCISES: dict[str, tuple[Callable[..., Verdict], ...]] = {
    "00": (check_euler_steps,),
    "01": (check_resnet_forward,),
    "02": (check_dense_step_adjoint,),
    "03": (check_f_relaxation,),
    "04": (check_two_level_factor,),
    "05": (check_gradient_settings,),
    "06": (check_block_starts,),
    "07": (check_layernorm_adjoint,),
    "08": (check_implicit_gru_step,),
    "09": (check_allreduce_time,),
    "10": (check_restrict_average, check_restrict_average_transpose),
    "11": (check_bias_noise_ratio,),
    "12": (check_halo_adjoint, check_stale_merge),
    "13": (check_gradient_errors, check_xbraid_report),
}


def solution_for(check: Callable[..., Verdict]):
    """The reference solution a check takes (``gradient_settings()`` is called: settings)."""
    name = check.__name__.removeprefix("check_")
    if name == "gradient_settings":
        return solutions.gradient_settings()
    return getattr(solutions, name)


def check_all(quiet: bool = False) -> list[Verdict]:
    """Run every check on its reference solution (all must PASS)."""
    return [check(solution_for(check), quiet=quiet)
            for checks in EXERCISES.values() for check in checks]


__all__ = ["EXERCISES", "Verdict", "check_all", "solution_for",
           *(c.__name__ for checks in EXERCISES.values() for c in checks)]
