"""The strict device stand-in (backend ``"strict"``, tests only): the ``cupy`` code path,
run on ``array_api_strict`` arrays on a non-default logical device.

The ``cupy`` backend is the reference kernels on another array type. Without a GPU it never
runs, so the mistakes that break GPU code on first contact would wait for the first GPU:
an implicit ``numpy.asarray`` of a device array, a ``float()`` in a loop, a NumPy-only
function or method (``np.pad``, ``x.sum()``), host and device arrays mixed in one expression.
`array-api-strict <https://data-apis.org/array-api-strict/>`_ is the Python array API
standard and nothing more; its arrays live on logical devices and refuse to mix them. This
backend places every array on :data:`DEVICE` (``"device1"``), so that

* a NumPy-only function or method is an AttributeError (the namespace has none);
* host data mixed into device arithmetic is a ValueError (two devices);
* ``numpy.asarray`` of a device array is a RuntimeError;
* and, under :func:`forbid_host_conversions`, ``float``, ``int``, ``bool``, ``complex``,
  ``operator.index``, ``format``, DLPack export and pickling of a device array raise
  :class:`HostConversionError` — the copies CuPy makes silently.

The only way to the host is :func:`refbraid.backends.host.to_host`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import array_api_strict as xp

OVERRIDES: tuple[str, ...] = ()

#: The logical device every array of this backend lives on (not the default CPU_DEVICE).
DEVICE = xp.Device("device1")

_GUARDED = ("__float__", "__int__", "__bool__", "__complex__", "__index__", "__format__",
            "__dlpack__", "__reduce__")


class HostConversionError(RuntimeError):
    """A device array was converted to a host value other than through ``to_host``."""


def _refuse(name: str, original):
    def guarded(self, *args, **kwargs):
        if self.device == DEVICE:
            raise HostConversionError(
                f"implicit host conversion `{name}` of a device array "
                f"(shape {tuple(self.shape)}); use refbraid.backends.host.to_host")
        return original(self, *args, **kwargs)

    guarded.__name__ = name
    return guarded


@contextlib.contextmanager
def forbid_host_conversions() -> Iterator[None]:
    """Within the block, every implicit host conversion of a :data:`DEVICE` array raises."""
    cls = type(xp.asarray(0.0))
    saved = {name: getattr(cls, name) for name in _GUARDED}
    try:
        for name, original in saved.items():
            setattr(cls, name, _refuse(name, original))
        yield
    finally:
        for name, original in saved.items():
            setattr(cls, name, original)


def is_usable() -> bool:
    """Always true where ``array_api_strict`` imports (it is pure Python over NumPy)."""
    return True


def erf(z):
    """erf on the stand-in device, as CuPy brings its own (``cupyx.scipy.special.erf``): the
    array API standard has none. It computes on the stand-in's own storage with Python's
    ``math.erf`` — the device's special-function library, not a host conversion."""
    data = z._array  # the device's storage (array-api-strict keeps a NumPy array)
    return xp.asarray(erf_values(data), device=z.device)


def erf_values(data):
    """erf of a NumPy array, element by element with Python's ``math.erf`` (a stand-in
    device's special-function kernel)."""
    import math

    import numpy as np

    return np.vectorize(math.erf, otypes=[data.dtype])(data) if data.size else data.copy()
