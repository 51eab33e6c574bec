"""GRU cells as time steps over a sequence, with their adjoints (docs/references.md §1).

Both cells share the gates of ``torch.nn.GRUCell`` (gate order r, z, n); x is the input at
the current sequence position, h the hidden state::

    [gx_r | gx_z | gx_n] = x W_ihᵀ + b_ih,   [gh_r | gh_z | gh_n] = h W_hhᵀ + b_hh   # B,3H
    r = σ(gx_r + gh_r),   z = σ(gx_z + gh_z),   n = tanh(gx_n + r ⊙ gh_n)            # B,H

and differ in the update over a step of size dt:

    classic   h_new = h + dt (1 − z) ⊙ (n − h)                 (= GRUCell's z⊙h + (1−z)⊙n at dt = 1)
    implicit  h_new = (h + dt (1 − z) ⊙ n) / (1 + dt (1 − z))  (Moon & Cyr, ICLR 2022)

The classic cell is forward Euler for h' = (1 − z) ⊙ (n − h) with dt = 1; the implicit one
treats the decay term −(1 − z) ⊙ h implicitly, which keeps coarse MGRIT steps of size m·dt
stable. Adjoint (kernel ``gru_cell_adjoint`` gives dgx, dgh and the direct part of dh)::

    dh = λ ∂h_new/∂h + dgh W_hh,   dx = dgx W_ih,
    dW_ih = dgxᵀ x,  db_ih = Σ_B dgx,   dW_hh = dghᵀ h,  db_hh = Σ_B dgh

Weights map one to one onto torch's (no transposes): ``W_ih`` ↔ ``weight_ih`` (3H, I),
``W_hh`` ↔ ``weight_hh`` (3H, H), ``b_ih`` ↔ ``bias_ih``, ``b_hh`` ↔ ``bias_hh``; for
``torch.nn.GRU`` add the suffix ``_l0``.

How the input reaches a step. Unlike a ResNet layer, every position of the sequence shares
one set of weights, and what changes from step to step is the *data* x_t. The cell therefore
takes x_t as a params entry ``x`` (B or 1, I): ``forward(params, h, dt, bk)`` is the same duck
type as every other ODE step (``y`` = h, step size dt), and the adjoint of x_t comes back in
dparams as ``x``. ``GRUCell.step(params, h, dt, x_t, bk)`` is the spelled-out call. Over a
sequence, ``GRUSequence.phi(params, h, xs, start, stop, bk)`` is the propagator MGRIT needs,

    Φ(h, start, stop) = step(params, h, (stop − start)·dt, xs[:, start]),

so a coarse level with coarsening factor m takes steps of size m·dt with the input at each
coarse step's start (docs/references.md §1); ``GRUSequence.run(..., stride=m)`` is that sequential
coarse solve. ``init`` makes a (1, I) stand-in ``x`` (a leading 1 broadcasts over the batch,
and its adjoint is then summed over the batch) so that a cell verifies on its own.

Shape legend: B batch, I input features, H hidden size, L sequence length, K steps taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..backends.device_batching import permuted_once, transposed_once
from ..backends.portable import contiguous, zeros_on
from .init import (
    check_adjoint,
    check_dtype,
    check_positive_int,
    check_step_size,
    uniform_fan_in,
)

SCHEMES = ("classic", "implicit")


def time_major(xs):
    """The inputs xs (B, L, I) as a C-ordered (L, B, I) copy: the step at position t reads
    xt[t], a contiguous (B, I) block — CuPy's GEMM would copy the strided xs[:, t, :] before
    each product that reads it. Made once per array within a GPU gradient
    (device_batching.permuted_once), so MGRIT's forward, adjoint and weight sweeps share it."""
    return permuted_once(xs, (1, 0, 2))


@dataclass(frozen=True)
class GRUCell:
    """One GRU step of size dt on the hidden state (B, H), input ``params["x"]`` (B or 1, I)."""

    input_size: int
    hidden_size: int
    scheme: str = "classic"

    #: params entries that are data, not weights: the input at this position (docstring)
    data_entries: ClassVar[tuple[str, ...]] = ("x",)

    def __post_init__(self):
        check_positive_int("input_size", self.input_size)
        check_positive_int("hidden_size", self.hidden_size)
        if self.scheme not in SCHEMES:
            raise ValueError(f"`scheme` must be one of {SCHEMES}, got {self.scheme!r}.")

    @property
    def implicit(self) -> bool:
        return self.scheme == "implicit"

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.hidden_size,)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """U(±1/√H) for every weight and bias, as torch.nn.GRUCell; plus a (1, I) stand-in ``x``."""
        I, H = self.input_size, self.hidden_size
        return {
            "W_ih": uniform_fan_in(rng, (3 * H, I), H, dtype),
            "W_hh": uniform_fan_in(rng, (3 * H, H), H, dtype),
            "b_ih": uniform_fan_in(rng, (3 * H,), H, dtype),
            "b_hh": uniform_fan_in(rng, (3 * H,), H, dtype),
            "x": rng.standard_normal((1, I)).astype(dtype),
        }

    def _check(self, params, h):
        if getattr(h, "ndim", None) != 2 or h.shape[1] != self.hidden_size:
            raise ValueError(f"`h` must have shape (batch, {self.hidden_size}), "
                             f"got {getattr(h, 'shape', type(h).__name__)}.")
        x = params.get("x")
        if x is None:
            raise ValueError("`params` must hold the input at this position as `x` (B, I).")
        if x.ndim != 2 or x.shape[0] not in (1, h.shape[0]) or x.shape[1] != self.input_size:
            raise ValueError(f"`x` must have shape (1 or {h.shape[0]}, {self.input_size}), "
                             f"got {tuple(x.shape)}.")
        return x

    def forward(self, params, h, dt: float, bk):
        """h_new from the gates (module docstring); returns (h_new, cache)."""
        x = self._check(params, h)
        dt = check_step_size("dt", dt)
        check_dtype("h", h, params)
        gx = bk.linear(x, params["W_ih"], params["b_ih"])  # B|1,3H
        gh = bk.linear(h, params["W_hh"], params["b_hh"])  # B,3H
        if gx.shape[0] != gh.shape[0]:  # a batch-1 input broadcasts over the batch
            gx = contiguous(bk.xp.broadcast_to(gx, gh.shape))
        h_new, gates = bk.gru_cell(gx, gh, h, dt, self.implicit)  # B,H and B,3H
        return h_new, (x, h, gh, gates)

    def adjoint(self, params, cache, dh_new, dt: float, bk, grads: bool = True):
        """dh = λ ∂h_new/∂h + dgh W_hh; with grads, dparams holds the weights' and ``x``'s."""
        x, h, gh, gates = cache
        dt = check_step_size("dt", dt)
        check_adjoint("dh_new", dh_new, h.shape)
        dgx, dgh, dh = bk.gru_cell_adjoint(gates, gh, h, dh_new, dt, self.implicit)
        if not grads:
            return dh + bk.matmul(dgh, params["W_hh"]), None
        dh_gates, dW_hh, db_hh = bk.linear_adjoint(h, params["W_hh"], dgh)
        if x.shape[0] != dgx.shape[0]:
            dgx = bk.xp.sum(dgx, axis=0, keepdims=True)
        dx, dW_ih, db_ih = bk.linear_adjoint(x, params["W_ih"], dgx)
        return dh + dh_gates, {"W_ih": dW_ih, "W_hh": dW_hh, "b_ih": db_ih, "b_hh": db_hh, "x": dx}

    def step(self, params, h, dt: float, x_t, bk):
        """``step(params, h, dt, x_t) = forward({**params, "x": x_t}, h, dt)``; (h_new, cache)."""
        return self.forward({**params, "x": x_t}, h, dt, bk)

    # -- k steps at once (MGRIT's batched sweeps over the sequence) -----------------------
    #: MGRIT's sweeps over the sequence use :meth:`forward_batched` / :meth:`adjoint_batched`
    #: (one call for k intervals) where :func:`refbraid.propagators.batchable` allows it:
    #: measured 1.3–3× faster solves on numpy and numba (docs/batched.md, "The GRU").
    batched_sweeps_pay: ClassVar[bool] = True

    def forward_batched(self, params, Hs, dt: float, bk):
        """k steps of size dt at once, row j as :meth:`forward` with ``x = X[j]``, ``h = Hs[j]``.

        The weights are shared, so the k·B rows of the stack go through one product each:
        ``gx = X W_ihᵀ + b_ih``, ``gh = Hs W_hhᵀ + b_hh`` (``matmul`` of the stack with the
        one weight matrix: NumPy runs the per-step 2-D GEMM per row, so each row gets the
        per-step bits), then the gate algebra on all k·B rows in one kernel call.
        ``params["x"]`` = X (k, B or 1, I), Hs (k, B, H). Returns (H_new (k, B, H), cache).
        """
        xp = bk.xp
        X = params["x"]
        k, B, H = Hs.shape
        if X.ndim != 3 or X.shape[0] != k or X.shape[1] not in (1, B):
            raise ValueError(f"`x` must have shape ({k}, 1 or {B}, {self.input_size}) for "
                             f"{k} stacked states, got {tuple(X.shape)}.")
        dt = check_step_size("dt", dt)
        check_dtype("Hs", Hs, params)
        gx = xp.matmul(X, transposed_once(params["W_ih"]))  # on a GPU Wᵀ copied once
        gx += params["b_ih"]  # k,B|1,3H: x Wᵀ, then + b, as bk.linear
        gh = xp.matmul(Hs, transposed_once(params["W_hh"]))
        gh += params["b_hh"]  # k,B,3H
        if gx.shape[1] != B:  # a batch-1 input broadcasts over the batch
            gx = contiguous(xp.broadcast_to(gx, gh.shape))
        rows = k * B
        h_new, gates = bk.gru_cell(xp.reshape(gx, (rows, 3 * H)), xp.reshape(gh, (rows, 3 * H)),
                                   xp.reshape(Hs, (rows, H)), dt, self.implicit)
        return xp.reshape(h_new, (k, B, H)), (X, Hs, gh, xp.reshape(gates, (k, B, 3 * H)))

    def adjoint_batched(self, params, cache, dH_new, dt: float, bk):
        """:meth:`adjoint` (without weight gradients) of k steps at once:
        ``dH[j] = λ[j] ∂h_new/∂h + dgh[j] W_hh``, the gate algebra on all k·B rows in one
        kernel call and ``dgh W_hh`` as ``matmul`` of the stack (the per-step GEMM per row)."""
        xp = bk.xp
        _, Hs, gh, gates = cache
        dt = check_step_size("dt", dt)
        check_adjoint("dH_new", dH_new, Hs.shape)
        k, B, H = Hs.shape
        rows = k * B
        _, dgh, dh = bk.gru_cell_adjoint(xp.reshape(gates, (rows, 3 * H)),
                                         xp.reshape(gh, (rows, 3 * H)), xp.reshape(Hs, (rows, H)),
                                         xp.reshape(dH_new, (rows, H)), dt, self.implicit)
        dH = xp.matmul(xp.reshape(dgh, (k, B, 3 * H)), params["W_hh"])
        dH += xp.reshape(dh, (k, B, H))  # dh + dgh W_hh (addition commutes exactly)
        return dH

    def weight_gradients_batched(self, params, cache, dH_new, dt: float, bk):
        """The weight gradients of k steps, stacked (k, ...): per row j, as :meth:`adjoint`,
        ``dW_ih = dgxᵀ x``, ``db_ih = Σ_B dgx``, ``dW_hh = dghᵀ h``, ``db_hh = Σ_B dgh``
        (``matmul`` of the transposed stacks: the per-step 2-D GEMM per row; the bias sums
        add the B rows in order, as the per-step column sums do). Needs x with the full
        batch (k, B, I)."""
        xp = bk.xp
        X, Hs, gh, gates = cache
        dt = check_step_size("dt", dt)
        check_adjoint("dH_new", dH_new, Hs.shape)
        k, B, H = Hs.shape
        if X.shape[1] != B:
            raise ValueError(f"`x` must have the full batch ({k}, {B}, {self.input_size}) for "
                             f"stacked weight gradients, got {tuple(X.shape)}.")
        rows = k * B
        dgx, dgh, _ = bk.gru_cell_adjoint(xp.reshape(gates, (rows, 3 * H)),
                                          xp.reshape(gh, (rows, 3 * H)),
                                          xp.reshape(Hs, (rows, H)),
                                          xp.reshape(dH_new, (rows, H)), dt, self.implicit)
        dgx, dgh = xp.reshape(dgx, (k, B, 3 * H)), xp.reshape(dgh, (k, B, 3 * H))
        return {"W_ih": xp.matmul(xp.permute_dims(dgx, (0, 2, 1)), X),
                "W_hh": xp.matmul(xp.permute_dims(dgh, (0, 2, 1)), Hs),
                "b_ih": xp.sum(dgx, axis=1), "b_hh": xp.sum(dgh, axis=1)}



@dataclass(frozen=True)
class GRUSequence:
    """A GRU over a sequence xs (B, L, I), positions spaced ``dt`` apart."""

    cell: GRUCell
    dt: float = 1.0

    def __post_init__(self):
        if not isinstance(self.cell, GRUCell):
            raise TypeError(f"`cell` must be a GRUCell, got {type(self.cell).__name__}.")
        check_step_size("dt", self.dt)

    def _check(self, xs, start: int, stop: int) -> None:
        if getattr(xs, "ndim", None) != 3 or xs.shape[2] != self.cell.input_size:
            raise ValueError(f"`xs` must have shape (batch, length, {self.cell.input_size}), "
                             f"got {getattr(xs, 'shape', type(xs).__name__)}.")
        if not 0 <= start < stop:
            raise ValueError(f"need 0 <= `start` < `stop`, got start={start}, stop={stop}.")
        if start >= xs.shape[1]:
            raise ValueError(f"`start` ({start}) must index into `xs` of length {xs.shape[1]}.")

    def phi(self, params, h, xs, start: int, stop: int, bk):
        """Φ(h, start, stop): one step of size (stop − start)·dt with input xs[:, start]."""
        self._check(xs, start, stop)
        return self.cell.step(params, h, (stop - start) * self.dt, xs[:, start, :], bk)

    def run(self, params, h0, xs, bk, stride: int = 1):
        """Sequential solve h[k+1] = Φ(h[k], k·m, (k+1)·m) over the sequence, m = ``stride``.

        Returns (states, tape): states = [h[0], …, h[K]], K = ⌈L/m⌉ steps (the last one may
        reach past L: positions are points in time, the inputs sit at the steps' starts).
        """
        check_positive_int("stride", stride)
        if getattr(xs, "ndim", None) != 3 or xs.shape[1] > 0:  # an empty sequence: h0 alone
            self._check(xs, 0, stride)
        L = xs.shape[1]
        xt = time_major(xs)  # L,B,I: x_t = xt[t] contiguous
        states, caches = [h0], []
        for start in range(0, L, stride):
            h, cache = self.cell.step(params, states[-1], stride * self.dt, xt[start, ...], bk)
            states.append(h)
            caches.append(cache)
        return states, (caches, stride, xs.shape)

    def run_adjoint(self, params, tape, dstates, bk):
        """Backprop through time. dstates[k−1] = ∂L/∂h[k] for k = 1..K (entries may be None).

        λ[K] = dstates[K−1],  λ[k] = Φ_k'ᵀ λ[k+1] + dstates[k−1];  returns (dh0 = λ[0], dxs
        (B, L, I) with the input adjoints at the steps' start positions, dweights summed over
        the steps).
        """
        caches, stride, xs_shape = tape
        if len(dstates) != len(caches):
            raise ValueError(f"`dstates` must hold {len(caches)} entries, got {len(dstates)}.")
        lam = None
        dweights: dict = {}
        dxs = None
        for k in reversed(range(len(caches))):
            seed = dstates[k]
            lam = seed if lam is None else (lam if seed is None else lam + seed)
            if lam is None:
                continue
            lam, d = self.cell.adjoint(params, caches[k], lam, stride * self.dt, bk)
            dx = d.pop("x")
            if dxs is None:
                dxs = zeros_on(dx, (dx.shape[0], *xs_shape[1:]))
            dxs[:, k * stride, :] = dx
            for name, v in d.items():
                dweights[name] = v if name not in dweights else dweights[name] + v
        return lam, dxs, dweights
