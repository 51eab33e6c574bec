"""Between levels: injection, the FAS coarse right-hand side, the correction, and the exact
coarsest solve (pure functions on one block; docs/references.md §2).

Level ℓ has iterate ``u`` and right-hand side ``g``; its C-points are the points of level ℓ+1
(Φ_Δ is the problem's step over a coarse interval)::

    restriction (injection):  v = u[C]                       (state)
                              R r = r at C-points            (residual after F-relaxation)
    coarse operator:          (A_Δ v)[j] = v[j] - Φ_Δ(v[j-1]),   (A_Δ v)[0] = v[0] at s = 0
    FAS right-hand side:      g_Δ = R r + A_Δ(v)
    coarse problem:           A_Δ(w) = g_Δ   (recursively, or exactly on the coarsest level)
    correction:               u[C] += w - v,  then F-relaxation interpolates to the F-points

With a spatial transfer (``Problem.transfer``, :mod:`refbraid.mgrit.transfer`) the same
steps read ``v = R u[C]``, ``g_Δ = R r + A_Δ(v)``, ``u[C] += P(w − v)``: :func:`to_coarse_space`
and :func:`to_fine_space` apply R and P point by point (identity without a transfer).

With F-relaxation last, injecting the residual equals MGRIT's ideal restriction, and
"correct C, then F-relax" is its ideal interpolation. For a linear Φ the FAS scheme is the
linear one (the A_Δ(v) terms cancel); it is always used so nonlinear problems need nothing
else.

Block conventions as in :mod:`refbraid.mgrit.relax`: ``ghost`` is the previous block's last
point of the same level at solver index ``ghost_point`` (None for the block at s = 0).

Shape legend: n points in the block, c C-points, S the state shape.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import is_cupy_array

from ..backends.cupy_fused import plus_difference
from ..backends.into import add_into, in_place_ok, one_array_library
from ..backends.portable import empty_on, stack_rows
from .relax import (
    StepFn,
    _write_row,
    copy,
    ghost_step,
    propagate_at,
    row_slice,
    set_rows,
    take_rows,
)


def restrict(u, c_pos):
    """Injection ``v = u[C]``: the level-ℓ values at the points of level ℓ+1; shape (c, *S)."""
    return take_rows(u, c_pos)


def to_coarse_space(block, transfer, level: int, fine_indices):
    """``R`` applied to every row of a level-``level`` block (rows at ``fine_indices``)."""
    if transfer is None:
        return block
    return stack_rows([transfer.restrict(block[j, ...], level, int(i))
                       for j, i in enumerate(fine_indices)])


def to_fine_space(block, transfer, level: int, fine_indices):
    """``P`` applied to every row of a level-``level + 1`` block (rows at ``fine_indices``)."""
    if transfer is None:
        return block
    return stack_rows([transfer.interpolate(block[j, ...], level, int(i))
                       for j, i in enumerate(fine_indices)])


def apply_operator(v, points, step: StepFn, ghost=None, ghost_point=None,
                   propagate=propagate_at):
    """``(A v)[j] = v[j] - Φ(v[j-1])`` at every point of the block (``v[0]`` at s = 0).

    ``propagate``: :func:`~refbraid.mgrit.relax.propagate_at`, or its batched twin
    (:mod:`refbraid.mgrit.batched`) for a problem with a ``batched_step``."""
    return v - propagate(v, None, points, range(len(points)), step, ghost, ghost_point)


def fas_rhs(r, v, coarse_points, coarse_step: StepFn, ghost=None, ghost_point=None,
            propagate=propagate_at, out=None):
    """FAS coarse right-hand side ``g_Δ = r + A_Δ(v)`` (r: fine C-point residual, v = u[C]).

    ``out``: an array to hold the sum (:func:`~refbraid.backends.into.add_into`: the same
    additions), else a new one."""
    return add_into(r, apply_operator(v, coarse_points, coarse_step, ghost, ghost_point,
                                      propagate), out)


def fas_sum(rr, v, phi, out=None):
    """``g_Δ = rr + (v − Φ_Δ)`` given the block ``phi`` of ``Φ_Δ(v[j − 1])`` (:func:`fas_rhs`'s
    arithmetic): into ``out`` (a fresh array for NumPy ``v`` without one) where NumPy allows,
    the difference and then the sum in place, no temporaries; else new arrays."""
    g = np.empty(v.shape, dtype=v.dtype) if out is None and isinstance(v, np.ndarray) else out
    if g is not None and in_place_ok(g, v, phi, rr):
        np.subtract(v, phi, out=g)
        return np.add(rr, g, out=g)
    if g is not None and plus_difference(g, rr, v, phi):  # CuPy: the same two, one launch
        return g
    return add_into(rr, v - phi, out)


def correct(u, c_pos, w, v, inplace: bool = False, interpolate=None):
    """FAS correction ``u[C] += w - v`` (``u[C] += P(w - v)`` with ``interpolate`` = P on
    the stacked differences); F-points are left for the interpolating F-sweep.

    Returns a corrected copy, or corrects ``u`` itself with ``inplace``. On CuPy arrays the
    difference and the sum are one launch (``cupy_fused.plus_difference``: the same
    additions)."""
    out = u if inplace else copy(u)
    rows = row_slice(c_pos)
    if interpolate is None and rows is not None and is_cupy_array(out):
        view = out[rows, ...]
        if plus_difference(view, view, w, v):
            return out
    d = w - v
    if interpolate is not None:
        d = interpolate(d)
    if rows is not None and (isinstance(out, np.ndarray) or one_array_library(out, d)):
        view = out[rows, ...]  # a NumPy (or CuPy) view of the C-rows: corrected in place
        view += d
        return out
    if rows is not None:  # other array-API arrays: one strided read, add and write
        out[rows, ...] = out[rows, ...] + d
        return out
    for j, k in enumerate(c_pos):
        out[int(k), ...] = out[int(k), ...] + d[j, ...]
    return out


def inject_up(u, c_pos, w, inplace: bool = False):
    """``u[C] = w``: start a finer level from a coarse solution (nested iteration); a copy,
    or ``u`` itself with ``inplace``."""
    return set_rows(u, c_pos, w, inplace)


def forward_substitution(g, points, step: StepFn, ghost=None, ghost_point=None, out=None):
    """Exact solve of ``A(u) = g`` on a block: ``u[0] = g[0]`` (or ``Φ(ghost) + g[0]``),
    ``u[j] = Φ(u[j-1]) + g[j]``. The coarsest-level solve and the sequential oracle.

    NumPy (and CuPy) arrays: each row ``Φ(u[j-1]) + g[j]`` goes straight into a preallocated
    block (``out`` when given: g's shape and dtype), the next step reading the row it wrote; a
    step that takes ``add=`` (a CountingStep's ``takes_add``) writes the sum itself as it
    writes Φ (one pass, the same sum; on a GPU one launch where a sum and a copy would be
    three). The same numbers as a list of rows and a stack. A step that changes dtype or shape
    sends the rest down the list path (as :func:`~refbraid.mgrit.relax.propagate_at`), and so
    does a step on CuPy arrays that returns a new array rather than writing the row (on a GPU
    one stack at the end is fewer launches than a copy per row); other arrays take the list
    path."""
    first = _first_row(g, points, step, ghost, ghost_point)
    p = [int(s) for s in points]
    if one_array_library(g, first):
        block = empty_on(g, g.shape) if out is None else out
        device = not isinstance(block, np.ndarray)
        adds = getattr(step, "takes_add", False)  # Φ + g written by the step (its add=)
        prev = first
        for j in range(1, len(p)):
            row, g_row = block[j, ...], g[j, ...]
            val = (step(prev, p[j - 1], p[j], out=row, add=g_row) if adds
                   else step(prev, p[j - 1], p[j]))
            if (not (one_array_library(val, block) and tuple(val.shape) == block.shape[1:])
                    or (device and val is not row)):
                rows = [first, *block[1:j], val if adds else val + g_row]
                return _substitute_rest(rows, g, p, step)
            _write_row(row, val, None if adds else g_row)  # nothing where the step wrote it
            prev = row
        block[0, ...] = first
        return block
    return _substitute_rest([first], g, p, step)


def _first_row(g, points, step: StepFn, ghost, ghost_point):
    """``u[0]`` of :func:`forward_substitution` (``propagate_at``'s row 0): ``g[0]`` at the
    initial point — a view, which the first step reads where it is and the block gets a copy
    of, at the end — else ``Φ(ghost) + g[0]``; no block of one row (on a GPU the stack of
    one row was a launch on the solve's critical path)."""
    if int(points[0]) == 0:
        return g[0, ...]
    if ghost is None:
        raise ValueError(f"block starting at s={int(points[0])} needs a `ghost` value.")
    return ghost_step(step, ghost, ghost_point, int(points[0])) + g[0, ...]


def _substitute_rest(rows: list, g, p: list, step: StepFn):
    """:func:`forward_substitution`'s list path from row ``len(rows)`` on; the rows stacked."""
    prev = rows[-1]
    for j in range(len(rows), len(p)):
        prev = step(prev, p[j - 1], p[j]) + g[j, ...]
        rows.append(prev)
    return stack_rows(rows)
