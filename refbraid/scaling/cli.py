"""``refbraid scale``: predicted time per training step from 1 to 1,024 ranks, and why.

Takes the same flags as ``refbraid train`` for the model (data, network, batch, MGRIT
settings), calibrates this machine (:func:`refbraid.scaling.predict.calibrate`) unless told
the costs, runs the real MGRIT schedule on a virtual cluster for P = 1, 2, 4, …, and writes::

    scaling.png    speedup vs P: layer-parallel, data-parallel, best DP × LP, ideal
    timeline.png   one virtual layer-parallel gradient on --timeline-ranks ranks: what every
                   rank does when, waits, and the critical path
    timeline_step.png  the whole distributed training step (DistributedGradient) on the most
                   layer ranks ≤ --step-ranks: exchanges, broadcasts, reductions included
    scaling.json   the table and the machine model behind it

Examples::

    refbraid scale                                        # the default network (N = 64)
    refbraid scale --layers 4096 --max-ranks 1024         # a deep dense network
    refbraid scale --alpha 2e-6 --beta 4e-11 --step-cost 1e-4,2e-4   # describe a GPU cluster
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..training.atomic import save_figure, write_json
from ..training.cli import add_config_arguments
from ..training.config import config_from_args
from ..training.run_folder import check_writable_folder


def _costs(text: str):
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds per step, comma-separated, got "
                                         f"{text!r}") from None
    if len(values) not in (1, 2) or not all(v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected FWD[,ADJ] positive seconds, got {text!r}")
    return values


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``scale`` sub-command on ``subparsers``."""
    p = subparsers.add_parser(
        "scale",
        help="predict time per training step on 1..1024 ranks (virtual cluster); "
        "scaling.png, timeline.png",
        description="Predict the time per training step of a `refbraid train` configuration "
        "for serial, layer-parallel (P = 1, 2, 4, ...), data-parallel and the best DP x LP "
        "split, by running the real MGRIT schedule on a virtual cluster calibrated on this "
        "machine. Writes scaling.png, timeline.png and scaling.json to --out.",
    )
    add_config_arguments(p)
    g = p.add_argument_group("scaling")
    g.add_argument("--max-ranks", type=int, default=1024, metavar="P",
                   help="largest number of ranks (default: 1024)")
    g.add_argument("--alpha", type=float, default=None, metavar="S",
                   help="seconds of latency per message (default: measured with a 2-rank "
                   "ping-pong here)")
    g.add_argument("--beta", type=float, default=None, metavar="S",
                   help="seconds per byte of a message (default: measured here)")
    g.add_argument("--step-cost", type=_costs, default=None, metavar="FWD[,ADJ]",
                   help="seconds of one forward step (and one adjoint step) on every level "
                   "instead of measuring the network here; a coarse adjoint step costs "
                   "FWD + ADJ (it recomputes the forward pass)")
    g.add_argument("--timeline-ranks", type=int, default=4, metavar="P",
                   help="ranks of the virtual run drawn in timeline.png (default: 4, or the "
                   "most the network allows)")
    g.add_argument("--step-ranks", type=int, default=4, metavar="P",
                   help="run the whole distributed training step (real values) on the "
                   "virtual cluster for every D x Q split up to P ranks (default: 4; 0: skip)")
    g.add_argument("--out", dest="out", default=None, metavar="DIR",
                   help="output folder (default: runs/scale-<data>-<model>)")
    p.set_defaults(func=run)
    return p


def _check_ranks(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"`--{name}` must be a positive integer, got {value}.")
    return value


def run(args: argparse.Namespace) -> int:
    """Calibrate, predict, print the table, write the figures; returns 0."""
    from ..distributed.ownership import BlockPlan
    from ..parallel.costs import StepCosts
    from ..parallel.plots import plot_timeline
    from ..training.gradients import layer_parallel_settings
    from .plots import plot_scaling
    from .predict import as_json, calibrate, format_table, predict, serial_time
    from .virtual_step import simulate_gradient_schedule

    max_ranks = _check_ranks("max-ranks", args.max_ranks)
    timeline_ranks = _check_ranks("timeline-ranks", args.timeline_ranks)
    if args.step_ranks < 0:
        raise ValueError(f"`--step-ranks` must be 0 (skip) or a positive integer, got "
                         f"{args.step_ranks}.")
    out_arg = args.out
    config = config_from_args(argparse.Namespace(**{**vars(args), "out": None}))
    if config.levels < 2:
        raise ValueError("`--levels` must be at least 2 for layer-parallel scaling (1 level is "
                         "sequential substitution).")
    out = check_writable_folder(Path(out_arg or f"runs/scale-{config.data}-{config.model}"))
    step_costs = None
    if args.step_cost is not None:
        fwd = args.step_cost[0]
        adj = args.step_cost[1] if len(args.step_cost) > 1 else fwd
        step_costs = StepCosts(forward=fwd, backward=(adj, fwd + adj))
    machine = calibrate(config, max_ranks=max_ranks, alpha=args.alpha, beta=args.beta,
                        step_costs=step_costs)
    rows = predict(machine, max_ranks)
    title = (f"{config.data}-{config.model}: N = {config.layers}, width {config.width}, batch "
             f"{config.batch_size}, {config.levels} levels, cfactor {config.cfactor}")
    print(format_table(machine, rows, title), flush=True)
    step_rows = []
    if args.step_ranks:
        from .predict import _batch
        from .virtual_training import format_steps, predict_steps

        net, params, x, y, bk = _batch(config)
        step_rows = predict_steps(machine, net, params, x, y, bk, args.step_ranks)
        print(format_steps(step_rows, serial_time(machine)), flush=True)

    settings = layer_parallel_settings(config)
    q = timeline_ranks
    while q > 1:  # the most ranks (≤ --timeline-ranks) the network can be split over
        try:
            BlockPlan.build(config.layers, settings, q)
            break
        except ValueError:
            q //= 2
    run_ = simulate_gradient_schedule(config.layers, machine.state_bytes, q, settings,
                                      machine.costs, machine.alpha, machine.beta,
                                      machine.iterations)
    files = [
        save_figure(plot_scaling(rows, serial_time(machine), title), out / "scaling.png"),
        save_figure(plot_timeline(run_.trace, run_.critical_path,
                                  title=f"one layer-parallel gradient on {q} virtual ranks "
                                  f"({1e3 * run_.wall_time:.2f} ms)"),
                    out / "timeline.png"),
        write_json(out / "scaling.json", {"config": config.to_dict(), **as_json(machine, rows),
                                          "training_step_rows": [r.as_dict() for r in step_rows]}),
    ]
    pure = [r for r in step_rows if r.groups == 1 and r.ranks > 1]
    if pure:  # the whole training step on the most layer ranks: its timed part
        step = pure[-1].run
        figure = plot_timeline(step.run.trace, step.run.critical_path,
                               t_range=(step.t0, step.t0 + step.step_time),
                               title=f"one distributed training step on {pure[-1].ranks} "
                               f"virtual ranks ({1e3 * step.step_time:.2f} ms + extra)")
        files.insert(2, save_figure(figure, out / "timeline_step.png"))
    print(f"wrote {', '.join(f.name for f in files)} to {out}/", file=sys.stdout, flush=True)
    return 0
