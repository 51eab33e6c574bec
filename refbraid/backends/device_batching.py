"""Where MGRIT's batched sweeps pay on a GPU backend (``cuda``, ``cupy``): decided by counts.

On the CPU backends a step layer's ``batched_sweeps_pay`` says whether one call per sweep beat
one call per interval *in time* (docs/batched.md: cache effects decide it there). On a GPU
small steps are bound by launches (docs/gpu_layer_parallel.md), so the question is how many
launches the host issues per gradient, which :mod:`refbraid.backends.launch_count` counts
without a GPU. One layer-parallel gradient (TorchBraid's settings; ``python -m
benchmarks quick counts [-o gpu_backend=cuda]``, the table in docs/gpu_layer_parallel.md)
on ``cupy`` issues 5–17× fewer launches with batched sweeps than with per-step ones (dense,
conv, transformer, GRU at N = 64 and 256; 3.0–5.4× on ``cuda`` at N = 64). The dependency
depth (critical path) is about the same either way: batching does not shorten the chain,
it issues the independent intervals' launches together.
Batched sweeps are on where they cut launches (:data:`BATCHED_ON_DEVICE`), and one
sweep is one launch set: the CPU's cache-sized chunks of the transformer and GRU batched calls
do not apply on a device (:func:`chunk_rows`). On ``cuda`` the batched convolution is one
Numba kernel per pass over all k intervals (:mod:`refbraid.backends.numba_cuda_conv_batched`),
as the per-step convolution is one per interval (before it, the batched conv step ran the
array-API reference there, nine stencil offsets of copies and GEMMs, 1,399 → 1,873 launches).
``tests/test_launch_count.py`` checks the rule on the counting device for each entry, so a
change that breaks it fails there. With a GPU at hand, the ``gpu`` suite's
(``python -m benchmarks quick gpu``) ``LP per-step`` / ``LP batched`` rows time the same comparison.

A batched sweep gathers its rows (the layers' weights, the states, MGRIT's C-points) with
host index arrays, and on a level whose intervals differ takes an array of step sizes: each
a small host→device copy, the same ones in every cycle of a solve and in every gradient.
:class:`DeviceCopies` keeps one device copy per distinct content (and device):
:func:`index_on` and :func:`copied_once` answer from the cache made current by
:func:`copies_cached` (``training.gradients.mgrit_gradient`` makes one per gradient
function, so each index array of each level's interval layout crosses once for the whole
training run) and copy afresh outside one. Likewise the sweeps' gathers of the layers'
weights (the same rows in every cycle, and the weights do not change during one gradient):
within :func:`gathers_cached` (one gradient call on a GPU backend) each distinct gather is
made once (:func:`gathered_once`), at the price of keeping the gathered stacks (about two
copies of the stacked weights) until the call ends. Where the backend's kernels read strided
rows in place (:data:`WEIGHT_ROWS_IN_PLACE`: ``cupy``'s dense and conv steps), a sweep's
evenly spaced layers are a view of the stacked weights instead, no gather and no index array
(:func:`weight_rows`; the sweeps that run downwards view one reversed copy per weight).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

#: The GPU backends (one launch per array operation or kernel).
DEVICE_BACKENDS = ("cuda", "cupy")

#: Whether each GPU backend's MGRIT sweeps take batched steps at all
#: (:func:`refbraid.backends.batched_sweeps_on`).
SWITCHED_ON = {"cuda": True, "cupy": True}

#: Per GPU backend, the step layers (class names) whose batched sweeps are on: the launch
#: counts in the module docstring.
BATCHED_ON_DEVICE = {
    "cupy": frozenset({"DenseStep", "ConvStep", "EncoderStep", "GRUCell"}),
    "cuda": frozenset({"DenseStep", "ConvStep", "EncoderStep", "GRUCell"}),
}


def on_device(bk) -> bool:
    """True for a GPU backend (``bk`` a Backend, or None for a plain call)."""
    return getattr(bk, "name", None) in DEVICE_BACKENDS


def gathers(bk) -> bool:
    """Whether ``bk``'s arrays take integer-array indices, which batched sweeps gather rows
    with (CuPy, NumPy, the counting device; not array-api-strict, the device of the ``cuda``
    backend in Numba's simulator, where MGRIT's cycle runs per step anyway)."""
    return not str(getattr(bk.xp, "__name__", "")).startswith("array_api_strict")


def pays(layer, bk) -> bool:
    """Whether MGRIT's sweeps of ``layer`` should be batched on GPU backend ``bk``."""
    return (on_device(bk) and type(layer).__name__ in BATCHED_ON_DEVICE[bk.name]
            and gathers(bk))


def chunk_rows(bk, cpu_rows: int, k: int) -> int:
    """Rows per batched call: the CPU's cache-sized ``cpu_rows``, or all ``k`` rows on a GPU
    backend (one launch set per sweep)."""
    return max(int(k), 1) if on_device(bk) else cpu_rows


_FORCED: list[bool] = []  # sweeps_batched's stack


@contextmanager
def sweeps_batched(on: bool) -> Iterator[None]:
    """``with sweeps_batched(True):`` — :func:`refbraid.propagators.batchable` answers
    ``on`` for every step layer with a batched form, whatever the backend's rule (benchmarks
    compare the two paths)."""
    _FORCED.append(bool(on))
    try:
        yield
    finally:
        _FORCED.pop()


def batches(layer, bk, sweeps_on: bool) -> bool:
    """:func:`refbraid.propagators.batchable` for a layer with a batched form: what
    :func:`sweeps_batched` forces; else, where the backend's batched sweeps are on
    (``sweeps_on``), the launch counts on a GPU backend (:func:`pays`) and the layer's
    measured ``batched_sweeps_pay`` elsewhere."""
    if _FORCED:
        return _FORCED[-1]
    if not sweeps_on:
        return False
    return pays(layer, bk) if on_device(bk) else bool(getattr(layer, "batched_sweeps_pay", False))


# ----------------------------------------------------------------------------- host→device copies
class DeviceCopies:
    """One device copy per distinct host array (content, dtype, shape) and device; the copies
    are read only (index arrays, step sizes), so sharing them is safe. ``limit`` bounds the
    entries (oldest dropped first)."""

    def __init__(self, limit: int = 4096):
        self.limit = int(limit)
        self._copies: dict[tuple, Any] = {}

    def __len__(self) -> int:
        return len(self._copies)

    def get(self, where, values: np.ndarray, make: Callable[[np.ndarray], Any]):
        """``make(values)`` (a host→device copy to ``where``) the first time, the same device
        array after."""
        key = (where, values.dtype.str, values.shape, values.tobytes())
        found = self._copies.get(key)
        if found is None:
            if len(self._copies) >= self.limit:
                self._copies.pop(next(iter(self._copies)))
            found = self._copies[key] = make(values)
        return found


_COPIES: list[DeviceCopies] = []  # copies_cached's stack


@contextmanager
def copies_cached(cache: DeviceCopies) -> Iterator[DeviceCopies]:
    """``with copies_cached(cache):`` — :func:`copied_once` and :func:`index_on` answer from
    ``cache`` within the block."""
    _COPIES.append(cache)
    try:
        yield cache
    finally:
        _COPIES.pop()


def copied_once(where, values: np.ndarray, make: Callable[[np.ndarray], Any]):
    """``make(values)``: from the current :class:`DeviceCopies` (:func:`copies_cached`), else
    made afresh. ``where`` names the device (hashable)."""
    values = np.ascontiguousarray(values)
    if not _COPIES:
        return make(values)
    return _COPIES[-1].get(where, values, make)


def device_of(like) -> tuple:
    """A hashable name of the device array ``like`` lives on (library and device)."""
    return (type(like).__module__, repr(getattr(like, "device", None)))


def values_on(like, values, dtype):
    """Host ``values`` (step sizes) as an array of ``dtype`` (``like``'s kind of dtype) where
    ``like`` lives, copied once per content within :func:`copies_cached`."""
    from .dtypes import numpy_dtype
    from .portable import asarray_on

    host = np.asarray(values, dtype=numpy_dtype(dtype))
    return copied_once(device_of(like), host, lambda v: asarray_on(like, v))


def index_on(like, positions):
    """``positions`` (host integers) as an int64 index array where ``like`` lives, copied
    once per content within :func:`copies_cached`."""
    from .portable import asarray_on

    idx = np.asarray(positions, dtype=np.int64)
    return copied_once(device_of(like), idx, lambda v: asarray_on(like, v))


_GATHERS: list[dict] = []  # gathers_cached's stack


@contextmanager
def gathers_cached(on: bool = True) -> Iterator[None]:
    """``with gathers_cached():`` — :func:`gathered_once` keeps its gathers until the block
    ends (the arrays gathered from must not change inside it); ``on=False``: a no-op."""
    _GATHERS.append({} if on else None)
    try:
        yield
    finally:
        _GATHERS.pop()


#: Per GPU backend and step layer (class name), the stacked weights whose batched kernels read
#: evenly spaced rows in place (strides): a sweep's weights are then a view, not a gather
#: (:func:`weight_rows`). cupy's dense step (its strided-batched GEMMs, element-wise bias) and
#: conv step (the direct kernels' row offset and stride); not the transformer's layer norms or
#: the GRU's kernels, which copy a strided operand at every call (launch counts:
#: docs/gpu_layer_parallel.md), nor any of ``cuda``'s: on a GPU its kernel arguments are made
#: contiguous first (``numba_cuda_memory.KernelCall.arg``), a view would be copied per call.
WEIGHT_ROWS_IN_PLACE = {
    "cupy": {"DenseStep": frozenset({"W", "b"}), "ConvStep": frozenset({"W", "b"})},
    "cuda": {},
}


def rows_read_in_place(layer, bk) -> frozenset[str]:
    """The names of ``layer``'s stacked weights that backend ``bk``'s batched kernels read as
    evenly spaced rows in place (:data:`WEIGHT_ROWS_IN_PLACE`; none off a GPU backend)."""
    table = WEIGHT_ROWS_IN_PLACE.get(getattr(bk, "name", None), {})
    return table.get(type(layer).__name__, frozenset())


def evenly_spaced(idx: np.ndarray) -> tuple[int, int] | None:
    """``(first, step)`` when the layer indices ``idx`` are ``first + j·step`` for j = 0 …
    k − 1 (k ≥ 1; step 1 for one index), else None (step 0 included: a repeated row)."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.ndim != 1 or idx.size == 0:
        return None
    step = int(idx[1] - idx[0]) if idx.size > 1 else 1
    if step == 0 or np.any(np.diff(idx) != step):
        return None
    return int(idx[0]), step


def weight_rows(rows, idx: np.ndarray, gather: Callable[[], Any]):
    """Rows ``idx`` of the stacked weights ``rows`` (N, ...) for a batched kernel that reads
    them in place: where ``idx`` is evenly spaced, the view ``rows[i₀ :: d]`` (no launch) —
    for d < 0 (an adjoint sweep visits layers downwards) the view ``R[N−1−i₀ :: −d]`` of ``R``,
    ``rows`` reversed: a copy, made once per array while gathers are cached (one gradient on
    a GPU backend: one launch per weight for every descending sweep); else ``gather()``.
    Row j of the result is ``rows[idx[j]]`` either way."""
    spaced = evenly_spaced(idx) if hasattr(rows, "shape") else None
    if spaced is None:
        return gather()
    (first, step), k = spaced, len(idx)
    if step < 0:
        from .portable import contiguous

        n = rows.shape[0]
        rows = gathered_once(rows, np.array([-2]), lambda: contiguous(rows[::-1]))
        first, step = n - 1 - first, -step
    return rows[first:first + step * (k - 1) + 1:step]


def permuted_once(a, axes: tuple[int, ...]):
    """``a`` with its axes permuted to ``axes`` as a C-ordered copy, made once per array while
    gathers are cached (a GPU gradient: :func:`gathers_cached`), else at every call. The key
    (−1, *axes) cannot be a gather's (row indices are ≥ 0), nor :func:`weight_rows`'s
    reversed copy's (−2)."""
    from .portable import contiguous
    from .reference import array_namespace

    xp = array_namespace(a)
    return gathered_once(a, np.array([-1, *axes]), lambda: contiguous(xp.permute_dims(a, axes)))


def transposed_once(W):
    """Wᵀ over the last two axes: while gathers are cached (a GPU backend's gradient), a
    C-ordered copy made once per array ``W`` (:func:`permuted_once`); else the view. CuPy's
    batched GEMM copies a transposed operand before every product that reads it
    (:func:`standin_array.matmul`): a weight, the same array for a whole gradient, is then
    copied once instead."""
    from .reference import array_namespace

    axes = (*range(W.ndim - 2), W.ndim - 1, W.ndim - 2)
    if not _GATHERS or _GATHERS[-1] is None:
        return array_namespace(W).permute_dims(W, axes)
    return permuted_once(W, axes)


def gathered_once(rows, idx: np.ndarray, gather: Callable[[], Any]):
    """``gather()`` (rows ``idx`` of ``rows``), made once per (``rows``, ``idx``) within
    :func:`gathers_cached`, else every time."""
    cache = _GATHERS[-1] if _GATHERS else None
    if cache is None:
        return gather()
    key = (id(rows), np.asarray(idx, dtype=np.int64).tobytes())
    hit = cache.get(key)
    if hit is None or hit[0] is not rows:  # the source is kept: its id cannot be reused
        hit = cache[key] = (rows, gather())
    return hit[1]
