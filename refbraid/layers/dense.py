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

from ..backends.into import add_into, euler_act_into, plus, rows_options
from ..backends.reference import check_activation
from .init import (
    check_adjoint,
    check_dtype,
    check_features,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)


@dataclass(frozen=True)
class DenseStep:
    """One forward-Euler ResNet step ``y_next = y + h σ(W y + b)`` of width ``width``."""

    width: int
    activation: str = "tanh"

    #: MGRIT's sweeps call :meth:`forward_batched` / :meth:`adjoint_batched` (one call for k
    #: intervals): 1.6–5× less time per step at width 32 (a retired benchmark,
    #: docs/batched.md), where the Python of a per-step call outweighs its arithmetic.
    batched_sweeps_pay = True

    #: the cache ``(y, z)`` of :meth:`forward` does not depend on h (``z = y Wᵀ + b``): a
    #: coarse adjoint step (step size m·h) from the same y may reuse a fine step's cache
    #: (refbraid.propagators.CapturingAdjoint)
    cache_independent_of_h = True

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

    def forward(self, params, y, h: float, bk, out=None, add=None):
        """y_next = y + h σ(y Wᵀ + b) (+ add); returns (y_next, cache). ``out``: an array to
        write y_next into where the backend can (backends/into.py; else y_next is new);
        ``add``: a state to add to y_next (MGRIT's right-hand side row: in the step's own
        kernel where the backend's takes it, else a sum after it — the same numbers). A
        backend that overrides the catalogue kernel ``dense_step`` (cupy: the GEMM, then
        bias, activation and Euler update in one kernel) computes the step whole; the others
        compose ``linear`` and ``euler_act``, the same arithmetic."""
        h = check_step_size("h", h)
        check_features("y", y, params["W"].shape[1])
        check_dtype("y", y, params)
        if "dense_step" in bk.overrides:  # one GEMM and one fused kernel (a GPU backend)
            kw = rows_options(bk.dense_step, out, add)  # its kernel writes y_next + add
            y_next, z = bk.dense_step(y, params["W"], params["b"], h, self.activation, **kw)
            return (y_next if kw else plus(y_next, add, out)), (y, z)
        z = bk.linear(y, params["W"], params["b"])  # B,C
        return plus(euler_act_into(bk, y, z, h, self.activation, out), add, out), (y, z)

    def adjoint(self, params, cache, dy_next, h: float, bk, grads: bool = True, out=None,
                add=None):
        """dy = dy_next + (h σ'(z) ⊙ dy_next) W (+ add); with grads, also dW, db. Returns
        (dy, dparams). ``out``: where dy may be written (NumPy, backends/into.py; else dy is
        new); ``add`` as in :meth:`forward`. Whole (``dense_step_adjoint``: GEMMs and two
        fused kernels) where the backend overrides it (cupy, cuda)."""
        y, z = cache
        h = check_step_size("h", h)
        check_adjoint("dy_next", dy_next, y.shape)
        if "dense_step_adjoint" in bk.overrides:  # GEMMs and fused kernels (a GPU backend)
            kw = rows_options(bk.dense_step_adjoint, out, add)
            dy, dW, db = bk.dense_step_adjoint(y, z, dy_next, params["W"], h, self.activation,
                                               grads, **kw)
            dy = dy if kw else plus(dy, add, out)
            return dy, (None if dW is None else {"W": dW, "b": db})
        s = h * bk.activation_adjoint(z, dy_next, self.activation)  # B,C
        if not grads:
            return plus(add_into(dy_next, bk.matmul(s, params["W"]), out), add, out), None
        ds_W, dW, db = bk.linear_adjoint(y, params["W"], s)
        return plus(add_into(dy_next, ds_W, out), add, out), {"W": dW, "b": db}


    # -- k steps at once (MGRIT's batched sweeps; NumPy, numba and cuda backends) ---------
    def forward_batched(self, params, Y, h, bk, out=None, add=None):
        """k steps at once, row j as :meth:`forward` with ``params[·][j]`` and ``h[j]``:
        ``Z = Y Wᵀ + b``, ``Y_next = Y + h σ(Z)``. Y (k,B,C), W (k,C,C), b (k,C), h (k,);
        returns (Y_next, Z). The catalogue kernel ``dense_step_batched``
        (:mod:`refbraid.backends.reference_batched`; fused on numba and cuda), each backend's
        version bit-identical to its per-step path. ``out``, ``add`` (MGRIT's F-sweep rows
        and right-hand side): where the backend's kernel takes them, ``Y_next + add`` is
        written into ``out`` (returned as Y_next); else ignored (layers/forward_into.py
        writes)."""
        kw = rows_options(bk.dense_step_batched, out, add)
        return bk.dense_step_batched(Y, params["W"], params["b"], h, self.activation, **kw)

    def adjoint_batched(self, params, Y, Z, dY_next, h, bk, grads: bool = True, out=None,
                        add=None):
        """:meth:`adjoint` of k steps at once: ``S = h σ'(Z) ⊙ dY_next``, ``dY = dY_next + S W``,
        with grads ``dW = Sᵀ Y``, ``db = Σ_B S`` per row. Returns (dY, dparams stacked or None).
        ``out``, ``add``: as :meth:`forward_batched`'s, for dY."""
        kw = rows_options(bk.dense_step_batched_adjoint, out, add)
        dY, dW, db = bk.dense_step_batched_adjoint(Y, Z, dY_next, params["W"], h,
                                                   self.activation, grads, **kw)
        return dY, (None if dW is None else {"W": dW, "b": db})


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
        check_features("x", x, params["W"].shape[1])
        check_dtype("x", x, params)
        z = bk.linear(x, params["W"], params["b"])  # B,C
        return bk.activation(z, self.activation), (x, z)

    def adjoint(self, params, cache, dout, bk):
        x, z = cache
        check_adjoint("dout", dout, z.shape)
        dz = bk.activation_adjoint(z, dout, self.activation)  # B,C
        dx, dW, db = bk.linear_adjoint(x, params["W"], dz)
        return dx, {"W": dW, "b": db}
