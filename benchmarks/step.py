"""Suite ``step``: the layer-parallel training step against serial, in one process and on
1 and P ranks (``mpiexec``), beside a cost model built from quantities measured in the run.

    python -m benchmarks full step [-o layers=64,256] [-o conv_dtype=float32]
        [-o settings=torchbraid|2level|fast|fast-2level] [-o ranks=2] [-o repeat=5]
        [-o same_process=True] [-o mpi=False] [-o workspace=True] [-o interleave=True]
        [-o breakdown=True]

Case ``gradient`` (one process; a dense ResNet, width 32, batch 64, NumPy): one gradient by
serial backprop (N forward + N adjoint steps) and by the layer-parallel gradient (MGRIT forward
and adjoint solves, TorchBraid's settings; a kept :class:`refbraid.mgrit.GradientWorkspace`
with ``workspace``; ``mpi=False`` runs this case alone): ms of each, their Φ applications,
the *work ratio* (LP Φ ÷ serial Φ), the overhead (time ratio ÷ work ratio: 1.0 means the
solver costs nothing beyond its steps), the forward residual and the relative gradient error.

Case ``messages`` (2 ranks): α and β of one message, ``t(n) = α + β·n`` from a ping-pong of
8 B and 1 MiB float64 arrays, three ways in turn: ``buffers`` (upper-case Send/Recv into a
preallocated array: the transport, and the ring allreduce model's), ``pickled`` (lower-case
isend/recv: how ``send_next`` once sent arrays) and ``MPIComm`` (``send_next`` / ``recv_prev``
now: header + raw bytes; the model's t_msg).

Cases ``resnet N=…`` (width 32, batch 64, N = 64 … 1024) and ``conv N=…`` (TorchBraid's MNIST
network: Conv2d(1→4)+ReLU, N steps ``x + h·ReLU(Conv2d(4→4, 3×3)(x))``, Linear(4·28·28 → 10),
batch 50, numba): one training step, sequential backprop + Adam (``serial``) against the
sharded layer-parallel step (:class:`~refbraid.distributed.sharded.ShardedTrainer`: MGRIT
solves, gradient rows, local Adam) on 1 and on P ranks, and (dense) data parallelism over the
same P ranks (D = P groups, sequential substitution per group, gradients summed); the conv
network also against PyTorch serial (1 thread; forward, backward, Adam) in float64 and float32.

The model (docs/references.md §4): unit costs of one step, c_f (forward Φ), c_bc (coarse
adjoint: the transposed step on the fine forward cache, or with the forward recomputed where
a layer's cache depends on h), c_bg (fine adjoint with its weight gradient);
an overhead o per Φ call fitted to the 1-rank run, ``o = (T_1 − W_1) / calls_1``; per rank q
its counted Φ calls per level and messages; ``T_P ≈ max_q (W_q + o·calls_q) + Σ_q (C_q +
o·calls^C_q) + max_q msgs_q · t_msg`` (coarsest-level work C_q is a pipeline: it adds up);
larger P: ``T_P ≈ (T_1 − C_1)/P + C_1 + msgs · t_msg``; data parallelism, ring allreduce of n
gradient bytes: ``T ≈ T_1(B/p) + 2(p−1)·α + 2(p−1)/p · n·β``.

``interleave=True`` adds, on P ranks, ``repeat`` pairs of a serial step (run on each rank's
core in turn, the other ranks asleep: the mean of the P) and a P-rank step measured back to
back in alternating order, and reports the median of the pairs' ratios (P ranks ÷ serial)
and their range: on a machine whose speed drifts between minutes, and whose cores' speeds
differ by moments, the ratio of one pair is read under one state of it.

``breakdown=True`` adds, on 1 and P ranks, where each rank's step time goes, from ``repeat``
more steps under an execution trace (:mod:`refbraid.parallel.trace`), ms per training step:
``Φ`` (its step applications, Python call included, split into fine/coarse forward/adjoint),
``waits`` (receiving from a neighbour and the solver's collectives: time a rank had nothing
to do or the message was in flight), ``other`` (the rest of the wall time: the solver's
passes between steps, Python, the opening and closing layers, the loss, the optimizer and the
gradient's gathering). Each traced step is paired with a serial step (as ``interleave``) and
``Φ``, ``waits``, ``other`` and ``wall ÷ serial`` give the pairs' median share of the serial
step: the same moment's machine in numerator and denominator.

Every case runs in a fresh ``mpiexec`` (its own processes) with malloc pinned
(``same_process=True`` and ``REFBRAID_PIN_ALLOCATOR=0 python -m benchmarks …`` bring back the
old ways, to show the effect: a case's time then depends on what ran before it,
docs/scaling_overhead.md §5). Timings: median of
``repeat`` steps after one warm-up, a step's time the slowest rank's wall time.
"""

from __future__ import annotations

import numpy as np

from benchmarks.harness import Result, emit, launch, measure, prepare_worker, worker_main
from benchmarks.step_model import model, ring_allreduce
from benchmarks.step_timing import (  # noqa: F401  (BREAKDOWN, SHARES: the rows, re-exported)
    BREAKDOWN,
    SHARES,
    breakdown,
    interleaved,
    ping_pong,
)

SETTINGS = ("torchbraid", "2level", "fast", "fast-2level")
#: ``repeat`` 0 and ``layers``/``conv_layers`` "" take the size's defaults (SIZES); "none": no cases
OPTIONS = {"settings": "torchbraid", "ranks": 2, "repeat": 0, "layers": "", "width": 32,
           "batch": 64, "backend": "numpy", "conv_layers": "", "conv_backend": "numba",
           "conv_dtype": "float64", "torch": True, "same_process": False, "workspace": False,
           "mpi": True, "interleave": False, "breakdown": False, "timeout": 1800.0}
#: per size: dense N, conv N, one-process gradient N, repeat, dense width and batch
SIZES = {"full": ("64,128,256,512,1024", "32,128", (32, 128, 512), 5, 32, 64),
         "quick": ("64,128", "", (32, 128), 5, 32, 64),
         "tiny": ("32", "32", (16,), 1, 4, 4)}


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
        raise ValueError(f"`settings` must be one of {', '.join(table)}, got {name!r}.")
    return table[name]()


def network(case: dict):
    """The case's network: the dense ``resnet`` (tanh, T = 3) or TorchBraid's ``conv``."""
    from refbraid.models import build_network

    if case["model"] == "resnet":
        C = case["width"]
        return build_network("resnet", (C,), 10, case["layers"], C, 3.0, "tanh")
    return build_network("conv", (1, 28, 28), 10, case["layers"], 4, 1.0, "relu")


def problem(case: dict):
    """(net, params, x, y, backend) of a case: weights seed 0, random inputs and labels."""
    from refbraid.backends import get_backend
    from refbraid.network import init_params

    net = network(case)
    params = init_params(net, 0, np.dtype(case["dtype"]))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((case["batch"], *net.opening.in_shape)).astype(case["dtype"])
    y = rng.integers(0, net.closing.out_shape[0], case["batch"])
    return net, params, x, y, get_backend(case["backend"])


def unit_costs(net, params, x, bk) -> dict[str, float]:
    """c_f, c_bc, c_bg (seconds) of one step at batch x.shape[0] (medians of 15 calls)."""
    from refbraid.network import group, layer_params

    theta = layer_params(group(params, "steps"), 0)
    y = np.random.default_rng(1).standard_normal((x.shape[0], *net.step.state_shape))
    y = y.astype(params["steps.W"].dtype)
    h = net.h
    _, cache = net.step.forward(theta, y, h, bk)

    def coarse():  # the fine cache where the layer's does not depend on h (CapturingAdjoint)
        c = cache if getattr(net.step, "cache_independent_of_h", False) else \
            net.step.forward(theta, y, 4 * h, bk)[1]
        net.step.adjoint(theta, c, y, 4 * h, bk, grads=False)

    return {"c_f": measure(lambda: net.step.forward(theta, y, h, bk), 15).median(),
            "c_bc": measure(coarse, 15).median(),
            "c_bg": measure(lambda: net.step.adjoint(theta, cache, y, h, bk, grads=True),
                            15).median()}


def worker(spec: dict) -> None:
    """Under mpiexec: times every case on this world, rank 0 emits one record per case."""
    from mpi4py import MPI

    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.network import backprop
    from refbraid.training.optim import make_optimizer

    prepare_worker()
    world = MPI.COMM_WORLD
    P, repeat = world.Get_size(), spec["repeat"]
    settings = named_settings(spec["settings"])
    meta = {"ranks": P, "levels": settings.forward.levels}
    if P > 1:
        meta["ping_pong"] = ping_pong(world)
    for case in spec["cases"]:
        net, params, x, y, bk = problem(case)
        res = {"case": case, **meta}
        p_serial = {k: v.copy() for k, v in params.items()}
        opt = make_optimizer("adam", 1e-4)

        def serial(p_serial=p_serial, opt=opt, net=net, x=x, y=y, bk=bk):
            _, g, _ = backprop(net, p_serial, x, y, bk)
            opt.step(p_serial, g)

        if P == 1:
            res["serial_s"] = measure(serial, repeat).median()
            res.update(unit_costs(net, params, x, bk))
            res["grad_bytes"] = int(sum(v.nbytes for v in params.values()))
            res["state_bytes"] = int(x.shape[0] * np.prod(net.step.state_shape) * x.itemsize)
        if case.get("dp_groups"):
            D = case["dp_groups"]
            xs, ys = (x, y) if P > 1 else (x[: x.shape[0] // D], y[: x.shape[0] // D])
            grad = distributed_gradient(net, LayerParallelSettings.exact(), bk,
                                        data_parallel=P)
            tr = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
            res["dp_s"] = measure(lambda tr=tr, xs=xs, ys=ys: tr.step(xs, ys), repeat,
                                  comm=world).median()
        grad = distributed_gradient(net, settings, bk)
        tr = ShardedTrainer(grad, params, make_optimizer("adam", 1e-4))
        comm = grad.topo.layer
        res["lp_s"] = measure(lambda tr=tr, x=x, y=y: tr.step(x, y), repeat,
                              comm=world).median()
        if P > 1 and spec.get("interleave"):
            res["paired"] = interleaved(world, serial, lambda tr=tr, x=x, y=y: tr.step(x, y),
                                        repeat)
        if spec.get("breakdown"):
            res["breakdown"] = world.gather(breakdown(world, lambda tr=tr, x=x, y=y:
                                                      tr.step(x, y), repeat, serial), root=0)
        sends0 = comm.counters["sends"]
        tr.step(x, y)  # one more, to read its counts
        solves = grad.last_solves
        mine = {"fwd": list(solves["forward"].step_counts),
                "bwd": list(solves["backward"].step_counts),
                "recomputed": solves["recomputed"], "sends": comm.counters["sends"] - sends0}
        res["per_rank"] = world.gather(mine, root=0)
        if world.Get_rank() == 0:
            emit(res)


def torch_times(layers: int, batch: int, repeat: int) -> dict[str, float]:
    """PyTorch serial (1 thread) training step of the conv network, float64 and float32."""
    import torch

    torch.set_num_threads(1)
    out = {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        torch.manual_seed(0)
        opening = torch.nn.Conv2d(1, 4, 3, padding=1).to(dtype)
        steps = torch.nn.ModuleList(torch.nn.Conv2d(4, 4, 3, padding=1).to(dtype)
                                    for _ in range(layers))
        closing = torch.nn.Linear(4 * 28 * 28, 10).to(dtype)
        opt = torch.optim.Adam(torch.nn.ModuleList([opening, steps, closing]).parameters(),
                               lr=1e-4)
        x, y = torch.randn(batch, 1, 28, 28, dtype=dtype), torch.randint(0, 10, (batch,))

        def step(opening=opening, steps=steps, closing=closing, opt=opt, x=x, y=y):
            opt.zero_grad()
            z = torch.relu(opening(x))
            for conv in steps:
                z = z + (1.0 / layers) * torch.relu(conv(z))
            torch.nn.functional.cross_entropy(closing(z.flatten(1)), y).backward()
            opt.step()

        out[name] = measure(step, repeat).median()
    return out


# ----------------------------------------------------------------------------- the cases
def gradient_cases(depths, width: int, batch: int, repeat: int, workspace: bool) -> list:
    """Case ``gradient``: serial backprop vs the layer-parallel gradient in one process."""
    from refbraid import Network, backprop, get_backend, init_params
    from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
    from refbraid.layers import Classifier, DenseLift, DenseStep
    from refbraid.mgrit import GradientWorkspace
    from refbraid.relative_error import relative_gradient_error

    bk, settings, rng = get_backend("numpy"), LayerParallelSettings(), np.random.default_rng(0)
    out = []
    for N in depths:
        net = Network(DenseLift(2, width), DenseStep(width, "tanh"), Classifier((width,), 5),
                      N, 3.0)
        params = init_params(net, 0)
        x, y = rng.standard_normal((batch, 2)), rng.integers(0, 5, batch)
        batch_ = (net, params, x, y)
        kw = {"workspace": GradientWorkspace()} if workspace else {}
        t_s = measure(lambda a=batch_: backprop(*a, bk), repeat).median()
        t_lp = measure(lambda a=batch_, kw=kw: layer_parallel_gradient(*a, settings, bk, **kw),
                       repeat).median()
        _, g_ref, _ = backprop(net, params, x, y, bk)
        _, g, info = layer_parallel_gradient(net, params, x, y, settings, bk)
        phi_s, phi_lp = 2 * N, int(info.stats()["phi_calls"])
        res = Result("step", f"gradient resnet N={N}", {"layers": N, "width": width,
                     "batch": batch, "workspace": workspace, "processes": 1})
        res.add("serial", 1e3 * t_s, "ms").add("LP", 1e3 * t_lp, "ms")
        res.add("time ratio", t_lp / t_s, "×").add("Φ serial", phi_s).add("Φ LP", phi_lp)
        res.add("work ratio", phi_lp / phi_s, "×")
        res.add("overhead", t_lp / t_s / (phi_lp / phi_s), "×")
        res.add("fwd ‖r‖", float(info.forward.norms[-1]))
        out.append(res.add("grad err", float(relative_gradient_error(g, g_ref, bk)), "rel"))
    return out


def mpi_cases(opts: dict, dense: list[dict], conv: list[dict], repeat: int, notes) -> list:
    """The 1-rank and P-rank launches, and one Result per case (module docstring)."""
    from refbraid.runtime import allocator_state

    P = opts["ranks"]
    if P < 2:
        raise ValueError(f"`ranks` must be at least 2, got {P}.")
    cases = dense + conv
    batches = [cases] if opts["same_process"] else [[c] for c in cases]

    def run_on(n):
        return [r for b in batches for r in launch(
            n, "benchmarks.step", {"cases": b, "repeat": repeat, "settings": opts["settings"],
                                   "interleave": opts["interleave"],
                                   "breakdown": opts["breakdown"]},
            opts["timeout"])]

    one, many = run_on(1), run_on(P)
    s = named_settings(opts["settings"])
    notes.append(f"P = {P} ranks, one thread each; MGRIT ({opts['settings']}): "
                 f"{s.forward.levels} levels, cfactor {s.forward.cfactor}, "
                 f"{s.forward.max_iter + 1} forward / {s.backward.max_iter + 1} backward "
                 f"iterations (counting the skipped first down-cycle); median of {repeat} steps")
    notes.append(f"{'all cases in one mpiexec' if opts['same_process'] else 'one mpiexec per case'}"
                 f"; {allocator_state()} (the workers' alike)")
    res = Result("step", f"messages {P} ranks", {"ranks": P})
    for v, (a, b) in many[0]["ping_pong"].items():
        res.add(f"α {v}", 1e6 * a, "µs").add(f"β {v}", 1e9 * b, "ns/byte")
    out = [res]
    a, b = many[0]["ping_pong"]["buffers"]
    crossover = None
    for o, m in zip(one, many, strict=True):
        case, md, s_ = o["case"], model(o, m), o["serial_s"]
        r = Result("step", f"{case['model']} N={case['layers']} {case['dtype']}", case)
        r.add("serial", 1e3 * s_, "ms").add("1 rank", 1e3 * o["lp_s"], "ms")
        r.add(f"{P} ranks", 1e3 * m["lp_s"], "ms").add("speedup", s_ / m["lp_s"], "×")
        r.add("model speedup", s_ / md["lp"], "×")
        if case["model"] == "resnet":
            r.add("P=4 model", s_ / md["at"](4), "×").add("P=8 model", s_ / md["at"](8), "×")
            r.add(f"DP D={P}", 1e3 * m["dp_s"], "ms").add("DP speedup", s_ / m["dp_s"], "×")
            dp_model = o["dp_s"] + ring_allreduce(o["grad_bytes"], P, a, b)
            r.add("DP ring model", s_ / dp_model, "×")
            if crossover is None and s_ / m["lp_s"] >= 1.0:
                crossover = case["layers"]
        elif opts["torch"]:
            try:
                t = torch_times(case["layers"], case["batch"], repeat)
                r.add("torch f64", 1e3 * t["float64"], "ms")
                r.add("torch f32", 1e3 * t["float32"], "ms")
                r.add(f"torch f64 ÷ {P} ranks", t["float64"] / m["lp_s"], "×")
                r.add(f"torch f32 ÷ {P} ranks", t["float32"] / m["lp_s"], "×")
            except ImportError:
                notes.append("PyTorch is not installed: no torch columns")
        if "paired" in m:
            ratios = sorted(b / a for a, b in m["paired"])
            r.add("paired serial", 1e3 * float(np.median([a for a, _ in m["paired"]])), "ms")
            r.add(f"paired {P} ranks", 1e3 * float(np.median([b for _, b in m["paired"]])), "ms")
            r.add(f"{P} ranks ÷ serial", float(np.median(ratios)), "× (paired median)")
            r.add("÷ serial min", ratios[0], "×").add("÷ serial max", ratios[-1], "×")
            r.add("fastest ÷ fastest", min(b for _, b in m["paired"])
                  / min(a for a, _ in m["paired"]), "× (noise only adds time)")
        for ranks, run_ in ((1, o), (P, m)):
            for q, parts in enumerate(run_.get("breakdown", ())):
                head = f"{ranks} rank{'s' if ranks > 1 else ''}: rank {q}"
                for kind in BREAKDOWN:
                    r.add(f"{head} {kind}", 1e3 * parts.get(kind, 0.0), "ms/step")
                for share in SHARES:
                    r.add(f"{head} {share} ÷ serial", parts[f"{share} ÷ serial"],
                          "× (paired median)")
        r.add("c_f", 1e6 * o["c_f"], "µs").add("c_bc", 1e6 * o["c_bc"], "µs")
        r.add("c_bg", 1e6 * o["c_bg"], "µs").add("o per Φ", 1e6 * md["o"], "µs")
        out.append(r.add("t_msg", 1e6 * md["t_msg"], "µs"))
    if dense:
        notes.append(f"crossover depth (measured speedup ≥ 1 on {P} ranks): "
                     f"{crossover or 'none up to N = ' + str(dense[-1]['layers'])}")
    return out


def _ints(text: str) -> list[int]:
    """``"64,256"`` → [64, 256]; ``"none"`` → [] (no such cases)."""
    if text.strip().lower() == "none":
        return []
    return [int(v) for v in text.replace(" ", ",").split(",") if v]


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    layers, conv_layers, depths, repeat, width, batch = SIZES[size]
    layers, conv_layers = _ints(opts["layers"] or layers), _ints(opts["conv_layers"] or conv_layers)
    repeat = opts["repeat"] or repeat
    width = opts["width"] if size != "tiny" else width
    batch = opts["batch"] if size != "tiny" else batch
    one = max(repeat, 2) if size != "tiny" else 1
    out = gradient_cases(depths, width, batch, one, opts["workspace"])
    notes.append(f"gradient: one process, dense width {width}, batch {batch}, numpy, "
                 f"TorchBraid's settings, wall time, median of {one}")
    dense = [{"model": "resnet", "layers": n, "width": width, "batch": batch,
              "backend": opts["backend"], "dtype": "float64", "dp_groups": opts["ranks"]}
             for n in layers]
    conv = [{"model": "conv", "layers": n, "batch": 50 if size != "tiny" else 2,
             "backend": opts["conv_backend"], "dtype": opts["conv_dtype"]} for n in conv_layers]
    if not (opts["mpi"] and dense + conv):
        return out
    return out + mpi_cases(opts, dense, conv, repeat, notes)


if __name__ == "__main__":
    worker_main(worker)
