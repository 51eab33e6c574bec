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
import textwrap
from pathlib import Path

from ..atomic import save_figure, write_json
from ..conventions import refbraid_counts
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


WIDTH = 100  # characters per line of the explanations under the tables
OWN_FLAGS = ("[--max-ranks P] [--alpha S] [--beta S] [--step-cost FWD[,ADJ]] "
             "[--timeline-ranks P] [--step-ranks P] [--out DIR]")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``scale`` sub-command on ``subparsers``.

    It takes every ``refbraid train`` flag that describes the model (``add_config_arguments``)
    but lists only its own in ``--help``: the training flags are hidden there and named by one
    group line pointing at ``refbraid train --help``.
    """
    p = subparsers.add_parser(
        "scale",
        help="predict time per training step on 1..1024 ranks (virtual cluster); "
        "scaling.png, timeline.png, timeline_step.png",
        usage=f"%(prog)s [refbraid train flags]\n       {' ' * 9}{OWN_FLAGS}",
        description="Predict the time per training step of a `refbraid train` configuration "
        "for serial, layer-parallel (P = 1, 2, 4, ...), data-parallel and the best DP x LP "
        "split, by running the real MGRIT schedule on a virtual cluster calibrated on this "
        "machine. Writes to --out: scaling.png (speedup vs P), timeline.png (one layer-"
        "parallel gradient, every rank), timeline_step.png (the whole distributed training "
        "step, with --step-ranks > 1) and scaling.json (the tables and the machine model).",
    )
    before = len(p._action_groups)
    add_config_arguments(p)
    for group in p._action_groups[before:]:  # the training flags: accepted, not listed
        for action in group._group_actions:
            action.help = argparse.SUPPRESS
    p.add_argument_group(
        "model", "every `refbraid train` flag that describes the run: data, network, batch, "
        "MGRIT settings (e.g. --layers 256 --width 8 --levels 2 --cfactor 8; --fwd-iters counts "
        "as train does, --torchbraid-conventions as TorchBraid); see `refbraid train --help`")
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
                   "instead of measuring the network here; a coarse adjoint step costs ADJ "
                   "too (the resnet and conv steps reuse the fine step's forward cache)")
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


def _paragraphs(*texts: str) -> str:
    """Each text as an indented paragraph of lines of at most :data:`WIDTH` characters."""
    return "\n".join(textwrap.fill(t, WIDTH, initial_indent="  ", subsequent_indent="  ")
                     for t in texts)


def explain_table(machine, rows) -> str:
    """What the scaling table's columns mean, and why a column is blank where it is."""
    from ..distributed.ownership import BlockPlan

    texts = [
        "LP: layer-parallel MGRIT on P layer ranks (at P = 1 its extra cycles make it slower "
        "than serial backprop). DP: serial backprop on B/P samples per rank + a ring "
        "allreduce. best: the fastest split of P = D×Q ranks into D data-parallel groups of Q "
        "layer ranks (Q = 1: DP, D = 1: LP). ×: serial ms / ms; above 1 is faster than one "
        "process.",
    ]
    lp = [r.ranks for r in rows if r.layer_parallel is not None]
    blank_lp = next((r.ranks for r in rows if r.layer_parallel is None), None)
    if blank_lp is not None:
        try:
            BlockPlan.build(machine.n_layers, machine.settings, blank_lp)
            why = "no such split of the layers"
        except ValueError as err:
            why = str(err).split(";")[0].split(": ", 1)[-1]
        texts.append(f"LP is blank from P = {blank_lp}: {why}.")
    blank_dp = next((r.ranks for r in rows if r.data_parallel is None), None)
    if blank_dp is not None:
        texts.append(f"DP is blank from P = {blank_dp}: every rank needs at least one sample "
                     f"of the batch of {machine.batch}.")
    blank_best = next((r.ranks for r in rows if r.best is None), None)
    if blank_best is not None and lp:
        texts.append(f"best is blank from P = {blank_best}: at most D = {machine.batch} "
                     f"groups × Q = {max(lp)} layer ranks.")
    return _paragraphs(*texts)


def explain_steps(machine, step_rows) -> str:
    """What the training-step table adds to the scaling table, and how its D×Q differs."""
    extra = f" ({1e3 * machine.extra:.2f} ms at P = 1, shared by the layer ranks)" \
        if machine.extra else ""
    texts = [
        "step ms: the whole step simulated (every message, broadcast and reduction of "
        "`mpiexec refbraid train`) + the calibrated time it does not simulate, the optimizer "
        f"and glue{extra}. comm ms: messages on its critical path. solves-only ms: the "
        "scaling table's model of the same split.",
        "D×Q here: each of the D groups trains layer-parallel (MGRIT) on Q ranks, even with "
        "Q = 1; in the scaling table Q = 1 is serial backprop (DP): the same D×Q, another "
        "gradient, another time.",
    ]
    return _paragraphs(*texts)


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
    config = config_from_args(refbraid_counts(argparse.Namespace(**{**vars(args), "out": None})))
    if config.levels < 2:
        raise ValueError("`--levels` must be at least 2 for layer-parallel scaling (1 level is "
                         "sequential substitution).")
    out = check_writable_folder(Path(out_arg or f"runs/scale-{config.data}-{config.model}"))
    step_costs = None
    if args.step_cost is not None:
        fwd = args.step_cost[0]
        adj = args.step_cost[1] if len(args.step_cost) > 1 else fwd
        # a coarse adjoint step reuses the fine forward cache (the dense and conv steps'
        # cache does not depend on h: layer_parallel.CapturingAdjoint), so it costs ADJ too
        step_costs = StepCosts(forward=fwd, backward=(adj, adj))
    machine = calibrate(config, max_ranks=max_ranks, alpha=args.alpha, beta=args.beta,
                        step_costs=step_costs)
    rows = predict(machine, max_ranks)
    title = (f"{config.data}-{config.model}: N = {config.layers}, width {config.width}, batch "
             f"{config.batch_size}, {config.levels} levels, cfactor {config.cfactor}")
    print(format_table(machine, rows, title), flush=True)
    print(explain_table(machine, rows), flush=True)
    step_rows = []
    if args.step_ranks:
        from .predict import _batch
        from .virtual_training import format_steps, predict_steps

        net, params, x, y, bk = _batch(config)
        step_rows = predict_steps(machine, net, params, x, y, bk, args.step_ranks)
        print(format_steps(step_rows, serial_time(machine)), flush=True)
        print(explain_steps(machine, step_rows), flush=True)

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
                                  title=f"one layer-parallel gradient on {q} virtual ranks: "
                                  f"{1e3 * run_.wall_time:.2f} ms\n{title}"),
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
                               f"virtual ranks: {1e3 * step.step_time:.2f} ms simulated + "
                               f"{1e3 * (pure[-1].step - step.step_time):.2f} ms not "
                               f"(optimizer, glue)\n{title}")
        files.insert(2, save_figure(figure, out / "timeline_step.png"))
    print(f"wrote {', '.join(f.name for f in files)} to {out}/", file=sys.stdout, flush=True)
    return 0
