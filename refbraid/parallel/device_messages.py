"""Device arrays in MPI messages: straight from device memory with CUDA-aware MPI, staged
through host buffers otherwise, never pickled.

A layer-parallel step on a GPU keeps its states on the device; MGRIT sends one state per
neighbour message and reduces gradients across ranks. Pickling a device array (what mpi4py's
lower-case methods would do) copies it to the host behind the code's back and ships Python
objects. Here a device array takes one of two routes, chosen once per communicator:

* **direct** (:func:`cuda_aware_mpi` true, and the array exports the CUDA array interface or
  DLPack): a small header (dtype, shape) goes first, then the device buffer itself, which a
  CUDA-aware MPI library reads and writes on the GPU; the receiver allocates the device array
  from the header and receives into it;
* **staged** (everything else): :func:`refbraid.backends.host.to_host` copies it into a host
  buffer that travels like any NumPy array (raw bytes, :mod:`refbraid.parallel.codec`), and
  the receiver's ``to_device`` (its backend's ``asarray``) puts it back on its device.

Inside the pickled collectives (``gather``, ``alltoall``, …: dicts of rows) a device array
travels as a :class:`Staged` host copy, unwrapped onto the device on arrival
(:func:`stage_tree`, :func:`unstage_tree`). Without a ``to_device`` a communicator refuses
device arrays with a message that says so, rather than pickling them.
:func:`refuse_pickled_device_arrays` is the tests' guard: within it, mpi4py's pickle raises
on any device array (CuPy, Numba, array-api-strict alike), so a device array that slipped
past the staging fails the test that sent it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.host import to_host

#: Set to 1 to assert that the MPI library is CUDA-aware where mpi4py cannot tell.
CUDA_AWARE_ENV = "REFBRAID_CUDA_AWARE_MPI"

ToDevice = Callable[[np.ndarray], Any]


def is_device_array(value: Any) -> bool:
    """True for an array that is not host NumPy data: CuPy, Numba CUDA device arrays,
    array-api-strict arrays (the tests' device stand-in)."""
    if isinstance(value, (np.ndarray, np.generic)) or not hasattr(value, "shape"):
        return False
    return hasattr(value, "__array_namespace__") or hasattr(value, "__cuda_array_interface__")


def exports_device_buffer(value: Any) -> bool:
    """True when MPI can read the array in place on the GPU (CUDA array interface)."""
    return hasattr(value, "__cuda_array_interface__")


def cuda_aware_mpi(MPI) -> bool:
    """Whether the MPI library takes device buffers: ``MPI.Query_cuda_support()`` where the
    mpi4py build exposes it, else the ``REFBRAID_CUDA_AWARE_MPI`` environment variable."""
    if os.environ.get(CUDA_AWARE_ENV, "") not in ("", "0"):
        return True
    query = getattr(MPI, "Query_cuda_support", None)
    if callable(query):
        try:
            return bool(query())
        except Exception:  # an MPI built without the extension: not CUDA-aware
            return False
    return False


def refuse_device(value: Any) -> None:
    """TypeError for a device array on a communicator that cannot bring it back."""
    raise TypeError(
        f"a device array ({type(value).__module__}.{type(value).__name__}, shape "
        f"{tuple(value.shape)}) cannot travel on this communicator: give MPIComm a "
        f"`to_device` (the backend's asarray) so that it is staged through host buffers.")


@dataclass(frozen=True)
class Staged:
    """A device array's host copy inside a pickled collective (``host`` is NumPy)."""

    host: np.ndarray


def stage_tree(tree: Any, to_device: ToDevice | None) -> Any:
    """``tree`` with every device array replaced by a :class:`Staged` host copy."""
    if isinstance(tree, dict):
        return {k: stage_tree(v, to_device) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple (BatchStats)
        return type(tree)(*(stage_tree(v, to_device) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(stage_tree(v, to_device) for v in tree)
    if is_device_array(tree):
        if to_device is None:
            refuse_device(tree)
        return Staged(np.asarray(to_host(tree)))
    return tree


def unstage_tree(tree: Any, to_device: ToDevice | None) -> Any:
    """Inverse of :func:`stage_tree`: each :class:`Staged` goes onto the device."""
    if isinstance(tree, dict):
        return {k: unstage_tree(v, to_device) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple (BatchStats)
        return type(tree)(*(unstage_tree(v, to_device) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(unstage_tree(v, to_device) for v in tree)
    if isinstance(tree, Staged):
        return to_device(tree.host)
    return tree


class DevicePickleError(TypeError):
    """A device array reached mpi4py's pickle (it must travel as a buffer, or staged)."""


class _DeviceGuardPickler(pickle.Pickler):
    """A pickler that refuses device arrays (``reducer_override`` sees every object)."""

    def reducer_override(self, obj):
        if is_device_array(obj):
            raise DevicePickleError(
                f"a device array ({type(obj).__module__}.{type(obj).__name__}, shape "
                f"{tuple(obj.shape)}) reached MPI's pickle: device arrays travel as buffers "
                f"(direct or staged through host buffers, refbraid.parallel.device_messages).")
        return NotImplemented


def _guarded_dumps(obj, protocol=None) -> bytes:
    out = io.BytesIO()
    _DeviceGuardPickler(out, protocol).dump(obj)
    return out.getvalue()


@contextlib.contextmanager
def refuse_pickled_device_arrays() -> Iterator[None]:
    """Within the block, mpi4py's lower-case (pickling) methods raise
    :class:`DevicePickleError` for any device array in the message — on every communicator
    of this process. Host values and the :class:`Staged` host copies pickle as before."""
    from mpi4py import MPI

    protocol = MPI.pickle.PROTOCOL
    MPI.pickle.__init__(_guarded_dumps, pickle.loads, protocol)
    try:
        yield
    finally:
        MPI.pickle.__init__(pickle.dumps, pickle.loads, protocol)
