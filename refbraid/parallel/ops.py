"""Communication as linear operators, each with its adjoint (docs/references.md §5; DistDL).

A *distributed tensor* is one local value per rank: an array, ``None`` (nothing on this rank,
read as zero), or a dict ``{global row index: array}`` of rows. Every exchange MGRIT and the
distributed gradient use is a linear map ``A`` between such tensors, and its adjoint ``Aᵀ``
is again an exchange (the transposed message pattern):

====================  ======================================  ===============================
operator              forward  ``y = A x``                    adjoint  ``x = Aᵀ y``
====================  ======================================  ===============================
``ShiftNext``         ``y_p = x_{p-1}``, ``y_0 = 0``          ``x_p = y_{p+1}``, ``x_{P-1} = 0``
                      (send to the next block)                (send to the previous block)
``HaloExchange``      ``y_p = [x_{p-1}[-1]; x_p]``            ``x_p = y_p[1:]``,
                      (prepend the ghost row)                 ``x_p[-1] += y_{p+1}[0]``
``Broadcast(r)``      ``y_p = x_r``                           ``x_r = Σ_p y_p``  (sum-reduce)
``SumReduce(r)``      ``y_r = Σ_p x_p``                       ``x_p = y_r``      (broadcast)
``AllReduce``         ``y_p = Σ_q x_q``                       itself (the all-ones matrix)
``Gather(r)``         ``y_r = [x_0; …; x_{P-1}]``             ``x_p = y_r[block p]`` (scatter)
``RowExchange``       ``y_p[i] = x_{owner(i)}[i]``, i needed  ``x_o[i] = Σ_{p needs i} y_p[i]``
                      (fetch rows from their owners)          (add the halos back to owners)
====================  ======================================  ===============================

"next" and "previous" are in the communicator's solver order, so on a ``reverted()``
communicator the shift runs the other way; that is exactly the adjoint of the shift, which is
how :class:`ShiftNext` implements it. Every operator is verified by the distributed
dot-product test ``⟨A x, y⟩ = ⟨x, Aᵀ y⟩`` with inner products summed over ranks
(:func:`dot`, :func:`adjoint_mismatch`; tests/mpi/test_ops.py).

The communicator is a :class:`refbraid.parallel.mpi.MPIComm` (or anything with its methods:
``send_next``, ``recv_prev``, ``reverted``, ``allreduce_sum``, ``gather``, ``bcast``,
``allgather``, ``alltoall``, ``scatter``). Device arrays (CuPy, the strict stand-in) stay on
their device: copies and sums are made with the array's own namespace, and the messages are
the communicator's (direct or staged, :mod:`refbraid.parallel.device_messages`).

Shape legend: P ranks, S the shape of one row/state, n_p rows on rank p.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..backends.portable import copy_of

Local = Any  # an array, None (zero) or a dict {row index: array}


# ----------------------------------------------------------------------------- inner products
def _local_dot(a: Local, b: Local) -> float:
    """Σ a·b on this rank; None is zero; dicts pair up by key (a missing key is zero)."""
    if a is None or b is None:
        return 0.0
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            raise TypeError("`a` and `b` must both be row dicts or both be arrays.")
        return float(sum(_local_dot(a[k], b[k]) for k in sorted(set(a) & set(b))))
    return float(np.vdot(np.asarray(a), np.asarray(b)).real)


def dot(comm, a: Local, b: Local) -> float:
    """Distributed inner product ``⟨a, b⟩ = Σ_ranks Σ a·b`` (an allreduce of local sums)."""
    return comm.allreduce_sum(_local_dot(a, b))


def adjoint_mismatch(op: LinearOperator, x: Local, y: Local) -> float:
    """Relative mismatch ``|⟨A x, y⟩ − ⟨x, Aᵀ y⟩| / max(|⟨A x, y⟩|, |⟨x, Aᵀ y⟩|, tiny)``."""
    lhs = dot(op.comm, op.forward(x), y)
    rhs = dot(op.comm, x, op.adjoint(y))
    return relative_error(lhs, rhs)


def _copy(a):
    """A copy that shares no memory (arrays, or dicts of arrays such as one layer's weights)."""
    if a is None:
        return None
    if isinstance(a, Mapping):
        return {k: _copy(v) for k, v in a.items()}
    return copy_of(a)


def _add(a, b):
    """a + b for arrays, or key by key for dicts of arrays (one layer's weight gradients)."""
    if isinstance(a, Mapping):
        return {k: _add(a[k], b[k]) for k in a}
    return a + b


def _sum_in_order(values: Iterable[Any]):
    """Σ of the non-None values, left to right (one fixed order on every rank)."""
    total = None
    for v in values:
        if v is not None:
            total = copy_of(v) if total is None else total + v
    return total


# ----------------------------------------------------------------------------- base class
class LinearOperator:
    """A linear map between distributed tensors; ``T`` is the adjoint as an operator."""

    def __init__(self, comm):
        for name in ("rank", "size", "allreduce_sum"):
            if not hasattr(comm, name):
                raise TypeError(f"`comm` must be a refbraid communicator (MPIComm), got {comm!r}.")
        self.comm = comm

    def forward(self, x: Local) -> Local:
        raise NotImplementedError

    def adjoint(self, y: Local) -> Local:
        raise NotImplementedError

    @property
    def T(self) -> LinearOperator:
        return _Transposed(self)

    def __call__(self, x: Local) -> Local:
        return self.forward(x)


class _Transposed(LinearOperator):
    def __init__(self, op: LinearOperator):
        super().__init__(op.comm)
        self.op = op

    def forward(self, x):
        return self.op.adjoint(x)

    def adjoint(self, y):
        return self.op.forward(y)

    @property
    def T(self) -> LinearOperator:
        return self.op

    def __repr__(self) -> str:
        return f"{self.op!r}.T"


# ----------------------------------------------------------------------------- neighbours
class ShiftNext(LinearOperator):
    """``y_p = x_{p-1}`` (zero on the first block): every rank sends its value to the next.

    Adjoint: the shift on the reverted communicator, ``x_p = y_{p+1}`` (zero on the last).
    Every rank holds an array of the same shape S.
    """

    def forward(self, x):
        return self._shift(self.comm, x)

    def adjoint(self, y):
        return self._shift(self.comm.reverted(), y)

    @staticmethod
    def _shift(comm, x):
        comm.send_next(x)
        got = comm.recv_prev()
        return np.zeros_like(x) if got is None else got

    def __repr__(self) -> str:
        return f"ShiftNext({self.comm!r})"


class HaloExchange(LinearOperator):
    """Prepend the previous block's last row (the ghost; zero on the first block).

    ``x_p`` is a block of rows (n_p, *S) (n_p ≥ 1), ``y_p`` is (n_p + 1, *S). Adjoint: drop
    the ghost row and add it back into its owner's last row (DistDL's halo adjoint).
    """

    def forward(self, x):
        x = np.asarray(x)
        self.comm.send_next(x[-1])
        ghost = self.comm.recv_prev()
        ghost = np.zeros_like(x[-1]) if ghost is None else ghost
        return np.concatenate([ghost[None], x], axis=0)

    def adjoint(self, y):
        y = np.asarray(y)
        back = self.comm.reverted()
        back.send_next(y[0])  # the ghost's cotangent goes home, to the previous block
        add = back.recv_prev()
        x = np.array(y[1:], copy=True)
        if add is not None:
            x[-1] += add
        return x

    def __repr__(self) -> str:
        return f"HaloExchange({self.comm!r})"


# ----------------------------------------------------------------------------- collectives
class Broadcast(LinearOperator):
    """``y_p = x_root`` on every rank (x is None off the root). Adjoint: sum-reduce to root."""

    def __init__(self, comm, root: int = 0):
        super().__init__(comm)
        self.root = _root(root, comm.size)

    def forward(self, x):
        out = self.comm.bcast(x if self.comm.rank == self.root else None, root=self.root)
        return _copy(out)

    def adjoint(self, y):
        parts = self.comm.gather(y, root=self.root)
        return _sum_in_order(parts) if parts is not None else None

    def __repr__(self) -> str:
        return f"Broadcast(root={self.root})"


class SumReduce(LinearOperator):
    """``y_root = Σ_p x_p`` (None elsewhere). Adjoint: broadcast from root."""

    def __init__(self, comm, root: int = 0):
        super().__init__(comm)
        self.root = _root(root, comm.size)
        self._bcast = Broadcast(comm, root)

    def forward(self, x):
        return self._bcast.adjoint(x)

    def adjoint(self, y):
        return self._bcast.forward(y)

    def __repr__(self) -> str:
        return f"SumReduce(root={self.root})"


class AllReduce(LinearOperator):
    """``y_p = Σ_q x_q`` on every rank, in rank order; self-adjoint."""

    def forward(self, x):
        return _sum_in_order(self.comm.allgather(x))

    def adjoint(self, y):
        return self.forward(y)

    def __repr__(self) -> str:
        return "AllReduce()"


class Gather(LinearOperator):
    """``y_root = [x_0; x_1; …]`` stacked along axis 0 (None elsewhere). Adjoint: scatter.

    ``counts`` (rows per rank) is exchanged once, at construction, from ``rows`` (this
    rank's n_p).
    """

    def __init__(self, comm, rows: int, root: int = 0):
        super().__init__(comm)
        self.root = _root(root, comm.size)
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
            raise ValueError(f"`rows` must be a non-negative integer, got {rows!r}.")
        self.counts = [int(c) for c in comm.allgather(int(rows))]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(int)

    def forward(self, x):
        x = np.asarray(x)
        if x.shape[0] != self.counts[self.comm.rank]:
            raise ValueError(f"`x` must have {self.counts[self.comm.rank]} rows on rank "
                             f"{self.comm.rank}, got shape {x.shape}.")
        parts = self.comm.gather(x, root=self.root)
        return None if parts is None else np.concatenate(parts, axis=0)

    def adjoint(self, y):
        blocks = None
        if self.comm.rank == self.root:
            y = np.asarray(y)
            if y.shape[0] != self.offsets[-1]:
                raise ValueError(f"`y` must have {self.offsets[-1]} rows on the root, got "
                                 f"shape {y.shape}.")
            o = self.offsets
            blocks = [np.array(y[o[q] : o[q + 1]], copy=True) for q in range(self.comm.size)]
        return self.comm.scatter(blocks, root=self.root)

    def __repr__(self) -> str:
        return f"Gather(root={self.root}, counts={self.counts})"


class RowExchange(LinearOperator):
    """Fetch rows from their owners: ``y_p[i] = x_{owner(i)}[i]`` for every ``i`` in ``needed``.

    Every global row index has one owner (``owned`` lists this rank's rows; together they must
    be disjoint). ``x`` is this rank's ``{i: row}`` for its owned rows, ``y`` its
    ``{i: row}`` for its needed rows. Adjoint: every needed row's cotangent is sent to the
    owner and added there (rows nobody needed are absent from the result: zero).

    The message plan (who sends which rows to whom) is built once here, with two collectives.
    Ghost weights and states of the distributed gradient travel through this operator.
    """

    def __init__(self, comm, owned: Iterable[int], needed: Iterable[int]):
        super().__init__(comm)
        self.owned = _index_list("owned", owned)
        self.needed = _index_list("needed", needed)
        owner: dict[int, int] = {}
        for q, rows in enumerate(comm.allgather(self.owned)):
            for i in rows:
                if i in owner:
                    raise ValueError(f"`owned`: row {i} is owned by ranks {owner[i]} and {q}; "
                                     "each row must have exactly one owner.")
                owner[i] = q
        missing = [i for i in self.needed if i not in owner]
        if missing:
            raise ValueError(f"`needed` rows {missing[:8]} on rank {comm.rank} are owned by no "
                             "rank.")
        self.recv_from = [[i for i in self.needed if owner[i] == q] for q in range(comm.size)]
        self.send_to = comm.alltoall(self.recv_from)

    def _exchange(self, payloads: list[dict[int, Any]]) -> list[dict[int, Any]]:
        """alltoall of row dicts; the rows a rank sends to itself never leave it."""
        me = self.comm.rank
        local, payloads[me] = payloads[me], {}
        got = self.comm.alltoall(payloads)
        got[me] = local
        return got

    def forward(self, x: Mapping[int, Any]) -> dict[int, Any]:
        _check_rows("x", x, self.owned)
        got = self._exchange([{i: x[i] for i in rows} for rows in self.send_to])
        merged = {i: v for part in got for i, v in part.items()}
        return {i: _copy(merged[i]) for i in self.needed}

    def adjoint(self, y: Mapping[int, Any]) -> dict[int, Any]:
        _check_rows("y", y, self.needed)
        got = self._exchange([{i: y[i] for i in rows} for rows in self.recv_from])
        out: dict[int, Any] = {}
        for part in got:  # rank order: the same sums on every run
            for i, v in part.items():
                out[i] = _copy(v) if i not in out else _add(out[i], v)
        return out

    @property
    def n_messages(self) -> int:
        """Rows this rank receives from other ranks in one forward application."""
        return sum(len(r) for q, r in enumerate(self.recv_from) if q != self.comm.rank)

    def __repr__(self) -> str:
        return f"RowExchange(rank={self.comm.rank}, owned={len(self.owned)}, " \
               f"needed={len(self.needed)})"


# ----------------------------------------------------------------------------- helpers
def _root(root, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}), got {root!r}.")
    return int(root)


def _index_list(name: str, values: Iterable[int]) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"`{name}` must hold non-negative integer row indices, got {v!r}.")
        out.append(int(v))
    return sorted(set(out))


def _check_rows(name: str, rows: Mapping[int, Any], want: list[int]) -> None:
    if not isinstance(rows, Mapping):
        raise TypeError(f"`{name}` must be a dict {{row index: array}}, got "
                        f"{type(rows).__name__}.")
    missing = [i for i in want if i not in rows]
    if missing:
        raise ValueError(f"`{name}` lacks rows {missing[:8]} (of {len(want)} expected).")


def relative_error(a: float, b: float) -> float:
    """|a − b| / max(|a|, |b|, tiny): the measure of the dot-product tests."""
    return abs(a - b) / max(abs(a), abs(b), np.finfo(float).tiny)
