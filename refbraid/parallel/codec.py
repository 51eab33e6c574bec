"""Neighbour messages as raw bytes: the codec of :class:`refbraid.parallel.mpi.MPIComm`.

Messages. mpi4py's lower-case methods (``isend``, ``recv``, ``bcast``, …) pickle every value:
a few microseconds of Python per message on top of the transport, and for a 1 MiB state
several times the transport's own time (``python -m benchmarks full step`` measures α and
β both ways). So NumPy arrays travel as raw bytes through the upper-case buffer methods, and only
other values are pickled:

* ``send_next`` / ``recv_prev``: ONE MPI message per value, raw bytes behind a small header::

      int64 kind | int64 ndim | dtype.str (8 ASCII bytes) | int64 shape[ndim] | pad to 16 B | data

  A NumPy array of a numeric dtype (:func:`travels_raw`: bool, integer, float, complex; any
  shape, 0-d and empty included, any memory layout) is copied into the buffer after the header
  (``kind = RAW``); anything else (None, tuples, dicts, strings, object arrays; not device ones) is
  pickled there (``kind = PICKLED``). The sender ``Isend``-s the buffer; the receiver
  ``Mprobe``-s the message, takes its length from the status, ``Recv``-s it into a buffer of
  that length and returns a view of the data with the sender's shape and dtype — the same bits,
  and the dtype is NumPy's own object (``x.dtype is np.dtype(np.float64)``), which the Numba
  backend's fast paths test for (a pickled array's dtype is an equal copy: kernels applied to a
  received ghost fell back to the reference implementation, with other round-off). Shape and
  dtype ride in the message, so there is no second message (and no second latency) and nothing
  to agree on beforehand.
* Order: one tag (``mpi.TAG_NEIGHBOUR``), one message per value; MPI delivers the messages
  of one pair and tag in the order they were sent.
* Non-blocking: ``send_next`` returns at once. Its request and buffer stay in a pending list
  until ``MPI_Test`` reports the send done or ``MPIComm.wait_sends`` completes it; that list
  is shared by every ``reverted()`` view, so a view dropped with sends in flight (the adjoint
  solve's) cannot free a buffer MPI is still reading. The copy is taken at the call, so the
  caller may overwrite its array as soon as ``send_next`` returns.
* ``bcast`` of a numeric array: its dtype and shape pickled, then its bytes with ``Bcast``;
  ``allreduce_sum``: the floats with ``Allgather`` into a float64 buffer; ``sum_to_all``:
  ``Reduce`` + ``Bcast`` of the array. ``gather``, ``allgather``, ``alltoall`` and ``scatter``
  stay pickled (checkpoints, set-up and the row dictionaries of :mod:`refbraid.parallel.ops`).
* ``counters``: neighbour messages sent and received, their bytes on the wire (header
  included), and the seconds ``recv_prev`` waited.
* Device arrays (CuPy, the tests' array-api-strict stand-in) are never pickled
  (:mod:`refbraid.parallel.device_messages`): staged, their host copy travels as raw bytes
  with ``kind = STAGED`` and the receiver's ``to_device`` puts it back on its device; direct
  (CUDA-aware MPI), a header-only message (``kind = DIRECT``) announces the device buffer
  that follows as a second message of the same tag.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.dtypes import numpy_dtype
from ..backends.host import to_host
from .device_messages import is_device_array

#: First header word of a neighbour message: raw array bytes follow, or a pickle, or a device
#: array's host copy (staged), or nothing (direct: the device buffer is the next message).
RAW, PICKLED, STAGED, DIRECT = 1, 2, 3, 4
#: dtype kinds sent as raw bytes: bool, signed and unsigned integers, floats, complex.
RAW_KINDS = "biufc"
#: Bytes of the header before the shape: kind, ndim, dtype string (NUL-padded ASCII).
_HEAD_FIXED = 24


def travels_raw(value: Any) -> bool:
    """True when ``value`` goes as raw bytes: a NumPy array (not a subclass) of a numeric dtype."""
    return type(value) is np.ndarray and value.dtype.kind in RAW_KINDS


def _header_bytes(ndim: int) -> int:
    """Header length for an ``ndim``-dimensional array, rounded up to 16 B (aligns the data)."""
    return -(-(_HEAD_FIXED + 8 * ndim) // 16) * 16


def _array_message(kind: int, shape: tuple[int, ...], dtype: np.dtype, data=None) -> np.ndarray:
    """Header (kind, ndim, dtype, shape) followed by ``data``'s bytes (none when None)."""
    ndim, head = len(shape), _header_bytes(len(shape))
    nbytes = 0 if data is None else int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(head + nbytes, np.uint8)
    struct.pack_into(f"<qq8s{ndim}q{head - _HEAD_FIXED - 8 * ndim}x", buf, 0, kind, ndim,
                     dtype.str.encode("ascii"), *shape)
    if data is not None:
        np.copyto(np.ndarray(shape, dtype, buffer=buf, offset=head), data)
    return buf


def encode_message(value: Any, direct: bool = False) -> np.ndarray:
    """One neighbour message as a fresh uint8 buffer (layout in the module docstring).

    The value is copied into the buffer, so the caller may change it afterwards. A device
    array is staged through the host, or with ``direct`` only announced (header only)."""
    if travels_raw(value):
        return _array_message(RAW, value.shape, value.dtype, value)
    if is_device_array(value):
        dtype = numpy_dtype(value.dtype)
        if direct:
            return _array_message(DIRECT, tuple(value.shape), dtype)
        return _array_message(STAGED, tuple(value.shape), dtype, np.asarray(to_host(value)))
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    buf = np.empty(16 + len(payload), np.uint8)
    struct.pack_into("<qq", buf, 0, PICKLED, 0)
    buf[16:] = np.frombuffer(payload, np.uint8)
    return buf


@dataclass(frozen=True)
class DirectHeader:
    """A direct device message's announcement: the device buffer that follows."""

    shape: tuple[int, ...]
    dtype: np.dtype


def decode_message(buf: np.ndarray, to_device: Callable[[np.ndarray], Any] | None = None) -> Any:
    """The value :func:`encode_message` packed into ``buf`` (an array is a view into ``buf``;
    a staged device array goes through ``to_device``; a direct one is a DirectHeader)."""
    kind, ndim = struct.unpack_from("<qq", buf, 0)
    if kind == PICKLED:
        return pickle.loads(memoryview(buf)[16:])
    if kind not in (RAW, STAGED, DIRECT):
        raise ValueError(f"`buf` is not a neighbour message: header kind {kind}.")
    dtype = np.dtype(struct.unpack_from("8s", buf, 16)[0].rstrip(b"\0").decode("ascii"))
    shape = struct.unpack_from(f"<{ndim}q", buf, _HEAD_FIXED)
    if kind == DIRECT:
        return DirectHeader(tuple(shape), dtype)
    value = np.ndarray(shape, dtype, buffer=buf, offset=_header_bytes(ndim))
    if kind == STAGED:
        if to_device is None:
            raise TypeError("a device array arrived but this communicator has no `to_device` "
                            "to put it back on the device (MPIComm(..., to_device=...)).")
        return to_device(value)
    return value
