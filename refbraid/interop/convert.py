"""PyTorch ODE-nets and modules ⇄ refbraid networks and parameter dicts (torch optional).

::

    state_dict + NetSpec  ─ from_state_dict ─►  Converted(net, params, keys)
    torch model           ─ from_torch ──────►  (its spec read from the modules, then the same)
    Converted + params    ─ to_state_dict ───►  state_dict with the original keys and dtypes

Weights are copied as they are (refbraid keeps torch's layouts), cast to float64 by default
(exact for float32 and float64), and cast back to each key's original dtype, so the round
trip is bit-exact. ``keys`` maps every refbraid parameter to its state-dict key(s): a stacked
``steps.*`` entry to one key per layer.

A torch model is read from its ``opening``, ``steps`` (a list of N step modules) and
``closing`` attributes and ``T`` (or explicit arguments): each role is a module or an
``nn.Sequential`` of leaves, ``[main, activation?]`` for the opening and the steps,
``[Flatten?, Linear]`` for the closing (modules.py). This module imports torch only to turn
tensors into arrays (``tensor.detach().cpu().numpy()``) when it is handed tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..network import Network, Params
from .modules import RULES, activation_name, rule_for
from .spec import NetSpec, RoleSpec


@dataclass(frozen=True)
class Converted:
    """A refbraid network with the weights of a state dict, and where each weight came from."""

    net: Network
    params: Params
    keys: dict[str, Any]  # refbraid name -> state-dict key (steps.*: a list, one per layer)
    dtypes: dict[str, Any]  # state-dict key -> its original dtype (numpy or torch)
    spec: NetSpec | None  # None for a refbraid checkpoint (its names are the keys)


def as_array(value, key: str = "value") -> np.ndarray:
    """A NumPy copy of a tensor or array (torch tensors are detached and moved to the CPU)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if not hasattr(value, "shape"):
        raise TypeError(f"`{key}` must be a tensor or an array, got {type(value).__name__}.")
    return np.array(value, copy=True)


def _read(state_dict, key: str, where: str):
    if key not in state_dict:
        near = sorted(k for k in state_dict if k.split(".")[0] == key.split(".")[0])[:6]
        raise ValueError(f"{where}: the state dict has no `{key}`"
                         f"{f' (keys nearby: {near})' if near else ''}.")
    return state_dict[key]


def _count_layers(state_dict, spec: NetSpec) -> int:
    if spec.n_layers is not None:
        return spec.n_layers
    first = next(iter(RULES[spec.steps.module].keys.values()))
    n = 0
    while f"{spec.steps.key.format(n=n)}.{first}" in state_dict:
        n += 1
    if n == 0:
        raise ValueError(f"spec `steps.key`: no `{spec.steps.key.format(n=0)}.{first}` in the "
                         f"state dict, so no step layer was found.")
    return n


def _role_weights(state_dict, role: RoleSpec, key: str, where: str, dtype):
    rule = RULES[role.module]
    out, keys = {}, {}
    for name, rel in rule.keys.items():
        full = f"{key}.{rel}" if key else rel
        out[name] = as_array(_read(state_dict, full, where), full).astype(dtype, copy=False)
        keys[name] = full
    return out, keys


def from_state_dict(state_dict: Mapping, spec: NetSpec | dict, dtype=np.float64) -> Converted:
    """A refbraid :class:`Network` and params from a state dict described by ``spec``.

    Every entry of the state dict must be used (an unused weight would be silently dropped
    from the comparison): leftovers are an error naming them.
    """
    spec = spec if isinstance(spec, NetSpec) else NetSpec.from_mapping(spec)
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"`state_dict` must be a mapping of names to tensors, got "
                        f"{type(state_dict).__name__}.")
    N = _count_layers(state_dict, spec)
    w_open, k_open = _role_weights(state_dict, spec.opening, spec.opening.key, "opening", dtype)
    opening = RULES[spec.opening.module].builds["opening"](
        w_open, spec.opening.activation, spec.input_shape, spec.opening.options)
    per_layer, k_steps = [], {}
    for n in range(N):
        w, k = _role_weights(state_dict, spec.steps, spec.steps.key.format(n=n), f"step {n}",
                             dtype)
        per_layer.append(w)
        for name, full in k.items():
            k_steps.setdefault(name, []).append(full)
    step = RULES[spec.steps.module].builds["step"](
        per_layer[0], spec.steps.activation, tuple(opening.out_shape), spec.steps.options)
    for n, w in enumerate(per_layer):
        for name, v in w.items():
            if v.shape != per_layer[0][name].shape:
                raise ValueError(f"step {n}: `{k_steps[name][n]}` has shape {v.shape}, but step "
                                 f"0's has {per_layer[0][name].shape}; every step must have "
                                 f"the same shapes.")
    w_close, k_close = _role_weights(state_dict, spec.closing, spec.closing.key, "closing",
                                     dtype)
    closing = RULES[spec.closing.module].builds["closing"](
        w_close, spec.closing.activation, tuple(step.state_shape), spec.closing.options)
    net = Network(opening, step, closing, N, float(spec.T))
    params = {f"opening.{k}": v for k, v in w_open.items()}
    params.update({f"steps.{k}": np.stack([w[k] for w in per_layer]) for k in per_layer[0]})
    params.update({f"closing.{k}": v for k, v in w_close.items()})
    keys = {f"opening.{k}": v for k, v in k_open.items()}
    keys.update({f"steps.{k}": v for k, v in k_steps.items()})
    keys.update({f"closing.{k}": v for k, v in k_close.items()})
    used = {k for v in keys.values() for k in (v if isinstance(v, list) else [v])}
    unused = [k for k in state_dict if k not in used]
    if unused:
        raise ValueError(f"the state dict has entries the spec does not place: {unused[:8]}"
                         f"{' ...' if len(unused) > 8 else ''}; describe them in the spec or "
                         f"remove them (refbraid converts {sorted(RULES)}).")
    dtypes = {k: getattr(v, "dtype", None) for k, v in state_dict.items()}  # (its order)
    for k, v in net_param_shapes(net).items():
        if tuple(params[k].shape) != v:
            raise ValueError(f"`{k}` from the state dict has shape {params[k].shape}, the "
                             f"refbraid layer expects {v}.")
    return Converted(net, params, keys, dtypes, spec)


def net_param_shapes(net: Network) -> dict[str, tuple]:
    """Shapes refbraid expects for ``net``'s weights (from
    :func:`refbraid.input_checks.param_spec`)."""
    from ..input_checks import param_spec

    return {k: tuple(e.shape) for k, e in param_spec(net).items() if e.kind == "weight"}


def to_state_dict(converted: Converted, params: Params | None = None) -> dict:
    """refbraid weights (``params``, default the converted ones) back under the original keys,
    each in its original dtype (a torch tensor when the original was one)."""
    params = converted.params if params is None else params
    out = {}
    for name, key in converted.keys.items():
        if name not in params:
            raise ValueError(f"`params` has no `{name}` (the network's weights: "
                             f"{sorted(converted.keys)}).")
        value = as_array(params[name], name)
        rows = key if isinstance(key, list) else [key]
        values = value if isinstance(key, list) else [value]
        if isinstance(key, list) and value.shape[0] != len(key):
            raise ValueError(f"`{name}` has {value.shape[0]} rows, the network has {len(key)} "
                             f"layers.")
        for k, v in zip(rows, values, strict=True):
            out[k] = _cast_like(v, converted.dtypes.get(k))
    return {k: out[k] for k in converted.dtypes}  # the state dict's order


def _cast_like(value: np.ndarray, dtype):
    if dtype is None:
        return value
    if isinstance(dtype, np.dtype):
        return value.astype(dtype)
    import torch  # the original was a tensor

    return torch.from_numpy(np.ascontiguousarray(value)).to(dtype)


# ----------------------------------------------------------------------------- torch modules
def _leaves(block) -> list:
    """The leaf modules of a role block (a module, an nn.Sequential or a list of modules)."""
    if isinstance(block, (list, tuple)):
        return [leaf for b in block for leaf in _leaves(b)]
    if type(block).__name__ == "Sequential":
        return [leaf for b in block for leaf in _leaves(b)]
    return [block]


def _role(block, role: str, names: dict[int, str], where: str) -> tuple[RoleSpec, Any]:
    """(RoleSpec, main module) of an opening / step / closing block."""
    leaves = _leaves(block)
    if role == "closing" and leaves and type(leaves[0]).__name__ == "Flatten":
        leaves = leaves[1:]
    if not 1 <= len(leaves) <= 2:
        raise ValueError(f"{where}: expected [module, activation?], got "
                         f"{[type(m).__name__ for m in leaves]}.")
    main = leaves[0]
    rule = rule_for(type(main).__name__, role, where, network=True)
    options = rule.options(main)
    act = activation_name(leaves[1], where) if len(leaves) == 2 else "identity"
    if id(main) not in names:
        raise ValueError(f"{where}: the `{type(main).__name__}` is not a sub-module of the "
                         f"model whose state dict is converted.")
    return RoleSpec(type(main).__name__, names[id(main)], act, options), main


def spec_of(model, input_shape, T: float | None = None, opening=None, steps=None,
            closing=None) -> NetSpec:
    """Read the :class:`NetSpec` of a torch ODE-net (module docstring)."""
    opening = getattr(model, "opening", None) if opening is None else opening
    steps = getattr(model, "steps", None) if steps is None else steps
    closing = getattr(model, "closing", None) if closing is None else closing
    if opening is None or steps is None or closing is None:
        raise ValueError("`model` must have `opening`, `steps` (a list of step modules) and "
                         "`closing` attributes, or pass them as arguments.")
    T = getattr(model, "T", None) if T is None else T
    if T is None:
        raise ValueError("give `T` (the final time: h = T / N), or set `model.T`.")
    names = {id(m): name for name, m in model.named_modules()}
    o, _ = _role(opening, "opening", names, "opening")
    steps = list(steps)
    if not steps:
        raise ValueError("`steps` is empty: an ODE-net needs at least one step module.")
    first, _ = _role(steps[0], "step", names, "step 0")
    second = _role(steps[1], "step", names, "step 1")[0].key if len(steps) > 1 else None
    pattern = _index_pattern(first.key, second)
    for n, block in enumerate(steps):
        s, _ = _role(block, "step", names, f"step {n}")
        if (s.module, s.activation) != (first.module, first.activation) \
                or s.key != pattern.format(n=n):
            raise ValueError(f"step {n}: `{s.key}` ({s.module}, {s.activation}) differs from "
                             f"step 0 ({first.module}, {first.activation}, keys "
                             f"`{pattern}`): every step must be the same kind of layer.")
    c, _ = _role(closing, "closing", names, "closing")
    return NetSpec(T=float(T), input_shape=tuple(int(s) for s in input_shape), opening=o,
                   steps=RoleSpec(first.module, pattern, first.activation, first.options),
                   closing=c, n_layers=len(steps))


def _index_pattern(key0: str, key1: str | None) -> str:
    """``steps.{n}.0`` from step 0's and step 1's keys (the part that reads 0, then 1; with
    one step, the first part that reads 0)."""
    parts = key0.split(".")
    other = key1.split(".") if key1 is not None else None
    for i, part in enumerate(parts):
        if part == "0" and (other is None or (len(other) == len(parts) and other[i] == "1")):
            return ".".join([*parts[:i], "{n}", *parts[i + 1:]])
    raise ValueError(f"step 0 is named `{key0}`: the steps must be an indexed list "
                     f"(nn.ModuleList / nn.Sequential), so that step n is `...n...`.")


def from_torch(model, input_shape, T: float | None = None, dtype=np.float64, **roles
               ) -> Converted:
    """A refbraid network with the weights of a torch ODE-net (module docstring)."""
    spec = spec_of(model, input_shape, T, **roles)
    return from_state_dict(model.state_dict(), spec, dtype)


def params_from_keyed(converted: Converted, keyed: Mapping, what: str = "gradient") -> Params:
    """Arrays keyed by state-dict key (a gradient saved by the user's code) — or already by
    refbraid name — as a refbraid params dict (the inverse of :func:`to_state_dict`)."""
    out = {}
    for name, key in converted.keys.items():
        if name in keyed:
            out[name] = as_array(keyed[name], name).astype(np.float64)
            continue
        rows = key if isinstance(key, list) else [key]
        missing = [k for k in rows if k not in keyed]
        if missing:
            raise ValueError(f"the {what} has no `{missing[0]}` (nor `{name}`): give one array "
                             f"per state-dict key of the model, e.g. {rows[0]!r}.")
        vals = [as_array(keyed[k], k).astype(np.float64) for k in rows]
        want = converted.params[name].shape[1:] if isinstance(key, list) else \
            converted.params[name].shape
        for k, v in zip(rows, vals, strict=True):
            if v.shape != tuple(want):
                raise ValueError(f"the {what}'s `{k}` has shape {v.shape}, the weight has "
                                 f"{tuple(want)}.")
        out[name] = np.stack(vals) if isinstance(key, list) else vals[0]
    return out


def convert_module(module, role: str = "layer", in_shape=(), activation: str = "identity",
                   **options) -> tuple[Any, Params, dict[str, str]]:
    """One torch module as (refbraid layer, its params, refbraid name → state-dict key).

    ``role`` as in modules.py; ``in_shape`` is one sample's input shape (no batch axis);
    ``options`` add hyper-parameters the module does not hold (``memory_len`` of a decoder
    layer, ``causal``, a GRU ``scheme``). Every entry of the module's state dict must be
    placed (else an error names the leftovers).
    """
    name = type(module).__name__
    rule = rule_for(name, role, name)
    opts = {**rule.options(module), **options}
    sd = module.state_dict()
    weights, keys = _role_weights(sd, RoleSpec(name, ""), "", name, np.float64)
    unused = [k for k in sd if k not in keys.values()]
    if unused:
        raise ValueError(f"{name}: state-dict entries {unused} have no refbraid counterpart.")
    layer = rule.builds[role](weights, activation, tuple(in_shape), opts)
    return layer, weights, keys


def module_state_dict(params: Params, keys: dict[str, str], like: Mapping) -> dict:
    """The inverse of :func:`convert_module`: params under the module's keys and dtypes."""
    name_of = {key: name for name, key in keys.items()}
    return {key: _cast_like(as_array(params[name_of[key]], name_of[key]),
                            getattr(like[key], "dtype", None)) for key in like}
