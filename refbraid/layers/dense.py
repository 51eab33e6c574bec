"""Dense layers.

ODE step (forward Euler for y' = σ(W y + b)), and its discrete adjoint
(Haber & Ruthotto 2017; docs/references.md §1)::

    z      = y Wᵀ + b                      # B,C
    y_next = y + h σ(z)                    # B,C
    s      = h σ'(z) ⊙ dy_next             # B,C
    dy     = dy_next + s W                 # B,C
    dW     = sᵀ y,   db = Σ_B s            # C,C and C

Opening ("lift") layer: ``out = σ(x Wᵀ + b)`` from K input features to C channels.

Shape legend: B batch, K input features, C width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.into import add_into, euler_act_into
from ..backends.portable import asarray_on
from ..backends.reference import check_activation
from .init import (
    check_adjoint,
    check_dtype,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)


def _fused_batched(bk, act: str, *arrays):
    """The backend's own batched dense kernels when they take these arrays, else None (the
    array-API code of the methods runs): numba :mod:`refbraid.backends.numba_cpu_batched`,
    cuda :mod:`refbraid.backends.numba_cuda_batched`, each bit-identical to its backend's
    per-step path."""
    if bk.name == "numba":
        from ..backends import numba_cpu_batched as fused
    elif bk.name == "cuda":
        from ..backends import numba_cuda_batched as fused
    else:
        return None
    return fused if fused.applies(act, *arrays) else None


@dataclass(frozen=True)
class DenseStep:
    """One forward-Euler ResNet step ``y_next = y + h σ(W y + b)`` of width ``width``."""

    width: int
    activation: str = "tanh"

    #: MGRIT's sweeps call :meth:`forward_batched` / :meth:`adjoint_batched` (one call for k
    #: intervals): 1.6–5× less time per step at width 32 (benchmarks/bench_batched_network.py,
    #: docs/batched.md), where the Python of a per-step call outweighs its arithmetic.
    batched_sweeps_pay = True

    def __post_init__(self):
        check_positive_int("width", self.width)
        check_activation(self.activation)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.width,)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        C = self.width
        return {"W": uniform_fan_in(rng, (C, C), C, dtype),
                "b": uniform_fan_in(rng, (C,), C, dtype)}

    def forward(self, params, y, h: float, bk, out=None):
        """y_next = y + h σ(y Wᵀ + b); returns (y_next, cache). ``out``: an array to write
        y_next into where the backend can (backends/into.py; else y_next is new)."""
        h = check_step_size("h", h)
        check_dtype("y", y, params)
        z = bk.linear(y, params["W"], params["b"])  # B,C
        return euler_act_into(bk, y, z, h, self.activation, out), (y, z)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True, out=None):
        """dy = dy_next + (h σ'(z) ⊙ dy_next) W; with grads, also dW, db. Returns (dy, dparams).
        ``out``: where dy may be written (NumPy, backends/into.py; else dy is new)."""
        y, z = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, y.shape)
        s = h * bk.activation_adjoint(z, dy_next, self.activation)  # B,C
        if not grads:
            return add_into(dy_next, bk.matmul(s, params["W"]), out), None
        ds_W, dW, db = bk.linear_adjoint(y, params["W"], s)
        return add_into(dy_next, ds_W, out), {"W": dW, "b": db}


    # -- k steps at once (MGRIT's batched sweeps; NumPy, numba and cuda backends) ---------
    def forward_batched(self, params, Y, h, bk):
        """k steps at once, row j as :meth:`forward` with ``params[·][j]`` and ``h[j]``:
        ``Z = Y Wᵀ + b``, ``Y_next = Y + h σ(Z)``. Y (k,B,C), W (k,C,C), b (k,C), h (k,);
        returns (Y_next, Z). The same floating-point operations per row as :meth:`forward` on
        the NumPy backend (``np.matmul`` runs the 2-D product per row): bit-identical there."""
        xp = bk.xp
        fused = _fused_batched(bk, self.activation, Y, params["W"], params["b"])
        if fused is not None:  # h as its backend's per-step path takes it
            return fused.dense_forward_batched(Y, params["W"], params["b"], h, self.activation)
        h = asarray_on(Y, h, dtype=Y.dtype)[:, None, None]  # as a Python float h is: Y's dtype
        Z = xp.matmul(Y, xp.permute_dims(params["W"], (0, 2, 1)))  # k,B,C
        Z += params["b"][:, None, :]
        # Y + h σ(Z), updating the fresh σ(Z) in place (h σ, then + Y: the same two roundings
        # as the expression, one (k, B, C) temporary fewer per call)
        out = bk.activation(Z, self.activation)
        out *= h
        out += Y
        return out, Z

    def adjoint_batched(self, params, Y, Z, dY_next, h, bk, grads: bool = True):
        """:meth:`adjoint` of k steps at once: ``S = h σ'(Z) ⊙ dY_next``, ``dY = dY_next + S W``,
        with grads ``dW = Sᵀ Y``, ``db = Σ_B S`` per row. Returns (dY, dparams stacked or None)."""
        xp = bk.xp
        fused = _fused_batched(bk, self.activation, Y, Z, dY_next, params["W"])
        if fused is not None:
            return fused.dense_adjoint_batched(Y, Z, dY_next, params["W"], h, self.activation,
                                               grads)
        h = asarray_on(dY_next, h, dtype=dY_next.dtype)[:, None, None]
        S = bk.activation_adjoint(Z, dY_next, self.activation)  # k,B,C, a fresh array
        S *= h  # h σ'(Z) ⊙ dY_next
        dY = xp.matmul(S, params["W"])
        dY += dY_next  # dY_next + S W (addition commutes exactly: the same bits)
        if not grads:
            return dY, None
        return dY, {"W": xp.matmul(xp.permute_dims(S, (0, 2, 1)), Y), "b": xp.sum(S, axis=1)}


@dataclass(frozen=True)
class DenseLift:
    """Opening layer ``out = σ(x Wᵀ + b)``: K input features to C channels."""

    in_features: int
    width: int
    activation: str = "tanh"

    def __post_init__(self):
        check_positive_int("in_features", self.in_features)
        check_positive_int("width", self.width)
        check_activation(self.activation)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.in_features,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.width,)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        K, C = self.in_features, self.width
        return {"W": uniform_fan_in(rng, (C, K), K, dtype),
                "b": uniform_fan_in(rng, (C,), K, dtype)}

    def forward(self, params, x, bk):
        check_dtype("x", x, params)
        z = bk.linear(x, params["W"], params["b"])  # B,C
        return bk.activation(z, self.activation), (x, z)

    def adjoint(self, params, cache, dout, bk):
        x, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.activation)  # B,C
        dx, dW, db = bk.linear_adjoint(x, params["W"], dz)
        return dx, {"W": dW, "b": db}
