"""Does the batched transformer step pay? Per-step vs batched: the step, MGRIT solves, gradient.

    python benchmarks/bench_batched_transformer.py [--dims 32] [--tokens 16] [--batches 8 32]
        [--layers 64 256] [--k 16 64] [--backends numpy numba] [--repeat 3] [--no-step]

A transformer's MGRIT sweeps apply the encoder step ``X_next = X + h (φ1(X) + φ2(X + φ1(X)))``
(``refbraid.layers.EncoderStep``: LN, self-attention, LN, MLP; per-layer weights) to the k
intervals of a sweep. ``EncoderStep.forward_batched`` / ``adjoint_batched``
(``refbraid.layers.transformer_batched``) do it in one call on the stacked states
(k, B, T, E) and the k layers' stacked weights, bit-identical to k per-step calls.

Two tables, heads E/8, MLP width 2E, 1 thread, CPU time of this process, median of
``--repeat`` (after one warm-up call):

* the step alone (``--k``): µs per step application of k per-step ``forward`` calls against
  one ``forward_batched`` call, and of the state-only adjoint a sweep of the adjoint solve
  makes (forward for the cache, then ``adjoint(grads=False)``);
* the ``transformer`` model (``refbraid.sequence.TransformerModel``, pooled head, N layers,
  TorchBraid's settings): ms of the MGRIT forward solve, the MGRIT adjoint solve, and the
  whole layer-parallel gradient (both solves, loss, weight gradients), with the batched path
  forced on (``EncoderStep.batched_sweeps_pay``, what ``refbraid.layer_parallel.batchable``
  reads; B·T > 64 then runs one layer per call through the batched machinery) and off;
  ``max |Δ|`` compares the solutions and the gradients (0: bit-identical); ``rule`` is what
  the models choose (``EncoderStep.for_batch``: on for B·T ≤ 64).

The decision and the numbers: docs/batched.md, "Transformer blocks".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from unittest import mock

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from cpu_timing import median_time  # noqa: E402

from refbraid import get_backend  # noqa: E402
from refbraid.layer_parallel import (  # noqa: E402
    LayerParallelSettings,
    adjoint_problem,
    mgrit_forward,
)
from refbraid.layers import transformer as transformer_module  # noqa: E402
from refbraid.layers.transformer import EncoderStep  # noqa: E402
from refbraid.mgrit import solve  # noqa: E402
from refbraid.network import group  # noqa: E402
from refbraid.sequence import TransformerModel  # noqa: E402


def heads_of(E: int) -> int:
    return max(1, E // 8)


# ----------------------------------------------------------------------------- the step alone
def step_row(backend: str, E: int, T: int, B: int, k: int, repeat: int) -> str:
    bk = get_backend(backend)
    step = EncoderStep(E, heads_of(E), 2 * E, T)
    rng = np.random.default_rng(0)
    layers = [step.init(rng) for _ in range(k)]
    stacked = {name: np.stack([p[name] for p in layers]) for name in layers[0]}
    X = rng.standard_normal((k, B, T, E))
    L = rng.standard_normal((k, B, T, E))
    h = np.full(k, 0.25)

    def fwd_per_step():
        return np.stack([step.forward(layers[j], X[j], 0.25, bk)[0] for j in range(k)])

    def fwd_batched():
        return step.forward_batched(stacked, X, h, bk)[0]

    def adj_per_step():
        out = []
        for j in range(k):
            _, cache = step.forward(layers[j], X[j], 0.25, bk)
            out.append(step.adjoint(layers[j], cache, L[j], 0.25, bk, grads=False)[0])
        return np.stack(out)

    def adj_batched():
        _, Z = step.forward_batched(stacked, X, h, bk)
        return step.adjoint_batched(stacked, X, Z, L, h, bk, grads=False)[0]

    us = 1e6 / k
    cells = []
    for per, bat in ((fwd_per_step, fwd_batched), (adj_per_step, adj_batched)):
        t_p, t_b = median_time(per, repeat), median_time(bat, repeat)
        d = float(np.max(np.abs(per() - bat())))
        cells.append(f"{t_p * us:>10.1f} {t_b * us:>10.1f} {t_p / t_b:>6.2f} {d:>8.1e}")
    return f"{backend:<6} {E:>3} {T:>3} {B:>3} {k:>4}  " + "   ".join(cells)


# ----------------------------------------------------------------------------- MGRIT solves
def model_row(backend: str, E: int, T: int, B: int, N: int, repeat: int) -> str:
    bk = get_backend(backend)
    model = TransformerModel(16, T, 4, N, E, heads_of(E), 2 * E, 1.0)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    x = rng.integers(0, 16, (B, T))
    y = rng.integers(0, 4, B)
    s = LayerParallelSettings()
    steps = group(params, "steps")
    on = dataclasses.replace(model.net.step, batched_sweeps_pay=True)
    nets = {True: dataclasses.replace(model.net, step=on), False: model.net}
    states = mgrit_forward(model.net, params, x, s.forward, bk)[1].solution
    lam_N = rng.standard_normal(states.shape[1:])
    batched = [True]  # which path the timed calls take

    def fwd():
        return mgrit_forward(nets[batched[0]], params, x, s.forward, bk)[1].solution

    def adj():
        return solve(adjoint_problem(nets[batched[0]], steps, states, lam_N, bk),
                     s.backward).solution

    def grad():  # the model switches batching per batch (EncoderStep.for_batch): forced here
        with mock.patch.object(transformer_module, "batched_pays", lambda B, T: batched[0]):
            return model.layer_parallel_gradient(params, x, y, s, bk)[1]

    out = []
    for name, fn in (("fwd", fwd), ("adj", adj), ("grad", grad)):
        batched[0] = True
        t_b = median_time(fn, repeat)
        bat = fn()
        batched[0] = False
        t_p = median_time(fn, repeat)
        per = fn()
        if name == "grad":
            d = max(float(np.max(np.abs(per[k] - bat[k]))) for k in per)
        else:
            d = float(np.max(np.abs(per - bat)))
        out.append(f"{1e3 * t_p:>9.1f} {1e3 * t_b:>9.1f} {t_p / t_b:>6.2f} {d:>8.1e}")
    rule = "on" if on.for_batch(B).batched_sweeps_pay else "off"
    return f"{backend:<6} {E:>3} {T:>3} {B:>3} {N:>4}  " + "  ".join(out) + f"  {rule:>4}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[32])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--layers", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--k", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--backends", nargs="+", default=["numpy", "numba"],
                    choices=("numpy", "numba"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-step", action="store_true", help="skip the step-alone table")
    args = ap.parse_args(argv)
    grid = [(b, E, T, B) for b in args.backends for E in args.dims for T in args.tokens
            for B in args.batches]
    if not args.no_step:
        print(f"encoder step alone: µs per step application, median of {args.repeat}; "
              f"load {os.getloadavg()[0]:.2f}")
        head = (f"{'bk':<6} {'E':>3} {'T':>3} {'B':>3} {'k':>4}  {'fwd per':>10} "
                f"{'fwd bat':>10} {'speed':>6} {'max |Δ|':>8}   {'adj per':>10} {'adj bat':>10} "
                f"{'speed':>6} {'max |Δ|':>8}")
        print(head)
        print("-" * len(head))
        for b, E, T, B in grid:
            for k in args.k:
                print(step_row(b, E, T, B, k, args.repeat), flush=True)
        print()
    print(f"transformer model, TorchBraid's settings: CPU ms per MGRIT solve / gradient, per-step "
          f"vs batched, median of {args.repeat}; load {os.getloadavg()[0]:.2f}")
    head = (f"{'bk':<6} {'E':>3} {'T':>3} {'B':>3} {'N':>4}  {'fwd per':>9} {'fwd bat':>9} "
            f"{'speed':>6} {'max |Δ|':>8}  {'adj per':>9} {'adj bat':>9} {'speed':>6} "
            f"{'max |Δ|':>8}  {'grad per':>9} {'grad bat':>9} {'speed':>6} {'max |Δ|':>8}  rule")
    print(head)
    print("-" * len(head))
    for b, E, T, B in grid:
        for N in args.layers:
            print(model_row(b, E, T, B, N, args.repeat), flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}; max |Δ| = 0: bit-identical; rule: what "
          f"EncoderStep.for_batch (B·T ≤ 64) switches on in the models.")


if __name__ == "__main__":
    main()
