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
:mod:`refbraid.layer_parallel`) first calls :func:`check_inputs`: the params must have
exactly the names and shapes :func:`init_params` gives (:func:`param_spec`, computed once per
network from ONE step's ``init``), one floating dtype shared with the input, and finite values;
the batch is checked by :func:`check_batch`. Extra, missing or mis-shaped entries would
otherwise be ignored silently (an extra row of ``steps.W``, an extra key) or fail deep inside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from numbers import Real
from typing import Any, NamedTuple

import numpy as np

from .backends import Backend, get_backend
from .backends.capture_state import host_reads_allowed
from .backends.device_batching import gathered_once, index_on
from .backends.dtypes import dtype_kind
from .backends.host import all_finite, first_non_finite, host_float, host_range, loss_value
from .backends.portable import indexes_with_integer_arrays, stack_rows
from .layers.init import NonFiniteError, check_positive_int

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


def layers_params(steps: dict[str, Any], idx: np.ndarray, bk: Backend) -> dict[str, Any]:
    """The stacked weights of layers ``idx``: ``{name: (len(idx), ...)}``, each gathered once
    per gradient call on a GPU backend (``device_batching.gathers_cached``)."""
    return {k: gathered_once(v, idx, lambda v=v: stacked_rows(v, idx, bk))
            for k, v in steps.items()}


def to_backend(params: Params, bk: Backend | str) -> Params:
    bk = get_backend(bk)
    return {k: bk.asarray(v) for k, v in params.items()}


def zeros_like_params(params: Params, bk: Backend | str = "numpy") -> Params:
    bk = get_backend(bk)
    return {k: bk.xp.zeros_like(v) for k, v in params.items()}


# ----------------------------------------------------------------------------- checks
class Expected(NamedTuple):
    """What one params entry must look like.

    ``shape``: sizes, with None for a free axis (a data entry's batch) and a trailing
    ``...`` for free trailing axes; ``kind``: 'weight' (exact shape, the params' floating
    dtype, finite), 'data' (required, e.g. a decoder's ``memory``: the pattern shape, the
    params' dtype when floating) or 'optional' (e.g. a padding mask: validated by its layer).
    """

    shape: tuple
    kind: str


def _layer_spec(layer, rng, rows: int | None) -> dict[str, Expected]:
    """The entries of one layer's ``init`` (stacked over ``rows`` layers when given)."""
    lead = () if rows is None else (rows,)
    data = tuple(getattr(layer, "data_entries", ()))
    spec = {}
    for name, value in layer.init(rng, np.float64).items():
        shape = tuple(value.shape)
        if name in data:  # data with a batch axis of 1 or B (module docstrings of the layers)
            spec[name] = Expected((*lead, None, *shape[1:]), "data")
        else:
            spec[name] = Expected((*lead, *shape), "weight")
    for name in data:
        spec.setdefault(name, Expected((*lead, ...), "optional"))
    return spec


def _build_spec(net: Network) -> dict[str, Expected]:
    rng = np.random.default_rng(0)  # values are discarded: only names and shapes are kept
    spec = {}
    for prefix, layer, rows in (("opening", net.opening, None), ("steps", net.step, net.n_layers),
                                ("closing", net.closing, None)):
        spec.update({f"{prefix}.{k}": v for k, v in _layer_spec(layer, rng, rows).items()})
    return spec


_cached_spec = lru_cache(maxsize=64)(_build_spec)


def param_spec(net: Network) -> dict[str, Expected]:
    """The names and shapes :func:`init_params` gives ``net`` (plus the data entries its layers
    accept), from one ``init`` per layer, not N, cached per network (:func:`init_params`
    costs 28 % of a backprop step on the default 64-layer net, this lookup under 1 µs).
    """
    try:
        hash(net)
    except TypeError:  # a network of unhashable custom layers: rebuild every time
        return _build_spec(net)
    return _cached_spec(net)


def _fits(shape: tuple, pattern: tuple) -> bool:
    if pattern and pattern[-1] is Ellipsis:
        head = pattern[:-1]
        return len(shape) >= len(head) and _fits(shape[: len(head)], head)
    return len(shape) == len(pattern) and all(p is None or p == s
                                              for s, p in zip(shape, pattern, strict=True))


def _show(pattern: tuple) -> str:
    parts = ["B" if p is None else "..." if p is Ellipsis else str(p) for p in pattern]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def check_param_dict(spec: dict[str, Expected], params, rows_hint: str = "") -> np.dtype:
    """Check ``params`` against ``spec`` (see :class:`Expected`); returns the params' dtype.

    Names: exactly the weights and required data of ``spec`` (optional data may be present).
    Weights: exact shape, one floating dtype for all, finite values. Errors name the entry.
    ``rows_hint`` explains a stacked entry's first axis (e.g. "one row per layer, N = 64").
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"`params` must be a dict of named arrays (as init_params returns), "
                        f"got {type(params).__name__}.")
    unknown = [k for k in params if k not in spec]
    if unknown:
        raise ValueError(f"`params` has unexpected entries {', '.join(f'`{k}`' for k in unknown)}"
                         f"; this network takes exactly "
                         f"{sorted(k for k, e in spec.items() if e.kind != 'optional')}.")
    missing = [k for k, e in spec.items() if e.kind != "optional" and k not in params]
    if missing:
        raise ValueError("`params` is missing " + ", ".join(
            f"`{k}` (shape {_show(spec[k].shape)})" for k in missing) + ".")
    dtype, first, weights = None, None, []
    for key, want in spec.items():
        if key not in params:
            continue
        value = params[key]
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"`{key}` must be an array, got {type(value).__name__}.")
        shape = tuple(value.shape)
        if not _fits(shape, want.shape):
            hint = f" ({rows_hint})" if rows_hint and ".steps." in f".{key}" else ""
            raise ValueError(f"`{key}` must have shape {_show(want.shape)}{hint}, got {shape}.")
        if want.kind == "optional":
            continue
        if dtype_kind(value.dtype) not in "fc":
            raise TypeError(f"`{key}` must be a floating array, got dtype {value.dtype}.")
        if dtype is None:
            dtype, first = value.dtype, key
        elif value.dtype != dtype:
            raise TypeError(f"`{key}` has dtype {value.dtype} but `{first}` has {dtype}: all "
                            f"parameters (and the input) must share one floating dtype; cast "
                            f"them with .astype(...).")
        if want.kind == "weight":
            weights.append((key, value))
    # one flag per weight, one copy to the host for all (inside host_reads_deferred the
    # caller has checked the values: a captured gradient, before each replay)
    bad = first_non_finite(weights) if host_reads_allowed() else None
    if bad is not None:
        raise NonFiniteError(f"`{bad}` must be finite, got NaN or infinite values.")
    return dtype


def check_params(net: Network, params) -> np.dtype:
    """Check ``params`` against what :func:`init_params` gives ``net`` (:func:`param_spec`):
    names, shapes, one floating dtype, finite weights. Returns that dtype.

    Cost on the default net (64 layers of width 16, batch 64; 2-core development machine):
    18 µs, 1.4 % of a 1.26 ms sequential backprop step and 0.35 % of a layer-parallel one; the
    isfinite pass over the weights is 8.4 µs of it. (Calling :func:`init_params` instead, to
    compare with, would cost 350 µs.)
    """
    return check_param_dict(param_spec(net), params,
                            f"one row per layer: n_layers = {net.n_layers}")


def check_input_dtype(name: str, x, dtype, discrete: bool = False) -> None:
    """TypeError unless a floating input ``x`` has the parameters' ``dtype`` (an opening that
    reads token ids, ``discrete``, takes any dtype)."""
    if discrete or dtype is None or getattr(x, "dtype", None) is None:
        return
    if dtype_kind(x.dtype) in "fc" and x.dtype != dtype:
        raise TypeError(f"`{name}` has dtype {x.dtype} but the parameters have {dtype}: one call "
                        f"must use one floating dtype; cast with .astype(...).")


def check_inputs(net: Network, params, x, labels=None) -> np.dtype:
    """Everything an entry point checks: :func:`check_params`, :func:`check_batch`, and the
    input's dtype against the parameters'. Returns the parameters' dtype."""
    dtype = check_params(net, params)
    check_batch(net, x, labels)
    check_input_dtype("x", x, dtype, getattr(net.opening, "discrete_input", False))
    return dtype


def check_batch(net: Network, x, labels=None) -> None:
    """Validate a batch: shape ``(B, *opening.in_shape)``, finite values, labels in range."""
    shape = tuple(net.opening.in_shape)
    if getattr(x, "ndim", None) != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise ValueError(f"`x` must have shape (batch, {', '.join(map(str, shape))}), "
                         f"got {getattr(x, 'shape', type(x).__name__)}.")
    if x.shape[0] < 1:
        raise ValueError("`x` must hold at least one sample.")
    if dtype_kind(x.dtype) not in "biufc":
        raise TypeError(f"`x` must be a numeric array, got dtype {x.dtype}.")
    # the values (finite, labels in range) cross to the host; inside host_reads_deferred the
    # caller has checked them (a captured gradient, before each replay)
    values = host_reads_allowed()
    if values and dtype_kind(x.dtype) in "fc" and not all_finite(x):
        raise NonFiniteError("`x` must be finite, got NaN or infinite values.")
    if labels is not None:
        if getattr(labels, "shape", None) != (x.shape[0],):
            raise ValueError(f"`labels` must have shape ({x.shape[0]},), "
                             f"got {getattr(labels, 'shape', None)}.")
        if dtype_kind(labels.dtype) not in "iu":
            raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}.")
        n_classes = net.closing.out_shape[0]
        if not values:
            return
        lo, hi = host_range(labels)  # min and max on the device: two numbers to the host
        if lo < 0 or hi >= n_classes:
            raise ValueError(f"`labels` must lie in [0, {n_classes}), got range [{lo}, {hi}].")


# ----------------------------------------------------------------------------- sequential
def forward(net: Network, params: Params, x, bk: Backend | str = "numpy", keep=True):
    """Sequential forward pass.

    Returns (logits, states, caches): states[n] = y[n] for n = 0..N and caches = (opening
    cache, [step caches], closing cache) when ``keep``; otherwise only y[N] and no step caches.
    ``params`` and ``x`` are checked first (:func:`check_inputs`).
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
