"""A step layer's forward with an optional destination for its result (MGRIT's F-sweeps).

``forward_into(layer, params, y, h, bk, out)`` is ``layer.forward(params, y, h, bk)``, passing
``out=`` where the layer's ``forward`` takes it (ConvStep, DenseStep: the Euler update is then
written into ``out`` where the backend can, refbraid/backends/into.py). Any other layer — or a
user's — is called as it is and returns a new array: the caller copies it (``y_next is out``
tells which happened). ``adjoint_into`` likewise for ``layer.adjoint`` (its ``dy``). The same
numbers either way.
"""

from __future__ import annotations

from functools import lru_cache

from ..backends.into import takes_out


@lru_cache(maxsize=64)
def _takes_out(cls: type, method: str = "forward") -> bool:
    """:func:`~refbraid.backends.into.takes_out` of ``cls.method``, once per class."""
    return takes_out(getattr(cls, method, None))


def forward_into(layer, params, y, h: float, bk, out=None):
    """``layer.forward(params, y, h, bk)``, with ``out=out`` where it takes it."""
    if out is not None and _takes_out(type(layer)):
        return layer.forward(params, y, h, bk, out=out)
    return layer.forward(params, y, h, bk)


def adjoint_into(layer, params, cache, dy_next, h: float, bk, grads: bool = True, out=None):
    """``layer.adjoint(params, cache, dy_next, h, bk, grads=grads)``, with ``out=out`` (where
    its ``dy`` may be written) where the layer's ``adjoint`` takes it."""
    if out is not None and _takes_out(type(layer), "adjoint"):
        return layer.adjoint(params, cache, dy_next, h, bk, grads=grads, out=out)
    return layer.adjoint(params, cache, dy_next, h, bk, grads=grads)
