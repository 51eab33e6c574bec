"""A network = opening layer → N ODE steps over [0, T] → closing layer, and the sequential
baseline every solver is compared with.

Forward (forward Euler, ``h = T/N``)::

    y[0]   = opening(x)
    y[n+1] = Φ_n(y[n]) = y[n] + h F(θ_n, y[n]),   n = 0..N-1
    logits = closing(y[N]),   L = loss(logits, labels)

Sequential backprop (the discrete adjoint, run backwards)::

    λ[N] = ∂L/∂y[N] = closing'ᵀ ∂L/∂logits
    λ[n] = Φ_n'(y[n])ᵀ λ[n+1],   ∂L/∂θ_n = (∂Φ_n/∂θ_n)ᵀ λ[n+1]
    ∂L/∂x = opening'ᵀ λ[0]

Parameters are one flat dict of named arrays: ``opening.W``, ``closing.b``, and the step
parameters stacked over layers, ``steps.W`` of shape (N, ...), so a layer's weights are the
view ``steps.W[n]``.

Every entry point (:func:`forward`, :func:`backprop`, and the layer-parallel gradient of
:mod:`refbraid.layer_parallel`) first calls :func:`~refbraid.input_checks.check_inputs`: the
params must have exactly the names and shapes :func:`init_params` gives
(:func:`~refbraid.input_checks.param_spec`, computed once per network from ONE step's
``init``), one floating dtype shared with the input, and finite values; the batch is checked by
:func:`~refbraid.input_checks.check_batch`. Extra, missing or mis-shaped entries would
otherwise be ignored silently (an extra row of ``steps.W``, an extra key) or fail deep inside.
Those checks live in :mod:`refbraid.input_checks`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from numbers import Real
from typing import Any

import numpy as np

from .backends import Backend, get_backend
from .backends.device_batching import gathered_once, index_on, weight_rows
from .backends.host import host_float, loss_value
from .backends.portable import indexes_with_integer_arrays, stack_rows
from .input_checks import check_inputs, check_params  # noqa: F401  (check_params re-exported)
from .layers.init import check_positive_int

Params = dict[str, Any]

GROUPS = ("opening", "steps", "closing")


@dataclass(frozen=True)
class Network:
    """Opening layer, ``n_layers`` ODE steps of kind ``step`` over ``[0, T]``, closing layer."""

    opening: Any
    step: Any
    closing: Any
    n_layers: int
    T: float = 1.0

    def __post_init__(self):
        check_positive_int("n_layers", self.n_layers)
        if isinstance(self.T, bool) or not isinstance(self.T, Real) \
                or not (math.isfinite(self.T) and self.T > 0):
            raise ValueError(f"`T` must be a positive finite number, got {self.T!r}.")
        if tuple(self.opening.out_shape) != tuple(self.step.state_shape):
            raise ValueError(
                f"opening output shape {self.opening.out_shape} does not match the step state "
                f"shape {self.step.state_shape}."
            )
        closing_in = getattr(self.closing, "in_shape", None)
        if closing_in is not None and tuple(closing_in) != tuple(self.step.state_shape):
            raise ValueError(
                f"closing input shape {tuple(closing_in)} does not match the step state "
                f"shape {self.step.state_shape}."
            )

    @property
    def h(self) -> float:
        """Layer step size h = T / N."""
        return self.T / self.n_layers


# ----------------------------------------------------------------------------- parameters
def init_params(net: Network, seed: int | np.random.Generator = 0, dtype=np.float64) -> Params:
    """Initial weights (PyTorch's fan-in uniform rule) as a flat dict of named host arrays."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    params: Params = {}
    for name, value in net.opening.init(rng, dtype).items():
        params[f"opening.{name}"] = value
    per_layer = [net.step.init(rng, dtype) for _ in range(net.n_layers)]
    for name in per_layer[0]:
        params[f"steps.{name}"] = np.stack([p[name] for p in per_layer])
    for name, value in net.closing.init(rng, dtype).items():
        params[f"closing.{name}"] = value
    return params


def group(params: Params, prefix: str) -> dict[str, Any]:
    """The parameters of one group (``opening``, ``steps``, ``closing``) without the prefix."""
    head = prefix + "."
    return {k[len(head) :]: v for k, v in params.items() if k.startswith(head)}


def row(a, n: int):
    """Row ``n`` of a stacked array (``a[n, ...]``: the array API has no NumPy-style partial
    index ``a[n]``), or entry ``n`` of a dict of rows (MPI shards, the virtual cluster)."""
    return a[n] if isinstance(a, Mapping) else a[n, ...]


def set_row(a, n: int, value) -> None:
    """``a[n, ...] = value`` for a stacked array, ``a[n] = value`` for a dict of rows."""
    if isinstance(a, Mapping):
        a[n] = value
    else:
        a[n, ...] = value


def set_rows_from(a, rows: list[int], values: list) -> None:
    """``a[rows[j], ...] = values[j]`` for every j: one stacked assignment into a NumPy or
    CuPy array (on a device: two launches, not one per row), else row by row (:func:`set_row`)."""
    if rows and indexes_with_integer_arrays(a):  # NumPy, CuPy
        a[index_on(a, rows), ...] = stack_rows(values)
        return
    for n, value in zip(rows, values, strict=True):
        set_row(a, n, value)


def layer_params(steps: dict[str, Any], n: int) -> dict[str, Any]:
    """Layer n's weights as views into the stacked step parameters."""
    return {k: row(v, n) for k, v in steps.items()}


def stacked_rows(rows, idx: np.ndarray, bk: Backend):
    """Rows ``idx`` of stacked layer data (an array (N, ...), or a ``{row: array}`` mapping as
    the distributed trainer's) as one array (len(idx), ...).

    Always a gathered, contiguous copy, also for evenly spaced rows: ``np.matmul`` over a
    strided view of stacked weights (every 4th layer's W) ran 1.5–4.5× slower than over the
    copy at k = 32–128 rows (the copy itself costs 1–2 % of that), measured."""
    if hasattr(rows, "shape"):  # on a device, the index crosses once (device_batching)
        return rows[idx] if isinstance(rows, np.ndarray) else rows[index_on(rows, idx)]
    return bk.xp.stack([rows[i] for i in idx.tolist()])


def layers_params(steps: dict[str, Any], idx: np.ndarray, bk: Backend,
                  in_place: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The stacked weights of layers ``idx``: ``{name: (len(idx), ...)}``, each made once per
    gradient call on a GPU backend (``device_batching.gathers_cached``): gathered, or for the
    names in ``in_place`` (``device_batching.rows_read_in_place``: the backend's batched
    kernels read strided rows) where ``idx`` is evenly spaced a view of the stack
    (``device_batching.weight_rows``)."""
    def make(v, viewed: bool):
        gather = partial(stacked_rows, v, idx, bk)
        return partial(weight_rows, v, idx, gather) if viewed else gather

    return {k: gathered_once(v, idx, make(v, k in in_place)) for k, v in steps.items()}


def to_backend(params: Params, bk: Backend | str) -> Params:
    bk = get_backend(bk)
    return {k: bk.asarray(v) for k, v in params.items()}


def zeros_like_params(params: Params, bk: Backend | str = "numpy") -> Params:
    bk = get_backend(bk)
    return {k: bk.xp.zeros_like(v) for k, v in params.items()}


# ----------------------------------------------------------------------------- sequential
def forward(net: Network, params: Params, x, bk: Backend | str = "numpy", keep=True):
    """Sequential forward pass.

    Returns (logits, states, caches): states[n] = y[n] for n = 0..N and caches = (opening
    cache, [step caches], closing cache) when ``keep``; otherwise only y[N] and no step caches.
    ``params`` and ``x`` are checked first
    (:func:`~refbraid.input_checks.check_inputs`).
    """
    bk = get_backend(bk)
    check_inputs(net, params, x)
    return _forward(net, params, x, bk, keep)


def _forward(net: Network, params: Params, x, bk: Backend, keep=True):
    """:func:`forward` without the checks (for callers that have made them)."""
    y, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    steps = group(params, "steps")
    states, step_caches = [y], []
    for n in range(net.n_layers):
        y, cache = net.step.forward(layer_params(steps, n), y, net.h, bk)
        if keep:
            states.append(y)
            step_caches.append(cache)
    if not keep:
        states = [y]
    logits, close_cache = net.closing.forward(group(params, "closing"), y, bk)
    return logits, states, (open_cache, step_caches, close_cache)


def loss_and_logits(net: Network, params: Params, x, labels, bk: Backend | str = "numpy"):
    bk = get_backend(bk)
    logits, _, _ = forward(net, params, x, bk, keep=False)
    loss, _ = bk.softmax_cross_entropy(logits, labels)
    return host_float(loss), logits


def stacked_gradients(steps: dict[str, Any], layer_grads: list[dict], bk: Backend) -> dict:
    """The step weights' gradients as stacked arrays like ``steps`` (N, ...): layer n's
    ``layer_grads[n][k]`` in row n of ``k``, in each parameter's dtype (0 where a layer gave
    none). One ``stack`` per parameter when every layer gave every parameter: on a GPU two
    launches in all, not two per layer (a row assignment each)."""
    xp = bk.xp
    if layer_grads and all(d.keys() == steps.keys() for d in layer_grads):
        return {k: stack_rows([d[k] for d in layer_grads], steps[k].dtype) for k in steps}
    out = {k: xp.zeros_like(v) for k, v in steps.items()}
    for n, d in enumerate(layer_grads):
        for k, v in d.items():
            set_row(out[k], n, v)
    return out


def backprop(net: Network, params: Params, x, labels, bk: Backend | str = "numpy"):
    """Loss and its gradient by sequential backprop (the exact discrete adjoint).

    Returns (loss, grads, info) with grads keyed like params and ``info`` holding the
    logits, the forward states y[0..N] and the adjoints λ[0..N].
    """
    bk = get_backend(bk)
    check_inputs(net, params, x, labels)
    logits, states, (open_cache, step_caches, close_cache) = _forward(net, params, x, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    grads = {f"closing.{k}": v for k, v in dclose.items()}
    steps = group(params, "steps")
    layer_grads = [None] * net.n_layers
    adjoints = [None] * (net.n_layers + 1)
    adjoints[net.n_layers] = lam
    for n in reversed(range(net.n_layers)):
        theta = layer_params(steps, n)
        lam, layer_grads[n] = net.step.adjoint(theta, step_caches[n], lam, net.h, bk)
        adjoints[n] = lam
    grads.update({f"steps.{k}": v for k, v in stacked_gradients(steps, layer_grads, bk).items()})
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, lam, bk)
    grads.update({f"opening.{k}": v for k, v in dopen.items()})
    info = {"logits": logits, "states": states, "adjoints": adjoints}
    return loss_value(loss), {k: grads[k] for k in params}, info
