"""Writing a step's result into an array the caller owns (MGRIT's F-sweeps write ``u[k]``).

``euler_act_into(bk, y, z, h, act, out)`` is ``bk.euler_act(y, z, h, act)``, written into
``out`` where the backend can (the NumPy reference and the Numba CPU kernels, on a NumPy
``out`` of y's shape and dtype, C-contiguous): the same operations, another destination.
Everywhere else (CUDA, CuPy, the strict stand-in, a mismatched ``out``) it returns a new
array, and the caller copies it (``result is out`` tells which happened). ``add_into(a, b,
out)`` is ``a + b`` the same way (the adjoint steps' last sum), on NumPy arrays.
"""

from __future__ import annotations

import inspect

import numpy as np

_INTO = ("numpy", "numba")  # backends whose euler_act takes out=


def takes_out(fn) -> bool:
    """Whether the callable ``fn`` has a parameter named ``out`` (where a result may be
    written); False for anything ``inspect.signature`` cannot read."""
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def writes_into(bk, out, y, z) -> bool:
    """Whether ``bk.euler_act(y, z, ..., out=out)`` writes its result into ``out``."""
    return (out is not None and getattr(bk, "name", None) in _INTO
            and isinstance(out, np.ndarray) and isinstance(y, np.ndarray)
            and isinstance(z, np.ndarray) and out.dtype == y.dtype == z.dtype
            and out.shape == y.shape == z.shape and out.flags.c_contiguous
            and not np.may_share_memory(out, y))


def euler_act_into(bk, y, z, h: float, act: str, out=None):
    """``y + h σ(z)`` (``bk.euler_act``), into ``out`` where :func:`writes_into` says so."""
    if writes_into(bk, out, y, z):
        return bk.euler_act(y, z, h, act, out=out)
    return bk.euler_act(y, z, h, act)


def add_into(a, b, out=None):
    """``a + b``, written into ``out`` (``numpy.add(a, b, out=out)``, the same additions) when
    all three are NumPy arrays of one dtype and shape and ``out`` overlaps neither; else new."""
    if (out is not None and isinstance(out, np.ndarray) and isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray) and out.dtype == a.dtype == b.dtype
            and out.shape == a.shape == b.shape
            and not (np.may_share_memory(out, a) or np.may_share_memory(out, b))):
        return np.add(a, b, out=out)
    return a + b
