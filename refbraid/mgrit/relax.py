"""Relaxation on one level: F-sweeps, C-sweeps and the C-point residual (pure functions).

On a level with points ``p_0 < ... < p_n`` (solver indices), iterate ``u`` and right-hand side
``g`` (docs/references.md §2)::

    Φ-update at k:   (P u)[k] = Φ(u[k-1]; p_{k-1} → p_k) + g[k]      (P u)[0] = g[0] at s = 0
    F-relaxation:    u[k] ← (P u)[k] for F-points k, in increasing order
    C-relaxation:    u[k] ← (P u)[k] for C-points k
    residual:        r[k] = g[k] - (A u)[k] = (P u)[k] - u[k]  at C-points
    FCF:             F, then (C, F) × cf_sweeps

so the residual at a C-point is the change C-relaxation would make there. After
an F-sweep the residual vanishes at F-points; at C-points it is what XBraid reports.

Every function works on a *block*: the contiguous points one rank owns (a block starts with a
C-point, so F-sweeps need no neighbour). The C-update of the block's first point needs the
previous block's last point on this level: ``ghost`` at solver index ``ghost_point`` (``None``
when the block starts at the initial point ``s = 0``), or that point already stepped across
the boundary, a :class:`Stepped` ghost (how the cycle exchanges it: the rank that owns a
step's start point, and so its layer, makes the step). The step is called ``step(u, s0, s1)``
in solver indices. Functions return new arrays and never modify their inputs, unless asked
with ``inplace=True`` (the cycle does, on the level arrays it owns, to save a copy of the whole
level per sweep; the math is the same).

Shape legend: n points in the block, c of them C-points, S the state shape; u, g are (n, *S).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.device_batching import index_on
from ..backends.into import one_array_library
from ..backends.portable import stack_rows
from ..indexing import even_slice
from .arrays import namespace

StepFn = Callable[[Any, int, int], Any]


@dataclass(frozen=True, eq=False)
class Stepped:
    """A ghost that crossed the block boundary already stepped: ``value = Φ(ghost; ghost_point →
    p_0)``, made by the previous block's owner (the owner of the step's start point) and sent
    instead of the ghost itself. The same float as the step made here."""

    value: Any


def ghost_step(step: StepFn, ghost, ghost_point, p0: int):
    """``Φ(ghost; ghost_point → p0)``: what a :class:`Stepped` ghost carries, else the step
    of a plain ghost made here."""
    if isinstance(ghost, Stepped):
        return ghost.value
    return step(ghost, int(ghost_point), int(p0))


def copy(u):
    """A fresh copy of an array in its own namespace."""
    return namespace(u).asarray(u, copy=True)


def take_rows(u, positions):
    """Rows ``u[positions]`` as one stacked array, shape (len(positions), *S)."""
    xp = namespace(u)
    return xp.take(u, index_on(u, positions), axis=0)  # the index: copied once per cache


def rows_view(u, positions):
    """Rows ``u[positions]`` for reading only: a strided slice when the positions are evenly
    spaced (a view on NumPy and CuPy: no copy, no launch), else :func:`take_rows`."""
    rows = row_slice(positions)
    return take_rows(u, positions) if rows is None else u[rows, ...]


def row_slice(positions) -> slice | None:
    """``positions`` as a slice when they are evenly spaced and increasing (MGRIT's C-points
    and the rows of one batched F-sweep always are), else None. A NumPy array indexed by a
    slice is a view: rows are read and written in place, without gathering copies."""
    return even_slice(positions)


def set_rows(u, positions, values, inplace: bool = False):
    """``u`` (a copy, or ``u`` itself with ``inplace``) with ``u[positions[j]] = values[j]``.

    One assignment through a slice when the positions are evenly spaced (the array API's
    strided slice assignment: one copy, one launch on a GPU), else a loop over rows (the array
    API has no integer-array assignment); the same values."""
    out = u if inplace else copy(u)
    rows = row_slice(positions)
    if rows is not None:
        out[rows, ...] = values
        return out
    for j, k in enumerate(positions):
        out[int(k), ...] = values[j, ...]
    return out


def propagate_at(u, g, points, positions, step: StepFn, ghost=None, ghost_point=None):
    """``(P u)[k] = Φ(u[k-1]; p_{k-1} → p_k) + g[k]`` at ``positions`` (g None: zero forcing).

    At the initial point (k = 0, p_0 = 0) it is ``g[0]``; at k = 0 of a later block the
    previous point is the ``ghost``. Returns shape (len(positions), *S).
    """
    xp = namespace(u)
    ks = np.asarray(positions).tolist()
    if isinstance(u, np.ndarray) and ks:
        return _propagate_into_block(u, g, points, ks, step, ghost, ghost_point)
    out = []
    p = np.asarray(points).tolist()
    for k in ks:
        if k > 0:
            val = step(u[k - 1, ...], p[k - 1], p[k])
        elif int(points[0]) == 0:
            out.append(g[0, ...] if g is not None else xp.zeros_like(u[0, ...]))
            continue
        else:
            if ghost is None:
                raise ValueError(f"block starting at s={int(points[0])} needs a `ghost` value.")
            val = ghost_step(step, ghost, ghost_point, int(points[0]))
        out.append(val + g[k, ...] if g is not None else val)
    if not out:
        return u[:0, ...]
    return stack_rows(out)


def _propagate_into_block(u, g, points, ks: list, step: StepFn, ghost, ghost_point):
    """:func:`propagate_at` for NumPy arrays, each row written into one preallocated block
    (``Φ(u[k-1]) + g[k]`` added straight into its row) instead of a list and a stack: the
    same numbers whenever every row has u's dtype and row shape, as the steps of MGRIT's
    problems do; the first row that does not sends the rest down the list path."""
    p = np.asarray(points).tolist()
    block = np.empty((len(ks), *u.shape[1:]), dtype=u.dtype)
    into = g is None and getattr(step, "takes_out", False)  # Φ written into its row
    for j, k in enumerate(ks):
        row = block[j, ...]
        if k > 0:
            val = step(u[k - 1, ...], p[k - 1], p[k], out=row) if into \
                else step(u[k - 1, ...], p[k - 1], p[k])
        elif p[0] == 0:
            if g is None:
                block[j, ...] = 0
            elif g.dtype == block.dtype:
                block[j, ...] = g[0, ...]
            else:
                return _rest_as_list(block, j, g[0, ...], u, g, points, ks, step, ghost,
                                     ghost_point)
            continue
        else:
            if ghost is None:
                raise ValueError(f"block starting at s={p[0]} needs a `ghost` value.")
            val = ghost_step(step, ghost, ghost_point, p[0])
        same = (isinstance(val, np.ndarray) and val.dtype == block.dtype
                and val.shape == block.shape[1:] and (g is None or g.dtype == block.dtype))
        if not same:
            row = val + g[k, ...] if g is not None else val
            return _rest_as_list(block, j, row, u, g, points, ks, step, ghost, ghost_point)
        _write_row(row, val, None if g is None else g[k, ...])
    return block


def _rest_as_list(block, j: int, row, u, g, points, ks: list, step, ghost, ghost_point):
    """Rows ``block[:j]``, ``row`` and the rest of :func:`propagate_at`'s rows, stacked."""
    tail = [propagate_at(u, g, points, [k], step, ghost, ghost_point)[0, ...]
            for k in ks[j + 1:]]
    return np.stack([*block[:j], row, *tail])


def c_residual(u, g, points, c_pos, step: StepFn, ghost=None, ghost_point=None):
    """``r = (P u)[C] - u[C]`` at the C-positions ``c_pos``; shape (c, *S)."""
    return propagate_at(u, g, points, c_pos, step, ghost, ghost_point) - take_rows(u, c_pos)


def c_relax(u, pu_c, c_pos, inplace: bool = False):
    """C-relaxation ``u[C] = (P u)[C]``, given ``pu_c = propagate_at(u, ..., c_pos, ...)``.

    (The cycle computes ``pu_c`` once and takes the residual ``pu_c - u[C]`` from it.)
    """
    return set_rows(u, c_pos, pu_c, inplace)


def f_relax(u, g, points, f_pos, step: StepFn, inplace: bool = False):
    """F-relaxation: ``u[k] = Φ(u[k-1]) + g[k]`` for every F-position k in increasing order
    (g None: zero forcing, ``u[k] = Φ(u[k-1])``).

    NumPy arrays: the result goes straight into row k — the step writes it there when it
    takes ``out=`` (:class:`~refbraid.mgrit.problem.CountingStep`), ``Φ + g[k]`` is added into
    it — instead of a new array copied in: the same numbers, one state copy less per step."""
    out = u if inplace else copy(u)
    p = np.asarray(points).tolist()  # Python ints: no NumPy scalar per index
    if isinstance(out, np.ndarray):
        into = getattr(step, "takes_out", False)
        for k in np.asarray(f_pos).tolist():
            row = out[k, ...]
            val = step(out[k - 1, ...], p[k - 1], p[k], out=row) if into and g is None \
                else step(out[k - 1, ...], p[k - 1], p[k])
            _write_row(row, val, None if g is None else g[k, ...])
        return out
    for k in np.asarray(f_pos).tolist():
        val = step(out[k - 1, ...], p[k - 1], p[k])
        out[k, ...] = val if g is None else val + g[k, ...]
    return out


def _write_row(row, val, g_row) -> None:
    """``row[...] = val (+ g_row)`` for a NumPy (or CuPy) row: nothing when the step wrote
    ``val`` into ``row`` already, the sum added straight into ``row`` when the arrays are of
    one library and dtype (else the sum of a new array, cast on assignment, as before)."""
    if g_row is None:
        if val is not row:
            row[...] = val
    elif one_array_library(val, g_row, row):
        np.add(val, g_row, out=row)
    else:
        row[...] = val + g_row
