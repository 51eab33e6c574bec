"""A running sum over stacked rows, in their order: ``acc += rows[0]; acc += rows[1]; …``.

A weight shared by every step (the GRU cell's, over the positions of a sequence) has the
gradient ``Σ_k g_k``; refbraid adds the terms in the order of k so that a batched gradient
has the bits of the per-step one. As array operations that is one launch per term on a GPU
(k dependent launches, each on the critical path). :func:`add_rows_in_order` does it in one
pass: each element of ``acc`` runs through the k rows in order, with the same additions in
the array's dtype, so the result is the loop's bit for bit::

    acc[i] = (…((acc[i] + rows[0][i]) + rows[1][i]) + …) + rows[k−1][i]

On CuPy arrays a ``RawKernel`` (a thread per element); on the CuPy stand-in that loop in
NumPy, reported as one launch; elsewhere the loop itself.

Shape legend: acc (*W), rows (k, *W) of acc's dtype.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import is_cupy_array

from .cupy_raw import compiled, on_host_into, real_cupy

THREADS = 256
#: the kernel of this module (the compile check walks it)
KERNELS = ("add_rows_in_order",)


def cuda_source(name: str, T: str) -> str:
    """The kernel's CUDA C for element type ``T``."""
    return f"""typedef {T} T;
extern "C" __global__ void {name}(T* acc, const T* rows, long long k, long long n) {{
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  T a = acc[i];
  for (long long j = 0; j < k; ++j) a = a + rows[j * n + i];
  acc[i] = a;
}}
"""


def _add_each(acc, rows):
    """The loop itself, in place; returns ``acc``."""
    for j in range(rows.shape[0]):
        acc += rows[j, ...]
    return acc


def add_rows_in_order(acc, rows) -> None:
    """``acc += rows[j]`` for j = 0, 1, …, k−1, in place (module docstring)."""
    fused = (is_cupy_array(acc) and is_cupy_array(rows) and acc.dtype == rows.dtype
             and acc.dtype.kind == "f" and tuple(rows.shape[1:]) == tuple(acc.shape))
    if not fused or (real_cupy(acc) and not acc.flags.c_contiguous):
        _add_each(acc, rows)
    elif not real_cupy(acc):
        on_host_into("add_rows_in_order", lambda a, r: _add_each(a.copy(), r), (acc,), acc,
                     rows)
    else:  # pragma: no cover - needs a GPU (the emulator runs this branch)
        import cupy

        rows = cupy.ascontiguousarray(rows)
        n = acc.size
        if n and rows.shape[0]:
            compiled(cuda_source, "add_rows_in_order", acc.dtype)(
                (-(-n // THREADS),), (THREADS,),
                (acc, rows, np.int64(rows.shape[0]), np.int64(n)))
