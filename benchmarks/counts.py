"""Suite ``counts``: what a GPU pays for, counted without one — kernel launches, the critical
path, host↔device copies and host synchronisations. Counts, not times: the same command prints
the same numbers on any machine, loaded or idle.

    python -m benchmarks quick counts                          # cupy; N = 64, 256; every model
    python -m benchmarks quick counts -o gpu_backend=cuda -o sizes=16 -o models=dense
    python -m benchmarks quick counts -o fused=False           # cupy without its fused kernels
    python -m benchmarks quick counts -o ranks=3               # the MPI cases on 3 ranks

Cases ``{backend}[ unfused] {model} N={n} {gradient}``
(:func:`refbraid.backends.launch_count.gradient_counts`; the model of each count:
:mod:`refbraid.backends.launch_model`): one gradient of the dense, conv, transformer and GRU
networks (CI-sized: width 4, batch 4; counts do not depend on widths), MGRIT at TorchBraid's
settings (refbraid's defaults), by serial backprop (``serial``), layer-parallel with one launch
set per interval (``lp-per-step``) and per sweep (``lp-batched``); for ``cupy``, dense and
conv, also serial and batched layer-parallel replayed from a CUDA graph (``serial, graph``,
``lp-batched, graph``: what the host issues per call once recorded — the replay is one
launch, the rest are the call's checks and copies; ``launch_count.graph_counts``; and
``graph nodes``, the kernels the graph holds, which the device works through at each replay:
``launch_count.graph_nodes``).
``cupy``: the cupy backend's operations on a counting CuPy-like device (NumPy underneath),
its fused kernels on unless ``fused=False``; ``cuda``: Numba's CUDA simulator with the glue
on the same device (slow: one Python thread per CUDA thread). Values: launches, critical path
(the longest chain of dependent launches), copies h→d and d→h, syncs, and launches and
critical path ÷ serial's.

Cases ``cupy traffic {case} {gradient}`` (``traffic``, cupy only): the GPU suite's
whole-gradient cases at their own sizes (benchmarks/gpu_cases.py's ``GRADIENT_CASES``, float32;
``tiny``: its tiny cases), serial backprop and batched layer-parallel, eager and recorded
as a CUDA graph: launches (graph: the kernel nodes a replay works through) and the bytes
they move (:mod:`refbraid.backends.launch_model`: every array a launch reads or writes, once),
in MB and ÷ serial's; and the largest shares of the batched gradient's bytes by launch
name. Once a graph takes the host's cost per launch away, these bytes are what is left for
the device (slow: the stand-in's arithmetic runs at full size, about 2 minutes).

Cases ``cupy[ unfused] layer {name}`` (``layers``, cupy only): per layer of the GPU suite's
per-layer table (benchmarks/gpu.py: dense and conv ODE steps, layer norm, MLP, attention,
encoder step, GRU cell; its unit is a forward then an adjoint), the launches of the forward
and of the adjoint on the counting device; ``fused=False`` counts the reference operations
the hand-written kernels replace.

Cases ``cuda step {model}`` (``transfers``): one layer-parallel training step on the ``cuda``
backend in the simulator, device-resident: the backend's kernel calls, Numba kernel launches,
copies and allocations through ``numba.cuda`` (``to_device``, ``device_array``,
``auto_device``, ``copy_to_host``), exits through ``refbraid.backends.host.to_host`` and the
largest of them (elements). ``cuda-host step {model}``: the same step in host-array mode
(``REFBRAID_CUDA_ARRAYS=host``): host→device and device→host copies and those made outside a
kernel wrapper. The models, sizes, step and counting are tests/test_cudasim_training_step.py's,
which asserts on these numbers.

Cases ``cuda sharded step rank r of P`` (``ranks`` > 0, under ``mpiexec``): per rank, one
sharded layer-parallel training step on ``cuda`` in the simulator (device-resident): the
layers it owns, its launches, its ``numba.cuda`` copies (zero: the kernels work in place), its
exits through the host door split into scalars (losses, residual norms, label range,
finiteness flags) and staged arrays (device arrays copied into host buffers for MPI: no
CUDA-aware MPI here), the largest exit (elements), and its neighbour messages and their
bytes. Model and step: tests/mpi/test_device_training.py's simulator test (dense, N = 8,
width 4, batch 4, 2 levels, cfactor 2, Adam), which asserts on these numbers.

Each part runs in a fresh process (:func:`benchmarks.harness.fresh`, MPI:
:func:`~benchmarks.harness.launch`): the simulator must be switched on before Numba is
imported, and host-array mode is chosen at import.
"""

from __future__ import annotations

import sys

from benchmarks.harness import ROOT, Result, emit, fresh, launch, worker_main

MODELS = ("dense", "conv", "transformer", "gru")
#: ``sizes`` "" takes the size's default N
OPTIONS = {"gpu_backend": "cupy", "models": ",".join(MODELS), "sizes": "", "fused": True,
           "layers": True, "transfers": True, "ranks": 2, "traffic": True}
SIZES = {"full": "64,256", "quick": "64,256", "tiny": "16"}
SIMULATOR = {"NUMBA_ENABLE_CUDASIM": "1"}


# ----------------------------------------------------------------------------- launches
def launch_records(backend: str, models, sizes, fused: bool = True) -> list[dict]:
    """One record per (model, N, gradient): the :class:`~refbraid.backends.launch_model.Tally`
    of one gradient on ``backend`` (``cupy``, or ``cuda`` in the simulator)."""
    from refbraid.backends import launch_count
    from refbraid.backends.cupy_fused import fused as fused_kernels

    out = []
    with fused_kernels(fused):
        for model in models:
            for n in sizes:
                for mode in launch_count.MODES:
                    t = launch_count.gradient_counts(backend, model, n, mode)
                    out.append({"backend": backend, "model": model, "N": n, "mode": mode,
                                "fused": fused, **t.row()})
                if backend != "cupy" or model not in ("dense", "conv"):
                    continue
                for mode in launch_count.GRAPH_MODES:  # what the host issues per replay
                    t = launch_count.graph_counts(model, n, mode)
                    out.append({"backend": backend, "model": model, "N": n,
                                "mode": f"{mode}, graph", "fused": fused, **t.row(),
                                "nodes": launch_count.graph_nodes(model, n, mode)})
    return out


def launch_results(recs: list[dict], suite: str = "counts") -> list[Result]:
    """:func:`launch_records`' records as results, with launches and critical path ÷ serial's
    (the serial record of the same backend, model and N)."""
    serial = {(r["backend"], r["model"], r["N"]): r for r in recs if r["mode"] == "serial"}
    out = []
    for r in recs:
        s = serial[r["backend"], r["model"], r["N"]]
        name = f"{r['backend']}{'' if r['fused'] else ' unfused'} {r['model']} N={r['N']} " \
               f"{r['mode']}"
        out.append(Result(suite, name, {k: r[k] for k in ("backend", "model", "N", "mode",
                                                          "fused")})
                   .add("launches", r["launches"]).add("critical path", r["critical_path"])
                   .add("copies h→d", r["h2d"]).add("copies d→h", r["d2h"])
                   .add("syncs", r["syncs"])
                   .add("launches ÷ serial", r["launches"] / s["launches"])
                   .add("critical path ÷ serial", r["critical_path"] / s["critical_path"]))
        if "nodes" in r:  # the device's share of a replay: the graph's kernel nodes
            out[-1].add("graph nodes", r["nodes"])
    return out


def layer_records(fused: bool = True) -> list[dict]:
    """Per layer of benchmarks/gpu.py (tiny sizes: counts do not depend on them), the cupy
    backend's launches of one forward and of one adjoint on the counting device."""
    import numpy as np

    from benchmarks.gpu_layers import layer_op, layers
    from refbraid.backends import launch_count
    from refbraid.backends.cupy_fused import fused as fused_kernels
    from refbraid.backends.launch_model import tracking
    from refbraid.network import to_backend
    from refbraid.verify.checks import example_input

    out = []
    for name, layer, batch in layers(True):
        rng = np.random.default_rng(0)
        op = layer_op(layer)
        shape = tuple(getattr(layer, "state_shape", None) or layer.in_shape)
        params = layer.init(rng, np.float32)
        x = example_input(layer, rng, batch, shape, np.float32)
        with fused_kernels(fused), launch_count.counting("cupy") as bk:
            p, xb = to_backend(params, bk), bk.asarray(x)
            y, _ = op.forward(p, xb, bk)  # warm: weights gathered, nothing left to copy
            w = bk.asarray(rng.standard_normal(tuple(y.shape)).astype(np.float32))
            with tracking() as forward:
                _, cache = op.forward(p, xb, bk)
            with tracking() as adjoint:
                op.adjoint(p, cache, w, bk)
        out.append({"layer": name, "fused": fused, "forward": forward.tally.launches,
                    "adjoint": adjoint.tally.launches})
    return out


# ----------------------------------------------------------------------------- bytes moved
#: the launch names whose shares of the batched gradient's bytes are listed
TOP_NAMES = 4


def traffic_records(tiny: bool) -> list[dict]:
    """Per whole-gradient case of the GPU suite (float32, its sizes), one record per gradient:
    serial and batched layer-parallel, eager (``launch_count.network_counts``) and recorded
    as a CUDA graph (``launch_count.graph_work``): launches, bytes moved, bytes by name."""
    import numpy as np

    from benchmarks.gpu_cases import (
        GRADIENT_CASES,
        TINY_GRADIENT_CASES,
        gradient_case,
        gradient_settings,
    )
    from refbraid.backends import launch_count

    settings, out = gradient_settings(tiny), []
    for case in TINY_GRADIENT_CASES if tiny else GRADIENT_CASES:
        net, params, x, labels, size = gradient_case(*case, np.float32)
        built = (net, params, x, labels)
        for mode in launch_count.GRAPH_MODES:
            for graph in (False, True):
                t = (launch_count.graph_work(*built, mode, settings) if graph
                     else launch_count.network_counts("cupy", *built, mode, settings))
                out.append({"case": size, "mode": f"{mode}{', graph' if graph else ''}",
                            "launches": t.launches, "bytes": t.bytes_moved,
                            "by_name": t.bytes_by_name})
    return out


def traffic_results(recs: list[dict]) -> list[Result]:
    """:func:`traffic_records` as results: launches, MB moved, and both ÷ the serial record's
    (eager or graph alike) of the same case; the batched records' largest bytes by name."""
    serial = {(r["case"], r["mode"]): r for r in recs if r["mode"].startswith("serial")}
    out = []
    for r in recs:
        s = serial[r["case"], r["mode"].replace("lp-batched", "serial")]
        res = (Result("counts", f"cupy traffic {r['case']} {r['mode']}",
                      {"case": r["case"], "mode": r["mode"]})
               .add("launches", r["launches"]).add("MB moved", r["bytes"] / 1e6, "MB")
               .add("launches ÷ serial", r["launches"] / s["launches"])
               .add("MB moved ÷ serial", r["bytes"] / s["bytes"]))
        if r["mode"].startswith("lp-batched"):
            top = sorted(r["by_name"].items(), key=lambda kv: -kv[1])[:TOP_NAMES]
            for name, b in top:
                res.add(f"share {name}", b / r["bytes"])
        out.append(res)
    return out


# ----------------------------------------------------------------------------- copies
def _tests(*parts: str) -> None:
    """Put a tests folder on ``sys.path``: the copy counting is the tests' own."""
    path = str(ROOT.joinpath("tests", *parts))
    if path not in sys.path:
        sys.path.insert(0, path)


def device_step_record(model: str) -> dict:
    """One layer-parallel training step of ``model`` on ``cuda`` (simulator, device-resident),
    counted by tests/test_cudasim_training_step.py's ``TransferCounter``."""
    import numpy as np
    import pytest

    _tests()
    from test_cudasim_training_step import TransferCounter, _model, _step

    from refbraid.backends import get_backend
    from refbraid.backends.host import COUNTS

    patch = pytest.MonkeyPatch()
    net, params, x, labels = _model(model, np.random.default_rng(0))
    counter = TransferCounter(patch)
    door = COUNTS["to_host"]
    try:
        _step(net, params, x, labels, counter.wrap(get_backend("cuda")))
    finally:
        patch.undo()
    return {"model": model, "kernel calls": counter.kernel_calls, "launches": counter.launches,
            "numba.cuda copies + allocations": sum(counter.copies.values()),
            "exits through to_host": COUNTS["to_host"] - door,
            "largest exit": max(counter.door_sizes)}


def host_step_record(model: str) -> dict:
    """The same step in host-array mode (``REFBRAID_CUDA_ARRAYS=host`` set before import)."""
    _tests()
    from test_cudasim_training_step import _host_mode_step_copies

    c = _host_mode_step_copies(model)
    return {"model": model, "host→device": c["h2d"], "device→host": c["d2h"],
            "copies outside a kernel": c["outside"]}


def sharded_step_record() -> dict | None:
    """This rank's counts of one sharded step on ``cuda`` (simulator; under mpiexec); the
    records of every rank on world rank 0, None elsewhere."""
    import array_api_strict
    import pytest

    _tests("mpi")
    from test_device_training import SETTINGS, CudaCopies, _batches, _net

    from refbraid.backends import get_backend
    from refbraid.backends.host import COUNTS
    from refbraid.backends.strict_device import forbid_host_conversions
    from refbraid.distributed.network import distributed_gradient
    from refbraid.distributed.sharded import ShardedTrainer
    from refbraid.network import init_params, to_backend
    from refbraid.parallel.device_messages import refuse_pickled_device_arrays
    from refbraid.training.optim import make_optimizer

    cuda = get_backend("cuda")
    net = _net("resnet", layers=8)
    (x, y), = _batches(net, n=1, B=4)
    trainer = ShardedTrainer(distributed_gradient(net, SETTINGS, cuda),
                             to_backend(init_params(net, 3), cuda), make_optimizer("adam", 1e-2))
    x, y = cuda.asarray(x), cuda.asarray(y)
    layer = trainer.gradient.topo.layer
    sizes: list[int] = []
    cpu = array_api_strict.Device("CPU_DEVICE")
    array_type = type(array_api_strict.asarray(0.0))
    to_device = array_type.to_device

    def recorded(array, device, /, **kwargs):
        if device == cpu and array.device != cpu:
            sizes.append(array.size)
        return to_device(array, device, **kwargs)

    patch = pytest.MonkeyPatch()
    try:
        counter = CudaCopies(patch)
        patch.setattr(array_type, "to_device", recorded)
        sends, sent, door = layer.counters["sends"], layer.counters["bytes_sent"], COUNTS["to_host"]
        with forbid_host_conversions(), refuse_pickled_device_arrays():
            trainer.step(x, y)
        sends, sent = layer.counters["sends"] - sends, layer.counters["bytes_sent"] - sent
        door = COUNTS["to_host"] - door
    finally:
        patch.undo()
    if door != len(sizes):
        raise RuntimeError(f"exits through to_host ({door}) and recorded copies to the CPU "
                           f"({len(sizes)}) differ")
    owned, scalars = trainer.gradient.owned, sum(s == 1 for s in sizes)
    world = trainer.gradient.topo.world
    mine = {"rank": layer.rank, "ranks": world.size, "layers": f"{int(owned[0])}..{int(owned[-1])}",
            "launches": counter.launches, "numba.cuda copies": sum(counter.copies.values()),
            "scalar exits": scalars, "staged arrays": door - scalars,
            "largest exit": max(sizes, default=0), "neighbour sends": sends, "bytes sent": sent}
    rows = world.gather(mine, root=0)
    return {"ranks": rows} if world.rank == 0 else None


def _result(case: str, rec: dict, params: dict) -> Result:
    res = Result("counts", case, params)
    for k, v in rec.items():
        if k not in params and k not in ("rank", "ranks"):
            res.add(k, v, "elements" if k == "largest exit" else "bytes" if k == "bytes sent"
                    else "")
    return res


# ----------------------------------------------------------------------------- the suite
def worker(spec: dict) -> None:
    """One part of the suite in this (fresh) process; emits one record per case."""
    part = spec["part"]
    if part == "launches":
        for rec in launch_records(spec["backend"], spec["models"], spec["sizes"],
                                  spec["fused"]):
            emit(rec)
    elif part == "layers":
        for rec in layer_records(spec["fused"]):
            emit(rec)
    elif part == "traffic":
        for rec in traffic_records(spec["tiny"]):
            emit(rec)
    elif part in ("device", "host"):
        for model in spec["models"]:
            emit((device_step_record if part == "device" else host_step_record)(model))
    elif part == "sharded":
        rec = sharded_step_record()
        if rec is not None:
            emit(rec)
    else:
        raise ValueError(f"`part` must be launches, layers, traffic, device, host or sharded, "
                         f"got {part!r}.")


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    backend = opts["gpu_backend"]
    if backend not in ("cupy", "cuda"):
        raise ValueError(f"`gpu_backend` must be cupy or cuda, got {backend!r}.")
    models = [m for m in opts["models"].replace(" ", ",").split(",") if m]
    if not set(models) <= set(MODELS):
        raise ValueError(f"`models` must be among {','.join(MODELS)}, got {opts['models']!r}.")
    sizes = [int(n) for n in (opts["sizes"] or SIZES[size]).replace(" ", ",").split(",") if n]
    spec = {"part": "launches", "backend": backend, "models": models, "sizes": sizes,
            "fused": opts["fused"]}
    recs = fresh("benchmarks.counts", spec, SIMULATOR if backend == "cuda" else None)
    notes.append(f"{backend}{'' if opts['fused'] or backend != 'cupy' else ' (unfused)'}: one "
                 "gradient, TorchBraid's MGRIT settings, CI-sized networks; counts, not times")
    out = launch_results(recs)
    if opts["layers"] and backend == "cupy":
        notes.append("cupy layer: one forward and one adjoint of each layer of the GPU suite's "
                     "per-layer table, float32")
        for rec in fresh("benchmarks.counts", {"part": "layers", "fused": opts["fused"]}):
            name = f"cupy{'' if rec['fused'] else ' unfused'} layer {rec['layer']}"
            out.append(Result("counts", name, {"layer": rec["layer"], "fused": rec["fused"]})
                       .add("forward launches", rec["forward"])
                       .add("adjoint launches", rec["adjoint"]))
    if opts["traffic"] and backend == "cupy" and opts["fused"]:
        notes.append("cupy traffic: the GPU suite's whole gradients at its sizes, float32; "
                     "bytes each launch reads and writes, once (a count, not a time)")
        out += traffic_results(fresh("benchmarks.counts", {"part": "traffic",
                                                             "tiny": size == "tiny"}))
    if opts["transfers"]:
        notes.append("cuda step / cuda-host step: one layer-parallel training step on the "
                     "CUDA simulator, device-resident / host-array mode")
        for rec in fresh("benchmarks.counts", {"part": "device", "models": list(MODELS)},
                         SIMULATOR):
            out.append(_result(f"cuda step {rec['model']}", rec, {"model": rec["model"]}))
        host = {**SIMULATOR, "REFBRAID_CUDA_ARRAYS": "host"}
        for rec in fresh("benchmarks.counts", {"part": "host", "models": list(MODELS)}, host):
            out.append(_result(f"cuda-host step {rec['model']}", rec, {"model": rec["model"]}))
    if opts["ranks"] > 0:
        P = opts["ranks"]
        notes.append(f"cuda sharded step: one sharded step on {P} ranks, cuda (simulator), "
                     "dense N = 8, width 4, batch 4")
        rows = launch(P, "benchmarks.counts", {"part": "sharded"}, env=SIMULATOR)[0]["ranks"]
        out += [_result(f"cuda sharded step rank {r['rank']} of {P}", r,
                        {"rank": r["rank"], "ranks": P}) for r in rows]
    return out


if __name__ == "__main__":
    worker_main(worker)
