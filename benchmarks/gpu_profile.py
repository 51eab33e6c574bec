"""Where a whole gradient's time goes on the host, per GPU backend: a cProfile of it.

    NUMBA_ENABLE_CUDASIM=0 python -m benchmarks.gpu_profile OUTDIR           # on a GPU
    python -m benchmarks.gpu_profile OUTDIR --simulator                     # no GPU: tiny

On one GPU a gradient of refbraid's is launch-bound: its time divided by the launches it
issues (counted without a GPU, ``python -m benchmarks quick counts``) was 30-100 µs per
launch on an H200, many times what the GPU needs to run most of those kernels. That time is
spent on the host, in refbraid's Python, in CuPy's or Numba's launch paths, or waiting at
synchronisations; a profile says which. For each backend (``cupy``, ``cuda``) and each
gradient (``serial`` backprop, layer-parallel ``lp-batched`` with TorchBraid's settings) of
the first case of :data:`benchmarks.gpu_cases.GRADIENT_CASES` (the dense ResNet, N = 64, C = 256,
B = 1024, float32), after two warm-up gradients, :data:`PROFILED` gradients run under cProfile
with a device synchronisation after each; ``OUTDIR/profile-<backend>-<mode>.txt`` gets the
time per gradient with and without the profiler, what the GPU itself ran in one gradient
(kernels, copies and their summed GPU time, read by PyTorch's profiler when PyTorch has
CUDA: against the wall time, how idle the GPU is; against the counted launches, whether the
count is what a GPU runs), the functions with the most own time and the most cumulative
time. In simulator mode the same runs at the tiny case on the simulator and
the strict stand-in (which checks this script, not speeds).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
import traceback
from pathlib import Path

import numpy as np

PROFILED = 5  #: gradients per profile (on the simulator 1, after 1 warm-up instead of 2)
TOP = 30  #: functions listed per ordering


def device_activity(one) -> str:
    """What the GPU itself ran in one call of ``one``, read by PyTorch's profiler (CUPTI sees
    every kernel of the process, CuPy's and Numba's included): the kernels and copies it
    ran and their summed time; with the wall time beside it, how busy the GPU was, and with
    the counted launches, whether the count is what a GPU runs."""
    try:
        import torch
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return "the GPU's own activity: not read (no PyTorch)"
    if not torch.cuda.is_available():
        return "the GPU's own activity: not read (PyTorch sees no CUDA device)"
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            one()
        events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        copies = [e for e in events if e.name.lower().startswith(("memcpy", "memset"))]
        if not events:
            return ("the GPU's own activity: the profiler listed no device event (it may not "
                    "see kernels launched outside PyTorch here)")
        busy = sum(e.time_range.elapsed_us() for e in events) / 1e3
        return (f"the GPU's own activity in one gradient: {len(events) - len(copies)} kernels "
                f"and {len(copies)} copies/sets, {busy:.2f} ms of GPU time in all")
    except Exception as err:  # a profiler that cannot read the device: said, not fatal
        return f"the GPU's own activity: not read ({type(err).__name__}: {err})"


def profile_one(bname: str, mode: str, case, dtype, simulator: bool = False) -> str:
    """The report of one backend and mode (see the module docstring)."""
    from benchmarks.gpu_cases import gradient_case, gradient_settings
    from benchmarks.gpu_timing import backend, median_ms, synchronise
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient, sequential_gradient

    net, params, x, y, size = gradient_case(*case, dtype)
    bk = backend(bname)
    p, xb, yb = to_backend(params, bk), bk.asarray(x), bk.asarray(y)
    grad = sequential_gradient(net, bk) if mode == "serial" else \
        mgrit_gradient(net, gradient_settings(simulator), bk)  # as benchmarks.gpu times them
    warmup, profiled = (1, 1) if simulator else (2, PROFILED)

    def gradient():
        with sweeps_batched(mode == "lp-batched"):
            grad(p, xb, yb)

    def one():
        gradient()
        synchronise(bname)

    plain = median_ms(gradient, bname, warmup, profiled) / 1e3  # synchronised after each
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(profiled):
        one()
    prof.disable()
    under = (time.perf_counter() - t0) / profiled
    text = io.StringIO()
    text.write(f"{bname} {mode}: {size} {np.dtype(dtype).name}; per gradient {plain * 1e3:.2f} "
               f"ms (median), {under * 1e3:.2f} ms under the profiler (mean of {profiled})\n")
    text.write(device_activity(one) + "\n")
    for order in ("tottime", "cumulative"):
        text.write(f"\n--- the {TOP} functions with the most {order} time, per "
                   f"{profiled} gradients\n")
        pstats.Stats(prof, stream=text).strip_dirs().sort_stats(order).print_stats(TOP)
    return text.getvalue()


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2 or (len(argv) == 2 and argv[1] != "--simulator"):
        print("usage: python -m benchmarks.gpu_profile OUTDIR [--simulator]", file=sys.stderr)
        return 2
    out, simulator = Path(argv[0]), len(argv) == 2
    # before Numba is first imported (by refbraid): the simulator, or the real GPU
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if simulator else "0"
    from benchmarks.gpu import gpu_backends
    from benchmarks.gpu_cases import GRADIENT_CASES, TINY_GRADIENT_CASES

    out.mkdir(parents=True, exist_ok=True)
    backends = [b for b in gpu_backends(simulator) if b != "cuda-host"]
    if not backends:
        print("no GPU backend here (see `python -m benchmarks tiny gpu`)", file=sys.stderr)
        return 1
    case = (TINY_GRADIENT_CASES if simulator else GRADIENT_CASES)[0]
    failed = 0
    for bname in backends:
        for mode in ("serial", "lp-batched"):
            try:
                report = profile_one(bname, mode, case, np.float32, simulator)
            except Exception:  # the other backends and modes go on; the exit status says so
                report = f"FAILED {bname} {mode}:\n{traceback.format_exc()}"
                failed = 1
            (out / f"profile-{bname}-{mode}.txt").write_text(report)
            print(report.splitlines()[0], flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
