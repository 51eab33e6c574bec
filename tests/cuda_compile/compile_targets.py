"""Compile recorded CUDA kernel signatures for real GPU targets (run as a script, in a process
without Numba's simulator).

    NUMBA_ENABLE_CUDASIM=0 python tests/cuda_compile/compile_targets.py RECORDS CC

RECORDS is a pickle of ``(module, name, made_by, argtypes, threads)`` tuples written by
tests/test_cuda_compile.py in the simulator: each is a kernel of refbraid's ``cuda`` backend,
the Numba types of one launch's arguments and the most threads per block it was launched
with. Each is compiled to PTX with ``numba.cuda.compile_ptx`` (NVIDIA's NVVM; no GPU and no
driver needed) for the compute capability CC (``7.5``, ``8.0``, ``9.0``), then assembled
for it by ptxas, whose registers and shared memory must fit the recorded block
(tests/cuda_compile/ptxas.py). A kernel made by a factory
(:func:`refbraid.backends.numba_cuda.kernel_factory`) is rebuilt from ``made_by``.

numba-cuda compiles a *device* function (``cuda.jit(device=True)``, called by a kernel) for
the current GPU's compute capability, and asks the driver for it; without a GPU that is a
CudaSupportError. This script answers the question with the target being compiled for
(:class:`_Target`), so one process compiles for one target at a time (device functions are
cached per signature, not per target): tests/test_cuda_compile.py runs one per target.

Prints one line per failure and two summaries ("compiled", "launchable"); exit status 0
when all compiled and fit their blocks, 1 when any did not, 3 when NVVM or nvJitLink is not
installed (``pip install "numba-cuda[cu13]"``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import time

from ptxas import (
    REGISTERS_PER_BLOCK,
    SHARED_PER_BLOCK,
    block_fits,
    ptxas_resources,
    registers_needed,
)


def _kernel(module: str, name: str, made_by):
    if made_by is not None:
        mod, factory, args = made_by
        return getattr(importlib.import_module(mod), factory)(*args)
    return getattr(importlib.import_module(module), name)


class _Target:
    """Stands in for ``get_current_device()``: the compute capability being compiled for."""

    def __init__(self, cc: tuple[int, int]):
        self.compute_capability = cc


def main(argv: list[str]) -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("compile_targets: run with NUMBA_ENABLE_CUDASIM=0", file=sys.stderr)
        return 2
    from numba import cuda

    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
        from cuda.bindings import nvjitlink

        nvjitlink.version()
    except Exception as err:
        print(f"compile_targets: NVVM or nvJitLink is not available ({type(err).__name__}: "
              f'{err}); pip install "numba-cuda[cu13]"', file=sys.stderr)
        return 3
    with open(argv[0], "rb") as f:
        records = pickle.load(f)
    ccs = [tuple(int(p) for p in cc.split(".")) for cc in argv[1:]]
    if len(ccs) != 1:
        print("compile_targets: one target per process (CC)", file=sys.stderr)
        return 2
    from numba.cuda import dispatcher

    dispatcher.get_current_device = lambda: _Target(ccs[0])
    failed = unfit = 0
    most = (0, "")
    t0 = time.perf_counter()
    for module, name, made_by, argtypes, threads in records:
        pyfunc = _kernel(module, name, made_by).py_func
        label = f"{module}.{name}" + (f" made_by {made_by[1]}{made_by[2]}" if made_by else "")
        for cc in ccs:
            where = f"{label} cc={cc[0]}.{cc[1]} {argtypes}"
            try:
                ptx, _ = cuda.compile_ptx(pyfunc, tuple(argtypes), cc=cc)
            except Exception as err:
                failed += 1
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                print(f"FAILED {where}: {type(err).__name__}: {first}")
                continue
            registers, shared = ptxas_resources(ptx, cc)
            most = max(most, (registers, label))
            need = registers_needed(registers, threads)
            if not block_fits(registers, shared, threads):
                unfit += 1
                print(f"DOES NOT LAUNCH {where}: {threads} threads a block × {registers} "
                      f"registers = {need} registers (at most {REGISTERS_PER_BLOCK}), "
                      f"{shared} bytes of shared memory (at most {SHARED_PER_BLOCK})")
    total = len(records) * len(ccs)
    print(f"compiled {total - failed}/{total} (kernel, signature, target) in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"launchable {total - failed - unfit}/{total} at their largest blocks; the most "
          f"registers a thread: {most[0]} ({most[1]})")
    return 1 if failed or unfit else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
