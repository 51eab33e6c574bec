"""GRU sequence classifier, trained by BPTT or with MGRIT over the sequence (Moon & Cyr 2022).

The hidden state is the MGRIT state and the sequence positions are the time steps
(docs/references.md §1)::

    h[0] = 0,   h[k+1] = Φ(h[k]; k → k+1),   k = 0..L-1,     logits = h[L] Wᵀ + b
    Φ(h; a → b) = step_s(θ, h, (b − a)·Δt, x[a]),   s = ``scheme`` if b − a = 1,
                                                       else ``coarse_scheme``

so a coarse level with factor m steps m·Δt at a time with the input at the coarse step's start.
The classic GRU (``torch.nn.GRUCell`` at Δt = 1) is forward Euler and loses stability for
large m·Δt, so by default coarse levels use the implicit GRU of Moon & Cyr (the decay term
treated implicitly, stable for every step size); model ``implicit-gru`` uses it on every level.
The adjoint and the gradient (one set of weights shared by all positions)::

    λ[L] = ∂L/∂h[L],   λ[k] = Φ'(h[k]; k → k+1)ᵀ λ[k+1]
    ∂L/∂θ = Σ_k (∂Φ(h[k]; k → k+1)/∂θ)ᵀ λ[k+1]

The sum is independent per position given the two trajectories (a parallel sweep and one
reduction), and with converged MGRIT solves equals BPTT to round-off; with one level it *is*
BPTT.

Parameters: ``cell.W_ih`` (3H, I), ``cell.W_hh`` (3H, H), ``cell.b_ih``, ``cell.b_hh`` (3H,)
(torch's names without ``weight_``), ``closing.W`` (K, H), ``closing.b`` (K,). Every entry
point checks them against :meth:`GRUModel.init_params` (names, shapes, one dtype shared with
``x``, finite values; :func:`refbraid.input_checks.check_param_dict`).

Shape legend: B batch, L sequence length, I input features, H hidden size, K classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.device_batching import chunk_rows, index_on
from ..backends.dtypes import dtype_kind
from ..backends.host import all_finite
from ..backends.ordered_sums import add_rows_in_order
from ..backends.portable import zeros_on
from ..input_checks import Expected, check_input_dtype, check_param_dict
from ..layer_parallel import LayerParallelInfo, LayerParallelSettings
from ..layers import Classifier, GRUCell, GRUSequence
from ..layers.gru import SCHEMES, time_major
from ..layers.init import NonFiniteError, check_positive_int, check_step_size
from ..mgrit import MGRITSettings, Problem, solve
from ..network import group
from ..propagators import batchable
from .losses import cross_entropy

CELL_WEIGHTS = ("W_ih", "W_hh", "b_ih", "b_hh")


@dataclass(frozen=True)
class SequenceInput:
    """The opening of a GRU model: sequences (B, L, I) pass through unchanged."""

    in_shape: tuple[int, int]


@dataclass(frozen=True)
class GRUModel:
    """GRU over L positions of I features, hidden size H, classifier on h[L]."""

    seq_len: int
    input_size: int
    hidden: int
    n_classes: int
    scheme: str = "classic"
    coarse_scheme: str = "implicit"
    dt: float = 1.0

    def __post_init__(self):
        for name in ("seq_len", "input_size", "hidden", "n_classes"):
            check_positive_int(name, getattr(self, name))
        for name in ("scheme", "coarse_scheme"):
            if getattr(self, name) not in SCHEMES:
                raise ValueError(f"`{name}` must be one of {SCHEMES}, got {getattr(self, name)!r}.")
        check_step_size("dt", self.dt)

    # the Network-like description the trainer reads -----------------------------------
    @property
    def step(self) -> GRUCell:
        return GRUCell(self.input_size, self.hidden, self.scheme)

    @property
    def opening(self) -> SequenceInput:
        return SequenceInput((self.seq_len, self.input_size))

    @property
    def closing(self) -> Classifier:
        return Classifier((self.hidden,), self.n_classes)

    @property
    def n_layers(self) -> int:
        """MGRIT time steps: one per sequence position."""
        return self.seq_len

    @property
    def h(self) -> float:
        return self.dt

    @property
    def T(self) -> float:
        return self.seq_len * self.dt

    def cell(self, span: int) -> GRUCell:
        """The cell of a step over ``span`` fine positions: ``scheme`` for 1, else coarse."""
        return self.step if span == 1 else GRUCell(self.input_size, self.hidden,
                                                   self.coarse_scheme)

    def init_params(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """torch.nn.GRUCell's U(±1/√H) weights and a fan-in uniform classifier."""
        cell = self.step.init(rng, dtype)
        params = {f"cell.{k}": cell[k] for k in CELL_WEIGHTS}
        params.update({f"closing.{k}": v for k, v in self.closing.init(rng, dtype).items()})
        return params

    def param_spec(self) -> dict[str, Expected]:
        """Names and shapes of :meth:`init_params` (cached per model)."""
        return _spec(self)

    def _check(self, params, x) -> None:
        """The entry-point checks: params against :meth:`param_spec`, x's shape, dtype and
        values."""
        dtype = check_param_dict(self.param_spec(), params)
        want = (self.seq_len, self.input_size)
        if getattr(x, "ndim", None) != 3 or tuple(x.shape[1:]) != want:
            raise ValueError(f"`x` must have shape (batch, {want[0]}, {want[1]}), "
                             f"got {getattr(x, 'shape', type(x).__name__)}.")
        check_input_dtype("x", x, dtype)
        if dtype_kind(x.dtype) in "fc" and not all_finite(x):
            raise NonFiniteError("`x` must be finite, got NaN or infinite values.")

    def h0(self, x, bk):
        return zeros_on(x, (x.shape[0], self.hidden))

    # sequential: BPTT ------------------------------------------------------------------
    def logits(self, params, x, bk: Backend | str = "numpy"):
        """logits = closing(h[L]) with the sequential (fine) recurrence."""
        bk = get_backend(bk)
        self._check(params, x)
        seq = GRUSequence(self.step, self.dt)
        states, _ = seq.run(group(params, "cell"), self.h0(x, bk), x, bk)
        return self.closing.forward(group(params, "closing"), states[-1], bk)[0]

    def backprop(self, params, x, labels, bk: Backend | str = "numpy"):
        """Loss and gradient by backprop through time; returns (loss, grads, info)."""
        bk = get_backend(bk)
        self._check(params, x)
        seq = GRUSequence(self.step, self.dt)
        cell = group(params, "cell")
        states, tape = seq.run(cell, self.h0(x, bk), x, bk)
        logits, cc = self.closing.forward(group(params, "closing"), states[-1], bk)
        loss, dlogits = cross_entropy(logits, labels, bk)
        lam, dclose = self.closing.adjoint(group(params, "closing"), cc, dlogits, bk)
        dstates = [None] * (self.seq_len - 1) + [lam]
        _, _, dcell = seq.run_adjoint(cell, tape, dstates, bk)
        grads = {f"cell.{k}": dcell[k] for k in CELL_WEIGHTS}
        grads.update({f"closing.{k}": v for k, v in dclose.items()})
        return loss, {k: grads[k] for k in params}, {"logits": logits, "states": states}

    # layer-parallel: MGRIT over the sequence ---------------------------------------------
    def mgrit_logits(self, params, x, settings: MGRITSettings, bk: Backend | str = "numpy"):
        """logits from the MGRIT forward solve (the forward a layer-parallel run trains)."""
        bk = get_backend(bk)
        self._check(params, x)
        fwd = solve(self.forward_problem(group(params, "cell"), x, bk), settings)
        return self.closing.forward(group(params, "closing"), fwd.solution[-1, ...], bk)[0]

    def forward_problem(self, cell, x, bk) -> Problem:
        return Problem(step=GRUForward(self, cell, x, bk), u0=self.h0(x, bk),
                       n_steps=self.seq_len)

    def layer_parallel_gradient(self, params, x, labels,
                                settings: LayerParallelSettings | None = None,
                                bk: Backend | str = "numpy"):
        """Loss and gradient with MGRIT forward and adjoint solves over the sequence."""
        bk = get_backend(bk)
        settings = LayerParallelSettings() if settings is None else settings
        self._check(params, x)
        cell = group(params, "cell")
        fwd = solve(self.forward_problem(cell, x, bk), settings.forward)
        states = fwd.solution  # L+1,B,H
        logits, cc = self.closing.forward(group(params, "closing"), states[-1, ...], bk)
        loss, dlogits = cross_entropy(logits, labels, bk)
        lam_L, dclose = self.closing.adjoint(group(params, "closing"), cc, dlogits, bk)
        adj = Problem(step=GRUAdjoint(self, cell, x, states, bk), u0=lam_L,
                      n_steps=self.seq_len, direction="backward")
        bwd = solve(adj, settings.backward)
        dcell = self.weight_gradient_sweep(cell, x, states, bwd.solution, bk)
        grads = {f"cell.{k}": dcell[k] for k in CELL_WEIGHTS}
        grads.update({f"closing.{k}": v for k, v in dclose.items()})
        info = LayerParallelInfo(fwd, bwd, states, bwd.solution, logits)
        return loss, {k: grads[k] for k in params}, info

    def weight_gradient_sweep(self, cell, x, states, adjoints, bk) -> dict[str, Any]:
        """∂L/∂θ = Σ_k (∂Φ(h[k]; k → k+1)/∂θ)ᵀ λ[k+1] (independent per k, then summed).

        Where :func:`batchable`, the terms come from :meth:`GRUCell.weight_gradients_batched`
        on chunks of positions and are added in the same order
        (:func:`~refbraid.backends.ordered_sums.add_rows_in_order`: one launch per weight and
        chunk on a GPU): the same bits."""
        dcell = {k: bk.xp.zeros_like(cell[k]) for k in CELL_WEIGHTS}
        xt = time_major(x)
        if batchable(self, bk):
            per_call = chunk_rows(bk, max(1, ROWS_PER_CALL // x.shape[0]), self.seq_len)
            for lo in range(0, self.seq_len, per_call):
                at = np.arange(lo, min(lo + per_call, self.seq_len))
                p = {**cell, "x": _inputs_at(xt, at)}
                _, cache = self.step.forward_batched(p, states[index_on(states, at), ...],
                                                     self.dt, bk)
                after = adjoints[index_on(adjoints, at + 1), ...]
                d = self.step.weight_gradients_batched(cell, cache, after, self.dt, bk)
                for name in CELL_WEIGHTS:  # the terms in the order of k: one pass each
                    add_rows_in_order(dcell[name], d[name])
            return dcell
        for k in range(self.seq_len):
            _, cache = self.step.step(cell, states[k, ...], self.dt, xt[k, ...], bk)
            _, d = self.step.adjoint(cell, cache, adjoints[k + 1, ...], self.dt, bk)
            for name in CELL_WEIGHTS:
                dcell[name] += d[name]
        return dcell


@lru_cache(maxsize=32)
def _spec(model: GRUModel) -> dict[str, Expected]:
    params = model.init_params(np.random.default_rng(0))  # values discarded: names and shapes
    return {k: Expected(tuple(v.shape), "weight") for k, v in params.items()}


class _TimeMajorInputs:
    """``xt``: the propagator's inputs ``x`` (B, L, I) time-major, made once
    (:func:`refbraid.layers.gru.time_major`)."""

    @cached_property
    def xt(self):
        return time_major(self.x)


@dataclass(frozen=True, eq=False)
class GRUForward(_TimeMajorInputs):
    """Φ(h; a → b) = step of size (b − a)·Δt with input x[:, a] (module docstring)."""

    model: GRUModel
    cell: dict[str, Any]
    x: Any
    bk: Backend

    def step(self, h, start: int, stop: int):
        span = stop - start
        m = self.model
        return m.cell(span).step(self.cell, h, span * m.dt, self.xt[start, ...], self.bk)[0]

    @property
    def batched_step(self):
        """Φ on k intervals at once (MGRIT's batched sweeps) where :func:`batchable`."""
        return self._steps_at_once if batchable(self.model, self.bk) else None

    def _steps_at_once(self, Hs, starts, stops):
        """Rows Φ(Hs[j]; starts[j] → stops[j]): one :meth:`GRUCell.forward_batched` call per
        distinct span (one per sweep but at a level's last, shorter interval)."""
        m = self.model

        def run(span, rows):
            X = _inputs_at(self.xt, starts[rows])
            return m.cell(span).forward_batched({**self.cell, "x": X}, Hs[rows, ...],
                                                span * m.dt, self.bk)[0]

        return _by_span(stops - starts, Hs, run, self.bk)


@dataclass(frozen=True, eq=False)
class GRUAdjoint(_TimeMajorInputs):
    """Ψ(λ; b → a) = Φ'(h[a]; a → b)ᵀ λ, linearised at the forward states (b > a)."""

    model: GRUModel
    cell: dict[str, Any]
    x: Any
    states: Any
    bk: Backend

    def step(self, lam, start: int, stop: int):
        span = start - stop  # the adjoint runs backwards: start = b > stop = a
        m = self.model
        c = m.cell(span)
        _, cache = c.step(self.cell, self.states[stop, ...], span * m.dt, self.xt[stop, ...],
                          self.bk)
        return c.adjoint(self.cell, cache, lam, span * m.dt, self.bk, grads=False)[0]

    @property
    def batched_step(self):
        """Ψ on k intervals at once (MGRIT's batched sweeps) where :func:`batchable`."""
        return self._steps_at_once if batchable(self.model, self.bk) else None

    def _steps_at_once(self, Lam, starts, stops):
        """Rows Ψ(Lam[j]; starts[j] → stops[j]): the forward gates at the states
        ``states[stops[j]]`` recomputed and :meth:`GRUCell.adjoint_batched`, per distinct span."""
        m = self.model

        def run(span, rows):
            at = stops[rows]
            c = m.cell(span)
            params = {**self.cell, "x": _inputs_at(self.xt, at)}
            _, cache = c.forward_batched(params, _states_at(self.states, at, self.bk),
                                         span * m.dt, self.bk)
            return c.adjoint_batched(params, cache, Lam[rows, ...], span * m.dt, self.bk)

        return _by_span(starts - stops, Lam, run, self.bk)


def _inputs_at(xt, positions):
    """xt[p] for each p, stacked: (k, B, I), contiguous (xt time-major:
    :func:`refbraid.layers.gru.time_major`)."""
    return xt[index_on(xt, positions), ...]


def _states_at(states, positions, bk):
    """states[p, ...] for each p, stacked: a stacked trajectory is indexed, a row view
    (the distributed trainer's, indexable one row at a time) gathered row by row."""
    if getattr(states, "ndim", None) is not None:
        return states[index_on(states, positions), ...]  # the index: copied once per content
    return bk.xp.stack([states[int(p), ...] for p in positions])


#: Rows (intervals × batch) per batched cell call: a sweep's k intervals go through the cell
#: in chunks of at most ``ROWS_PER_CALL // B`` intervals, so the (rows, 3H) temporaries of the
#: gate algebra stay in cache (one call for all k·B rows at B = 64 was slower than per-step
#: calls; 256 rows measured best of 128–2048 at H = 32; docs/batched.md, "The GRU").
ROWS_PER_CALL = 256


def _by_span(spans, U, run, bk):
    """``run(span, rows)`` for each distinct span, in chunks of at most ``ROWS_PER_CALL``
    state rows, each result put in place (rows: a slice or an index array)."""
    spans = np.asarray(spans)
    k, B = U.shape[0], U.shape[1]
    per_call = chunk_rows(bk, max(1, ROWS_PER_CALL // B), k)
    first = int(spans[0])
    if k <= per_call and (spans == first).all():
        return run(first, slice(None))
    out = bk.xp.empty_like(U)
    if (spans == first).all():
        for lo in range(0, k, per_call):
            rows = slice(lo, min(lo + per_call, k))
            out[rows, ...] = run(first, rows)
        return out
    for span in np.unique(spans):
        where = np.flatnonzero(spans == span)
        for lo in range(0, where.size, per_call):
            rows = where[lo : lo + per_call]
            out[rows, ...] = run(int(span), rows)
    return out


def gru_model(data_shape: tuple[int, ...], n_classes: int, hidden: int,
              scheme: str = "classic") -> GRUModel:
    """A GRUModel reading samples of shape (L, I), (L,) (scalars) or (1, H, W) (rows)."""
    if len(data_shape) == 1:
        L, features = data_shape[0], 1
    elif len(data_shape) == 2:
        L, features = data_shape
    elif len(data_shape) == 3 and data_shape[0] == 1:
        L, features = data_shape[1], data_shape[2]  # an image read row by row
    else:
        raise ValueError(f"a GRU reads sequences (L, I), (L,) or one-channel images (1, H, W); "
                         f"got samples of shape {tuple(data_shape)}.")
    coarse = "implicit"
    return GRUModel(L, features, hidden, n_classes, scheme, coarse)
