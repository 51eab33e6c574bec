"""Figures of ``refbraid scale``: speedup against the number of ranks (each returns a Figure)."""

from __future__ import annotations

from matplotlib.figure import Figure

from .predict import ScalingRow


def plot_scaling(rows: list[ScalingRow], serial: float, title: str | None = None) -> Figure:
    """Predicted speedup over serial training vs ranks P: layer-parallel, data-parallel, the
    best DP × LP split, and the ideal line ``speedup = P``."""
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    ranks = [r.ranks for r in rows]
    ax.plot(ranks, ranks, ":", color="grey", label="ideal (P)")
    for key, label, style in (("layer_parallel", "layer-parallel (MGRIT)", "o-"),
                              ("data_parallel", "data-parallel (ring allreduce)", "s--"),
                              ("best", "best DP × LP split", "^-")):
        pts = [(r.ranks, serial / getattr(r, key)) for r in rows
               if getattr(r, key) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="ranks P", ylabel="speedup over serial",
           title=title or "predicted time per training step (virtual cluster)")
    ax.set_xticks(ranks, [str(p) for p in ranks])
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return fig
