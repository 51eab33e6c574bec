"""MGRIT's rows and step sizes as the ``cupy`` backend's kernels take them.

A batched step of the cupy backend may be handed rows of MGRIT's iterate (``out``: an
F-sweep's, a residual's, the coarsest solve's row) and the right-hand side there (``add``);
its fused kernels then write ``result + add`` into the rows (:func:`writable_rows` says when),
and a caller that got a new result instead adds ``add`` itself (:func:`plus_unless_written`).
The k rows' step sizes go to a kernel as one float when they agree (:func:`step_sizes`).
"""

from __future__ import annotations

from .cupy_fused import one_float_dtype
from .into import plus


def writable_rows(Y, out, add) -> bool:
    """Whether MGRIT's rows ``out`` (and its right-hand side ``add``) are given and of Y's
    float dtype: the fused kernels then write ``result + add`` there."""
    return out is not None and one_float_dtype(Y, out, *(() if add is None else (add,)))


def step_sizes(like, h):
    """The k step sizes as a Python float when all equal (a kernel argument: no copy), else
    an array (k, 1, …, 1) of ``like``'s rank on its device (one host→device copy per distinct
    set of step sizes, :func:`refbraid.backends.device_batching.values_on`)."""
    from .device_batching import values_on

    h = [float(v) for v in h]
    if all(v == h[0] for v in h):
        return h[0]
    return values_on(like, h, like.dtype)[(slice(None),) + (None,) * (like.ndim - 1)]


def plus_unless_written(result, add, into):
    """``result + add``, or ``result`` itself where a kernel wrote ``result + add`` into the
    rows ``into`` (``result is into``)."""
    return result if into is not None and result is into else plus(result, add)
