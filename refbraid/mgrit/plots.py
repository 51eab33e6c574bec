"""Figures from an MGRIT record. Each function returns a matplotlib ``Figure`` (built with
``matplotlib.figure.Figure``, no pyplot state, never shown).

===========================  ==========================================================
function                     shows
===========================  ==========================================================
plot_residual_history        ‖r‖ vs iteration: fine level (both conventions), coarse levels
plot_residual_heatmap        |r| over time index × iteration, one panel per level
plot_hierarchy               the levels' points, C filled, F open, over the fine index
plot_error                   ‖u_k[i] - u_ref[i]‖ over the fine index i, per iteration
===========================  ==========================================================

Residual magnitudes of vector states are the 2-norm over the state axes.
Shape legend: c C-points of a level, S state shape.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from .grid import Hierarchy
from .record import MGRITResult


def _np(x) -> np.ndarray:
    """Host NumPy copy of an array (CuPy arrays via ``.get()``)."""
    return np.asarray(x.get() if hasattr(x, "get") else x)


def _pointwise(r) -> np.ndarray:
    """‖r[k]‖ over the state axes: shape (c,)."""
    r = _np(r)
    return np.sqrt(np.sum(np.abs(r.reshape(r.shape[0], -1)) ** 2, axis=1))


def _fine(result_or_n: MGRITResult, s: np.ndarray) -> np.ndarray:
    r = result_or_n
    return s if r.direction == "forward" else r.hierarchy.n_steps - s


def plot_residual_history(result: MGRITResult, title: str | None = None) -> Figure:
    """Residual norm vs iteration: fine level (XBraid and post-cycle), every relaxed coarse
    level; the coarsest level, solved exactly, is named in the legend (it has no residual).

    The fine level's two conventions coincide with F-relaxation on it (the post-cycle iterate
    is the next relaxation's); they are then drawn once, labelled so, instead of as two lines
    on top of each other. The title names the solve's settings (or ``title``, above them).
    """
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.add_subplot()
    it = result.iteration_numbers
    norms, post = result.norms, result.post_cycle_norms
    if np.allclose(norms, post, rtol=1e-12, atol=0, equal_nan=True):
        ax.semilogy(it, norms, "o-", lw=2, color="k",
                    label="level 0 (XBraid's ‖r‖ = after the cycle here)")
    else:
        ax.semilogy(it, norms, "o-", lw=2, color="k", label="level 0 (XBraid: before correction)")
        ax.semilogy(it, post, "x--", ms=8, color="C3", label="level 0 (after cycle)")
    n_levels = len(result.hierarchy)
    for lvl in range(1, n_levels - 1):
        ax.semilogy(it, result.level_norms(lvl), "s-", ms=4, color=f"C{lvl - 1}",
                    label=f"level {lvl} (FAS residual)")
    if n_levels > 1:
        ax.plot([], [], " ", label=f"level {n_levels - 1}: coarsest, solved exactly (no residual)")
    s, h = result.settings, result.hierarchy
    relax = "/".join(s.relax_on(lvl) for lvl in range(n_levels - 1)) or "-"
    settings = (f"MGRIT {result.direction} solve ({result.status}), N = {h.n_steps}: "
                f"{n_levels} levels,\ncfactors {'/'.join(map(str, h.cfactors))}, relax {relax}, "
                f"{s.cycle}-cycle")
    ax.set_xlabel("iteration")
    ax.set_ylabel("C-point residual ‖r‖ (2-norm)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, which="major")
    ax.set_title(f"{title}\n{settings}" if title else settings, fontsize="medium")
    ax.legend(fontsize=8)
    return fig


def plot_residual_heatmap(result: MGRITResult) -> Figure:
    """|r| at each C-point (x: fine index) and iteration (y), one panel per relaxed level."""
    if result.settings.keep_residuals is False:
        raise ValueError("plot_residual_heatmap needs a solve with `keep_residuals=True`.")
    n_lvl = max(len(result.hierarchy) - 1, 1)
    fig = Figure(figsize=(7, 2.2 * n_lvl + 0.6), layout="constrained")
    axes = fig.subplots(n_lvl, 1, squeeze=False)[:, 0]
    for lvl, ax in enumerate(axes):
        rows = [
            (k, r)
            for k, r in zip(result.iteration_numbers, result.residuals(lvl), strict=False)
            if r is not None
        ]
        if not rows:
            ax.set_title(f"level {lvl}: not visited")
            continue
        x = _fine(result, result.hierarchy[lvl].c_points)
        mag = np.array([_pointwise(r) for _, r in rows])
        order = np.argsort(x)
        mag = np.maximum(mag[:, order], 1e-300)
        positive = mag[mag > 1e-300]
        norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if positive.size else None
        mesh = ax.pcolormesh(x[order], [k for k, _ in rows], mag, norm=norm, shading="nearest")
        fig.colorbar(mesh, ax=ax, label="|r|")
        ax.set_ylabel("iteration")
        ax.set_title(f"level {lvl} (cfactor {result.hierarchy[lvl].cfactor})")
    axes[-1].set_xlabel("fine time index i")
    return fig


def plot_hierarchy(hierarchy: Hierarchy | MGRITResult, max_points: int = 200) -> Figure:
    """The grid levels over the fine index: C-points filled, F-points open (first max_points)."""
    h = hierarchy.hierarchy if isinstance(hierarchy, MGRITResult) else hierarchy
    fig = Figure(figsize=(7, 0.6 * len(h) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    for lvl in h:
        keep = lvl.points <= max_points
        pts, is_c = lvl.points[keep], lvl.is_c[keep]
        ax.plot(pts[~is_c], np.full((~is_c).sum(), lvl.index), "o", mfc="white", mec="C0", ms=5)
        ax.plot(pts[is_c], np.full(is_c.sum(), lvl.index), "o", color="C3", ms=6)
    ax.set_yticks(range(len(h)))
    ax.set_yticklabels(
        [f"level {lvl.index}" + (f" (m={lvl.cfactor})" if lvl.cfactor else "") for lvl in h]
    )
    ax.invert_yaxis()
    ax.set_xlabel("solver index s (= fine index for a forward solve)")
    ax.set_title(f"MGRIT hierarchy, N = {h.n_steps}: C-points filled, F-points open")
    return fig


def plot_error(result: MGRITResult, reference) -> Figure:
    """Error ``‖u_k[i] - u_ref[i]‖`` vs the fine index for each kept iterate (and the solution).

    ``reference``: the sequential solution, shape (N + 1, *S), fine order.
    """
    ref = _np(reference)
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.add_subplot()
    iterates = result.iterates(0)
    fine = _fine(result, result.hierarchy[0].points)
    for k, u in zip(result.iteration_numbers, iterates, strict=False):
        if u is None:
            continue
        err = _pointwise(_np(u) - ref[fine])
        ax.semilogy(fine, np.maximum(err, 1e-17), lw=1, label=f"iteration {k}")
    err = _pointwise(_np(result.solution) - ref[result.fine_indices])
    ax.semilogy(result.fine_indices, np.maximum(err, 1e-17), "k--", lw=1.5, label="solution")
    ax.set_xlabel("fine time index i")
    ax.set_ylabel("‖u_k[i] − u_seq[i]‖")
    ax.set_title("error vs the sequential solve")
    ax.legend(fontsize=7, ncol=2)
    return fig
