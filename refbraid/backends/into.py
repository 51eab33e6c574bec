"""Writing a step's result into an array the caller owns (MGRIT's F-sweeps write ``u[k]``).

``euler_act_into(bk, y, z, h, act, out)`` is ``bk.euler_act(y, z, h, act)``, written into
``out`` where the backend can (the NumPy reference and the Numba CPU kernels, on a NumPy
``out`` of y's shape and dtype, C-contiguous): the same operations, another destination.
Everywhere else (CUDA, CuPy, the strict stand-in, a mismatched ``out``) it returns a new
array, and the caller copies it (``result is out`` tells which happened). ``add_into(a, b,
out)`` is ``a + b`` the same way (the adjoint steps' last sum), on NumPy arrays; ``plus(result,
add, out)`` adds MGRIT's right-hand side row to a step's result (in place only into ``out``).
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import numpy as np
from array_api_compat import is_cupy_array, is_numpy_array

_INTO = ("numpy", "numba")  # backends whose euler_act takes out=


def takes_out(fn, name: str = "out") -> bool:
    """Whether the callable ``fn`` has a parameter called ``name`` (default ``out``: where a
    result may be written; ``add``: an addend it adds to its result); False for anything
    ``inspect.signature`` cannot read."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@lru_cache(maxsize=256)
def writes_rows(fn) -> bool:
    """Whether the backend kernel ``fn`` takes both ``out=`` and ``add=`` (a batched step that
    writes MGRIT's F-sweep rows, ``Φ + add``, itself), once per function."""
    return takes_out(fn) and takes_out(fn, "add")


def rows_options(fn, out, add) -> dict:
    """``{"out": out, "add": add}`` where ``out`` is given and ``fn`` :func:`writes_rows`,
    else ``{}``: the keywords to call ``fn`` with."""
    return {"out": out, "add": add} if out is not None and writes_rows(fn) else {}


def plus(result, add, out=None):
    """``result + add``: into ``result`` itself when it is ``out`` (an array the caller gave
    to be written) and NumPy allows (one dtype), else a new array. The same sum either way;
    ``add`` None: ``result``."""
    if add is None:
        return result
    if (out is not None and result is out and isinstance(out, np.ndarray)
            and isinstance(add, np.ndarray) and out.dtype == add.dtype):
        return np.add(out, add, out=out)
    return result + add


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


def written_into(result, out, add=None):
    """``result + add`` (add None: ``result``) in ``out``: nothing to do when ``result`` is
    ``out`` (a kernel wrote it there), else the copy or the ``numpy.add`` (CuPy's on CuPy
    arrays) an F-sweep makes of a new result. Returns ``out`` (out None: ``result``)."""
    if out is None or result is out:
        return result
    if add is None:
        out[...] = result
    else:
        np.add(result, add, out=out)
    return out


def one_array_library(*arrays) -> bool:
    """Whether ``arrays`` are all NumPy or all CuPy arrays, of one dtype: then ``numpy.add(a,
    b, out=c)`` is one operation of that library into ``c`` (on CuPy arrays NumPy dispatches
    to CuPy's ``add``: one launch on a GPU, where a new sum copied in would be two), with the
    additions of ``a + b``."""
    same = all(map(is_numpy_array, arrays)) or all(map(is_cupy_array, arrays))
    return same and len({a.dtype for a in arrays}) == 1


def in_place_ok(out, *others) -> bool:
    """Whether ``out`` may receive an elementwise result of ``others``: NumPy arrays of one
    dtype and shape, ``out`` a fresh array (owns its data) overlapping none of them."""
    return (isinstance(out, np.ndarray) and out.flags.owndata
            and all(isinstance(a, np.ndarray) and a.dtype == out.dtype
                    and a.shape == out.shape and not np.may_share_memory(a, out)
                    for a in others))


def add_into(a, b, out=None):
    """``a + b``, written into ``out`` (``numpy.add(a, b, out=out)``, the same additions) when
    all three are NumPy arrays of one dtype and shape and ``out`` overlaps neither; else new."""
    if (out is not None and isinstance(out, np.ndarray) and isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray) and out.dtype == a.dtype == b.dtype
            and out.shape == a.shape == b.shape
            and not (np.may_share_memory(out, a) or np.may_share_memory(out, b))):
        return np.add(a, b, out=out)
    return a + b
