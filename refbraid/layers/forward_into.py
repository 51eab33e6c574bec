"""A step layer's forward with an optional destination for its result (MGRIT's F-sweeps).

``forward_into(layer, params, y, h, bk, out)`` is ``layer.forward(params, y, h, bk)``, passing
``out=`` where the layer's ``forward`` takes it (ConvStep, DenseStep: the Euler update is then
written into ``out`` where the backend can, refbraid/backends/into.py). Any other layer — or a
user's — is called as it is and returns a new array: the caller copies it (``y_next is out``
tells which happened). ``adjoint_into`` likewise for ``layer.adjoint`` (its ``dy``). ``add``: a
row to add to the result (MGRIT's right-hand side on coarse levels), inside the layer's kernel
where its method takes ``add=``. The same numbers either way.
"""

from __future__ import annotations

from functools import lru_cache

from ..backends.into import plus, rows_options, takes_out, written_into


@lru_cache(maxsize=64)
def _takes(cls: type, method: str = "forward", name: str = "out") -> bool:
    """:func:`~refbraid.backends.into.takes_out` of ``cls.method`` for the parameter
    ``name``, once per class."""
    return takes_out(getattr(cls, method, None), name)


def _options(cls: type, method: str, out, add) -> dict:
    """The keywords ``out=`` and ``add=`` that ``cls.method`` takes, of those given."""
    kw = {}
    if out is not None and _takes(cls, method):
        kw["out"] = out
    if add is not None and _takes(cls, method, "add"):
        kw["add"] = add
    return kw


def forward_into(layer, params, y, h: float, bk, out=None, add=None):
    """``layer.forward(params, y, h, bk)``, with ``out=out`` where it takes it; with ``add``
    (MGRIT's right-hand side row) the result is ``y_next + add``: the layer's own ``add=``
    where it takes one (ConvStep on numba: one kernel), else added here (:func:`plus`)."""
    kw = _options(type(layer), "forward", out, add)
    y_next, cache = layer.forward(params, y, h, bk, **kw)
    return (y_next if "add" in kw else plus(y_next, add, out)), cache


def adjoint_into(layer, params, cache, dy_next, h: float, bk, grads: bool = True, out=None,
                 add=None):
    """``layer.adjoint(params, cache, dy_next, h, bk, grads=grads)``, with ``out=out`` (where
    its ``dy`` may be written) where the layer's ``adjoint`` takes it, and ``add`` added to
    ``dy`` as :func:`forward_into` adds it."""
    kw = _options(type(layer), "adjoint", out, add)
    dy, grads_ = layer.adjoint(params, cache, dy_next, h, bk, grads=grads, **kw)
    return (dy if "add" in kw else plus(dy, add, out)), grads_


def forward_batched_into(layer, params, Y, h, bk, out=None, add=None):
    """``layer.forward_batched(params, Y, h, bk)`` with its ``Y_next + add`` (add None: 0)
    written into ``out`` (MGRIT's F-sweep rows, a view): by the layer's own ``out=`` and
    ``add=`` where its ``forward_batched`` takes them and its backend could write there (it
    returns ``out`` then), else by :func:`written_into` — the copy or the sum the F-sweep made
    before. Returns ``(out, Z)`` (out None: the layer's own ``(Y_next, Z)``)."""
    Y_next, Z = layer.forward_batched(params, Y, h, bk, **rows_options(
        type(layer).forward_batched, out, add))
    return written_into(Y_next, out, add), Z


def adjoint_batched_into(layer, params, Y, Z, dY_next, h, bk, grads: bool, out=None,
                         add=None):
    """``layer.adjoint_batched(params, Y, Z, dY_next, h, bk, grads)`` with its ``dY + add``
    written into ``out`` as :func:`forward_batched_into` writes ``Y_next``. Returns ``(out,
    parameter gradients)``."""
    dY, g = layer.adjoint_batched(params, Y, Z, dY_next, h, bk, grads,
                                  **rows_options(type(layer).adjoint_batched, out, add))
    return written_into(dY, out, add), g
