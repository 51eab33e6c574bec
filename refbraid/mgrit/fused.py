"""The solver's bookkeeping fused into the sweeps: the same arithmetic, one pass per row.

The textbook cycle (:mod:`refbraid.mgrit.cycle`) passes over whole blocks of C-rows between
its sweeps: the C-point residual ``r = (P u)[C] − u[C]`` after the F-sweep, the FAS
right-hand side ``g_Δ = r + (v − Φ_Δ(v))`` and the restriction ``w = v`` after the
relaxation, the correction ``u[C] += w − v`` before the next F-sweep. Each of these is a
function of a few rows at one C-point, so it can be done *at* that point, while its rows
are in cache, by the loop that visits it anyway::

    sweep_residual (per C-point j of the block, in order):
        u[c_j] += w[j] − v[j]                           the deferred correction (if any)
        r[j]    = Φ(u[c_j − 1]) + g[c_j] − u[c_j]       the residual (j ≥ 1; row 0 needs the
                                                        ghost: first_residual_row)
        u[k]    = Φ(u[k − 1]) + g[k],  k in interval j  the F-sweep
    restrict_fas (per coarse point j):
        w[j] = v[j];   g_Δ[j] = r[j] + (v[j] − Φ_Δ(w[j − 1]))
    c_relax_rows (per C-point j):  u[c_j] = Φ(u[c_j − 1]) + g[c_j]  (and, if asked, the
        residual pu − u[c_j] of the old value first)
    FiniteWatch: the solver's finiteness check of its solution, row by row in the last
        fine sweep, each row checked as it is written (not a pass over the block after)

Why the order is allowed: the residual at ``c_j`` reads ``u[c_j − 1]``, the last point of
interval ``j − 1``, which is final once that interval is swept, and ``u[c_j]``, corrected
just before; interval ``j``'s sweep reads only ``u[c_j]`` and its own points. C-relaxation
reads only F-points and writes only C-points (C-points are ≥ 2 apart), so it may run in any
order. Nothing else reads level ℓ between a coarse correction and the next F-sweep of
level ℓ (cycle.py: every correction is followed by that sweep), so the correction may wait
for it.

Equality: every row gets the same floating-point operations on the same operands as in the
textbook (``Φ`` written into its destination is the same kernel with another output;
``a + b = b + a`` exactly), so the results are **bit-identical** whenever the step returns
the state's dtype — every step refbraid makes does. (A step returning another dtype gets
its residual rounded to the state's dtype here, as the iterate is; the textbook keeps the
promoted dtype.) tests/mgrit/test_fused.py compares the two paths bit for bit.

The functions take NumPy blocks (C-rows of a CPU state are what a cache holds): rows are
written in place, the step writing ``Φ`` straight into its destination row, ``+ g`` and
``− u`` following in place. On device arrays (CuPy, the ``cuda`` backend's arrays) the cycle
keeps the textbook's block operations (fused_cycle.py): one launch per block operation
there, where a loop over rows would be one per row.

Shape legend: n points in the block, c C-points, S the state shape; ``c_pos`` positions of
the C-points in the block (0, m, 2m, ...: a block starts with a C-point).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .relax import StepFn, _write_row, ghost_step


class Correction(NamedTuple):
    """A coarse correction waiting for the next F-sweep: ``u[c_j] += P_j(w[j] − v[j])``.

    ``interpolate(j, d)`` is P on row j (None: the identity, time-only coarsening)."""

    w: Any  # (c, *S_{ℓ+1}) the coarse solution
    v: Any  # (c, *S_{ℓ+1}) the restricted C-values it corrects (a view of u[C] without R)
    interpolate: Any = None


#: the sweep checks rows of at least this many values one by one (FiniteWatch); a block of
#: smaller rows is checked in one pass afterwards, cheaper than a Python call per row
WATCH_MIN_ROW = 4096


class FiniteWatch:
    """Whether every row shown to it holds only finite values (``ok``), and how many rows it
    saw (``rows``). The solver checks that its solution is finite; the sweep that writes
    the F-rows last shows each row here while the row is still in cache, so the check is no
    second pass over the whole block (the solver checks only the C-rows after).

    A real row is finite if ``Σ r²`` is (an inf or NaN anywhere makes the sum inf or NaN):
    one BLAS pass, no temporary. Only a non-finite sum (or an overflow of finite squares)
    falls back to ``isfinite(row).all()``, the test of
    :func:`refbraid.backends.host.all_finite`: the same answer either way.

    ``carried`` (the problem's ``carries_nonfinite``: ``Φ(u)`` is non-finite wherever ``u``
    is, as in ``u + h F(u)``): a non-finite row k makes every later row of its interval
    non-finite, so only the interval's last F-row is read — the same answer from one row in
    ``cfactor − 1``."""

    def __init__(self, carried: bool = False) -> None:
        self.ok = True
        self.rows = 0
        self.carried = carried

    def see(self, row, last: bool = True) -> None:
        """Count ``row``; read it unless ``carried`` and not ``last`` of its interval."""
        self.rows += 1
        if not self.ok or (self.carried and not last):
            return
        if row.dtype.kind == "f" and row.flags.c_contiguous \
                and np.isfinite(np.vdot(row, row)):
            return
        self.ok = bool(np.isfinite(row).all())


def _correct_row(u, k: int, corr: Correction, j: int) -> None:
    """``u[k] += P(w[j] − v[j])`` (coarse.correct on one row: the same operations)."""
    d = corr.w[j, ...] - corr.v[j, ...]
    if corr.interpolate is not None:
        d = corr.interpolate(j, d)
    row = u[k, ...]
    row += d


def _phi_plus_g(prev, p0: int, p1: int, g_row, step: StepFn, out_row):
    """``Φ(prev; p0 → p1) + g_row`` (g_row None: Φ) written into ``out_row``: the step writes
    Φ there if it takes ``out=``, ``+ g`` is added in place (relax._write_row), or by the step
    as it writes Φ if it takes ``add=`` (one pass: the same sum, ``(Φ rounded) + g``)."""
    if g_row is not None and getattr(step, "takes_add", False):
        _write_row(out_row, step(prev, p0, p1, out=out_row, add=g_row), None)
        return out_row
    val = step(prev, p0, p1, out=out_row) if getattr(step, "takes_out", False) \
        else step(prev, p0, p1)
    _write_row(out_row, val, g_row)
    return out_row


def sweep_residual(u, g_sweep, g_res, points, c_pos, step: StepFn,
                   correction: Correction | None = None, residual: bool = True,
                   watch: FiniteWatch | None = None):
    """F-sweep of a block in place, the pending ``correction`` applied at each C-point just
    before its interval, and (``residual``) the C-point residual rows j ≥ 1; ``watch`` (a
    :class:`FiniteWatch`) sees every F-row as it is written, each flagged whether it ends its
    interval.

    ``g_sweep``: the F-sweep's right-hand side (None: zero forcing); ``g_res``: the
    residual's (the level's g). Returns the residual (c, *S) with row 0 still to be written
    by :func:`first_residual_row`, or None without ``residual``. Same values as
    relax.f_relax, then relax.c_residual at the positions ``c_pos[1:]`` (coarse.correct
    before both when a correction is given)."""
    n = u.shape[0]
    cs = np.asarray(c_pos).tolist()
    p = np.asarray(points).tolist()
    r = np.empty((len(cs), *u.shape[1:]), dtype=u.dtype) if residual else None
    for j, c in enumerate(cs):
        if correction is not None:
            _correct_row(u, c, correction, j)
        if residual and j > 0:
            g_row = None if g_res is None else g_res[c, ...]
            row = _phi_plus_g(u[c - 1, ...], p[c - 1], p[c], g_row, step, r[j, ...])
            np.subtract(row, u[c, ...], out=row)
        stop = cs[j + 1] if j + 1 < len(cs) else n
        for k in range(c + 1, stop):
            g_row = None if g_sweep is None else g_sweep[k, ...]
            row = _phi_plus_g(u[k - 1, ...], p[k - 1], p[k], g_row, step, u[k, ...])
            if watch is not None:
                watch.see(row, k == stop - 1)
    return r


def _first_pu(g, points, step: StepFn, ghost, ghost_point, out_row):
    """``(P u)[0]`` written into ``out_row``: g[0] at the initial point (zeros without g),
    else ``Φ(ghost) + g[0]`` (the ghost's step as relax.propagate_at makes it: no out=)."""
    p0 = int(points[0])
    g_row = None if g is None else g[0, ...]
    if p0 == 0:
        out_row[...] = 0 if g_row is None else g_row
        return out_row
    if ghost is None:
        raise ValueError(f"block starting at s={p0} needs a `ghost` value.")
    _write_row(out_row, ghost_step(step, ghost, ghost_point, p0), g_row)
    return out_row


def first_residual_row(r, u, g, points, step: StepFn, ghost=None, ghost_point=None):
    """Row 0 of :func:`sweep_residual`'s residual, ``(P u)[0] − u[0]`` (the ghost has
    arrived); returns the whole residual (c, *S)."""
    row = _first_pu(g, points, step, ghost, ghost_point, r[0, ...])
    np.subtract(row, u[0, ...], out=row)
    return r


def c_relax_rows(u, g, points, c_pos, step: StepFn, ghost=None, ghost_point=None,
                 residual: bool = False):
    """C-relaxation in place, ``u[c] = Φ(u[c − 1]) + g[c]`` at every C-position, each value
    written straight into its row; with ``residual`` also ``r = (P u)[C] − u[C]`` of the
    values before (relax.c_relax after propagate_at, and their difference: the same
    operations). Returns r (c, *S) or None."""
    cs = np.asarray(c_pos).tolist()
    p = np.asarray(points).tolist()
    r = np.empty((len(cs), *u.shape[1:]), dtype=u.dtype) if residual else None
    scratch = np.empty(u.shape[1:], dtype=u.dtype) if residual else None
    for j, c in enumerate(cs):
        out = scratch if residual else u[c, ...]  # (P u)[c]: straight into u[c] if it may
        if c == 0:
            _first_pu(g, points, step, ghost, ghost_point, out)
        else:
            _phi_plus_g(u[c - 1, ...], p[c - 1], p[c], None if g is None else g[c, ...],
                        step, out)
        if residual:
            np.subtract(scratch, u[c, ...], out=r[j, ...])
            u[c, ...] = scratch
    return r


def restrict_fas(v, r, points, step: StepFn, ghost=None, ghost_point=None,
                 u_out=None, g_out=None):
    """The coarse level's start in one pass over its rows: ``w = v`` (the restriction's
    copy) and the FAS right-hand side ``g_Δ = r + A_Δ(v)``, ``A_Δ(v)[j] = v[j] − Φ_Δ(v[j−1])``
    (``v[0]`` at s = 0, Φ_Δ of the ``ghost`` at a later block's first point).

    ``u_out``, ``g_out``: arrays to write into (a workspace's), else new ones. Returns
    ``(w, g_Δ)``; the same values as coarse.fas_rhs and a copy of v."""
    p = np.asarray(points).tolist()
    w = np.empty(v.shape, dtype=v.dtype) if u_out is None else u_out
    g = np.empty(v.shape, dtype=v.dtype) if g_out is None else g_out
    for j in range(v.shape[0]):
        w[j, ...] = v[j, ...]
        row = g[j, ...]
        if j == 0:
            _first_pu(None, points, step, ghost, ghost_point, row)
        else:
            _phi_plus_g(w[j - 1, ...], p[j - 1], p[j], None, step, row)
        np.subtract(w[j, ...], row, out=row)
        np.add(r[j, ...], row, out=row)
    return w, g
