"""Regenerate the README's figures: ``python -m refbraid.figures [--out figures]``.

Trains the default ``refbraid train`` configuration (Peaks, ResNet; see
:class:`refbraid.training.config.TrainConfig`) and writes, atomically, with the Agg backend:

* ``training_curves.png``      loss and accuracy per epoch;
* ``peaks_decision_regions.png`` the validation points and the learned decision regions;
* ``peaks_trajectories.png``   y[n], n = 0..N, of a few validation points per class through
  the layers (two principal directions).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from .data.peaks import peaks_labels
from .training.atomic import save_figure
from .training.config import TrainConfig
from .training.models import as_network_input
from .training.plots import plot_decision_regions, plot_training_curves, plot_trajectories
from .training.trainer import fit, run_summary, select_gradient, setup

PER_CLASS = 6  # trajectories drawn per class


def make_figures(out: str | Path = "figures", config: TrainConfig | None = None,
                 quiet: bool = True) -> dict[str, Path]:
    """Train ``config`` (default: the CLI defaults) and write the figures into ``out``."""
    config = config or TrainConfig()
    config = replace(config, quiet=quiet)
    out = Path(out)
    net, data, state, bk = setup(config)
    name, gradient = select_gradient(config, net, bk)
    result = fit(net, state, data, gradient, epochs=config.epochs,
                 batch_size=config.batch_size, bk=bk, out_dir=None, quiet=quiet,
                 meta=run_summary(config, net, data, state.optimizer, name))
    params, history = result.state.params, result.state.history
    final = history[-1]
    title = (f"{data.name}, {config.model}: N = {config.layers}, width {config.width}, "
             f"T = {config.T:g} (val acc {100 * final['val_acc']:.1f}%)")
    files = {"curves": save_figure(plot_training_curves(history, title),
                                   out / "training_curves.png")}
    if data.input_shape == (2,):
        label_fn = peaks_labels if data.name == "peaks" else None
        files["regions"] = save_figure(plot_decision_regions(net, params, data, bk,
                                                             label_fn=label_fn),
                                       out / f"{data.name}_decision_regions.png")
    pick = np.concatenate([np.flatnonzero(data.y_val == c)[:PER_CLASS]
                           for c in range(data.n_classes)])
    x = as_network_input(net, data.x_val[pick])
    files["trajectories"] = save_figure(
        plot_trajectories(net, params, x, data.y_val[pick], data.n_classes, bk),
        out / f"{data.name}_trajectories.png")
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
