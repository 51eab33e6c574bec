"""Regenerate the README's figures: ``python -m refbraid.figures [--out figures]``.

Trains the default ``refbraid train`` configuration (Peaks, ResNet; see
:class:`refbraid.training.config.TrainConfig`) twice — layer-parallel (the default) and
``--serial`` — with the same seed, and writes, atomically, with the Agg backend:

* ``training_curves.png``        loss and accuracy per epoch, serial vs layer-parallel;
* ``mgrit_residuals.png``        a forward MGRIT solve through the trained network, iterated
  to convergence: residual per iteration on every level;
* ``gradient_error.png``         layer-parallel gradient error vs MGRIT cycles at the
  trained weights.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from matplotlib.figure import Figure

from .atomic import save_figure
from .gradient_error import gradient_error_study, plot_gradient_error
from .layer_parallel import forward_problem
from .mgrit import MGRITSettings, solve
from .mgrit.plots import plot_residual_history
from .models import as_network_input
from .network import group
from .training.config import TrainConfig
from .training.run import run_summary, setup
from .training.trainer import fit, select_gradient


def _train(config: TrainConfig, quiet: bool):
    net, data, state, bk = setup(config)
    name, gradient = select_gradient(config, net, bk)
    result = fit(net, state, data, gradient, epochs=config.epochs,
                 batch_size=config.batch_size, bk=bk, out_dir=None, quiet=quiet,
                 meta=run_summary(config, net, data, state.optimizer, name))
    return net, data, bk, result.state


def plot_serial_vs_layer_parallel(histories: dict[str, list[dict]], title: str) -> Figure:
    """Training loss and validation accuracy per epoch for each named run."""
    fig = Figure(figsize=(8.0, 3.2), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    for (name, hist), style in zip(histories.items(), ("-", "--"), strict=False):
        epochs = [r["epoch"] for r in hist]
        ax_loss.plot(epochs, [r["train_loss"] for r in hist], style, label=name)
        ax_acc.plot(epochs, [100 * r["val_acc"] for r in hist], style, label=name)
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log")
    ax_acc.set(xlabel="epoch", ylabel="validation accuracy (%)", ylim=(0, 100))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    return fig


def make_figures(out: str | Path = "figures", config: TrainConfig | None = None,
                 quiet: bool = True) -> dict[str, Path]:
    """Train ``config`` (default: the CLI defaults) serial and layer-parallel; write figures."""
    config = replace(config or TrainConfig(), quiet=quiet)
    out = Path(out)
    runs = {}
    for serial in (True, False):
        runs["serial" if serial else "layer-parallel"] = _train(replace(config, serial=serial),
                                                                quiet)
    net, data, bk, _ = runs["serial"]
    lp_state = runs["layer-parallel"][3]
    final = {k: v[3].history[-1]["val_acc"] for k, v in runs.items()}
    title = (f"{data.name}, {config.model}: N = {config.layers}, width {config.width}, "
             f"T = {config.T:g}; val acc serial {100 * final['serial']:.1f}%, "
             f"layer-parallel {100 * final['layer-parallel']:.1f}%\nlayer-parallel: MGRIT, "
             f"{config.levels} levels, cfactor {config.cfactor}, {config.fwd_iters} forward / "
             f"{config.bwd_iters} adjoint cycles after the skipped first")
    histories = {k: v[3].history for k, v in runs.items()}
    files = {"curves": save_figure(plot_serial_vs_layer_parallel(histories, title),
                                   out / "training_curves.png")}
    xb = bk.asarray(as_network_input(net, data.x_train[: config.batch_size]))
    yb = bk.asarray(data.y_train[: config.batch_size])
    y0, _ = net.opening.forward(group(lp_state.params, "opening"), xb, bk)
    settings = MGRITSettings(levels=config.levels, cfactor=config.cfactor, max_iter=15,
                             abs_tol=1e-10, relax=config.relax_per_level, min_coarse=1)
    solved = solve(forward_problem(net, group(lp_state.params, "steps"), y0, bk), settings)
    files["mgrit"] = save_figure(
        plot_residual_history(solved, "the trained network's forward pass, to convergence"),
        out / "mgrit_residuals.png")
    rows = gradient_error_study(net, lp_state.params, xb, yb, range(0, 16), bk)
    files["gradient_error"] = save_figure(
        plot_gradient_error(rows, "layer-parallel gradient at the trained weights"),
        out / "gradient_error.png")
    return files


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    parser = argparse.ArgumentParser(prog="python -m refbraid.figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="figures", help="output folder (default: figures)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="override the default number of epochs (for a quick look)")
    args = parser.parse_args(argv)
    config = TrainConfig() if args.epochs is None else TrainConfig(epochs=args.epochs)
    for path in make_figures(args.out, config).values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
