"""Residual norms whose reduction may wait: one collective at the end of a solve.

A rank's residual norm is ``‖r‖ = (Σ_ranks Σ_rows r²)^½``: a local sum, then a reduction over
the ranks, which is a synchronisation point — every rank waits there for the slowest. The
solver *decides* on few of its norms: the level-0 norm of an iteration after which another
may follow (the stopping test). Every other norm is only recorded: the coarse levels' visits,
the post-cycle norm, and the level-0 norm of an iteration known to be the last (the loop
ends whatever it is; only the status' name depends on it). Those keep their local sums here
and are reduced together, with the solution's finiteness flag, in one collective at the end
of the solve. The floats are the same (each sum in rank order, as ``allreduce_sum`` makes
it); a solve makes fewer collectives: with TorchBraid's settings 2 instead of 4 in the
forward solve and 1 instead of 2 in the adjoint one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.host import finite_by_sum, to_host
from ..parallel.comm import allreduce_sums
from .arrays import namespace
from .record import IterationRecord
from .settings import MGRITSettings


@dataclass(frozen=True, eq=False)
class FiniteBySum:
    """A device block's finiteness, told by its sum: ``total`` (``Σ u``, a 0-d device array
    left where it was reduced) is finite whenever every value is — one NaN or ±inf makes it
    NaN or ±inf — so one read of the block answers, where ``all(isfinite(u))`` writes and
    reads a block of flags as well. A total that is not finite (a NaN/inf, or finite values
    whose sum overflows) is checked again exactly (:meth:`settle`)."""

    total: Any
    block: Any

    def settle(self, total: float) -> bool:
        """Whether the block is finite, given ``total`` brought to the host."""
        return finite_by_sum(total, self.block)


class PendingNorms:
    """Local sums of squares waiting for one reduction; each with the setter that stores its
    norm ``√(Σ_ranks local)`` into the record once reduced."""

    def __init__(self) -> None:
        self._items: list[tuple[float, Callable[[float], None]]] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, local_sq, store: Callable[[float], None]) -> None:
        """Keep ``local_sq`` (this rank's Σ r²: a float, or a 0-d device array left where it
        was reduced); ``store(norm)`` runs in :meth:`resolve`."""
        self._items.append((local_sq, store))

    def resolve(self, comm, finite=True, keep: bool = False) -> bool:
        """Bring the kept sums and this rank's ``finite`` (a bool, a 0-d boolean device
        array, or a :class:`FiniteBySum`) to the host, the device ones in one transfer;
        reduce the sums and the count of ranks whose block is not finite in one collective
        (every rank calls it with as many values); store the norms. Returns whether every
        rank's block is finite. ``keep``: keep the sums for another resolution (a captured
        solve's, after each replay)."""
        items = self._items
        if not keep:
            self._items = []
        by_sum = isinstance(finite, FiniteBySum)
        *mine, ok = _on_host([sq for sq, _ in items] + [finite.total if by_sum else finite])
        ok = finite.settle(ok) if by_sum else ok
        # the count of non-finite blocks (not of finite ones: the reduction group may be
        # larger than the solve's communicator, e.g. data-parallel groups)
        *sums, bad = allreduce_sums(comm, [*mine, 0.0 if ok else 1.0])
        for (_, store), total in zip(items, sums, strict=True):
            store(math.sqrt(total))
        return bad == 0


def _on_host(values: list) -> list[float]:
    """Floats of ``values`` (floats and 0-d device arrays): the device ones stacked where they
    live and copied to the host once (one synchronisation instead of one per norm)."""
    device = [k for k, v in enumerate(values)
              if not isinstance(v, (float, int, bool, np.floating, np.bool_))]
    out = [float(v) if k not in device else 0.0 for k, v in enumerate(values)]
    if device:
        xp = namespace(values[device[0]])
        kinds = [values[k].dtype for k in device]
        target = next((d for d in kinds if d != xp.bool), xp.float64)  # the sums' dtype
        same = [values[k] if d == target else xp.astype(values[k], target)  # flags: 1 / 0
                for k, d in zip(device, kinds, strict=True)]
        host = np.asarray(to_host(xp.stack(same)), np.float64)
        for k, v in zip(device, host.tolist(), strict=True):
            out[k] = float(v)
    return out


def defer_norms(pending: PendingNorms, local_sq: Callable, rec: IterationRecord, r, r_post,
                deferred: bool) -> None:
    """Keep the norms of iteration record ``rec`` that wait for the end of the solve: the
    post-cycle norm of ``r_post`` when it is another residual than ``r`` (only recorded), and
    with ``deferred`` the iteration's own norm of ``r`` (``rec.norm``, its level-0 visit, and
    the post-cycle norm when that is the same residual). ``local_sq(r, on_host=False)``: this
    rank's Σ r², left where it was reduced."""
    if r_post is not r:
        pending.add(local_sq(r_post, on_host=False),
                    lambda n: setattr(rec, "post_cycle_norm", n))
    if deferred:
        def store(n: float) -> None:
            rec.norm = rec.visits[0].norm = n
            if r_post is r:
                rec.post_cycle_norm = n

        pending.add(local_sq(r, on_host=False), store)


def status(norm: float, first: float, s: MGRITSettings) -> tuple[str | None, str]:
    """'diverged' (NaN/inf, or grown beyond ``max_growth`` × ``first``), 'converged' (within
    ``abs_tol`` or ``rel_tol`` × ``first``) or None, with the message that says why."""
    if not math.isfinite(norm):
        return "diverged", f"residual norm is {norm}"
    if first > 0 and norm > s.max_growth * first:
        return "diverged", f"residual grew by {norm / first:.3g} > max_growth={s.max_growth:g}"
    if s.abs_tol is not None and norm <= s.abs_tol:
        return "converged", f"||r|| = {norm:.3e} <= abs_tol={s.abs_tol:g}"
    if s.rel_tol is not None and norm <= s.rel_tol * first:
        return "converged", f"||r|| = {norm:.3e} <= rel_tol={s.rel_tol:g} * ||r_first||"
    return None, ""


def status_after(norm: float, first: float, s: MGRITSettings, cycles: int,
                 n_levels: int) -> tuple[str | None, str]:
    """The status after iteration ``cycles`` measured ``norm`` (``first``: the first
    iteration's): :func:`status`, else 'converged' with one level (the exact sequential
    solve), else 'max_iter' after the last cycle, else ``(None, "")``: go on."""
    found, message = status(norm, first, s)
    if found is None and n_levels == 1:
        return "converged", "one level: exact sequential solve"
    if found is None and cycles >= s.max_iter:
        return "max_iter", f"max_iter={s.max_iter} cycles done"
    return found, message
