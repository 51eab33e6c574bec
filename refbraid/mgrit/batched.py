"""Batched relaxation: the functions of relax.py with one step call per *sweep*, not per point.

The per-point functions in :mod:`refbraid.mgrit.relax` are the definition; these compute the
same values when the problem has a ``batched_step`` (:class:`~refbraid.mgrit.problem.Problem`).
What makes batching possible is that the updates of one sweep are independent:

* F-relaxation: in every coarse interval the F-points ``c+1, ..., c+m-1`` after the C-point
  ``c`` are updated in order, but different intervals never read each other. So sweep j
  (j = 1..m-1) updates the j-th F-point of *every* interval at once::

      for j = 1..m-1:   u[F_j] = Φ(u[F_j - 1]) + g[F_j]        (F_j: j-th F-point of each
                                                                interval; F_0 = the C-points)

  m - 1 batched calls instead of one call per F-point (N (m-1)/m on level 0).
* C-relaxation, the C-point residual, and the FAS operator ``(A v)[k] = v[k] - Φ(v[k-1])``
  read only the *old* iterate: one batched call ``(P u)[K] = Φ(u[K - 1]) + g[K]`` for all
  positions K, the previous block's ``ghost`` stacked in front when the block's first point
  needs it. A step that writes rows (``out=``/``add=``) writes the residual's rows in place
  (:func:`residual_at`): no stacked block, no separate ``+ g``.

The coarsest level's forward substitution is sequential by nature and stays per-point.
Under a communicator each rank batches over its own block (the ghost comes from its
neighbour as before). Arrays must support integer-array indexing (NumPy, CuPy).

Round-off: each row of a batched call is the step of that row, so the result is bit-identical
to the per-point path whenever ``batched_step`` does the same floating-point operations per
row: elementwise steps, and matrix steps written as ``np.matmul(M, U[:, :, None])`` (NumPy's
per-row matrix-vector kernel, as ``M @ u``). All the problems of refbraid.mgrit.problems and
pymgrit_twins are (tests/mgrit/test_mgrit_batched.py). One GEMM ``U @ Mᵀ`` for all rows sums
in another order: round-off, and results that change with the block split over ranks.

Shape legend: n points in the block, S the state shape, k rows of one batched call.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from array_api_compat import is_cupy_array

from ..backends.cupy_fused import plus_difference
from ..backends.into import in_place_ok, one_array_library
from ..backends.portable import empty_on
from .arrays import namespace
from .coarse import fas_sum
from .relax import Stepped, copy, row_slice, rows_view, set_rows


def f_sweeps(f_pos) -> list[np.ndarray]:
    """The F-positions grouped by sweep: entry j-1 holds the j-th F-point of every interval.

    ``f_pos`` is increasing and every run of consecutive F-positions follows a C-point (a
    block starts with a C-point), so the j-th member of each run depends only on the
    (j-1)-th. Returns m - 1 arrays (fewer on a block whose intervals are all shorter).
    """
    f = np.asarray(f_pos, dtype=np.int64)
    if f.size == 0:
        return []
    starts_run = np.ones(f.size, dtype=bool)
    starts_run[1:] = np.diff(f) != 1
    idx = np.arange(f.size)
    run_start = np.maximum.accumulate(np.where(starts_run, idx, 0))
    offset = idx - run_start  # 0 for the first F-point after a C-point
    return [f[offset == j] for j in range(int(offset.max()) + 1)]


class Sweep(NamedTuple):
    """One F-sweep of a level's block, ready to run: the rows it writes and reads (slices,
    i.e. views, when evenly spaced, as they always are in MGRIT) and their solver indices."""

    rows: slice | np.ndarray  # positions F_j
    prev: slice | np.ndarray  # positions F_j - 1
    starts: np.ndarray  # points[F_j - 1]
    stops: np.ndarray  # points[F_j]


def sweep_plan(sweeps: list[np.ndarray], points) -> list[Sweep]:
    """:func:`f_sweeps`' groups as :class:`Sweep` records for the block with ``points`` (the
    cycle makes them once per level, not once per relaxation)."""
    out = []
    for rows in sweeps:
        prev = rows - 1
        out.append(Sweep(row_slice(rows) or rows, row_slice(prev) or prev, points[prev],
                         points[rows]))
    return out


def f_relax(u, g, points, sweeps: list, step, inplace: bool = False):
    """F-relaxation with one batched call per sweep: ``u[F_j] = Φ(u[F_j - 1]) + g[F_j]``.

    ``sweeps`` from :func:`f_sweeps` (or already planned by :func:`sweep_plan` for these
    ``points``); ``step`` a :class:`~refbraid.mgrit.problem.CountingStep`; g None: zero
    forcing. Same values as :func:`refbraid.mgrit.relax.f_relax` (module docstring on
    round-off).
    """
    out = u if inplace else copy(u)
    if sweeps and not isinstance(sweeps[0], Sweep):
        sweeps = sweep_plan(sweeps, points)
    for sw in sweeps:
        # the rows of one sweep are evenly spaced: slices (views), no gathered copies
        if (step.batched_into and isinstance(sw.rows, slice)
                and (g is None or one_array_library(out, g))):
            # Φ (+ g) written into u's rows by the step itself: a step kernel that can write
            # there saves the copy (or the sum) a new result would need
            step.many(out[sw.prev, ...], sw.starts, sw.stops, out=out[sw.rows, ...],
                      add=None if g is None else g[sw.rows, ...])
            continue
        val = step.many(out[sw.prev, ...], sw.starts, sw.stops)
        if g is not None and isinstance(sw.rows, slice) and one_array_library(out, val, g):
            np.add(val, g[sw.rows, ...], out=out[sw.rows, ...])  # Φ + g straight into u
        else:
            out[sw.rows, ...] = val if g is None else val + g[sw.rows, ...]
    return out


def propagate_at(u, g, points, positions, step, ghost=None, ghost_point=None):
    """``(P u)[k] = Φ(u[k-1]; p_{k-1} → p_k) + g[k]`` at ``positions``, one batched call.

    As :func:`refbraid.mgrit.relax.propagate_at` (g None: zero forcing; at the initial point
    ``g[0]``; at k = 0 of a later block Φ of the ``ghost``). Returns (len(positions), *S).
    """
    xp = namespace(u)
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size == 0:
        return u[:0, ...]
    first = pos.size and pos[0] == 0
    inner = pos[1:] if first else pos
    prev = inner - 1
    x, s0, s1 = rows_view(u, prev), points[prev], points[inner]
    initial = first and int(points[0]) == 0
    if first and not initial:  # the block's first point: Φ of the previous block's last point
        if ghost is None:
            raise ValueError(f"block starting at s={int(points[0])} needs a `ghost` value.")
        if isinstance(ghost, Stepped):  # Φ of the ghost made by its owner
            head = xp.asarray(ghost.value)[None, ...]
            out = xp.concat([head, step.many(x, s0, s1)], axis=0) if len(s0) else head
            return out + rows_view(g, pos) if g is not None else out
        x = xp.concat([xp.asarray(ghost)[None, ...], x], axis=0)
        s0 = np.concatenate([[int(ghost_point)], s0])
        s1 = np.concatenate([[int(points[0])], s1])
    out = step.many(x, s0, s1) if len(s0) else u[:0, ...]
    if initial:
        head = g[:1, ...] if g is not None else xp.zeros_like(u[:1, ...])
        return xp.concat([head, out + rows_view(g, inner) if g is not None else out], axis=0)
    return out + rows_view(g, pos) if g is not None else out


def residual_at(u, g, points, c_pos, step, ghost=None, ghost_point=None,
                unforced: bool = False):
    """The C-point residual ``r[j] = Φ(u[c_j − 1]) + g[c_j] − u[c_j]`` of a block, shape
    (c, *S): :func:`propagate_at` at the C-positions minus ``u[C]``, the same values.

    Where the step writes rows (:attr:`~refbraid.mgrit.problem.CountingStep.batched_into`)
    and the arrays allow (:func:`_propagate_into`), the rows are made where they end::

        r[0]  = g[0]                   (the initial point)   or   Φ(ghost) + g[0]  (Stepped)
        r[1:] = Φ(u[C[1:] − 1]) + g[C[1:]]                   written by the step itself
        r    -= u[C]                                         in place

    instead of the block ``(P u)[C]`` stacked from the ghost's row and the step's rows, then
    ``+ g`` and ``− u[C]`` each into a new block: on a GPU two whole-block launches (and their
    memory traffic) fewer. ``unforced``: g is zero except at the initial point (level 0 of an
    unforced problem), so ``+ g`` is left out on the other rows (``Φ + 0 = Φ``; only a zero's
    sign can differ). Otherwise (a plain ghost to step here, another array library, a step
    that returns new arrays) :func:`propagate_at` and a subtraction, as before.
    """
    return residual_and_squares(u, g, points, c_pos, step, ghost, ghost_point, unforced,
                                squares=False)[0]


def residual_and_squares(u, g, points, c_pos, step, ghost=None, ghost_point=None,
                         unforced: bool = False, squares: bool = True):
    """``(r, Σ r²)``: :func:`residual_at`'s r, and where its rows were written in place on
    CuPy arrays (a GPU, or the CuPy stand-in) with ``squares``, the last pass ``r −= u[C]``
    and the sum of squares its norm needs in one launch
    (:func:`refbraid.backends.cupy_residual.subtract_sum_squares`: a 0-d float64 array where
    r lives, summed in double in a fixed order); else ``Σ r²`` is None (the caller reduces
    r as before)."""
    rows = row_slice(c_pos)
    if rows is not None:
        uc = u[rows, ...]
        r = empty_on(u, uc.shape)
        if _propagate_into(r, u, g, points, c_pos, step, ghost, unforced):
            if squares and is_cupy_array(r):
                from ..backends.cupy_residual import subtract_sum_squares

                return r, subtract_sum_squares(r, uc)
            return np.subtract(r, uc, out=r), None
    pu = propagate_at(u, g, points, c_pos, step, ghost, ghost_point)
    uc = rows_view(u, c_pos)
    return (np.subtract(pu, uc, out=pu) if in_place_ok(pu, uc) else pu - uc), None


def c_relax_at(u, g, points, c_pos, step, ghost=None, ghost_point=None,
               unforced: bool = False):
    """C-relaxation ``u[c_j] = Φ(u[c_j − 1]) + g[c_j]`` in place (``relax.c_relax`` of
    :func:`propagate_at`'s block: the same values; ``unforced`` as in :func:`residual_at`).
    Where the step writes rows the C-rows of ``u`` are its output (:func:`_propagate_into`):
    no block of ``(P u)[C]``, no ``+ g`` apart, no copy into ``u``. Returns ``u``."""
    rows = row_slice(c_pos)
    if rows is not None and _propagate_into(u[rows, ...], u, g, points, c_pos, step, ghost,
                                            unforced):
        return u
    pu = propagate_at(u, g, points, c_pos, step, ghost, ghost_point)
    return set_rows(u, c_pos, pu, inplace=True)


def _propagate_into(out, u, g, points, c_pos, step, ghost, unforced: bool) -> bool:
    """``out[j] = (P u)[c_j] = Φ(u[c_j − 1]) + g[c_j]`` written row by row where it ends —
    ``out[0]`` from g (the initial point) or a Stepped ghost, the other rows by the step's
    own ``out=``/``add=`` (``+ g`` left out where ``unforced``) — when the step writes rows
    and the arrays allow: NumPy or CuPy alike, one dtype, the block starting with a C-point
    and C-positions evenly spaced (``out`` and these rows of u may be the same memory: the
    step reads F-rows only). Returns whether it did (else nothing is written)."""
    c = len(c_pos)
    initial = c and int(points[0]) == 0
    if not (step.batched_into and c and int(c_pos[0]) == 0
            and (initial or isinstance(ghost, Stepped))
            and one_array_library(u, out, *(() if g is None else (g,)))):
        return False
    if initial:  # (P u)[0] = g[0] (0 without g: propagate_at's zeros)
        out[:1, ...] = 0 if g is None else g[:1, ...]
    elif g is None or unforced:
        out[:1, ...] = namespace(u).asarray(ghost.value)[None, ...]
    else:
        np.add(namespace(u).asarray(ghost.value)[None, ...], g[:1, ...], out=out[:1, ...])
    if c > 1:
        inner = np.asarray(c_pos[1:], dtype=np.int64)
        add = None if (g is None or unforced) else g[row_slice(inner), ...]
        step.many(u[row_slice(inner - 1), ...], points[inner - 1], points[inner],
                  out=out[1:, ...], add=add)
    return True


def fas_rhs(rr, v, points, step, ghost=None, ghost_point=None, out=None):
    """The FAS right-hand side of a coarse block, ``g_Δ[j] = rr[j] + (v[j] − Φ_Δ(v[j − 1]))``
    (``rr`` the restricted residual, ``v`` the restricted C-values; at s = 0 ``Φ_Δ`` is 0),
    as :func:`refbraid.mgrit.coarse.fas_rhs` computes it: the same values.

    ``out``: an array for g_Δ (a workspace's), else a new one. Where the step writes rows
    (as for :func:`residual_at`) ``Φ_Δ`` is made in ``out`` itself::

        out[0]  = 0 (the initial point)   or   Φ_Δ(ghost) (a Stepped ghost)
        out[1:] = Φ_Δ(v[:-1])              written by the step
        out     = rr + (v − out)           in place

    (no stacked block of ``Φ_Δ``, no temporaries); otherwise :func:`propagate_at`, then the
    difference and the sum into ``out`` where NumPy allows.
    """
    n = v.shape[0]
    g = empty_on(v, v.shape) if out is None else out
    if (one_array_library(v, rr) and rr.shape == g.shape == v.shape
            and _propagate_into(g, v, None, points, np.arange(n), step, ghost, False)):
        if plus_difference(g, rr, v, g):  # CuPy: the two lines below in one launch
            return g
        np.subtract(v, g, out=g)
        return np.add(rr, g, out=g)
    return fas_sum(rr, v, propagate_at(v, None, points, range(n), step, ghost, ghost_point),
                   g)
