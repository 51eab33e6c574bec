"""Conv ODE steps, the lift and the classifier with their feature maps split by rows.

On rank p (rows [o_p, o_{p+1}) of every feature map; ``*`` the 3×3 cross-correlation, here
'valid' along rows, zero-padded along columns; ``H_p`` the :class:`SpatialHalo`)::

    step      ỹ = H_p(y_p);  z = W * ỹ + b;  y_next = y_p + h σ(z)
    adjoint   s = h σ'(z) ⊙ dy_next;  dỹ, dW_p, db_p = (W *)ᵀ s;  dy_p = dy_next + H_pᵀ(dỹ)
    lift      out = σ(W * H_p(x_p) + b);  dx_p = H_pᵀ((W *)ᵀ (σ'(z) ⊙ dout))
    classifier (its weight columns split like its input, DistDL's affine layer)
              logits = SumReduce_root(flat(x_p) W_pᵀ) + b;   W_p = W[:, rows of p]
              dlogits_p = Broadcast_root(dlogits);  dx_p = unflat(dlogits_p W_p);
              dW_p = dlogits_pᵀ flat(x_p) (rank p's columns);  db on the root

The weights are replicated (read as a broadcast from the root), so each rank's ``dW_p, db_p``
is a partial gradient and the full one is their sum over ranks (the broadcast's adjoint);
:class:`~refbraid.space.network.SpatialNetwork` sums them once per step.

Shape legend: B batch, C channels, n_p rows here, W columns, K classes.
"""

from __future__ import annotations

import numpy as np

from ..layers.conv import ConvLift, ConvStep
from ..layers.heads import Classifier
from ..layers.init import check_adjoint, check_dtype, check_step_size
from ..parallel.ops import Broadcast, LinearOperator, SumReduce
from .halo import RowSplit, SpatialHalo


def conv_rows(y_halo, W, b, bk):
    """z = W * ỹ + b, valid along rows (n_p + 2 rows in, n_p out), 'same' along columns."""
    return bk.conv2d(y_halo, W, b)[:, :, 1:-1]


def conv_rows_adjoint(y_halo, W, dz, bk):
    """Adjoint of :func:`conv_rows`: (dỹ, dW, db); the two padded output rows carry zero."""
    pad = np.zeros((dz.shape[0], dz.shape[1], 1, dz.shape[3]), dtype=dz.dtype)
    return bk.conv2d_adjoint(y_halo, W, np.concatenate([pad, dz, pad], axis=2))


class SpatialConv(LinearOperator):
    """The linear part of a step, ``y_p ↦ W * H_p(y_p)`` (no bias), for dot-product tests."""

    def __init__(self, comm, W, bk):
        super().__init__(comm)
        self.halo, self.W, self.bk = SpatialHalo(comm), W, bk

    def forward(self, y):
        return conv_rows(self.halo.forward(y), self.W, None, self.bk)

    def adjoint(self, dz):
        y_halo = np.zeros((dz.shape[0], self.W.shape[1], dz.shape[2] + 2, dz.shape[3]),
                          dtype=dz.dtype)  # dỹ does not depend on ỹ (linear)
        return self.halo.adjoint(conv_rows_adjoint(y_halo, self.W, dz, self.bk)[0])


class SpatialConvStep:
    """:class:`~refbraid.layers.conv.ConvStep` on this rank's rows (module docstring)."""

    def __init__(self, step: ConvStep, comm):
        if not isinstance(step, ConvStep):
            raise TypeError(f"`step` must be a ConvStep, got {type(step).__name__}.")
        self.step, self.halo = step, SpatialHalo(comm)

    def forward(self, params, y, h: float, bk):
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        y_halo = self.halo.forward(y)  # B,C,n_p+2,W
        z = conv_rows(y_halo, params["W"], params["b"], bk)  # B,C,n_p,W
        return bk.euler_act(y, z, h, self.step.activation), (y_halo, z)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True):
        """(dy_p, this rank's partial {dW, db}, or None without ``grads``); the halo's
        adjoint is always applied (it is collective over the space ranks)."""
        y_halo, z = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, z.shape)
        s = h * bk.activation_adjoint(z, dy_next, self.step.activation)
        dy_halo, dW, db = conv_rows_adjoint(y_halo, params["W"], s, bk)
        return dy_next + self.halo.adjoint(dy_halo), ({"W": dW, "b": db} if grads else None)


class SpatialConvLift:
    """:class:`~refbraid.layers.conv.ConvLift` on this rank's rows."""

    def __init__(self, lift: ConvLift, comm):
        if not isinstance(lift, ConvLift):
            raise TypeError(f"`lift` must be a ConvLift, got {type(lift).__name__}.")
        self.lift, self.halo = lift, SpatialHalo(comm)

    def forward(self, params, x, bk):
        check_dtype("x", x, params)
        x_halo = self.halo.forward(x)
        z = conv_rows(x_halo, params["W"], params["b"], bk)
        return bk.activation(z, self.lift.activation), (x_halo, z)

    def adjoint(self, params, cache, dout, bk):
        x_halo, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.lift.activation)
        dx_halo, dW, db = conv_rows_adjoint(x_halo, params["W"], dz, bk)
        return self.halo.adjoint(dx_halo), {"W": dW, "b": db}


class SpatialClassifier:
    """:class:`~refbraid.layers.heads.Classifier` with its weight columns split by rows."""

    def __init__(self, head: Classifier, comm, split: RowSplit, root: int = 0):
        if not isinstance(head, Classifier) or len(head.in_shape) != 3:
            raise TypeError("`head` must be a Classifier of (C, H, W) feature maps.")
        if split.rows != head.in_shape[1] or split.ranks != comm.size:
            raise ValueError(f"`split` must give {head.in_shape[1]} rows over {comm.size} "
                             f"ranks, got {split.counts}.")
        self.head, self.comm, self.root = head, comm, root
        self.rows = split.bounds(comm.rank)
        self.reduce, self.bcast = SumReduce(comm, root), Broadcast(comm, root)

    def columns(self, W):
        """W_p: the columns of W that multiply this rank's rows, (K, C·n_p·W)."""
        C, H, Wd = self.head.in_shape
        lo, hi = self.rows
        return W.reshape(W.shape[0], C, H, Wd)[:, :, lo:hi, :].reshape(W.shape[0], -1)

    def forward(self, params, x, bk):
        """Logits on the root (None elsewhere); cache flat(x_p)."""
        check_dtype("x", x, params)
        flat = x.reshape(x.shape[0], -1)  # B,C·n_p·W
        logits = self.reduce.forward(flat @ self.columns(params["W"]).T)
        if logits is not None:
            logits = logits + params["b"]
        return logits, (flat, x.shape)

    def adjoint(self, params, cache, dlogits, bk):
        """dx_p and this rank's partial (dW, db): rank p's columns of dW, db on the root."""
        flat, shape = cache
        d = self.bcast.forward(dlogits)  # B,K on every rank
        dx = (d @ self.columns(params["W"])).reshape(shape)
        dW = np.zeros_like(params["W"])
        C, H, Wd = self.head.in_shape
        lo, hi = self.rows
        dW.reshape(dW.shape[0], C, H, Wd)[:, :, lo:hi, :] = \
            (d.T @ flat).reshape(dW.shape[0], C, hi - lo, Wd)
        db = d.sum(axis=0) if self.comm.rank == self.root else np.zeros_like(params["b"])
        return dx, {"W": dW, "b": db}
