"""Multilevel training in depth: epochs and seconds to a target validation accuracy for plain
training from random weights, nested initialisation (constant / linear in t) and MG/Opt.

    python benchmarks/bench_multilevel.py [--quick] [--data peaks|digits|both] [--seeds 3]

Every method trains the same dense ResNet (N layers, tanh, T = 3) with the layer-parallel
gradient (TorchBraid's MGRIT settings: 3 levels where they fit, cfactor 4, 2 forward / 1
adjoint cycles) and plain gradient descent with one step size η on minibatches:

plain       θ ← θ − η ∇f(θ) per batch, from random weights at depth N
nested-c/l  train N/4 layers for ``--coarse-epochs`` epochs, interpolate in t (constant / linear)
            to N/2, train as long, interpolate to N, then continue at depth N
mgopt-2/3   one MG/Opt V-cycle per batch (refbraid.training.multilevel), 2 or 3 depth levels,
            factor 2, ν₁ = ν₂ = 1, 2 coarsest steps, smoothing = the layer-parallel step, line
            search on the MGRIT forward loss (a forward solve, not counted as a gradient call)

Columns: epochs to reach the target (epochs at every depth for nested, with the fine-epoch
equivalent Σ depth/N · epochs in brackets), seconds of training to reach it (evaluation not
counted), the gradient evaluations (all levels) and the best validation accuracy. Medians
over ``--seeds`` seeds (weights and batch order); '—' = not reached in ``--max-epochs``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from refbraid.backends import get_backend
from refbraid.data.digits import load_digits_dataset
from refbraid.data.peaks import load_peaks
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.mgrit import MGRITSettings, max_levels
from refbraid.network import init_params
from refbraid.training.evaluate import evaluate
from refbraid.training.gradients import mgrit_gradient
from refbraid.training.models import build_network
from refbraid.training.multilevel import (
    MGOpt,
    MGOptSettings,
    coarser_network,
    prolong_weights,
)


def lp_gradient(net):
    """TorchBraid-like layer-parallel gradient (levels that fit the depth, min 1 interval)."""
    levels = min(3, max_levels(net.n_layers, 4, min_coarse=1))
    if levels == 1:
        return mgrit_gradient(net, LayerParallelSettings.exact())
    base = dict(levels=levels, cfactor=4, min_coarse=1, relax=("F", "FCF")[: levels - 1])
    return mgrit_gradient(net, LayerParallelSettings(MGRITSettings.torchbraid(max_iter=1, **base),
                                                     MGRITSettings.torchbraid(max_iter=0, **base)))


def lp_loss(net):
    """The loss of the forward pass the layer-parallel gradient trains (MGRIT forward solve):
    MG/Opt's line search needs only this, not a gradient."""
    logits = lp_gradient(net).logits
    bk = get_backend("numpy")

    def loss(params, x, y):
        return float(bk.softmax_cross_entropy(logits(params, x), y)[0])
    return loss


class Run:
    """Epoch loop with a clock that stops during evaluation."""

    def __init__(self, data, args, seed):
        self.data, self.args = data, args
        self.rng = np.random.default_rng(seed)
        self.seconds, self.epochs, self.fine_epochs, self.calls = 0.0, 0, 0.0, 0
        self.best = 0.0
        self.reached = None  # (epochs, fine epochs, seconds, calls)

    def batches(self):
        n = self.data.x_train.shape[0]
        perm = self.rng.permutation(n)
        for s in range(0, n, self.args.batch):
            idx = perm[s: s + self.args.batch]
            yield self.data.x_train[idx], self.data.y_train[idx]

    def epoch(self, net, params, update, depth_fraction=1.0):
        t = time.perf_counter()
        for xb, yb in self.batches():
            params, calls = update(params, xb, yb)
            self.calls += calls
        self.seconds += time.perf_counter() - t
        self.epochs += 1
        self.fine_epochs += depth_fraction
        _, acc = evaluate(net, params, self.data.x_val, self.data.y_val)
        self.best = max(self.best, acc)
        if self.reached is None and acc >= self.args.target and depth_fraction == 1.0:
            self.reached = (self.epochs, self.fine_epochs, self.seconds, self.calls)
        return params


def gd_update(gradient, lr):
    def update(params, x, y):
        _, g, _ = gradient(params, x, y)
        return {k: params[k] - lr * g[k] for k in params}, 1
    return update


def mgopt_update(mg):
    def update(params, x, y):
        params, info = mg.cycle(params, x, y)
        return params, info["gradient_calls"]  # (+ forward-only line-search evaluations)
    return update


def train(method, net, data, args, seed):
    run = Run(data, args, seed)
    params = init_params(net, seed)
    if method.startswith("nested"):
        kind = "constant" if method.endswith("c") else "linear"
        depths = [coarser_network(net, 4), coarser_network(net, 2)]
        params = init_params(depths[0], seed)
        for i, n in enumerate(depths):
            upd = gd_update(lp_gradient(n), args.lr)
            for _ in range(args.coarse_epochs):
                params = run.epoch(n, params, upd, n.n_layers / net.n_layers)
            nxt = depths[i + 1] if i + 1 < len(depths) else net
            params = prolong_weights(params, nxt.n_layers, kind)
    if method.startswith("mgopt"):
        levels = int(method[-1])
        mg = MGOpt.build(net, lp_gradient, MGOptSettings(levels=levels, lr=args.lr), lp_loss)
        update = mgopt_update(mg)
    else:
        update = gd_update(lp_gradient(net), args.lr)
    while run.reached is None and run.epochs < args.max_epochs:
        params = run.epoch(net, params, update)
    return run


def table(name, data, args):
    net = build_network("resnet", data.x_train.shape[1:], data.n_classes, args.layers,
                        args.width, 3.0, "tanh")
    lines = [f"{name}: N = {args.layers}, width {args.width}, batch {args.batch}, η = {args.lr}, "
             f"target val acc {args.target}, {args.seeds} seed(s)",
             f"{'method':10s} {'epochs (fine eq.)':>18s} {'seconds':>8s} {'grad calls':>10s} "
             f"{'best acc':>8s} {'reached':>8s}"]
    for method in ("plain", "nested-c", "nested-l", "mgopt-2", "mgopt-3"):
        runs = [train(method, net, data, args, seed) for seed in range(args.seeds)]
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
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="both", choices=("peaks", "digits", "both"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--coarse-epochs", type=int, default=2, dest="coarse_epochs")
    ap.add_argument("--max-epochs", type=int, default=30, dest="max_epochs")
    ap.add_argument("--samples", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.layers, args.width, args.samples, args.max_epochs = 1, 16, 8, 400, 6
    print(f"load average {os.getloadavg()[0]:.2f} (1 min)\n")
    sets = {"peaks": (lambda: load_peaks(args.samples, seed=0), 0.2, 0.6),
            "digits": (lambda: load_digits_dataset(seed=0), 0.1, 0.93)}
    for name in (("peaks", "digits") if args.data == "both" else (args.data,)):
        load, lr, target = sets[name]
        a = argparse.Namespace(**vars(args))
        a.lr = args.lr if args.lr is not None else lr
        a.target = args.target if args.target is not None else (0.3 if args.quick else target)
        data = load()
        if name == "digits":
            data = _flat(data)
        print("\n".join(table(name, data, a)) + "\n")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


def _flat(data):
    """Digits as vectors (n, 64) for the dense ResNet."""
    from types import SimpleNamespace

    return SimpleNamespace(x_train=data.x_train.reshape(data.x_train.shape[0], -1),
                           x_val=data.x_val.reshape(data.x_val.shape[0], -1),
                           y_train=data.y_train, y_val=data.y_val, n_classes=data.n_classes)


if __name__ == "__main__":
    main()
