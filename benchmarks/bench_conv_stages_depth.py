"""Multilevel training in depth for the staged conv network (``--model conv-stages``): epochs
and seconds to a target validation accuracy on digits, plain training from random weights vs
nested initialisation (constant / linear in t) vs MG/Opt.

    python benchmarks/bench_conv_stages_depth.py [--quick] [--batch-norm] [--seeds 2]

Every method trains the same conv-stages network (open conv → N/2 conv ODE steps → 2×2 pool +
widen → N/2 steps → classifier; with ``--batch-norm`` BN steps and a BN transition) with the
layer-parallel gradient of ``refbraid train --model conv-stages`` (2 levels, cfactor 2, FCF,
1 forward / 1 adjoint cycle) and plain gradient descent with one step size η on minibatches:

plain       θ ← θ − η ∇f(θ) per batch, from random weights at depth N
nested-c/l  train N/2 layers (every stage halved) for ``--coarse-epochs`` epochs, interpolate
            per stage in t (constant / linear; transitions, opening, closing copied; BN running
            statistics interpolated likewise), then continue at depth N
mgopt-2     one MG/Opt V-cycle per batch over N and N/2 layers (``refbraid train
            --mgopt-levels 2``: refbraid.training.mgopt_step; BN statistics once per step)

Columns: epochs to reach the target (shallow + fine epochs for nested, with the fine-epoch
equivalent in brackets), seconds of training to reach it (evaluation not counted), gradient
evaluations (all levels) and the best validation accuracy (evaluation mode: running
statistics with BN). Medians over ``--seeds`` seeds (weights and batch order); '—' = not
reached in ``--max-epochs``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from refbraid.backends import get_backend
from refbraid.training.config import TrainConfig
from refbraid.training.evaluate import evaluate
from refbraid.training.gradients import layer_parallel_settings, mgrit_gradient, select_gradient
from refbraid.training.models import as_network_input
from refbraid.training.multilevel import coarser_network, prolong_weights
from refbraid.training.run import setup

METHODS = ("plain", "nested-c", "nested-l", "mgopt-2")


class Run:
    """Epoch loop with a clock that stops during evaluation."""

    def __init__(self, model, data, args, seed):
        self.x = as_network_input(model, data.x_train)
        self.data, self.args = data, args
        self.rng = np.random.default_rng(1000 + seed)
        self.seconds, self.epochs, self.fine_epochs, self.calls = 0.0, 0, 0.0, 0
        self.best = 0.0
        self.reached = None  # (epochs, fine epochs, seconds, calls)

    def epoch(self, model, params, gradient, depth_fraction=1.0):
        lr = self.args.lr
        n = self.data.x_train.shape[0]
        perm = self.rng.permutation(n)
        t = time.perf_counter()
        for s in range(0, n, self.args.batch):
            idx = perm[s: s + self.args.batch]
            _, g, stats = gradient(params, self.x[idx], self.data.y_train[idx])
            params = {k: params[k] - lr * g[k] for k in params}
            self.calls += int(stats.get("gradient_calls", 1))
        self.seconds += time.perf_counter() - t
        self.epochs += 1
        self.fine_epochs += depth_fraction
        x_val = as_network_input(model, self.data.x_val)
        _, acc = evaluate(model, params, x_val, self.data.y_val)
        self.best = max(self.best, acc)
        if self.reached is None and acc >= self.args.target and depth_fraction == 1.0:
            self.reached = (self.epochs, self.fine_epochs, self.seconds, self.calls)
        return params


def config_for(method, args):
    extra = dict(mgopt_levels=2) if method.startswith("mgopt") else {}
    return TrainConfig(model="conv-stages", data="digits", layers=args.layers, width=args.width,
                       batch_norm=args.batch_norm, optimizer="sgd", momentum=0.0, lr=args.lr,
                       batch_size=args.batch, samples=args.samples or None, quiet=True,
                       **extra)


def train(method, args, seed):
    config = config_for(method, args)
    model, data, _, bk = setup(config)
    run = Run(model, data, args, seed)
    params = model.init_params(np.random.default_rng(seed))
    settings = layer_parallel_settings(config)
    if method.startswith("nested"):
        kind = "constant" if method.endswith("c") else "linear"
        shallow = coarser_network(model, 2)
        params = shallow.init_params(np.random.default_rng(seed))
        grad = mgrit_gradient(shallow, settings, bk)
        for _ in range(args.coarse_epochs):
            params = run.epoch(shallow, params, grad, 0.5)
        params = prolong_weights(params, model.n_layers, kind)
        if shallow.running:
            model.running = prolong_weights(shallow.running, model.n_layers, kind)
    if method.startswith("mgopt"):
        gradient = select_gradient(config, model, get_backend("numpy"))[1]
    else:
        gradient = mgrit_gradient(model, settings, bk)
    while run.reached is None and run.epochs < args.max_epochs:
        params = run.epoch(model, params, gradient)
    return run


def table(args):
    bn = ", batch norm" if args.batch_norm else ""
    lines = [f"digits, conv-stages{bn}: N = {args.layers}, width {args.width}, batch "
             f"{args.batch}, η = {args.lr}, target val acc {args.target}, {args.seeds} seed(s)",
             f"{'method':10s} {'epochs (fine eq.)':>18s} {'seconds':>8s} {'grad calls':>10s} "
             f"{'best acc':>8s} {'reached':>8s}"]
    for method in METHODS:
        runs = [train(method, args, seed) for seed in range(args.seeds)]
        hit = [r.reached for r in runs if r.reached is not None]
        best = statistics.median(r.best for r in runs)
        if hit:
            ep = statistics.median(h[0] for h in hit)
            fe = statistics.median(h[1] for h in hit)
            sec = statistics.median(h[2] for h in hit)
            calls = statistics.median(h[3] for h in hit)
            lines.append(f"{method:10s} {ep:>8g} ({fe:6.2f})  {sec:8.2f} {calls:10g} "
                         f"{best:8.3f} {len(hit):>4d}/{len(runs)}")
        else:
            lines.append(f"{method:10s} {'—':>18s} {'—':>8s} {'—':>10s} {best:8.3f} "
                         f"{0:>4d}/{len(runs)}")
        print(lines[-1], flush=True)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch-norm", action="store_true", dest="batch_norm")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--coarse-epochs", type=int, default=2, dest="coarse_epochs")
    ap.add_argument("--max-epochs", type=int, default=12, dest="max_epochs")
    ap.add_argument("--samples", type=int, default=0, help="0: the whole digits set")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.samples, args.max_epochs, args.target = 1, 400, 4, 0.5
    print(f"load average {os.getloadavg()[0]:.2f} (1 min)\n", flush=True)
    print("\n".join(table(args)) + "\n")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
