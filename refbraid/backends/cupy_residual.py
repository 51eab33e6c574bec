"""The last pass of MGRIT's C-point residual and its ``Σ r²``, in one launch on ``cupy``.

The batched cycle makes the residual ``r = (P u)[C] − u[C]`` by letting the step write
``(P u)[C]`` into r (:func:`refbraid.mgrit.batched.residual_at`), then subtracting ``u[C]``
in place; the solver then reduces ``Σ r²`` for the residual norm, which as array operations
is a square into a temporary of r's size and a sum over it. :func:`subtract_sum_squares`
makes both in one pass over r::

    r[i] = r[i] − u[i]            (rounded to r's dtype, as the subtraction alone)
    Σ_i r[i]²                     (in double, over the subtracted values)

On a GPU, one ``RawKernel`` launch of G blocks: each block sums a fixed grid-stride share of
the elements (a block tree, :data:`refbraid.backends.cupy_raw.BLOCK_REDUCTIONS`) into its
partial sum; the last block to finish — a counter incremented atomically after a memory
fence, reset by that block — adds the G partials in a fixed order. Which block finishes last
varies; the order of every addition does not, so the sum is the same bits at every run (not
those of CuPy's ``sum``, which adds in another order). ``u`` may be rows of MGRIT's iterate
(every m-th state) and is read in place by offset and row stride. Elsewhere (NumPy arrays, the
CuPy stand-in) the subtraction into r and NumPy's sum of squares in double, reported as one
launch: the same r, a sum equal to round-off.

Shape legend: r (c, *S) contiguous, u (c, *S) (rows of a C-contiguous base, or any array).
"""

from __future__ import annotations

import math

import numpy as np

from .cupy_raw import BLOCK_REDUCTIONS, compiled, on_host_into, read_by_rows, real_cupy, row_args

#: threads of a block, and the most blocks one launch uses (each sums ≥ THREADS elements)
THREADS = 256
MAX_BLOCKS = 1024
#: the kernel of this module (the compile check walks it)
KERNELS = ("residual_sum_squares",)
#: per device, the kernel's counter of finished blocks (0 between launches; the launches of
#: one stream follow each other, as refbraid's do)
_COUNTERS: dict = {}


def cuda_source(name: str, T: str) -> str:
    """The kernel's CUDA C for element type ``T`` (``float`` or ``double``)."""
    return f"""typedef {T} T;
{BLOCK_REDUCTIONS}
extern "C" __global__ void {name}(T* r, const T* u, long long u_off, long long u_stride,
                                  long long row, long long n, double* partial,
                                  unsigned int* done, double* total) {{
  __shared__ double buf[{THREADS}];
  __shared__ bool last;
  double acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {{
    T v = r[i] - u[u_off + (i / row) * u_stride + i % row];
    r[i] = v;
    acc += (double)v * (double)v;
  }}
  double block = block_sum(buf, acc);
  if (threadIdx.x == 0) {{
    partial[blockIdx.x] = block;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }}
  __syncthreads();
  if (!last) return;
  double mine = 0;  // volatile: the other blocks' partial sums from memory, not a cache
  const volatile double* sums = partial;
  for (long long b = threadIdx.x; b < gridDim.x; b += blockDim.x) mine += sums[b];
  double sum = block_sum(buf, mine);
  if (threadIdx.x == 0) {{
    total[0] = sum;
    *done = 0;
  }}
}}
"""


def _on_host(r, u):
    d = np.subtract(r, u)
    return d, np.asarray(np.sum(np.square(d, dtype=np.float64)))


def subtract_sum_squares(r, u):
    """``r −= u`` in place and ``Σ r²`` of the result: a 0-d float64 array where r lives
    (module docstring). r must be contiguous; u of r's shape and dtype."""
    if not real_cupy(r):  # after the copy of u the kernel's branch makes (row_args)
        (u,) = read_by_rows((u, r.ndim - 1))
        _, total = on_host_into("residual_sum_squares", _on_host, (r, None), r, u)
        return total
    import cupy  # pragma: no cover - needs a GPU (the emulator runs this branch)

    n = r.size
    item = r.shape[1:]
    base, offset, stride = row_args(u, len(item))
    blocks = max(1, min(MAX_BLOCKS, -(-n // THREADS)))
    partial = cupy.empty(blocks, dtype=np.float64)
    total = cupy.empty((), dtype=np.float64)
    key = (id(cupy), cupy.cuda.Device().id)
    done = _COUNTERS.get(key)
    if done is None:  # zero once: the last block of every launch sets it back to 0
        done = _COUNTERS[key] = cupy.zeros(1, dtype=np.uint32)
    compiled(cuda_source, "residual_sum_squares", r.dtype)((blocks,), (THREADS,), (
        r, base, np.int64(offset), np.int64(stride), np.int64(max(math.prod(item), 1)),
        np.int64(n), partial, done, total))
    return total
