"""Gradient error of a sequence model's layer-parallel gradient against BPTT / backprop.

For MGRIT settings S (forward and adjoint),

    e(S) = ‖g_MGRIT(S) − g_sequential‖₂ / ‖g_sequential‖₂      (all parameters together)

with |L_MGRIT − L| beside it: the same quantity as
:func:`refbraid.gradient_error.gradient_error_study` for ResNets, for any model of
:mod:`refbraid.sequence` (anything with ``backprop`` and ``layer_parallel_gradient``). With one
level e = 0 to round-off; with several it falls with the cycles and reaches round-off once both
solves have converged.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..backends import Backend, get_backend
from ..gradient_error import GradientErrorRow
from ..layer_parallel import LayerParallelSettings, relative_gradient_error


def sequence_gradient_error_study(model, params, x, labels, iterations: Iterable[int] = range(6),
                                  bk: Backend | str = "numpy",
                                  default: LayerParallelSettings | None = None,
                                  **mgrit) -> list[GradientErrorRow]:
    """Rows: one level, ``default`` (if given), then k forward and k adjoint cycles for each k
    in ``iterations`` with the TorchBraid hierarchy and ``mgrit`` overrides (e.g. ``levels``,
    ``cfactor``); format them with
    :func:`refbraid.gradient_error.format_gradient_error_table`."""
    bk = get_backend(bk)
    loss_ref, g_ref, _ = model.backprop(params, x, labels, bk)
    cases = [("1 level", LayerParallelSettings.exact())]
    if default is not None:
        cases.append(("default", default))
    cases += [(f"{k} cycles", LayerParallelSettings.with_iterations(k, k, **mgrit))
              for k in iterations]
    rows = []
    for label, settings in cases:
        loss, g, info = model.layer_parallel_gradient(params, x, labels, settings, bk)
        stats = info.stats()
        rows.append(GradientErrorRow(label, int(stats["fwd_iters"]), int(stats["bwd_iters"]),
                                     stats["fwd_res"], stats["bwd_res"],
                                     relative_gradient_error(g, g_ref, bk),
                                     abs(loss - loss_ref)))
    return rows
