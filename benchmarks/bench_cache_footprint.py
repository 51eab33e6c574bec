"""Step cost as a function of how many layer caches are alive, under default and pinned malloc.

    python benchmarks/bench_cache_footprint.py [--layers 128] [--dtype float64] [--repeat 7]

Serial backprop keeps every layer's forward cache and state alive until its adjoint step
(N = 128 conv layers of TorchBraid's MNIST network: 50·4·28·28 values per state, 1.25 MB in
float64); an MGRIT rank keeps half of them, and a unit-cost measurement (bench_mpi's c_f, c_bg)
only one. Here N forward steps, then N adjoint steps cycling backwards over the kept caches,
run while keeping the last K caches alive (K = 1: each dropped at once; K = N: backprop's
order; numba, batch 50), and the table prints per step: forward and adjoint µs (median of
``--repeat`` passes after one warm-up, CPU time: a shared machine's load moves it less), minor
page faults (``resource.getrusage``) and the peak RSS, each in a fresh process, with glibc's
default malloc and with :func:`refbraid.runtime.pin_allocator`, alternating. If the cost per
step grows with K, the footprint (cache misses, page faults) explains why serial's step costs
exceed those traced inside a 2-rank run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import deque

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "FOOTPRINT "


def _pass(net, steps, y0, keep: int, bk):
    """Seconds per step of N forward steps that keep the last ``keep`` caches alive, then of
    N adjoint steps cycling backwards over the kept caches (``keep`` = N: backprop's order)."""
    from refbraid.network import layer_params

    N = net.n_layers
    alive: deque = deque(maxlen=keep)
    y = y0
    t0 = time.process_time()
    for n in range(N):
        y, cache = net.step.forward(layer_params(steps, n), y, net.h, bk)
        alive.append((n, cache))
    t_fwd = time.process_time() - t0
    lam = np.ones_like(y)
    window = list(alive)
    t0 = time.process_time()
    for i in range(N):
        n, cache = window[-1 - (i % len(window))]
        lam, _ = net.step.adjoint(layer_params(steps, n), cache, lam, net.h, bk)
    t_adj = time.process_time() - t0
    return t_fwd / N, t_adj / N


def worker(spec: dict) -> dict:
    from refbraid.backends import get_backend
    from refbraid.network import group, init_params
    from refbraid.runtime import pin_allocator
    from refbraid.training.models import build_network

    if spec["malloc"] == "pinned":
        pin_allocator()
    bk = get_backend("numba")
    N = spec["layers"]
    net = build_network("conv", (1, 28, 28), 10, N, 4, 1.0, "relu")
    steps = group(init_params(net, 0, np.dtype(spec["dtype"])), "steps")
    y0 = np.random.default_rng(0).standard_normal((50, *net.step.state_shape))
    y0 = y0.astype(spec["dtype"])
    out = {}
    for keep in spec["keeps"]:
        _pass(net, steps, y0, keep, bk)
        f, a, flt = [], [], []
        for _ in range(spec["repeat"]):
            r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            tf, ta = _pass(net, steps, y0, keep, bk)
            flt.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / (2 * N))
            f.append(tf)
            a.append(ta)
        out[keep] = (statistics.median(f), statistics.median(a), statistics.median(flt))
    out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keeps", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    args = ap.parse_args(argv)
    if args.worker:
        print(TAG + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    print(f"conv step (MNIST network), N = {args.layers}, {args.dtype}, batch 50, numba; µs per "
          f"step, medians of {args.repeat}; fresh process per malloc; load "
          f"{os.getloadavg()[0]:.2f}")
    res = {}
    for malloc in ("default", "pinned", "default", "pinned"):  # alternating, two each
        spec = {"layers": args.layers, "dtype": args.dtype, "repeat": args.repeat,
                "keeps": args.keeps, "malloc": malloc}
        run = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                             capture_output=True, text=True, check=True)
        line = next(x for x in run.stdout.splitlines() if x.startswith(TAG))
        res.setdefault(malloc, []).append(json.loads(line[len(TAG):]))
    print(f"{'malloc':<8} {'caches alive K':>14} {'fwd µs/step':>14} {'adj µs/step':>14} "
          f"{'faults/step':>12}")
    for malloc, runs in res.items():
        for keep in args.keeps:
            v = [r[str(keep)] for r in runs]
            f = "-".join(f"{1e6 * x[0]:.0f}" for x in v)
            a = "-".join(f"{1e6 * x[1]:.0f}" for x in v)
            flt = "-".join(f"{x[2]:.0f}" for x in v)
            print(f"{malloc:<8} {keep:>14} {f:>14} {a:>14} {flt:>12}")
        rss = "/".join(f"{r['rss']:.0f}" for r in runs)
        print(f"{malloc:<8} peak RSS MB {rss}")
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
