"""Which parallelism, when? Data (D), space (S), depth (Q) and their combinations, measured here
(up to 4 ranks) and predicted (up to 1,024), and DASO against synchronous data parallelism.

    python benchmarks/bench_parallelisms.py [--quick] [--repeat 5] [--no-daso]

One network and batch: the ``conv`` model (Conv2d(1→C) lift, N conv ODE steps, a dense
classifier) on random H×W images, batch B, float64, NumPy kernels; depth runs TorchBraid's
MGRIT settings (3 levels, cfactor 4, 2 forward / 1 adjoint cycles), data and space alone run
the exact sequential solve. One training step = gradient + Adam on replicated parameters
(:func:`refbraid.distributed.space.space_depth_gradient` for every split, so the same code
runs each combination). Timings: median of ``--repeat`` steps after a warm-up, the slowest rank's.

Tables:

1. measured seconds per step for every split D·S·Q ≤ 4, next to the prediction of
   :mod:`refbraid.scaling.parallelisms` (calibrated in this run), with bytes per rank;
2. predicted fastest split, and the best of each single axis, for P = 1 … 1,024;
3. DASO (``refbraid train --dp-groups 2 --global-sync-every 8`` on 4 ranks, digits, ResNet,
   sequential backprop) against synchronous data parallelism: validation accuracy after the
   same epochs (several seeds), time per epoch here, bytes per rank per step (intra/inter);
4. DASO against plain data parallelism on a described cluster (:class:`Cluster`), for this
   network and for an assumed 25M-parameter model.

The machine is shared: the load is printed; rerun before trusting small differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "BENCH "
ROOT = Path(__file__).resolve().parents[1]
SPLITS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 1, 1), (1, 4, 1), (1, 1, 4),
          (2, 2, 1), (2, 1, 2), (1, 2, 2)]


def _problem(quick: bool):
    from refbraid.network import init_params
    from refbraid.training.models import build_network

    H, C, N, B = (8, 4, 64, 16) if quick else (16, 4, 64, 32)
    net = build_network("conv", (1, H, H), 10, N, C, 1.0, "relu")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((B, 1, H, H)), rng.integers(0, 10, B)
    return net, init_params(net, 0), x, y


def _settings(q: int):
    from refbraid.layer_parallel import LayerParallelSettings

    return LayerParallelSettings() if q > 1 else LayerParallelSettings.exact()


def worker(spec: dict) -> None:
    """Under mpiexec -n P: time every split with D·S·Q = P; rank 0 prints one JSON per split."""
    from mpi4py import MPI

    from refbraid.distributed.space import space_depth_gradient
    from refbraid.errors import CollectiveError
    from refbraid.training.optim import make_optimizer

    world = MPI.COMM_WORLD
    P = world.Get_size()
    net, params, x, y = _problem(spec["quick"])
    if P > 1:  # one halo exchange, forward + adjoint (4 messages), on this world
        from refbraid.parallel.mpi import MPIComm
        from refbraid.space import RowSplit, SpatialHalo

        comm = MPIComm.world()
        halo = SpatialHalo(comm)
        rows = RowSplit.even(net.step.height, P).counts[comm.rank]
        block = np.ones((x.shape[0], net.step.channels, rows, net.step.width))
        cot = np.ones((x.shape[0], net.step.channels, rows + 2, net.step.width))
        times = []
        for _ in range(30):
            world.Barrier()
            t0 = time.perf_counter()
            halo.forward(block)
            halo.adjoint(cot)
            times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if world.Get_rank() == 0:
            print(TAG + json.dumps({"halo_P": P, "s": statistics.median(times)}), flush=True)
    for d, s, q in [t for t in SPLITS if t[0] * t[1] * t[2] == P]:
        try:
            grad = space_depth_gradient(net, _settings(q), data_parallel=d, space_parallel=s)
        except CollectiveError:  # e.g. more layer ranks than coarsest intervals
            continue
        p = {k: v.copy() for k, v in params.items()}
        opt = make_optimizer("adam", 1e-3)

        def step(grad=grad, p=p, opt=opt):
            _, g, _ = grad(p, x, y)
            opt.step(p, g)

        step()
        times = []
        for _ in range(spec["repeat"]):
            world.Barrier()
            t0 = time.perf_counter()
            step()
            times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if world.Get_rank() == 0:
            print(TAG + json.dumps({"split": [d, s, q], "s": statistics.median(times)}),
                  flush=True)


def _launch(n: int, spec: dict, timeout: float = 600) -> list[dict]:
    from refbraid.parallel.launch import run_mpi

    run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                  timeout=timeout, cwd=ROOT).check()
    return [json.loads(line[len(TAG):]) for line in run.output.splitlines()
            if line.startswith(TAG)]


def _machine(quick: bool):
    from refbraid.backends import get_backend
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.scaling.predict import calibrate_network
    from refbraid.training.optim import make_optimizer

    net, params, x, y = _problem(quick)
    m = calibrate_network(net, params, x, y, LayerParallelSettings(), get_backend("numpy"),
                          optimizer=lambda: make_optimizer("adam", 1e-3), max_ranks=1024)
    row_bytes = x.shape[0] * net.step.channels * net.step.width * 8
    return net, m, row_bytes


def _name(d, s, q):
    return "×".join(f"{n}{v}" for n, v in (("D", d), ("S", s), ("Q", q)) if v > 1) or "serial"


def measured_table(args, net, m, row_bytes) -> list[str]:
    from refbraid.scaling.parallelisms import predict_split

    spec = {"quick": args.quick, "repeat": args.repeat}
    got = {}
    halos = {}
    for n in (1, 2, 4):
        for r in _launch(n, spec):
            if "halo_P" in r:
                halos[r["halo_P"]] = r["s"]
            else:
                got[tuple(r["split"])] = r["s"]
    serial = got[(1, 1, 1)]
    lines = [f"{'split':>9} {'P':>2} {'measured ms':>12} {'× serial':>9} {'predicted ms':>13} "
             f"{'KB/rank':>8}"]
    lines.append("-" * len(lines[0]))
    for d, s, q in SPLITS:
        if (d, s, q) not in got:
            continue
        pred = predict_split(m, d, s, q, net.step.height, row_bytes)
        pms = "-" if pred is None else f"{1e3 * pred.seconds:13.1f}"
        kb = "-" if pred is None else f"{pred.bytes_per_rank / 1e3:8.1f}"
        t = got[(d, s, q)]
        lines.append(f"{_name(d, s, q):>9} {d * s * q:2d} {1e3 * t:12.1f} {serial / t:9.2f} "
                     f"{pms:>13} {kb:>8}")
    model = 4 * (m.alpha + row_bytes * m.beta)
    for n, t in sorted(halos.items()):
        lines.append(f"one halo exchange (forward + adjoint, 4 messages of {row_bytes / 1e3:.1f}"
                     f" KB) on {n} ranks: {1e6 * t:.0f} µs measured, {1e6 * model:.0f} µs model"
                     f" 4(α + r·β); per training step ×{net.n_layers}")
    return lines


def predicted_table(net, m, row_bytes) -> list[str]:
    from refbraid.scaling.parallelisms import all_splits

    t0 = m.serial[max(m.serial)]
    lines = [f"{'P':>5} {'data ms':>9} {'space ms':>9} {'depth ms':>9} {'best ms':>9} "
             f"{'best':>12} {'× serial':>9} {'best KB/rank':>13}"]
    lines.append("-" * len(lines[0]))
    p = 1
    while p <= 1024:
        rows = all_splits(m, p, net.step.height, row_bytes)

        def pure(axis, rows=rows, p=p):
            hit = [r for r in rows if getattr(r, axis) == p]
            return f"{1e3 * hit[0].seconds:9.1f}" if hit else f"{'-':>9}"

        if not rows:  # more ranks than data × space × depth can use
            lines.append(f"{p:5d} {'-':>9} {'-':>9} {'-':>9} {'-':>9} {'none':>12}")
            p *= 2
            continue
        best = rows[0]
        lines.append(f"{p:5d} {pure('data')} {pure('space')} {pure('depth')} "
                     f"{1e3 * best.seconds:9.1f} {best.name:>12} {t0 / best.seconds:9.2f} "
                     f"{best.bytes_per_rank / 1e3:13.1f}")
        p *= 2
    return lines


def _train(out: Path, seed: int, epochs: int, extra: list[str]) -> dict:
    from refbraid.parallel.launch import run_mpi

    flags = ["-m", "refbraid", "train", "--data", "digits", "--serial", "--data-parallel", "4",
             "--epochs", str(epochs), "--seed", str(seed), "--quiet", "--out", str(out), *extra]
    run_mpi(4, flags, timeout=600, cwd=ROOT).check()
    return json.loads((out / "log.json").read_text())


def daso_measured(args) -> list[str]:
    epochs = 6 if args.quick else 10
    seeds = [0] if args.quick else [0, 1, 2]
    modes = {"synchronous": [],
             "DASO G=2 k=8": ["--dp-groups", "2", "--global-sync-every", "8"]}
    lines = [f"digits, ResNet (64 layers, width 16), batch 64, Adam, {epochs} epochs, "
             f"4 ranks (2 nodes of 2 for DASO), seeds {seeds}",
             f"{'mode':>14} {'val acc % (per seed)':>24} {'mean':>6} {'s/epoch':>8} "
             f"{'intra KB/step':>14} {'inter KB/step':>14}"]
    lines.append("-" * len(lines[-1]))
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in modes.items():
            accs, times, intra, inter = [], [], [], []
            for seed in seeds:
                log = _train(Path(tmp) / f"{len(extra)}-{seed}", seed, epochs, extra)
                accs.append(100 * log["history"][-1]["val_acc"])
                times += [h["time_s"] for h in log["history"]]
                st = [h["stats"] for h in log["history"]]
                intra += [s.get("bytes_intra", np.nan) for s in st]
                inter += [s.get("bytes_inter", np.nan) for s in st]
            if not extra:  # plain DP logs no bytes: the ring model, 2(P−1)/P·n, half inter
                n = _resnet_grad_bytes()
                intra = inter = [2 * 3 / 4 * n / 2]
            lines.append(f"{name:>14} {' '.join(f'{a:5.1f}' for a in accs):>24} "
                         f"{np.mean(accs):6.1f} {statistics.median(times):8.2f} "
                         f"{np.mean(intra) / 1e3:14.2f} {np.mean(inter) / 1e3:14.2f}")
    return lines


def _resnet_grad_bytes() -> int:
    from refbraid.network import init_params
    from refbraid.training.models import build_network

    net = build_network("resnet", (64,), 10, 64, 16, 3.0, "tanh")
    return sum(v.nbytes for v in init_params(net, 0).values())


def daso_predicted(m) -> list[str]:
    from refbraid.scaling.parallelisms import Cluster, daso_bytes, daso_step, plain_dp_step

    cl = Cluster()
    cases = {"this conv net, 8 samples/rank": (m.serial.get(8, m.serial[min(m.serial)]),
                                               m.grad_bytes),
             "25M params (100 MB), 0.25 s compute/step (assumed)": (0.25, 100e6)}
    lines = [f"cluster: {cl.describe()}; weak scaling (fixed batch per rank); DASO cycling "
             "phase, k = 8 with w = 2 (overlapped) and blocking"]
    for title, (c, n) in cases.items():
        lines += ["", title,
                  f"{'P':>5} {'plain ms':>9} {'DASO ms':>9} {'blocking':>9} {'saved %':>8} "
                  f"{'plain inter MB':>15} {'DASO inter MB':>14}"]
        lines.append("-" * len(lines[-1]))
        p = 8
        while p <= 1024:
            plain = plain_dp_step(c, n, p, cl)
            daso = daso_step(c, n, p, cl, every=8, wait=2)
            block = daso_step(c, n, p, cl, every=8, wait=0)
            G = p // cl.per_node
            plain_inter = 2 * (p - 1) / p * n * (G / p)
            _, inter = daso_bytes(n, p, cl.per_node, 8)
            lines.append(f"{p:5d} {1e3 * plain:9.2f} {1e3 * daso:9.2f} {1e3 * block:9.2f} "
                         f"{100 * (1 - daso / plain):8.1f} {plain_inter / 1e6:15.3f} "
                         f"{inter / 1e6:14.3f}")
            p *= 4
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller network, fewer runs")
    ap.add_argument("--repeat", type=int, default=5, help="timed steps per split (median)")
    ap.add_argument("--no-daso", action="store_true", help="skip the DASO training runs")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average) on {os.cpu_count()} cores")
    net, m, row_bytes = _machine(args.quick)
    print(f"network: conv, {net.n_layers} layers, {net.step.channels} channels, "
          f"{net.step.height}×{net.step.width} images, batch {m.batch}; gradient "
          f"{m.grad_bytes / 1e3:.1f} KB; α = {m.alpha * 1e6:.2f} µs, β = "
          f"{m.beta * 1e9:.3f} ns/B ({m.source.get('messages')})\n")
    print("1. measured here vs predicted, seconds per training step (gradient + Adam)")
    print("\n".join(measured_table(args, net, m, row_bytes)))
    print("\n2. predicted (α, β of this machine), fastest split per rank count")
    print("\n".join(predicted_table(net, m, row_bytes)))
    if not args.no_daso:
        print("\n3. DASO vs synchronous data parallelism, measured here")
        print("\n".join(daso_measured(args)))
    print("\n4. DASO vs plain data parallelism, predicted on a described cluster")
    print("\n".join(daso_predicted(m)))
    print(f"\nload at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
