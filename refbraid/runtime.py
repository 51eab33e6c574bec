"""Process-wide runtime settings that make timings repeatable: glibc malloc's thresholds.

glibc's malloc serves a request above its *mmap threshold* with fresh ``mmap`` pages (zeroed
by the kernel, one page fault per 4 KiB on first touch, returned with ``munmap`` on free) and
returns free memory at the top of the heap to the kernel above its *trim threshold*. Both start
at 128 KiB and are raised *dynamically*: freeing an mmapped block of size s sets the mmap
threshold to s and the trim threshold to 2 s. Serial backprop of TorchBraid's MNIST network
(N = 128, float64) allocates ≈ 465 MiB of states and caches per step and frees them at its end;
under the default thresholds the heap top is trimmed and the next step faults all of it in
again: 119,100 minor page faults and 338–375 ms CPU per step in a fresh process, against 0
faults and 130–138 ms with the thresholds pinned; after other work in the same process,
anywhere between (docs/scaling_overhead.md §5).

:func:`pin_allocator` fixes the thresholds once (``mallopt``; setting any of them switches the
dynamic adjustment off), so the allocator behaves the same whatever ran before:

    M_MMAP_THRESHOLD  = MMAP_THRESHOLD  (32 MiB, glibc's maximum on 64-bit: every state and
                                        per-level block of refbraid's networks comes from the heap)
    M_TRIM_THRESHOLD  = TRIM_THRESHOLD  (1 GiB: freed heap memory stays in the process)
    M_TOP_PAD         = TOP_PAD         (64 MiB: the heap grows in large steps)

It is a no-op (returns False) off glibc, and when ``REFBRAID_PIN_ALLOCATOR=0`` is set (the
opt-out); environment variables the user set (``MALLOC_MMAP_THRESHOLD_`` …) win over it. The
CLI's ``train`` and ``scale``, the MPI workers and the benchmarks call it once at start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

OPT_OUT_ENV = "REFBRAID_PIN_ALLOCATOR"
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 64 * 1024 * 1024

# mallopt parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: parameter → (mallopt number, value, the glibc environment variable that overrides it)
_SETTINGS = {
    "mmap_threshold": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
    "trim_threshold": (_M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
    "top_pad": (_M_TOP_PAD, TOP_PAD, "MALLOC_TOP_PAD_"),
}

_pinned: dict[str, int] | None = None


def _glibc_mallopt():
    """glibc's ``mallopt`` as a ctypes function, or None (not Linux/glibc, or not found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        gnu_get_libc_version = libc.gnu_get_libc_version  # only glibc has it (not musl)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    gnu_get_libc_version.restype = ctypes.c_char_p
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def pin_allocator(environ: dict[str, str] | None = None) -> bool:
    """Fix glibc malloc's mmap threshold, trim threshold and top pad (module docstring).

    Returns True when the thresholds are pinned (now or by an earlier call), False when it did
    nothing: not glibc, ``REFBRAID_PIN_ALLOCATOR=0``, or ``mallopt`` refused. Idempotent.
    """
    global _pinned
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _pinned is not None:
        return True
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    done = {}
    for name, (param, value, env_name) in _SETTINGS.items():
        if env_name in env:  # the user's own setting wins
            continue
        if mallopt(param, value) != 1:
            return False
        done[name] = value
    _pinned = done
    return True


def allocator_state() -> str:
    """One line for benchmark headers: what :func:`pin_allocator` did in this process."""
    if _pinned is None:
        return "malloc: glibc defaults (dynamic thresholds)" if _glibc_mallopt() else \
            "malloc: platform default"
    parts = [f"{k} {v >> 20} MiB" for k, v in _pinned.items()]
    return "malloc: pinned (" + ", ".join(parts) + ")"
