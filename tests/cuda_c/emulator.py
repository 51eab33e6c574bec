"""Run the ``cupy`` backend's CUDA C kernels on the CPU: a stand-in that shares their source.

The CuPy stand-in runs the reference in a hand-written kernel's place, so it proves nothing
about the kernel's own CUDA C. This emulator compiles that very source as C++ (g++, C++20)
and runs it: every block in turn, every thread of a block a host thread, ``__syncthreads``
a ``std::barrier`` (a thread that returns drops out of it), ``__shared__`` memory one static
array per kernel (blocks run one at a time). :func:`fake_cupy` then puts a ``cupy`` module
into ``sys.modules`` whose arrays are NumPy's and whose ``RawKernel`` is this emulator, so
the backend's GPU branch — array preparation, grid, argument order, kernel — runs end to end.

What it shares with a GPU: the kernel's arithmetic, indexing, block reductions and barriers,
and the Python that launches it. What it cannot see: warps and their scheduling, memory
coalescing, races a barrier would not order (threads here interleave differently), CUDA's
math library (its exp/tanh/erf round differently from glibc's), fused multiply-adds the
GPU compiler forms, launch limits, streams.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using namespace std;
struct Dim3 { long long x, y, z; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* emulated_barrier;
#define __global__
#define __device__ static
#define __shared__ static
#define __syncthreads() emulated_barrier->arrive_and_wait()
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
"""

_LAUNCHER = r"""
extern "C" void emulate_{name}(long long gx, long long gy, long long bx, void** args) {{
  blockDim = {{bx, 1, 1}};
  gridDim = {{gx, gy, 1}};
  for (long long by = 0; by < gy; ++by)
    for (long long b = 0; b < gx; ++b) {{
      blockIdx = {{b, by, 0}};
      std::barrier<> bar(bx);
      emulated_barrier = &bar;
      std::vector<std::thread> threads;
      for (long long t = 0; t < bx; ++t)
        threads.emplace_back([&, t] {{
          threadIdx = {{t, 0, 0}};
          {name}({call});
          bar.arrive_and_drop();
        }});
      for (auto& th : threads) th.join();
    }}
}}
"""


def available() -> bool:
    """Whether a C++20 compiler (g++) is at hand."""
    return shutil.which("g++") is not None


def _parameters(source: str, name: str) -> list[str]:
    match = re.search(rf"void\s+{name}\s*\(([^)]*)\)", source)
    if match is None:
        raise ValueError(f"kernel {name!r} not found in its source")
    return [" ".join(p.split()) for p in match.group(1).split(",")]


def _argument(i: int, param: str) -> str:
    ctype = param.rsplit(" ", 1)[0] if "*" not in param else param[: param.rindex("*") + 1]
    return f"({ctype})args[{i}]" if "*" in param else f"*({ctype}*)args[{i}]"


_LIBRARIES: dict[str, ctypes.CDLL] = {}


def _library(source: str) -> ctypes.CDLL:
    """The source's every ``__global__`` kernel, compiled once (one shared library per
    source text: give several kernels in one source to compile them together)."""
    names = re.findall(r'__global__\s+void\s+(\w+)\s*\(', source)
    launchers = "".join(_LAUNCHER.format(name=n, call=", ".join(
        _argument(i, p) for i, p in enumerate(_parameters(source, n)))) for n in names)
    code = _PRELUDE + source.replace('extern "C" __global__', "") + launchers
    name = names[0] if names else "none"
    key = hashlib.sha256(code.encode()).hexdigest()[:16]
    if key not in _LIBRARIES:
        folder = Path(tempfile.gettempdir()) / "refbraid-cuda-c-emulator"
        folder.mkdir(exist_ok=True)
        lib = folder / f"{name}-{key}.so"
        if not lib.exists():
            src = folder / f"{name}-{key}.cpp"
            src.write_text(code)
            tmp = folder / f"{name}-{key}.{os.getpid()}.so"
            subprocess.run(["g++", "-std=c++20", "-O0", "-shared", "-fPIC", "-pthread",
                            "-w", "-o", str(tmp), str(src)], check=True,
                           capture_output=True, text=True)
            tmp.replace(lib)  # atomic: parallel test workers may race here
        _LIBRARIES[key] = ctypes.CDLL(str(lib))
    return _LIBRARIES[key]


class RawKernel:
    """``cupy.RawKernel(source, name)`` emulated: called with ``(grid, block, args)``, args
    NumPy arrays (device memory) and NumPy scalars (passed by value, their C type)."""

    def __init__(self, source: str, name: str):
        self.source, self.name = source, name
        self._lib = _library(source)

    def __call__(self, grid, block, args) -> None:
        grid, block = tuple(grid) + (1,) * (2 - len(grid)), tuple(block)
        if len(block) != 1 or grid[1:] != grid[1:2]:
            raise ValueError("the emulator launches 1-D blocks on a 1-D or 2-D grid")
        keep, pointers = [], []
        for a in args:
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError("kernel arrays must be C-contiguous")
                keep.append(a)
                pointers.append(a.ctypes.data)
            elif isinstance(a, np.generic):
                box = np.array(a)
                keep.append(box)
                pointers.append(box.ctypes.data)
            else:
                raise TypeError(f"a kernel argument must be an array or a NumPy scalar, "
                                f"got {type(a).__name__}")
        argv = (ctypes.c_void_p * len(pointers))(*pointers)
        getattr(self._lib, f"emulate_{self.name}")(
            ctypes.c_longlong(grid[0]), ctypes.c_longlong(grid[1]),
            ctypes.c_longlong(block[0]), argv)


@contextlib.contextmanager
def fake_cupy() -> Iterator[types.ModuleType]:
    """Within the block ``import cupy`` is NumPy with the emulated ``RawKernel``: the
    ``cupy`` backend's GPU branches run on NumPy arrays."""
    fake = types.ModuleType("cupy")
    for name in ("ascontiguousarray", "empty", "empty_like", "zeros", "bool_", "float32",
                 "float64", "stack", "asarray"):
        setattr(fake, name, getattr(np, name))
    fake.ndarray = np.ndarray
    fake.RawKernel = RawKernel
    fake.ElementwiseKernel = None  # present, as on CuPy (cupy_fused's test for a real CuPy)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = fake
    try:
        yield fake
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
