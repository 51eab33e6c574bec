"""Per-batch training time: serial sequential training vs layer-parallel MPI ranks, with a model.

    python benchmarks/bench_mpi.py [--quick] [--ranks 2] [--repeat 5] [--no-conv] [--no-torch]
        [--settings torchbraid|2level|fast|fast-2level] [--default-malloc] [--same-process]

Runs itself under ``mpiexec -n 1`` and ``mpiexec -n P`` (``python -m mpi4py``, one thread per
rank) and prints the tables; every ratio is formed from timings taken in this one run.

Every case runs in a fresh ``mpiexec`` (its own processes) with glibc malloc's thresholds
pinned (:func:`refbraid.runtime.pin_allocator`), so a case's time does not depend on what ran
before it (docs/scaling_overhead.md §5). ``--same-process`` and ``--default-malloc`` bring
back the old way, to show that effect. ``--settings`` picks the MGRIT settings of the
layer-parallel runs (:func:`named_settings`).

Dense ResNets (``resnet`` model, width C, batch B, N = 64 … 1024 layers). One training step:
sequential backprop + Adam (``serial``) against the sharded layer-parallel step
(:class:`refbraid.distributed.network.ShardedTrainer`: MGRIT forward and adjoint solves with
TorchBraid's settings — 3 levels, cfactor 4, 2 forward / 1 backward iterations — gradient
rows, local Adam) on 1 rank and on P ranks; and data parallelism over the same P ranks (D = P
groups, one MGRIT level: sequential substitution per group, gradients summed).

The model (docs/references.md §4), built from quantities measured in this run:

* unit costs of one network step: c_f (forward Φ), c_bc (coarse adjoint step: forward
  recomputed + transposed step), c_bg (fine adjoint step with its weight gradient, forward
  cache reused); an overhead o per Φ call (MGRIT bookkeeping, block copies, optimizer) fitted
  so that the 1-rank run is reproduced: ``o = (T_1 − W_1) / calls_1``;
* per rank q, its counted Φ calls per level and messages: work outside the coarsest level
  ``W_q``, coarsest-level work ``C_q`` (a pipeline through the ranks: it adds up);
* ``T_P ≈ max_q (W_q + o·calls_q) + Σ_q (C_q + o·calls^C_q) + max_q msgs_q · t_msg`` with
  t_msg the one-way time of one state-sized ``send_next`` message, α + n·β of the ``MPIComm``
  ping-pong in this run (benchmarks/bench_messages.py);
* larger P: ``T_P ≈ (T_1 − C_1)/P + C_1 + msgs · t_msg`` (same counts, evenly split);
* data parallelism, ring allreduce of n gradient bytes on p ranks:
  ``T ≈ T_1(B/p) + 2(p−1)·α + 2(p−1)/p · n·β`` (α latency, β seconds per byte, from a
  ping-pong of preallocated buffers in this run).

TorchBraid's MNIST network (``conv`` model: open Conv2d(1→4, 3×3)+ReLU, N steps
``x + h·ReLU(Conv2d(4→4, 3×3)(x))``, close Linear(4·28·28 → 10); batch 50; N = 32 and 128;
same MGRIT settings) on random 28×28 inputs, against PyTorch serial with 1 thread (forward,
backward, Adam) in float64 and in float32 (PyTorch's default), when torch is importable.

Timings are medians of ``--repeat`` steps after one warm-up step; a step's time is the
slowest rank's. The machine is shared: rerun before trusting small differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

TAG = "BENCH "
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("torchbraid", "2level", "fast", "fast-2level")


def named_settings(name: str):
    """The layer-parallel MGRIT settings called ``name`` (docs/scaling_overhead.md §6).

    torchbraid   TorchBraid's examples: 3 levels, cfactor 4, F / FCF, skipped first down-cycle,
                 2 forward iterations (skip + 1 cycle) and 1 adjoint (the skipped cycle)
    2level       2 levels, cfactor 16, F, TorchBraid's iterations (2 forward / 1 adjoint): the
                 same gradient error as torchbraid at ≈ 0.76× its ideal 2-rank path
    fast         torchbraid with 1 forward iteration (the skipped cycle only)
    fast-2level  2 levels, cfactor 16, 1 forward and 1 adjoint iteration
    """
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.mgrit import MGRITSettings

    def iterations(levels: int, cfactor: int, forward: int) -> LayerParallelSettings:
        def mg(max_iter):
            return MGRITSettings.torchbraid(levels=levels, cfactor=cfactor, max_iter=max_iter)

        return LayerParallelSettings(forward=mg(forward), backward=mg(0))

    table = {"torchbraid": LayerParallelSettings, "2level": lambda: iterations(2, 16, 1),
             "fast": lambda: iterations(3, 4, 0), "fast-2level": lambda: iterations(2, 16, 0)}
    if name not in table:
        raise ValueError(f"`--settings` must be one of {', '.join(table)}, got {name!r}.")
    return table[name]()


def prepare_worker() -> None:
    """First thing in every worker: pin malloc's thresholds (unless REFBRAID_PIN_ALLOCATOR=0)."""
    from refbraid.runtime import pin_allocator

    pin_allocator()


# ----------------------------------------------------------------------------- cases
def _network(case):
    from refbraid.training.models import build_network

    if case["model"] == "resnet":
        C = case["width"]
        return build_network("resnet", (C,), 10, case["layers"], C, 3.0, "tanh")
    return build_network("conv", (1, 28, 28), 10, case["layers"], 4, 1.0, "relu")


def _data(net, batch, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *net.opening.in_shape))
    return x, rng.integers(0, net.closing.out_shape[0], batch)


def _median_step(step, repeat, comm=None):
    """Median over ``repeat`` calls (after a warm-up) of the slowest rank's time, seconds."""
    step()
    times = []
    for _ in range(repeat):
        if comm is not None:
            comm.Barrier()
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        if comm is not None:
            from mpi4py import MPI

            dt = comm.allreduce(dt, op=MPI.MAX)
        times.append(dt)
    return statistics.median(times)


def _median_call(f, repeat=15):
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _unit_costs(net, params, x, bk):
    """c_f, c_bc, c_bg, c_serial (seconds) of one step at batch x.shape[0]."""
    from refbraid.network import group, layer_params

    theta = layer_params(group(params, "steps"), 0)
    y = np.random.default_rng(1).standard_normal((x.shape[0], *net.step.state_shape))
    y = y.astype(params["steps.W"].dtype)
    h = net.h
    _, cache = net.step.forward(theta, y, h, bk)
    c_f = _median_call(lambda: net.step.forward(theta, y, h, bk))

    def coarse():
        _, c = net.step.forward(theta, y, 4 * h, bk)
        net.step.adjoint(theta, c, y, 4 * h, bk, grads=False)

    c_bc = _median_call(coarse)
    c_bg = _median_call(lambda: net.step.adjoint(theta, cache, y, h, bk, grads=True))
    return {"c_f": c_f, "c_bc": c_bc, "c_bg": c_bg}


# ----------------------------------------------------------------------------- the worker
def worker(spec: dict) -> None:
    """Runs under mpiexec: times every case on this world, rank 0 prints one JSON per case."""
    from mpi4py import MPI

    from refbraid.backends import get_backend
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.network import backprop, init_params
    from refbraid.training.optim import make_optimizer

    prepare_worker()
    world = MPI.COMM_WORLD
    P, repeat = world.Get_size(), spec["repeat"]
    settings = named_settings(spec.get("settings", "torchbraid"))
    out_meta = {"ranks": P, "levels": settings.forward.levels}
    if P > 1:
        out_meta.update(_ping_pong(world))
    for case in spec["cases"]:
        net = _network(case)
        bk = get_backend(case["backend"])
        params = init_params(net, 0, np.dtype(case["dtype"]))
        x, y = _data(net, case["batch"])
        x = x.astype(case["dtype"])
        res = {"case": case, **out_meta}
        if P == 1:
            p_serial = {k: v.copy() for k, v in params.items()}
            opt = make_optimizer("adam", 1e-4)

            def serial(p_serial=p_serial, opt=opt, net=net, x=x, y=y, bk=bk):
                _, g, _ = backprop(net, p_serial, x, y, bk)
                opt.step(p_serial, g)

            res["serial_s"] = _median_step(serial, repeat)
            res.update(_unit_costs(net, params, x, bk))
            res["grad_bytes"] = int(sum(v.nbytes for v in params.values()))
            res["state_bytes"] = int(x.shape[0] * np.prod(net.step.state_shape) * x.itemsize)
        if case.get("dp_groups"):
            D = case["dp_groups"]
            xs, ys = (x, y) if P > 1 else (x[: x.shape[0] // D], y[: x.shape[0] // D])
            grad = distributed_gradient(net, LayerParallelSettings.exact(), bk,
                                        data_parallel=P)
            tr = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
            res["dp_s"] = _median_step(lambda tr=tr, xs=xs, ys=ys: tr.step(xs, ys), repeat,
                                       world)
        grad = distributed_gradient(net, settings, bk)
        tr = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
        comm = grad.topo.layer
        res["lp_s"] = _median_step(lambda tr=tr, x=x, y=y: tr.step(x, y), repeat, world)
        sends0 = comm.counters["sends"]
        tr.step(x, y)  # one more, to read its counts
        solves = grad.last_solves
        mine = {
            "fwd": list(solves["forward"].step_counts),
            "bwd": list(solves["backward"].step_counts),
            "recomputed": solves["recomputed"],
            "sends": comm.counters["sends"] - sends0,
        }
        res["per_rank"] = world.gather(mine, root=0)
        if world.Get_rank() == 0:
            print(TAG + json.dumps(res), flush=True)


def _ping_pong(world) -> dict:
    """α (s) and β (s/byte) of one message between ranks 0 and 1 (8 B and 1 MiB), three ways.

    benchmarks/bench_messages.py has the full table: ``buffers`` (upper-case Send/Recv into a
    preallocated array: the transport, and how ``sum_to_all`` moves gradients), ``pickled``
    (lower-case isend/recv: how ``send_next`` sent arrays before) and ``MPIComm``
    (``send_next``/``recv_prev`` now: header + raw bytes)."""
    from bench_messages import alpha_beta, ping_pong

    t = ping_pong(world, [8, 1 << 20], repeat=5)
    fits = {v: alpha_beta(t[v]) for v in t}
    return {"alpha": fits["buffers"][0], "beta": fits["buffers"][1], "ping_pong": fits}


# ----------------------------------------------------------------------------- the model
def _counts(r, L):
    fwd, bwd = r["fwd"], r["bwd"]
    return {
        "fine_fwd": sum(fwd[: L - 1]),
        "coarsest": fwd[L - 1] + bwd[L - 1],
        "bwd_fine": bwd[0],
        "bwd_coarse": sum(bwd[1 : L - 1]),
        "calls": sum(fwd) + sum(bwd),
        "coarsest_bwd": bwd[L - 1],
        "coarsest_fwd": fwd[L - 1],
    }


def _work(c, u):
    """Seconds of kernel work outside the coarsest level, and on it."""
    w = c["fine_fwd"] * u["c_f"] + c["bwd_fine"] * u["c_bg"] + c["bwd_coarse"] * u["c_bc"]
    w_c = c["coarsest_fwd"] * u["c_f"] + c["coarsest_bwd"] * u["c_bc"]
    return w, w_c


def model(one: dict, many: dict) -> dict:
    """Predicted per-batch times (see the module docstring) from the 1-rank and P-rank runs."""
    L = one.get("levels", 3)
    u = {k: one[k] for k in ("c_f", "c_bc", "c_bg")}
    c1 = _counts(one["per_rank"][0], L)
    w1, wc1 = _work(c1, u)
    recomputed1 = one["per_rank"][0]["recomputed"] * u["c_f"]
    o = max(one["lp_s"] - w1 - wc1 - recomputed1, 0.0) / c1["calls"]
    alpha, beta = many.get("ping_pong", {}).get("MPIComm", (0.0, 0.0))  # send_next's way
    t_msg = alpha + one["state_bytes"] * beta
    busy, pipe, msgs = [], 0.0, 0
    for r in many["per_rank"]:
        c = _counts(r, L)
        w, wc = _work(c, u)
        busy.append(w + r["recomputed"] * u["c_f"] + o * (c["calls"] - c["coarsest"]))
        pipe += wc + o * c["coarsest"]
        msgs = max(msgs, r["sends"])
    t_p = max(busy) + pipe + msgs * t_msg
    coarsest_1 = wc1 + o * c1["coarsest"]

    def at(p):
        return (one["lp_s"] - coarsest_1) / p + coarsest_1 + msgs * t_msg

    return {"lp": t_p, "o": o, "t_msg": t_msg, "at": at}


def ring_allreduce(n_bytes: float, p: int, alpha: float, beta: float) -> float:
    """T ≈ 2(p−1)·α + 2(p−1)/p · n·β (docs/references.md §4)."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


# ----------------------------------------------------------------------------- the driver
def _launch(n: int, cases: list[dict], repeat: int, timeout: float, settings: str = "torchbraid",
            fresh: bool = True, pinned: bool = True) -> list[dict]:
    """One ``mpiexec -n n`` per case (``fresh``), or one for all cases (the old way)."""
    from refbraid.parallel.launch import run_mpi
    from refbraid.runtime import OPT_OUT_ENV

    env = None if pinned else {OPT_OUT_ENV: "0"}
    out = []
    for batch in ([[c] for c in cases] if fresh else [cases]):
        spec = json.dumps({"cases": batch, "repeat": repeat, "settings": settings})
        run = run_mpi(n, [str(Path(__file__).resolve()), "--worker", spec], timeout=timeout,
                      cwd=ROOT, env=env).check()
        out += [json.loads(line[len(TAG):]) for line in run.output.splitlines()
                if line.startswith(TAG)]
    return out


def _torch_times(layers: int, batch: int, repeat: int) -> dict[str, float]:
    """PyTorch serial (1 thread) training step of the same conv network, float64 and float32."""
    import torch

    torch.set_num_threads(1)
    out = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        torch.manual_seed(0)
        opening = torch.nn.Conv2d(1, 4, 3, padding=1).to(dtype)
        steps = torch.nn.ModuleList(torch.nn.Conv2d(4, 4, 3, padding=1).to(dtype)
                                    for _ in range(layers))
        closing = torch.nn.Linear(4 * 28 * 28, 10).to(dtype)
        h = 1.0 / layers
        modules = torch.nn.ModuleList([opening, steps, closing])
        opt = torch.optim.Adam(modules.parameters(), lr=1e-4)
        x = torch.randn(batch, 1, 28, 28, dtype=dtype)
        y = torch.randint(0, 10, (batch,))

        def step(opening=opening, steps=steps, closing=closing, opt=opt, x=x, y=y, h=h):
            opt.zero_grad()
            z = torch.relu(opening(x))
            for conv in steps:
                z = z + h * torch.relu(conv(z))
            loss = torch.nn.functional.cross_entropy(closing(z.flatten(1)), y)
            loss.backward()
            opt.step()

        out[name] = _median_step(step, repeat)
    return out


def _fmt_ms(s: float) -> str:
    return f"{1e3 * s:9.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="N = 64, 128 only, no conv network")
    ap.add_argument("--ranks", type=int, default=2, help="ranks P of the parallel runs")
    ap.add_argument("--repeat", type=int, default=5, help="timed steps per case (median)")
    ap.add_argument("--width", type=int, default=32, help="dense width C")
    ap.add_argument("--batch", type=int, default=64, help="dense batch B")
    ap.add_argument("--layers", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--backend", default="numpy", help="kernels of the dense runs")
    ap.add_argument("--conv-layers", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--conv-backend", default="numba", help="kernels of the conv runs")
    ap.add_argument("--conv-dtype", default="float64", choices=("float64", "float32"),
                    help="refbraid's dtype in the conv runs (PyTorch runs both)")
    ap.add_argument("--no-conv", action="store_true", help="skip TorchBraid's conv network")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec launch")
    ap.add_argument("--settings", default="torchbraid", choices=SETTINGS,
                    help="MGRIT settings of the layer-parallel runs (default: TorchBraid's)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc malloc's thresholds dynamic (REFBRAID_PIN_ALLOCATOR=0)")
    ap.add_argument("--same-process", action="store_true",
                    help="all cases in one mpiexec (the old way: times depend on the order)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.ranks < 2:
        ap.error(f"`--ranks` must be at least 2, got {args.ranks}.")
    layers = [64, 128] if args.quick else args.layers
    P = args.ranks
    dense = [{"model": "resnet", "layers": n, "width": args.width, "batch": args.batch,
              "backend": args.backend, "dtype": "float64", "dp_groups": P} for n in layers]
    conv = [] if (args.quick or args.no_conv) else [
        {"model": "conv", "layers": n, "batch": 50, "backend": args.conv_backend,
         "dtype": args.conv_dtype} for n in args.conv_layers]
    cases = dense + conv
    how = dict(settings=args.settings, fresh=not args.same_process,
               pinned=not args.default_malloc)
    load0 = os.getloadavg()[0]
    one = _launch(1, cases, args.repeat, args.timeout, **how)
    many = _launch(P, cases, args.repeat, args.timeout, **how)
    s = named_settings(args.settings)
    print(f"P = {P} ranks, one thread each; MGRIT ({args.settings}): {s.forward.levels} levels, "
          f"cfactor {s.forward.cfactor}, {s.forward.max_iter + 1} forward / "
          f"{s.backward.max_iter + 1} backward iterations (counting the skipped first "
          f"down-cycle); median of {args.repeat} steps; ms per batch")
    print(f"{'one mpiexec per case' if how['fresh'] else 'all cases in one mpiexec'}; malloc "
          f"{'pinned (refbraid.runtime)' if how['pinned'] else 'glibc default'}; load "
          f"{load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    a, b = many[0].get("alpha", 0.0), many[0].get("beta", 0.0)
    notes = {"buffers": "Send/Recv, preallocated: the ring model's",
             "pickled": "isend/recv: send_next before",
             "MPIComm": "send_next now: the model's t_msg"}
    for v, (av, bv) in many[0]["ping_pong"].items():
        print(f"messages, {v:<8} α = {1e6 * av:5.1f} µs, β = {1e9 * bv:6.3f} ns/byte "
              f"(ping-pong, {notes[v]})")
    print()
    print(f"Dense ResNet, width {args.width}, batch {args.batch}, backend {args.backend}")
    head = (f"{'N':>5} {'serial':>9} {'1 rank':>9} {f'{P} ranks':>9} {'speedup':>8} "
            f"{'model':>6} {'P=4 mdl':>8} {'P=8 mdl':>8} | {f'DP D={P}':>9} {'speedup':>8} "
            f"{'ring mdl':>8}")
    print(head)
    crossover = None
    for o, m in zip(one[: len(dense)], many[: len(dense)], strict=True):
        md = model(o, m)
        s = o["serial_s"]
        sp = s / m["lp_s"]
        if crossover is None and sp >= 1.0:
            crossover = o["case"]["layers"]
        dp_model = o["dp_s"] + ring_allreduce(o["grad_bytes"], P, a, b)
        print(f"{o['case']['layers']:>5} {_fmt_ms(s)} {_fmt_ms(o['lp_s'])} {_fmt_ms(m['lp_s'])} "
              f"{sp:8.2f} {s / md['lp']:6.2f} {s / md['at'](4):8.2f} {s / md['at'](8):8.2f} | "
              f"{_fmt_ms(m['dp_s'])} {s / m['dp_s']:8.2f} {s / dp_model:8.2f}")
    last = model(one[len(dense) - 1], many[len(dense) - 1])
    print(f"crossover depth (measured speedup ≥ 1 on {P} ranks): "
          f"{crossover if crossover else f'none up to N = {layers[-1]}'}")
    print(f"unit costs at N = {layers[-1]}: c_f {1e6 * one[len(dense) - 1]['c_f']:.1f} µs, "
          f"c_bc {1e6 * one[len(dense) - 1]['c_bc']:.1f} µs, c_bg "
          f"{1e6 * one[len(dense) - 1]['c_bg']:.1f} µs, overhead o {1e6 * last['o']:.1f} µs "
          f"per Φ call, t_msg {1e6 * last['t_msg']:.1f} µs")
    if conv:
        print(f"\nTorchBraid's MNIST network (conv, batch 50), backend {args.conv_backend}, "
              f"{args.conv_dtype}")
        hdr = (f"{'N':>5} {'serial':>9} {'1 rank':>9} {f'{P} ranks':>9} {'speedup':>8} "
               f"{'model':>6}")
        if not args.no_torch:
            hdr += f" | {'torch f64':>9} {'torch f32':>9} {f'{P}r÷f64':>7} {f'{P}r÷f32':>7}"
        print(hdr)
        for o, m in zip(one[len(dense):], many[len(dense):], strict=True):
            md = model(o, m)
            s = o["serial_s"]
            line = (f"{o['case']['layers']:>5} {_fmt_ms(s)} {_fmt_ms(o['lp_s'])} "
                    f"{_fmt_ms(m['lp_s'])} {s / m['lp_s']:8.2f} {s / md['lp']:6.2f}")
            if not args.no_torch:
                try:
                    t = _torch_times(o["case"]["layers"], 50, args.repeat)
                    line += (f" | {_fmt_ms(t['float64'])} {_fmt_ms(t['float32'])} "
                             f"{t['float64'] / m['lp_s']:7.2f} {t['float32'] / m['lp_s']:7.2f}")
                except ImportError:
                    line += " | torch is not installed"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
