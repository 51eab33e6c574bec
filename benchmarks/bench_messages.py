"""Messages between MPI ranks, pickled against buffers: α, β, and the training step.

    python benchmarks/bench_messages.py [--repeat 7] [--max-bytes 8388608] [--steps 21]
                                        [--no-gradient] [--no-conv]

Runs itself under ``mpiexec -n 2`` (``python -m mpi4py``, one thread per rank) and prints two
tables; every ratio is formed from timings taken in this one run.

1. Ping-pong. Ranks 0 and 1 send a float64 array of n bytes (8 B, 32 B, … ×4 … 8 MiB) there
   and back; the one-way time is half a round trip, the median of ``--repeat`` trials. Three
   ways to send the same array, taken in turn inside every trial (same load for all three):

   =========  ===================================================================================
   pickled    mpi4py's lower-case ``isend`` / ``recv``: ``pickle.dumps`` on the sender,
              ``pickle.loads`` on the receiver — how ``MPIComm.send_next`` / ``recv_prev`` sent
              arrays before
   buffers    upper-case ``Send`` / ``Recv`` of the array into a preallocated array of the known
              shape: the transport alone, the floor
   MPIComm    ``MPIComm.send_next`` / ``recv_prev`` now (:mod:`refbraid.parallel.mpi`): one
              message of header + raw bytes (one copy on the sender), ``Mprobe``, ``Recv``
   =========  ===================================================================================

   The model of one message is ``t(n) = α + β·n``: α is the one-way time of the smallest
   message, ``β = (t(n_max) − t(n_min)) / (n_max − n_min)`` seconds per byte.

2. Training step (``ShardedTrainer``: the layer-parallel MGRIT gradient + Adam, TorchBraid's
   settings) of benchmarks/bench_mpi.py's dense ResNets (N = 64, 128) and conv network (N = 32),
   with the communicators switched between :class:`PickledComm` (every value pickled, as
   before) and :class:`~refbraid.parallel.mpi.MPIComm` (arrays as buffers) step by step, so
   both see the same load. The table shows median ms per step (slowest rank), the median of
   the paired ratios, and each way's relative gradient error against the single-process
   :func:`~refbraid.layer_parallel.layer_parallel_gradient` (0: bit-identical; checked
   ≤ 1e-12 before anything is timed).

The machine may be shared: rerun before trusting small differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

from refbraid.parallel.mpi import TAG_NEIGHBOUR, MPIComm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("pickled", "buffers", "MPIComm")
#: Bytes moved per size and trial, roughly: sets how many round trips a trial takes.
TRIAL_BYTES = 8 << 20
#: Round trips per trial, at least and at most.
MIN_TRIPS, MAX_TRIPS = 4, 400


class PickledComm(MPIComm):
    """:class:`MPIComm` sending every value pickled, as it did before arrays went as buffers.

    Neighbour messages with mpi4py's lower-case ``isend`` / ``recv``, ``bcast`` pickled,
    ``allreduce_sum`` through a pickled ``allgather`` (the same sums, in the same order)."""

    def send_next(self, value):
        nxt = self._neighbour(+1)
        if nxt is None:
            return
        self._pending[:] = [(r, b) for r, b in self._pending if not r.Test()]
        self._pending.append((self.mpi.isend(value, dest=nxt, tag=TAG_NEIGHBOUR), None))
        self.counters["sends"] += 1

    def recv_prev(self):
        prv = self._neighbour(-1)
        if prv is None:
            return None
        t0 = time.perf_counter()
        value = self.mpi.recv(source=prv, tag=TAG_NEIGHBOUR)
        self.counters["wait_s"] += time.perf_counter() - t0
        self.counters["recvs"] += 1
        return value

    def allreduce_sum(self, value):
        return float(sum(float(v) for v in self.reduce_mpi.allgather(float(value))))

    def bcast(self, value, root=0):
        return self.mpi.bcast(value, root=root)


def _round_trips(world, variant: str, a: np.ndarray, trips: int) -> None:
    """``trips`` round trips of ``a`` between ranks 0 and 1, sent the ``variant`` way."""
    rank = world.Get_rank()
    if rank > 1:
        return
    other = 1 - rank
    if variant == "pickled":
        for _ in range(trips):
            if rank == 0:
                req = world.isend(a, dest=other)
                world.recv(source=other)
                req.wait()
            else:
                b = world.recv(source=other)
                world.isend(b, dest=other).wait()
    elif variant == "buffers":
        b = np.empty_like(a)
        for _ in range(trips):
            if rank == 0:
                world.Send(a, dest=other)
                world.Recv(b, source=other)
            else:
                world.Recv(b, source=other)
                world.Send(b, dest=other)
    else:
        there = MPIComm(world)  # rank 0 → rank 1
        back = there.reverted()  # rank 1 → rank 0
        for _ in range(trips):
            if rank == 0:
                there.send_next(a)
                back.recv_prev()
            else:
                back.send_next(there.recv_prev())
        there.wait_sends()
        back.wait_sends()  # the same list today; separate lists in older versions


def ping_pong(world, sizes: list[int], repeat: int = 7,
              variants: tuple[str, ...] = VARIANTS) -> dict[str, dict[int, float]]:
    """One-way seconds ``{variant: {n_bytes: t}}`` between ranks 0 and 1 (the same on every rank).

    Every trial times each variant in turn (after one untimed round trip); medians over
    ``repeat`` trials. Sizes are rounded to whole float64 elements (8 bytes at least)."""
    times: dict[str, dict[int, list[float]]] = {v: {} for v in variants}
    for n in sizes:
        a = np.random.default_rng(0).standard_normal(max(1, n // 8))
        trips = int(min(MAX_TRIPS, max(MIN_TRIPS, TRIAL_BYTES // max(n, 1))))
        for v in variants:
            _round_trips(world, v, a, 1)  # warm-up: connections, allocations
        for _ in range(repeat):
            for v in variants:
                world.Barrier()
                t0 = time.perf_counter()
                _round_trips(world, v, a, trips)
                times[v].setdefault(n, []).append((time.perf_counter() - t0) / (2 * trips))
    out = {v: {n: statistics.median(ts) for n, ts in by_n.items()} for v, by_n in times.items()}
    return world.bcast(out, root=0)


def alpha_beta(t: dict[int, float]) -> tuple[float, float]:
    """α (seconds) and β (seconds per byte) of ``t(n) = α + β·n``: smallest and largest n."""
    lo, hi = min(t), max(t)
    return t[lo], max(t[hi] - t[lo], 0.0) / (hi - lo)


def print_ping_pong(t: dict[str, dict[int, float]], repeat: int) -> None:
    sizes = sorted(t["buffers"])
    print(f"one-way time per message, µs (ranks 0 ↔ 1, one thread each; median of {repeat} "
          f"trials)")
    print(f"{'bytes':>9} " + " ".join(f"{v:>9}" for v in VARIANTS) + f" {'pickled÷MPIComm':>16}")
    for n in sizes:
        print(f"{n:>9} " + " ".join(f"{1e6 * t[v][n]:9.1f}" for v in VARIANTS)
              + f" {t['pickled'][n] / t['MPIComm'][n]:16.2f}")
    fits = {v: alpha_beta(t[v]) for v in VARIANTS}
    print(f"{'α (µs)':>9} " + " ".join(f"{1e6 * fits[v][0]:9.1f}" for v in VARIANTS))
    print(f"{'β (ns/B)':>9} " + " ".join(f"{1e9 * fits[v][1]:9.3f}" for v in VARIANTS))
    print(f"(α: the {sizes[0]}-byte message; β: slope from {sizes[0]} B to {sizes[-1]} B)")


# ----------------------------------------------------------------------------- training step
CASES = [
    {"model": "resnet", "layers": 64, "width": 32, "batch": 64, "backend": "numpy"},
    {"model": "resnet", "layers": 128, "width": 32, "batch": 64, "backend": "numpy"},
    {"model": "conv", "layers": 32, "batch": 50, "backend": "numba"},
]


def _use(comms, cls) -> None:
    """Switch the communicators' class: same state, the other way of sending."""
    for c in comms:
        c.wait_sends()
        c.__class__ = cls


def time_step(world, case: dict, steps: int) -> dict:
    """Median seconds per training step with pickled and buffer communicators, interleaved."""
    from bench_mpi import _data, _network

    from refbraid.backends import get_backend
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.layer_parallel import (
        LayerParallelSettings,
        layer_parallel_gradient,
        relative_gradient_error,
    )
    from refbraid.network import init_params
    from refbraid.training.optim import make_optimizer

    net = _network(case)
    params = init_params(net, 0, np.dtype("float64"))
    x, y = _data(net, case["batch"])
    bk = get_backend(case["backend"])
    grad = distributed_gradient(net, LayerParallelSettings(), bk)
    comms = [grad.topo.world, grad.topo.layer, grad.topo.data]
    _, g_one, _ = layer_parallel_gradient(net, params, x, y, LayerParallelSettings(), bk)
    errors = {}
    for cls in (PickledComm, MPIComm):  # both against one process, before anything is timed
        _use(comms, cls)
        errors[cls] = relative_gradient_error(grad(params, x, y)[1], g_one)
        if errors[cls] > 1e-12:
            raise RuntimeError(f"{cls.__name__}: gradient error {errors[cls]:.1e} vs one "
                               f"process in {case}")
    trainer = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
    times: dict[type, list[float]] = {PickledComm: [], MPIComm: []}
    for k in range(steps + 1):
        order = (PickledComm, MPIComm) if k % 2 == 0 else (MPIComm, PickledComm)
        for cls in order:
            _use(comms, cls)
            world.Barrier()
            t0 = time.perf_counter()
            trainer.step(x, y)
            dt = world.allreduce(time.perf_counter() - t0, op=_mpi().MAX)
            if k > 0:  # step 0 warms up
                times[cls].append(dt)
    _use(comms, MPIComm)
    ratios = [a / b for a, b in zip(times[PickledComm], times[MPIComm], strict=True)]
    return {"pickled": statistics.median(times[PickledComm]),
            "buffers": statistics.median(times[MPIComm]), "ratio": statistics.median(ratios),
            "err_pickled": errors[PickledComm], "err_buffers": errors[MPIComm]}


def _mpi():
    from mpi4py import MPI

    return MPI


def worker(repeat: int, max_bytes: int, steps: int, gradient: bool, conv: bool) -> None:
    world = _mpi().COMM_WORLD
    sizes = [8 * 4**k for k in range(16) if 8 * 4**k <= max_bytes]
    t = ping_pong(world, sizes, repeat)
    root = world.Get_rank() == 0
    if root:
        print_ping_pong(t, repeat)
    if not gradient:
        return
    if root:
        print(f"\ntraining step (layer-parallel gradient + Adam) on {world.Get_size()} ranks, ms "
              f"per batch; pickled and buffer steps interleaved, median of {steps} each")
        print(f"{'model':>6} {'N':>5} {'pickled':>9} {'buffers':>9} {'pickled÷buffers':>16} "
              f"{'err pickled':>12} {'err buffers':>12}")
    for case in CASES:
        if case["model"] == "conv" and not conv:
            continue
        r = time_step(world, case, steps)
        if root:
            print(f"{case['model']:>6} {case['layers']:>5} {1e3 * r['pickled']:9.1f} "
                  f"{1e3 * r['buffers']:9.1f} {r['ratio']:16.3f} {r['err_pickled']:12.1e} "
                  f"{r['err_buffers']:12.1e}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=7, help="ping-pong trials per size (median)")
    ap.add_argument("--max-bytes", type=int, default=8 << 20, help="largest message, bytes")
    ap.add_argument("--steps", type=int, default=21, help="timed training steps per way")
    ap.add_argument("--no-gradient", action="store_true", help="only the ping-pong table")
    ap.add_argument("--no-conv", action="store_true", help="skip the conv network (Numba)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for the mpiexec launch")
    args = ap.parse_args(argv)
    for name in ("repeat", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"`--{name}` must be at least 1, got {getattr(args, name)}.")
    if args.max_bytes < 32:
        ap.error(f"`--max-bytes` must be at least 32 (two sizes for β), got {args.max_bytes}.")
    if args.worker:
        worker(args.repeat, args.max_bytes, args.steps, not args.no_gradient, not args.no_conv)
        return 0
    from refbraid.parallel.launch import run_mpi

    flags = ["--repeat", str(args.repeat), "--max-bytes", str(args.max_bytes), "--steps",
             str(args.steps)] + ["--no-gradient"] * args.no_gradient + ["--no-conv"] * args.no_conv
    run = run_mpi(2, [str(Path(__file__).resolve()), "--worker", *flags], timeout=args.timeout,
                  cwd=ROOT).check()
    print(run.output.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
