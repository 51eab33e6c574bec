"""The checks every entry point makes before it computes: the params against what
:func:`~refbraid.network.init_params` gives the network, and the batch against the opening.

A params dict must hold exactly the entries :func:`param_spec` lists (each an
:class:`Expected`: a shape pattern and a kind), so that for a network of N steps::

    opening.<name>  shape of opening.init()[name]
    steps.<name>    (N, *shape of step.init()[name])     one row per layer, θ_n = steps.<name>[n]
    closing.<name>  shape of closing.init()[name]

with one floating dtype shared by every weight and the input, and finite values (one flag per
weight — on a device its sum, re-checked exactly where the sum is not finite — copied to the
host once). A batch is ``x`` of shape ``(B, *opening.in_shape)``, B ≥ 1,
finite, and ``labels`` of shape ``(B,)``, integers in ``[0, n_classes)``. Errors name the entry
and what was expected.

``net`` is a :class:`~refbraid.network.Network` (or a model built of its parts, as the
sequence models' encoder and decoder); these checks read only its layers and ``n_layers``, and
:mod:`refbraid.network` imports them (its :func:`~refbraid.network.forward` and
:func:`~refbraid.network.backprop` call :func:`check_inputs` first), so this module does not
import it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .backends.capture_state import host_reads_allowed
from .backends.dtypes import dtype_kind
from .backends.host import all_finite, first_non_finite, host_range
from .layers.init import NonFiniteError


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


def _build_spec(net) -> dict[str, Expected]:
    rng = np.random.default_rng(0)  # values are discarded: only names and shapes are kept
    spec = {}
    for prefix, layer, rows in (("opening", net.opening, None), ("steps", net.step, net.n_layers),
                                ("closing", net.closing, None)):
        spec.update({f"{prefix}.{k}": v for k, v in _layer_spec(layer, rng, rows).items()})
    return spec


_cached_spec = lru_cache(maxsize=64)(_build_spec)


def param_spec(net) -> dict[str, Expected]:
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


def check_params(net, params) -> np.dtype:
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


def check_inputs(net, params, x, labels=None) -> np.dtype:
    """Everything an entry point checks: :func:`check_params`, :func:`check_batch`, and the
    input's dtype against the parameters'. Returns the parameters' dtype."""
    dtype = check_params(net, params)
    check_batch(net, x, labels)
    check_input_dtype("x", x, dtype, getattr(net.opening, "discrete_input", False))
    return dtype


def check_batch(net, x, labels=None) -> None:
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

