"""Their residual history beside refbraid's (reads a ``refbraid compare`` report)."""

from __future__ import annotations

from matplotlib.figure import Figure

FLOOR = 1e-17  # keep exact zeros visible on the log axis


def plot_comparison(report: dict) -> Figure:
    """Forward and adjoint panels: refbraid's record (every measurement, including the final
    relaxation XBraid does not report, at XBraid's iteration numbers), what XBraid/TorchBraid
    reports, and the user's norms when the report holds them; the title gives the gradient
    errors."""
    fig = Figure(figsize=(8.5, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    theirs = report.get("their_residuals", {})
    for ax, direction in zip(axes, ("forward", "backward"), strict=True):
        res = report["residuals"][direction]
        rb, xb = res["refbraid"], res["xbraid"]
        skip = 1 if rb["start"] == "skip" else 0
        norms = [v for v in rb["norms"] if v is not None]
        ax.semilogy([k + skip for k in range(len(norms))], [max(v, FLOOR) for v in norms],
                    "o-", color="C0", label="refbraid record (last: the final relaxation)")
        for level, values in rb["level_norms"].items():
            pts = [(k + skip, v) for k, v in enumerate(values) if v is not None]
            if pts:
                ax.semilogy(*zip(*[(k, max(v, FLOOR)) for k, v in pts], strict=True), ":",
                            marker=".", color="0.5", label=f"refbraid level {level}")
        if xb["norms"]:
            ax.semilogy(xb["iteration_numbers"], [max(v, FLOOR) for v in xb["norms"]], "s",
                        mfc="none", ms=10, color="C1", label="XBraid/TorchBraid reports")
        mine = theirs.get(direction)
        got = [v for v in (mine or {}).get("theirs", []) if v >= 0]  # -1: none measured
        if got:
            its = xb["iteration_numbers"][: len(got)] if len(xb["iteration_numbers"]) >= \
                len(got) else list(range(skip, skip + len(got)))
            ax.semilogy(its, [max(v, FLOOR) for v in got], "x", ms=9, mew=2, color="C3",
                        label="theirs")
        ax.set(title=f"{direction} solve", xlabel="XBraid iteration",
               ylabel="fine C-point residual ‖r‖")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    err = report["layer_parallel"]["gradient_error"]
    title = f"layer-parallel gradient error vs exact: total {err['total']:.2e}"
    if "their_gradient" in report:
        tg = report["their_gradient"]
        title += (f"; theirs vs refbraid: {tg['vs_layer_parallel']['total']:.2e} "
                  f"({'PASS' if tg['pass'] else 'FAIL'})")
    fig.suptitle(title, fontsize=9)
    return fig
