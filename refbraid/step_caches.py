"""The forward caches of a layer-parallel gradient as rows of the batched calls that made them.

:class:`refbraid.propagators.CachingForward` keeps, per layer a, the cache
``(y[a], z[a])`` of the latest fine step a → a+1. A batched call (one MGRIT sweep) makes the
caches of k layers at once as rows of two stacked arrays ``Y, Z`` (k, B, C);
:func:`remember` notes for each layer which call and row its cache came from. The adjoint's
batched fine steps need the caches of the k layers of *its* sweep stacked in its order:
when they are the rows ``j_0, j_0 + d, ...`` (d ≠ 0, also negative: the adjoint runs the
layers backwards) of one call, :func:`cached_stacks` returns views ``Y[j_0::d]``,
``Z[j_0::d]`` instead of stacking k rows into new arrays. With TorchBraid's settings every
sweep of the adjoint finds its layers in one sweep of the forward's final relaxation.
Same numbers either way (a view reads the very rows the stack would copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backends.portable import stack_rows
from .indexing import signed_even_slice


def remember(origins: dict[int, tuple[Any, Any, int]], layers: list[int], Y, Z) -> None:
    """``origins[layers[j]] = (Y, Z, j)``: layer ``layers[j]``'s cache is row j of Y, Z."""
    for j, a in enumerate(layers):
        origins[a] = (Y, Z, j)


def cached_stacks(caches: dict[int, Any], origins: dict[int, tuple[Any, Any, int]],
                  layers: list[int], xp):
    """``(stack of y[a], stack of z[a])`` over ``layers`` (each (k, B, C)): views of one
    batched call's arrays when the layers are evenly spaced rows of it (any array type: on a
    GPU a view instead of a gather launch), else the rows of ``caches`` stacked (a host
    object array of cache handles stays on the host)."""
    src = [origins.get(a) for a in layers]
    head = src[0] if src else None
    if (head is not None and hasattr(head[1], "shape")
            and all(s is not None and s[1] is head[1] for s in src)):
        rows = signed_even_slice([s[2] for s in src])
        if rows is not None:
            return head[0][rows, ...], head[1][rows, ...]
    zs = [caches[a][1] for a in layers]  # arrays, or a layer's cache handles (host objects)
    return (stack_rows([caches[a][0] for a in layers]),
            stack_rows(zs) if hasattr(zs[0], "shape") else np.stack(zs))
