"""Compile recorded CUDA kernel signatures for real GPU targets (run as a script, in a process
without Numba's simulator).

    NUMBA_ENABLE_CUDASIM=0 python tests/cuda_compile/compile_targets.py RECORDS CC

RECORDS is a pickle of ``(module, name, made_by, argtypes, threads)`` tuples written by
tests/test_cuda_compile.py in the simulator: each is a kernel of refbraid's ``cuda`` backend,
the Numba types of one launch's arguments and the most threads per block it was launched
with. Each is compiled to PTX with ``numba.cuda.compile_ptx`` (NVIDIA's NVVM; no GPU and no
driver needed) for the compute capability CC (``7.5``, ``8.0``, ``9.0``), then assembled
for it by ptxas through nvJitLink (``-verbose``: the registers per thread and the static
shared memory per block it reports). A launch needs, per block, ⌈threads / 32⌉ warps of
⌈32 · registers / 256⌉ · 256 registers each within :data:`REGISTERS_PER_BLOCK`, and its
shared memory within :data:`SHARED_PER_BLOCK`; else the driver refuses it
(``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``). A kernel made by a factory
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
import re
import sys
import time

#: 32-bit registers one block may use, on compute capability 7.5, 8.0 and 9.0
REGISTERS_PER_BLOCK = 65536
#: bytes of static shared memory one block may use (more needs an opt-in the kernels lack)
SHARED_PER_BLOCK = 48 * 1024


def _kernel(module: str, name: str, made_by):
    if made_by is not None:
        mod, factory, args = made_by
        return getattr(importlib.import_module(mod), factory)(*args)
    return getattr(importlib.import_module(module), name)


def ptxas_resources(ptx: str, cc: tuple[int, int]) -> tuple[int, int]:
    """(registers per thread, static shared bytes per block) of the one kernel in ``ptx``,
    as ptxas assembles it for compute capability ``cc`` (nvJitLink's info log)."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    text = log.decode(errors="replace")
    registers = re.search(r"[Uu]sed (\d+) registers", text)
    shared = re.search(r"(\d+) bytes smem", text)
    if registers is None:
        raise RuntimeError(f"ptxas reported no register count:\n{text}")
    return int(registers.group(1)), int(shared.group(1)) if shared else 0


def registers_needed(registers: int, threads: int) -> int:
    """Registers a block of ``threads`` takes: whole warps, each allocated in units of 256."""
    per_warp = -(-32 * registers // 256) * 256
    return -(-threads // 32) * per_warp


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
            if need > REGISTERS_PER_BLOCK or shared > SHARED_PER_BLOCK:
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
