"""Their residual history beside refbraid's (reads a ``refbraid compare`` report)."""

from __future__ import annotations

from matplotlib.figure import Figure

FLOOR = 1e-17  # keep exact zeros visible on the log axis


def plot_comparison(report: dict) -> Figure:
    """Forward and adjoint panels: refbraid's record (every measurement, including the final
    relaxation XBraid does not report, at XBraid's iteration numbers), what XBraid/TorchBraid
    reports, and the user's norms when the report holds them. Iterations are whole numbers on
    an axis that spans every iteration of the solve; a solve XBraid reports no norm for says
    so in its panel. The title gives the settings and the gradient errors."""
    fig = Figure(figsize=(8.5, 3.9), layout="constrained")
    axes = fig.subplots(1, 2)
    theirs = report.get("their_residuals", {})
    for ax, direction in zip(axes, ("forward", "backward"), strict=True):
        res = report["residuals"][direction]
        rb, xb = res["refbraid"], res["xbraid"]
        skip = 1 if rb["start"] == "skip" else 0
        norms = [v for v in rb["norms"] if v is not None]
        its = [k + skip for k in range(len(norms))]
        ax.semilogy(its, [max(v, FLOOR) for v in norms],
                    "o-", color="C0", label="refbraid record (last: the final relaxation)")
        for level, values in rb["level_norms"].items():
            pts = [(k + skip, v) for k, v in enumerate(values) if v is not None]
            if pts:
                ax.semilogy(*zip(*[(k, max(v, FLOOR)) for k, v in pts], strict=True), ":",
                            marker=".", color="0.5", label=f"refbraid level {level}")
        if xb["norms"]:
            ax.semilogy(xb["iteration_numbers"], [max(v, FLOOR) for v in xb["norms"]], "s",
                        mfc="none", ms=10, color="C1", label="XBraid/TorchBraid reports")
        else:
            stats = "getFwdStats" if direction == "forward" else "getBwdStats"
            ax.text(0.5, 0.04, f"XBraid/TorchBraid report no norm for this solve\n"
                    f"({xb['iterations']} iteration(s); {stats}: −1)",
                    transform=ax.transAxes, ha="center", fontsize=7, color="C1")
        mine = theirs.get(direction)
        got = [v for v in (mine or {}).get("theirs", []) if v >= 0]  # -1: none measured
        if got:
            at = xb["iteration_numbers"][: len(got)] if len(xb["iteration_numbers"]) >= \
                len(got) else list(range(skip, skip + len(got)))
            ax.semilogy(at, [max(v, FLOOR) for v in got], "x", ms=9, mew=2, color="C3",
                        label="theirs")
            its += list(at)
        first, last = min([0, *its]), max([skip, *its])
        ax.set_xlim(first - 0.5, last + 0.5)
        ax.set_xticks(range(first, last + 1))
        if len(norms) == 1:  # one point: a decade around it, not a 4 % sliver
            ax.set_ylim(max(norms[0], FLOOR) / 10, max(norms[0], FLOOR) * 10)
        ax.set(title=f"{direction} solve", xlabel="XBraid iteration (0: the skipped cycle)"
               if skip else "XBraid iteration", ylabel="fine C-point residual ‖r‖ (2-norm)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    err = report["layer_parallel"]["gradient_error"]
    title = f"layer-parallel gradient error vs exact: total {err['total']:.2e}"
    if "their_gradient" in report:
        tg = report["their_gradient"]
        title += (f"; theirs vs refbraid: {tg['vs_layer_parallel']['total']:.2e} "
                  f"({'PASS' if tg['pass'] else 'FAIL'})")
    fig.suptitle(f"{_settings_line(report)}\n{title}", fontsize=9)
    return fig


def _settings_line(report: dict) -> str:
    """The compared settings in refbraid's words (cycles after the skipped first, final FC)."""
    settings = report.get("settings", {})
    fwd, bwd = settings.get("forward", {}), settings.get("backward", {})
    if not fwd:
        return "refbraid compare"
    if fwd.get("levels", 1) == 1:
        return "refbraid compare: 1 level (exact sequential solves)"
    final = [d for d, s in (("forward", fwd), ("adjoint", bwd)) if s.get("final_fc_relax")]
    words = (f"refbraid compare: {fwd['levels']} levels, cfactor "
             f"{'/'.join(map(str, fwd.get('cfactors', [])))}, {fwd.get('max_iter')} forward / "
             f"{bwd.get('max_iter')} adjoint cycles"
             f"{' after the skipped first' if fwd.get('skip_first_down') else ''}, final FC "
             f"relaxation: {' and '.join(final) if final else 'none'}")
    if settings.get("conventions") == "torchbraid":
        words += " (flags read with --torchbraid-conventions)"
    return words
