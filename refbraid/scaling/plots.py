"""Figures of ``refbraid scale``: speedup against the number of ranks (each returns a Figure)."""

from __future__ import annotations

from matplotlib.figure import Figure

from .predict import ScalingRow

#: why a curve ends before the last P (the table's explanation lines say it in full)
ENDS = {"layer_parallel": "LP ends at P = {}:\none coarsest interval per rank",
        "data_parallel": "DP ends at P = {}:\none sample per rank"}


def plot_scaling(rows: list[ScalingRow], serial: float, title: str | None = None) -> Figure:
    """Predicted speedup over serial training vs ranks P: layer-parallel, data-parallel, the
    best DP × LP split, and the ideal line ``speedup = P``; a curve that stops early says why
    (layer-parallel: every rank needs a coarsest interval; data-parallel: a sample)."""
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    ranks = [r.ranks for r in rows]
    low = min(serial / t for r in rows for t in (r.layer_parallel, r.data_parallel, r.best)
              if t is not None) / 1.5
    ax.plot(ranks, ranks, ":", color="grey", label="ideal (P)")
    for key, label, style in (("layer_parallel", "layer-parallel (MGRIT)", "o-"),
                              ("data_parallel", "data-parallel (ring allreduce)", "s--"),
                              ("best", "best DP × LP split", "^-")):
        pts = [(r.ranks, serial / getattr(r, key)) for r in rows
               if getattr(r, key) is not None]
        if pts:
            line, = ax.plot(*zip(*pts, strict=True), style, label=label)
            last = pts[-1][0]
            if key in ENDS and last < ranks[-1]:  # say why the curve stops
                ax.annotate(ENDS[key].format(last), pts[-1], xytext=(0, -9),
                            textcoords="offset points", fontsize="x-small",
                            color=line.get_color(), ha="center", va="top")
                low = min(low, pts[-1][1] / 4)  # room for the note under the point
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="ranks P",
           ylabel="speedup over serial backprop (1 process)",
           title=title or "predicted time per training step (virtual cluster)")
    ax.set_xticks(ranks, [str(p) for p in ranks])
    ax.set_ylim(bottom=low)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return fig
