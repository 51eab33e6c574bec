"""CuPy backend (``"cupy"``): the reference kernels, run on CuPy arrays on the GPU.

The reference kernels in :mod:`refbraid.backends.reference` look up the array module of
their inputs (``array_namespace``), so on ``cupy.ndarray`` inputs the very same code runs on
the GPU: ``x @ W.T`` is cuBLAS, the element-wise lines are CuPy kernels, ``einsum`` is
cuBLAS/cuTENSOR, and exact GELU uses ``cupyx.scipy.special.erf``. Nothing is overridden
(``OVERRIDES = ()``): this backend *is* the tested reference code on another array type.

The reference kernels use the array API standard's functions (``permute_dims``, ``concat``,
``astype``, ``take``), which CuPy's main namespace has since it mirrors the NumPy 2 API;
:func:`is_usable` says no to a CuPy without them.

``xp`` is the ``cupy`` module, imported on first use so that importing this module (for
:func:`is_usable`) never fails on a machine without CuPy or without a GPU; asking for
``xp`` there raises an ImportError that says so.
"""

from __future__ import annotations

import importlib
from types import ModuleType

OVERRIDES: tuple[str, ...] = ()


def _import_cupy() -> ModuleType:
    try:
        return importlib.import_module("cupy")
    except Exception as err:
        raise ImportError(
            f"the `cupy` backend needs CuPy and a CUDA GPU: `import cupy` failed ({err})."
        ) from err


def __getattr__(name: str):
    """Lazy module attribute ``xp`` = the cupy module (PEP 562)."""
    if name == "xp":
        return _import_cupy()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_usable() -> bool:
    """True when CuPy imports, sees a GPU, and a tiny array op (with erf, for GELU) works."""
    try:
        cupy = _import_cupy()
        if not cupy.cuda.is_available():
            return False
        if not all(hasattr(cupy, f) for f in ("permute_dims", "concat", "astype")):
            return False  # an older CuPy: no array API functions in the main namespace
        import cupyx.scipy.special

        a = cupy.arange(4, dtype=cupy.float64)
        return float(cupyx.scipy.special.erf(a @ a)) > 0.0
    except Exception:  # no CuPy, no driver, no device, a broken toolkit: all mean "no"
        return False
