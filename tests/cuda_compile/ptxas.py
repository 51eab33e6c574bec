"""What ptxas says a compiled kernel takes, and whether a block of it launches (no GPU needed).

ptxas (NVIDIA's PTX assembler, here inside nvJitLink from PyPI: ``numba-cuda[cu13]``
brings it) reports, with ``-verbose``, the registers one thread of a kernel uses and the
static shared memory of one block. A block of T threads is allocated ⌈T / 32⌉ warps of
⌈32 · registers / 256⌉ · 256 registers (the allocation unit of compute capability 7.5, 8.0
and 9.0), which must fit in :data:`REGISTERS_PER_BLOCK`, and its shared memory in
:data:`SHARED_PER_BLOCK`; else the driver refuses the launch
(``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``). Used by compile_targets.py (the Numba kernels)
and tests/test_gpu_fused.py (the CuPy ones).
"""

from __future__ import annotations

import re

#: 32-bit registers one block may use, on compute capability 7.5, 8.0 and 9.0
REGISTERS_PER_BLOCK = 65536
#: bytes of static shared memory one block may use (more needs an opt-in the kernels lack)
SHARED_PER_BLOCK = 48 * 1024
#: threads one block may have
THREADS_PER_BLOCK = 1024


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


def block_fits(registers: int, shared: int, threads: int) -> bool:
    """Whether a block of ``threads`` of a kernel with these resources launches."""
    return (threads <= THREADS_PER_BLOCK and shared <= SHARED_PER_BLOCK
            and registers_needed(registers, threads) <= REGISTERS_PER_BLOCK)


def registers_needed(registers: int, threads: int) -> int:
    """Registers a block of ``threads`` takes: whole warps, each allocated in units of 256."""
    per_warp = -(-32 * registers // 256) * 256
    return -(-threads // 32) * per_warp
