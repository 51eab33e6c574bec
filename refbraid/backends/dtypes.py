"""Dtypes across array libraries: NumPy and CuPy share NumPy's dtype objects, the array API
standard (array-api-strict) has its own, without NumPy's ``.kind`` or ``.itemsize``.

The package asks two questions of a dtype — what kind it is (float, complex, integer,
bool: NumPy's one-letter ``kind``) and which NumPy dtype it corresponds to — and asks them
here, so the same line works on every backend's arrays.
"""

from __future__ import annotations

import numpy as np


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype equal to ``dtype`` (a NumPy/CuPy dtype, a name, or an array-API dtype
    such as ``array_api_strict.float64``, whose repr ends in the NumPy name)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype(str(dtype).rsplit(".", 1)[-1])


def dtype_kind(dtype) -> str:
    """NumPy's kind letter of ``dtype``: 'f' float, 'c' complex, 'i'/'u' integer, 'b' bool."""
    return numpy_dtype(dtype).kind
