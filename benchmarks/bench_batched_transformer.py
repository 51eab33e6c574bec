"""Would a batched transformer step pay? A prototype, timed against k per-step calls.

    python benchmarks/bench_batched_transformer.py [--dims 32 64] [--tokens 16 32]
        [--batches 8 32] [--k 16 64] [--repeat 7]

A transformer's MGRIT sweeps apply the encoder step ``X_next = X + h (φ1(X) + φ2(X + φ1(X)))``
(``refbraid.layers.EncoderStep``: LN, self-attention, LN, MLP; per-layer weights) to the k
intervals of a sweep. A batched step would stack the k states (k, B, T, E) and the k layers'
weights and run every product as a batched ``matmul`` over the k rows (the attention's
products over k·B·heads), every element-wise op and layer norm once on the stack.

This file holds such a batched *forward* (``encoder_forward_batched``, plain NumPy, exact-erf
GELU, biased-variance layer norm, no masks: the arithmetic of ``EncoderStep.forward``; not
part of the package) and times, per step application, on the NumPy backend (1 thread, CPU
time of this process, median of ``--repeat``):

* per-step   k calls of ``EncoderStep.forward`` (what MGRIT's sweeps do today);
* batched    one call of the prototype on the stacks;
* max |Δ|    their largest difference (round-off: the prototype is not written to be
             bit-identical; a package version would be).

The adjoint does the same products transposed (about twice the forward's arithmetic and
kernel calls), so the forward's ratio bounds what batching could save there. The decision and
the numbers: docs/batched.md, "Transformer blocks".
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy.special import erf  # noqa: E402

from refbraid import get_backend  # noqa: E402
from refbraid.layers.transformer import EncoderStep  # noqa: E402


def median_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _layernorm(X, gamma, beta, eps):
    """(X − μ) / √(σ² + eps) γ + β over the last axis; γ, β (k, E) broadcast per row."""
    mean = X.mean(axis=-1, keepdims=True)
    xc = X - mean
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    return xc * rstd * gamma[:, None, None, :] + beta[:, None, None, :]


def _linear(X, W, b):
    """X Wᵀ + b per row: X (k, B, T, n), W (k, m, n), b (k, m) -> (k, B, T, m)."""
    k, B, T, n = X.shape
    Z = np.matmul(X.reshape(k, B * T, n), W.transpose(0, 2, 1)) + b[:, None, :]
    return Z.reshape(k, B, T, W.shape[1])


def encoder_forward_batched(P, X, h, heads: int, eps: float):
    """X_next = X + h (a + c) for k encoder steps at once; P holds (k, ...) stacked weights."""
    k, B, T, E = X.shape
    d = E // heads
    l1 = _layernorm(X, P["ln1.gamma"], P["ln1.beta"], eps)
    qkv = _linear(l1, P["sa.W_in"], P["sa.b_in"])  # k,B,T,3E
    qkv = qkv.reshape(k, B, T, 3, heads, d).transpose(3, 0, 1, 4, 2, 5)  # 3,k,B,nh,T,d
    q, kk, v = qkv[0], qkv[1], qkv[2]
    s = np.matmul(q, kk.swapaxes(-1, -2)) / math.sqrt(d)  # k,B,nh,T,T
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, v).transpose(0, 1, 3, 2, 4).reshape(k, B, T, E)
    a = _linear(o, P["sa.W_out"], P["sa.b_out"])
    l2 = _layernorm(X + a, P["ln2.gamma"], P["ln2.beta"], eps)
    z = _linear(l2, P["mlp.W1"], P["mlp.b1"])
    g = 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))
    c = _linear(g, P["mlp.W2"], P["mlp.b2"])
    return X + h[:, None, None, None] * (a + c)


def row(E: int, T: int, B: int, k: int, repeat: int) -> str:
    bk = get_backend("numpy")
    heads = max(1, E // 8)
    step = EncoderStep(E, heads, 2 * E, T)
    rng = np.random.default_rng(0)
    layers = [step.init(rng) for _ in range(k)]
    stacked = {name: np.stack([p[name] for p in layers]) for name in layers[0]}
    X = rng.standard_normal((k, B, T, E))
    h = np.full(k, 0.25)

    def per_step():
        return [step.forward(layers[j], X[j], 0.25, bk)[0] for j in range(k)]

    def batched():
        return encoder_forward_batched(stacked, X, h, heads, step.eps)

    t_p = median_time(per_step, repeat)
    t_b = median_time(batched, repeat)
    d = float(np.max(np.abs(np.stack(per_step()) - batched())))
    us = 1e6 / k
    return (f"{E:>4} {T:>4} {B:>4} {k:>4} {t_p * us:>12.1f} {t_b * us:>11.1f} "
            f"{t_p / t_b:>7.2f} {d:>9.1e}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--tokens", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--k", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    print(f"encoder step forward, NumPy, heads E/8, MLP 2E; µs per step application, median "
          f"of {args.repeat}; load {os.getloadavg()[0]:.2f}")
    head = (f"{'E':>4} {'T':>4} {'B':>4} {'k':>4} {'per-step µs':>12} {'batched µs':>11} "
            f"{'speedup':>7} {'max |Δ|':>9}")
    print(head)
    print("-" * len(head))
    for E in args.dims:
        for T in args.tokens:
            for B in args.batches:
                for k in args.k:
                    print(row(E, T, B, k, args.repeat), flush=True)


if __name__ == "__main__":
    main()
