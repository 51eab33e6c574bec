"""Distributed dense layers (DistDL's affine layers): weights split by rows or by columns.

Features split over ranks: rank p owns features [o_p, o_{p+1}) (a :class:`RowSplit` of the
feature count). ``z = x Wᵀ + b`` with W (K_out, K_in) becomes::

    RowSplitDense     (output features split; x whole on the root)
        forward   x̂ = Broadcast_root(x);   z_p = x̂ W_pᵀ + b_p,      W_p = W[rows of p]
        adjoint   dx = SumReduce_root(dz_p W_p);   dW_p = dz_pᵀ x̂,  db_p = Σ_B dz_p
    ColumnSplitDense  (input features split; z whole on the root)
        forward   z = SumReduce_root(x_p W_pᵀ) + b,                  W_p = W[:, columns of p]
        adjoint   dẑ = Broadcast_root(dz);   dx_p = dẑ W_p;  dW_p = dẑᵀ x_p;  db on the root

A row-split layer's output is exactly a column-split layer's input, so a two-layer MLP
``ColumnSplitDense ∘ σ ∘ RowSplitDense`` moves data only at its ends (one broadcast, one
sum-reduce). Weights are replicated (read as a broadcast): each rank's ``dW, db`` are partial,
full-shaped, zero outside its rows/columns, and sum over ranks to the full gradient.

Shape legend: B batch, K_in / K_out features, k_p this rank's share.
"""

from __future__ import annotations

import numpy as np

from ..parallel.ops import Broadcast, SumReduce
from .halo import RowSplit


def _check(split: RowSplit, comm, features: int, what: str) -> tuple[int, int]:
    if not isinstance(split, RowSplit) or split.ranks != comm.size or split.rows != features:
        raise ValueError(f"`split` must split the {features} {what} features over {comm.size} "
                         f"ranks, got {getattr(split, 'counts', split)!r}.")
    return split.bounds(comm.rank)


class RowSplitDense:
    """``z_p = Broadcast(x) W_pᵀ + b_p``: this rank's output features (module docstring)."""

    def __init__(self, comm, split: RowSplit, out_features: int, root: int = 0):
        self.comm, self.root = comm, root
        self.lo, self.hi = _check(split, comm, out_features, "output")
        self.bcast, self.reduce = Broadcast(comm, root), SumReduce(comm, root)

    def forward(self, params, x):
        """x on the root (None elsewhere) → (z_p (B, k_p), cache)."""
        x_all = self.bcast.forward(x)  # B,K_in
        W, b = params["W"][self.lo : self.hi], params["b"][self.lo : self.hi]
        return x_all @ W.T + b, x_all

    def adjoint(self, params, cache, dz):
        """dz_p (B, k_p) → (dx on the root / None, partial {dW, db})."""
        x_all = cache
        dx = self.reduce.forward(dz @ params["W"][self.lo : self.hi])
        dW, db = np.zeros_like(params["W"]), np.zeros_like(params["b"])
        dW[self.lo : self.hi] = dz.T @ x_all
        db[self.lo : self.hi] = dz.sum(axis=0)
        return dx, {"W": dW, "b": db}


class ColumnSplitDense:
    """``z = SumReduce(x_p W_pᵀ) + b`` on the root: x split by input features."""

    def __init__(self, comm, split: RowSplit, in_features: int, root: int = 0):
        self.comm, self.root = comm, root
        self.lo, self.hi = _check(split, comm, in_features, "input")
        self.bcast, self.reduce = Broadcast(comm, root), SumReduce(comm, root)

    def forward(self, params, x):
        """x_p (B, k_p) → (z on the root / None, cache)."""
        z = self.reduce.forward(x @ params["W"][:, self.lo : self.hi].T)
        return (None if z is None else z + params["b"]), x

    def adjoint(self, params, cache, dz):
        """dz on the root (None elsewhere) → (dx_p, partial {dW, db})."""
        x = cache
        d = self.bcast.forward(dz)  # B,K_out on every rank
        dx = d @ params["W"][:, self.lo : self.hi]
        dW = np.zeros_like(params["W"])
        dW[:, self.lo : self.hi] = d.T @ x
        db = d.sum(axis=0) if self.comm.rank == self.root else np.zeros_like(params["b"])
        return dx, {"W": dW, "b": db}
