"""Suite ``gpu``: each layer (forward then adjoint) and whole gradients on the GPU backends:
``cuda`` (Numba CUDA kernels), ``cupy`` (the reference kernels on CuPy arrays) and PyTorch
CUDA when it is installed, in float64 and float32 (not in ``quick``: it needs a GPU).

    NUMBA_ENABLE_CUDASIM=0 python -m benchmarks quick gpu            # on a GPU machine
    python -m benchmarks full gpu -o dtype=float32 -o repeat=20
    python -m benchmarks quick gpu -o dtype=float32 -o backends=cupy,cuda   # a short session
    python -m benchmarks tiny gpu                                   # no GPU: checks the suite

``tiny`` (or ``-o simulator=True``) runs the same cases at tiny sizes on Numba's CUDA
simulator and the strict device stand-in (``strict``: the cupy code path on array-api-strict
arrays), which checks the suite and every backend's results, not speeds.

The unit timed per layer is what MGRIT applies over and over: ``op.forward`` then
``op.adjoint`` (refbraid.verify.ops), inputs already where the backend keeps them: device
arrays for cupy and cuda (device-resident: Numba kernels on CuPy memory, zero copies, see
refbraid.backends.numba_cuda_memory). The backend ``cuda-host`` runs the same Numba kernels on
NumPy arrays (host-array mode, what a GPU without CuPy gets: every kernel copies its inputs
in and its outputs out), so ``cuda-host`` / ``cuda`` is what residency buys. A step is one
``mgrit_gradient`` call on the default ResNet (TorchBraid's MGRIT settings). Every backend's
layer output is compared with the NumPy reference first (``check``: max relative difference).
Times: :func:`benchmarks.harness.measure` (median of ``repeat`` after ``warmup``), each call
followed by a device synchronisation.

Cases ``LP per-step`` / ``LP batched`` / ``refbraid serial`` / ``torch eager serial``: one
whole gradient of the dense ResNet at N = 64–1024 and of the conv ODE-net at N = 64 and 256
(16 channels, 16×16 images, batch 64; TorchBraid's MGRIT settings): refbraid's
layer-parallel gradient with MGRIT's sweeps one launch set per interval and one per sweep
(:func:`refbraid.backends.device_batching.sweeps_batched`; batched is the default on cuda and
cupy), refbraid's serial backprop, and PyTorch eager serial backprop of the same network;
``ratio`` against refbraid serial on the same backend (torch: against the first backend's),
``check`` the largest relative gradient difference batched vs per-step. On ``cupy`` also
``LP batched, CuPy matmul``: the batched gradient with its batched products through CuPy's
``matmul`` instead of refbraid's strided-batched GEMM (``REFBRAID_CUPY_GEMM=cupy``), the A/B
of that choice; the gradients replayed from CUDA graphs; and for the conv network, the
``…, im2col conv`` rows: its gradients (eager and replayed) with column-matrix convolutions
instead of the direct kernels (``REFBRAID_CUPY_CONV=im2col``), that choice's A/B. Last, what
a GPU pays for per gradient, counted without one (launches, critical path, copies,
synchronisations of the dense and conv networks: the ``counts`` suite's cases,
:func:`benchmarks.counts.launch_records`).

The cases run in one fresh process (:func:`benchmarks.harness.fresh`) with
``NUMBA_ENABLE_CUDASIM`` set for the mode before Numba is imported; how each row is timed is
:mod:`benchmarks.gpu_timing`. This module is the suite: its options, the backends it times,
the worker and the results.
"""

from __future__ import annotations

import numpy as np

from benchmarks.gpu_timing import gradient_rows, layer_rows, step_rows
from benchmarks.harness import Result, WorkerFailed, emit, fresh, prepare_worker, worker_main
from refbraid.backends import available_backends

#: ``repeat`` 0 and ``warmup`` -1 take the size's (REPEATS)
#: ``backends`` "" times every GPU backend here (:func:`gpu_backends`), else a comma-separated
#: choice of them, e.g. ``cupy,cuda`` (no ``cuda-host``: what a short GPU session leaves out)
OPTIONS = {"dtype": "both", "repeat": 0, "warmup": -1, "simulator": False, "backends": ""}
REPEATS = {"tiny": (1, 0), "quick": (5, 2), "full": (10, 3)}  # (repeat, warmup) per size


# ----------------------------------------------------------------------------- the suite
def gpu_backends(simulator: bool) -> list[str]:
    """The backends to time: on the simulator ``cuda``, ``cuda-host`` and ``strict``; on a GPU
    those of ``cuda`` (with ``cuda-host``) and ``cupy`` that work here."""
    if simulator:
        return ["cuda", "cuda-host", "strict"]
    from refbraid.backends.numba_cuda import simulated

    here = available_backends()
    backends = [b for b in ("cuda", "cupy") if b in here and not (b == "cuda" and simulated())]
    return backends + (["cuda-host"] if "cuda" in backends else [])


def worker(spec: dict) -> None:
    """Every case in this (fresh) process: a first record with the notes (or the reason no
    GPU backend is here), then one per row, then the counts."""
    from benchmarks.counts import launch_records
    from refbraid.backends.numba_cuda_memory import mode_note

    prepare_worker()
    tiny, repeat, warmup = spec["simulator"], spec["repeat"], spec["warmup"]
    backends = gpu_backends(tiny)
    if spec.get("backends"):
        backends = [b for b in spec["backends"] if b in backends]
    if not backends:
        emit({"error": "no GPU backend here (cuda needs a GPU and NUMBA_ENABLE_CUDASIM=0, cupy "
                       "needs a CuPy with the array API functions); `python -m benchmarks tiny "
                       "gpu` checks the suite without one"})
        return
    emit({"notes": [mode_note(), f"backends: {', '.join(backends)}; ratio: against "
                    f"{backends[0]} (layers, step) or refbraid serial (gradients) in the same "
                    f"run; median of {repeat} after {warmup} warm-up runs"]})
    dtypes = [np.float64, np.float32] if spec["dtype"] == "both" else [np.dtype(spec["dtype"]).type]
    for dtype in dtypes:
        for rows in (gradient_rows, layer_rows, step_rows):  # the whole gradient first
            for row in rows(backends, dtype, tiny, warmup, repeat):
                emit({"row": list(row)})
    names = ["cupy"] + (["cuda"] if tiny else [])
    emit({"counts": [r for name in names for r in launch_records(
        name, ("dense", "conv"), (16,) if tiny else (64, 256))]})


def run(size: str, opts: dict, notes: list[str]) -> list[Result]:
    from benchmarks.counts import launch_results

    if opts["dtype"] not in ("float64", "float32", "both"):
        raise ValueError(f"`dtype` must be float64, float32 or both, got {opts['dtype']!r}.")
    simulator = opts["simulator"] or size == "tiny"
    chosen = [b.strip() for b in opts["backends"].split(",") if b.strip()]
    known = ("cuda", "cuda-host", "cupy", "strict")
    if any(b not in known for b in chosen):
        raise ValueError(f"`backends` must be a comma-separated choice of {', '.join(known)}, "
                         f"got {opts['backends']!r}.")
    repeat = opts["repeat"] or REPEATS[size][0]
    warmup = opts["warmup"] if opts["warmup"] >= 0 else REPEATS[size][1]
    spec = {"simulator": simulator, "dtype": opts["dtype"], "repeat": repeat, "warmup": warmup,
            "backends": chosen}
    try:
        recs = fresh("benchmarks.gpu", spec, {"NUMBA_ENABLE_CUDASIM": "1" if simulator else "0"})
    except WorkerFailed as err:  # the rows it finished are kept; the run reports the crash
        if not err.records:
            raise
        recs = err.records
        last = (str(err).strip().splitlines() or [""])[-1][:300]
        notes.append(f"FAILED: the worker crashed after {len(recs) - 1} rows: {last}")
    if "error" in recs[0]:
        raise SystemExit(recs[0]["error"])
    notes += recs[0]["notes"]
    out = []
    for rec in recs[1:]:
        if "counts" in rec:
            notes.append("counted per gradient (refbraid.backends.launch_count; the same on any "
                         "machine)")
            out += launch_results(rec["counts"], "gpu")
            continue
        name, shape, dtype, backend, ms, ratio, check = rec["row"]
        if str(check).startswith("FAILED: "):
            notes.append(f"FAILED {name} {shape} {dtype} {backend}: "
                         f"{check.removeprefix('FAILED: ')}")
            continue
        res = Result("gpu", f"{name} {shape} {dtype} {backend}",
                     {"case": name, "size": shape, "dtype": dtype, "backend": backend})
        res.add("median", ms, "ms").add("ratio", ratio, "×")
        if check != "-":
            res.add("check", float(check))
        out.append(res)
    return out


if __name__ == "__main__":
    worker_main(worker)
