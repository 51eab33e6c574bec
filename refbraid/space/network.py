"""A conv network with every feature map split by rows: forward and backprop over a
communicator, equal to :func:`refbraid.network.backprop` of one process to round-off.

    y_p[0] = lift_p(x_p);  y_p[n+1] = step_p(θ_n, y_p[n]);  logits = classifier(y[N]) (root)
    L = CE(logits, labels) on the root, broadcast;  dlogits on the root
    backward: the adjoints of :mod:`.layers` in reverse order, then ∇θ = Σ_p ∇θ_p
    (an all-reduce in rank order: the same bits on every rank)

Shape legend: N layers, B batch, x_p (B, C_in, n_p, W) this rank's rows of the input.
"""

from __future__ import annotations

import numpy as np

from ..backends import Backend, get_backend
from ..layers.conv import ConvLift, ConvStep
from ..network import Network, Params, group, layer_params
from ..parallel.mpi import sum_to_all
from .halo import RowSplit
from .layers import SpatialClassifier, SpatialConvLift, SpatialConvStep


class SpatialNetwork:
    """``net`` (conv lift, conv steps, classifier) with its feature maps split by ``split``."""

    def __init__(self, net: Network, comm, split: RowSplit | None = None, root: int = 0):
        if not (isinstance(net, Network) and isinstance(net.opening, ConvLift)
                and isinstance(net.step, ConvStep)):
            raise TypeError("`net` must be a conv Network (ConvLift, ConvStep, Classifier): "
                            "space parallelism splits image rows.")
        H = net.step.height
        self.split = RowSplit.even(H, comm.size) if split is None else split
        if self.split.rows != H or self.split.ranks != comm.size:
            raise ValueError(f"`split` must give {H} rows over {comm.size} ranks, got "
                             f"{self.split.counts}.")
        self.net, self.comm, self.root = net, comm, root
        self.opening = SpatialConvLift(net.opening, comm)
        self.step = SpatialConvStep(net.step, comm)
        self.closing = SpatialClassifier(net.closing, comm, self.split, root)

    def local_input(self, x):
        """This rank's rows of a full input batch (B, C_in, H, W)."""
        return self.split.local(x, self.comm.rank)

    def forward(self, params: Params, x_local, bk: Backend | str = "numpy"):
        """Logits on the root (None elsewhere), the local states y_p[0..N] and the caches."""
        bk = get_backend(bk)
        y, open_cache = self.opening.forward(group(params, "opening"), x_local, bk)
        steps = group(params, "steps")
        states, caches = [y], []
        for n in range(self.net.n_layers):
            y, cache = self.step.forward(layer_params(steps, n), y, self.net.h, bk)
            states.append(y)
            caches.append(cache)
        logits, close_cache = self.closing.forward(group(params, "closing"), y, bk)
        return logits, states, (open_cache, caches, close_cache)

    def backprop(self, params: Params, x_local, labels, bk: Backend | str = "numpy"):
        """(loss, grads) on every rank: the full gradient (Σ over ranks of the partials)."""
        bk = get_backend(bk)
        logits, _, (open_cache, caches, close_cache) = self.forward(params, x_local, bk)
        loss = dlogits = None
        if self.comm.rank == self.root:
            loss, probs = bk.softmax_cross_entropy(logits, labels)
            dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
        loss = float(self.comm.bcast(None if loss is None else float(loss), self.root))
        lam, dclose = self.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
        grads = {f"closing.{k}": v for k, v in dclose.items()}
        steps = group(params, "steps")
        dsteps = {k: np.zeros_like(v) for k, v in steps.items()}
        for n in reversed(range(self.net.n_layers)):
            lam, dtheta = self.step.adjoint(layer_params(steps, n), caches[n], lam,
                                            self.net.h, bk)
            for k, v in dtheta.items():
                dsteps[k][n] = v
        grads.update({f"steps.{k}": v for k, v in dsteps.items()})
        _, dopen = self.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
        grads.update({f"opening.{k}": v for k, v in dopen.items()})
        grads = {k: grads[k] for k in params}  # the parameters' order
        flat = sum_to_all(self.comm.mpi, np.concatenate([np.ravel(v) for v in grads.values()]))
        out, o = {}, 0
        for k, v in grads.items():  # one message for all partial gradients, then unpacked
            out[k] = flat[o : o + v.size].reshape(v.shape)
            o += v.size
        return loss, out
