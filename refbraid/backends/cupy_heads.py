"""The attention's head split and merge on CuPy in one launch each (``cupy`` backend).

:func:`refbraid.backends.reference.split_heads` is one copy per block of the stacked
projection (q, k and v: three launches), :func:`~refbraid.backends.reference.merge_heads` one
per block and a concatenation (dq, dk and dv: four). Here one thread per output element::

    split_heads_rows  out[p, b·nh + j, l, i] = a[b·L + l, p·E + j·d + i]
    merge_heads_rows  out[b·L + l, p·E + j·d + i] = block_p[b·nh + j, l, i]

for the P ≤ 3 blocks at once: pure data movement, so the results are the reference's bit for
bit. :func:`split_heads` returns P contiguous views of one (P, B·nh, L, d) buffer. Off a GPU
(the CuPy stand-in) each runs the reference and reports one launch to the launch counter
(:mod:`.cupy_raw`); the CUDA source compiles with NVRTC for sm_75, sm_80 and sm_90
(tests/test_gpu_fused.py).
"""

from __future__ import annotations

import numpy as np

from .cupy_raw import compiled, on_host, real_cupy

THREADS = 256  # threads per block
MAX_GRID = 65535  # blocks per launch at most; a grid-stride loop covers the rest
MAX_BLOCKS = 3  # merge_heads_rows takes up to three blocks (q, k, v)

_SOURCES = {
    "split_heads_rows": """
extern "C" __global__ void split_heads_rows(const T* a, T* out, long long B, long long L,
    long long nh, long long d, long long P) {
  long long n = P * B * nh * L * d;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n;
       t += (long long)gridDim.x * blockDim.x) {
    long long i = t % d, l = (t / d) % L, g = (t / (d * L)) % (B * nh), p = t / (d * L * B * nh);
    long long b = g / nh, j = g % nh, E = nh * d;
    out[t] = a[(b * L + l) * (P * E) + p * E + j * d + i];
  }
}
""",
    "merge_heads_rows": """
extern "C" __global__ void merge_heads_rows(const T* a0, const T* a1, const T* a2, T* out,
    long long B, long long L, long long nh, long long d, long long P) {
  long long E = nh * d, n = B * L * P * E;
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n;
       t += (long long)gridDim.x * blockDim.x) {
    long long c = t % (P * E), r = t / (P * E);
    long long p = c / E, j = (c % E) / d, i = c % d, b = r / L, l = r % L;
    const T* src = p == 0 ? a0 : (p == 1 ? a1 : a2);
    out[t] = src[((b * nh + j) * L + l) * d + i];
  }
}
""",
}

#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


def cuda_source(name: str, T: str = "double") -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``."""
    return f"typedef {T} T;\n{_SOURCES[name]}"


def _grid(n: int) -> tuple[tuple[int], tuple[int]]:
    return (max(1, min((n + THREADS - 1) // THREADS, MAX_GRID)),), (THREADS,)


def split_heads(a, B: int, L: int, heads: int, parts: int = 1):
    """reference.split_heads in one launch: ``parts`` arrays (B·heads, L, d)."""
    from . import reference

    if not real_cupy(a):
        out = on_host("split_heads_rows",
                      lambda x: reference.split_heads(x, B, L, heads, parts), a)
        return out if parts > 1 else (out,)
    import cupy  # pragma: no cover - needs a GPU

    a = cupy.ascontiguousarray(a)
    d = a.shape[-1] // (parts * heads)
    out = cupy.empty((parts, B * heads, L, d), dtype=a.dtype)
    compiled(cuda_source, "split_heads_rows", a.dtype)(*_grid(out.size), (
        a, out, np.int64(B), np.int64(L), np.int64(heads), np.int64(d), np.int64(parts)))
    return tuple(out[p] for p in range(parts))


def merge_heads(blocks, B: int, heads: int):
    """reference.merge_heads in one launch: (B·L, P·E) from P ≤ 3 arrays (B·heads, L, d)."""
    from . import reference

    if not real_cupy(blocks[0]):
        return on_host("merge_heads_rows",
                       lambda *bs: reference.merge_heads(list(bs), B, heads), *blocks)
    import cupy  # pragma: no cover - needs a GPU

    blocks = [cupy.ascontiguousarray(b) for b in blocks]
    P = len(blocks)
    _, L, d = blocks[0].shape
    out = cupy.empty((B * L, P * heads * d), dtype=blocks[0].dtype)
    a0, a1, a2 = (blocks + [blocks[0]] * MAX_BLOCKS)[:MAX_BLOCKS]  # unused pointers unread
    compiled(cuda_source, "merge_heads_rows", out.dtype)(*_grid(out.size), (
        a0, a1, a2, out, np.int64(B), np.int64(L), np.int64(heads), np.int64(d), np.int64(P)))
    return out
