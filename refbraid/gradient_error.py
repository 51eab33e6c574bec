"""How far the layer-parallel gradient is from sequential backprop, as MGRIT iterates.

For MGRIT settings S (forward and adjoint), the measured quantity is

    e(S) = ‖g_MGRIT(S) − g_backprop‖₂ / ‖g_backprop‖₂

over all parameters together, with the loss error ``|L_MGRIT − L|`` beside it. With one level,
e = 0 to round-off; with several levels, e must fall as the iterations grow and reach round-off
once both solves have converged. ``refbraid verify --layer-parallel`` prints this table for the
default training network; the tests check that it decays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from .backends import Backend, get_backend
from .layer_parallel import LayerParallelSettings, layer_parallel_gradient, relative_gradient_error
from .network import Network, Params, backprop


@dataclass(frozen=True)
class GradientErrorRow:
    label: str
    fwd_iters: int
    bwd_iters: int
    fwd_res: float
    bwd_res: float
    grad_error: float
    loss_error: float


def gradient_error_study(
    net: Network,
    params: Params,
    x,
    labels,
    iterations: Iterable[int] = range(0, 9),
    bk: Backend | str = "numpy",
    default: LayerParallelSettings | None = None,
    **mgrit,
) -> list[GradientErrorRow]:
    """Rows: one level (exact), the default settings, then k forward and k adjoint cycles
    (tolerances off) for each k in ``iterations``, with the TorchBraid hierarchy and ``mgrit``
    overrides (e.g. ``levels=2``)."""
    bk = get_backend(bk)
    loss_ref, g_ref, _ = backprop(net, params, x, labels, bk)
    cases = [("1 level", LayerParallelSettings.exact())]
    cases.append(("default", default or LayerParallelSettings()))
    cases += [(f"{k} cycles", LayerParallelSettings.with_iterations(k, k, **mgrit))
              for k in iterations]
    rows = []
    for label, settings in cases:
        loss, g, info = layer_parallel_gradient(net, params, x, labels, settings, bk)
        rows.append(GradientErrorRow(
            label, info.forward.iterations, info.backward.iterations,
            float(info.forward.norms[-1]), float(info.backward.norms[-1]),
            relative_gradient_error(g, g_ref, bk), abs(loss - loss_ref)))
    return rows


def format_gradient_error_table(rows: list[GradientErrorRow]) -> str:
    """A plain-text table: settings, cycles, final residuals, gradient and loss error."""
    head = f"{'settings':<12} {'fwd it':>6} {'bwd it':>6} {'fwd ‖r‖':>10} {'bwd ‖r‖':>10} " \
           f"{'grad rel err':>13} {'|ΔL|':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.label:<12} {r.fwd_iters:>6d} {r.bwd_iters:>6d} {r.fwd_res:>10.2e} "
                     f"{r.bwd_res:>10.2e} {r.grad_error:>13.2e} {r.loss_error:>10.2e}")
    return "\n".join(lines)


def plot_gradient_error(rows: list[GradientErrorRow], title: str | None = None) -> Figure:
    """Gradient error and final residual norms against the number of MGRIT cycles."""
    cyc = [r for r in rows if r.label.endswith("cycles")]
    k = np.array([r.fwd_iters for r in cyc])
    floor = 1e-17  # keep exact zeros visible on the log axis
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.semilogy(k, [max(r.grad_error, floor) for r in cyc], "o-", label="gradient rel. error")
    ax.semilogy(k, [max(r.fwd_res, floor) for r in cyc], "s--", label="forward residual")
    ax.semilogy(k, [max(r.bwd_res, floor) for r in cyc], "^--", label="adjoint residual")
    ax.set(xlabel="MGRIT cycles (forward = adjoint)", ylabel="norm")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    if title:
        ax.set_title(title)
    return fig
