"""The rules of the CuPy-like stand-in's arrays (:mod:`.standin_array`): the device they live
on, the doors to the host CuPy keeps shut, what a CUDA graph capture forbids, and which
operations cost a launch. Data and small helpers; the array applies them.

* The device: :data:`DEVICE`, the one (pretend) GPU every array reports as ``a.device``.
* The host doors: ``numpy.asarray(a)`` is CuPy's TypeError (:data:`IMPLICIT`), a host
  ``numpy.ndarray`` mixed into an operation is CuPy's ``Unsupported type`` (``_refuse_host``),
  and under :func:`forbid_host_conversions` ``float``, ``int``, ``bool``, ``item``, ... raise
  :class:`~refbraid.backends.strict_device.HostConversionError` (``_guarded``).
* The capture rule: inside :func:`~refbraid.backends.capture_state.recording_graph` (the
  contract of a CUDA graph capture) every copy between host and device raises
  :class:`CaptureViolation`, and so does a ``stack``/``concat`` of more than 8 arrays of one
  dtype: CuPy copies a table of their addresses from the host for it (its single-kernel
  concatenation), which a capture would record pointing at host memory that is freed
  afterwards.
* What counts (the table in :mod:`.standin_array`): functions in :data:`VIEWS` cost nothing
  when they return a view, those in :data:`EMPTY` make memory without a launch, a basic index
  (``_is_basic``: integers, slices, ``None``, ``...``) is a free view, and an operator's launch
  is reported under the array API's name of its function (:data:`OPERATOR_NAMES`,
  ``_reported``: ``a @ b`` is ``matmul``).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator

from .capture_state import is_recording_graph
from .strict_device import HostConversionError


# ----------------------------------------------------------------------------- the device
class _Device:
    """``ndarray.device``: the one (pretend) GPU, as CuPy's ``cupy.cuda.Device(0)``."""

    id = 0

    def __repr__(self) -> str:
        return "<CUDA Device 0>"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Device)

    def __hash__(self) -> int:
        return 0


DEVICE = _Device()
_state = {"guard": False}


# ----------------------------------------------------------------------------- the host doors
IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly.")


@contextlib.contextmanager
def forbid_host_conversions() -> Iterator[None]:
    """Within the block every implicit host conversion of a stand-in array raises."""
    before = _state["guard"]
    _state["guard"] = True
    try:
        yield
    finally:
        _state["guard"] = before


def _guarded(name: str, convert):
    def method(self, *args):
        if _state["guard"]:
            raise HostConversionError(
                f"implicit host conversion `{name}` of a device array (shape {self.shape}); "
                "use refbraid.backends.host.to_host")
        return convert(self.get(), *args)

    method.__name__ = name
    return method


def _refuse_host(x):
    raise TypeError(f"Unsupported type {type(x)}")


# ----------------------------------------------------------------------------- the capture rule
class CaptureViolation(RuntimeError):
    """Host↔device traffic inside ``recording_graph`` (module docstring)."""


def _capture_check(what: str) -> None:
    if is_recording_graph():
        raise CaptureViolation(f"{what} inside recording_graph() (a CUDA graph capture would "
                               f"record it pointing at host memory, or fail).")


# ----------------------------------------------------------------------------- what counts
#: NumPy functions that return a view of their input (no launch when they do).
VIEWS = frozenset({"reshape", "permute_dims", "transpose", "expand_dims", "squeeze",
                   "broadcast_to", "swapaxes", "moveaxis", "matrix_transpose", "ravel",
                   "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_arrays", "unstack",
                   "split", "flip", "as_strided"})
#: Functions that make new memory without writing it.
EMPTY = frozenset({"empty", "empty_like"})


def _is_basic(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (slice, numbers.Integral))
               for i in items)


#: The array API's name of each operator, as a launch is reported (``a @ b`` is ``matmul``).
OPERATOR_NAMES = {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide",
                  "floordiv": "floor_divide", "mod": "remainder", "pow": "power",
                  "matmul": "matmul", "and": "bitwise_and", "or": "bitwise_or",
                  "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
                  "rshift": "bitwise_right_shift", "lt": "less", "le": "less_equal",
                  "gt": "greater", "ge": "greater_equal", "eq": "equal", "ne": "not_equal"}


def _reported(op: str) -> str:
    """``__radd__``, ``__iadd__``, ``__add__`` → ``add`` (the function the launch runs)."""
    bare = op.strip("_")
    for prefix in ("", "r", "i"):
        if bare.startswith(prefix) and bare[len(prefix):] in OPERATOR_NAMES:
            return OPERATOR_NAMES[bare[len(prefix):]]
    return op
