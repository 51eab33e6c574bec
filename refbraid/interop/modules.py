"""Which PyTorch module becomes which refbraid layer: one registry entry per module type.

A PyTorch ODE-net is read as roles (docs/interop.md)::

    opening   [main, activation?]        y[0]   = σ(main(x))            DenseLift, ConvLift
    step n    [main, activation?]        y[n+1] = y[n] + h·σ(main(y[n]))  DenseStep, ConvStep
    closing   [Flatten?, Linear]         logits = Linear(flatten(y[N]))   Classifier
    layer     one module on its own (LayerNorm, attention, transformer layers, GRU cell)

Transformer layers and the GRU cell are steps in their residual form: ``Φ(y) = y + h·(layer(y)
− y)`` for a norm-first ``TransformerEncoderLayer``/``DecoderLayer`` (``layer(y) − y`` is the sum
of its residual branches, refbraid's ``F``), ``y + h·(GRUCell(x, y) − y)`` for the GRU cell.

Each :class:`ModuleRule` says, for one torch class: the state-dict key of every refbraid
parameter below the module (``keys``, copied as they are: refbraid stores weights in torch's
layouts), the hyper-parameters read from a module, with checks that name what is not
supported (``options``), and, per role, how to build the refbraid layer from the weights, the
activation, the input shape and those options. A new layer type (Conv3d, BatchNorm) plugs in
with one :func:`register` call; nothing else changes. The module is looked up by class name,
so this file never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any

from ..layers import (
    Classifier,
    ConvLift,
    ConvStep,
    DecoderStep,
    DenseLift,
    DenseStep,
    EncoderStep,
    GRUCell,
    LayerNorm,
    MultiheadAttention,
)

ROLES = ("opening", "step", "closing", "layer")
#: torch activation class -> refbraid activation name
ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "Identity": "identity", "GELU": "gelu"}

Build = Callable[[dict, str, tuple, dict], Any]  # (weights, activation, in_shape, options) -> layer


@dataclass(frozen=True)
class ModuleRule:
    """How one torch module class maps to refbraid (module docstring)."""

    torch_class: str
    keys: dict[str, str]  # refbraid parameter -> state-dict key below the module
    builds: dict[str, Build]  # role -> build
    options: Callable[[Any], dict] = field(default=lambda module: {})
    in_networks: bool = True  # usable in a whole ODE-net (refbraid.network.Network)


RULES: dict[str, ModuleRule] = {}


def register(rule: ModuleRule) -> ModuleRule:
    """Add (or replace) the rule of ``rule.torch_class``."""
    bad = [r for r in rule.builds if r not in ROLES]
    if bad:
        raise ValueError(f"`builds` roles must be among {ROLES}, got {bad}.")
    RULES[rule.torch_class] = rule
    return rule


def supported(role: str | None = None, network: bool = False) -> list[str]:
    """Torch class names refbraid converts (in ``role``, or in any role; ``network``: only
    those a whole ODE-net may hold)."""
    return sorted(n for n, r in RULES.items() if (role is None or role in r.builds)
                  and (r.in_networks or not network))


def rule_for(class_name: str, role: str, where: str, network: bool = False) -> ModuleRule:
    """The rule of a torch class in a role, or a ValueError naming module, role and options
    (``network``: as part of a whole ODE-net)."""
    rule = RULES.get(class_name)
    if rule is None or role not in rule.builds:
        raise ValueError(f"{where}: unsupported module `{class_name}` as {role}; supported "
                         f"{role} modules: {', '.join(supported(role, network))} (activations: "
                         f"{', '.join(sorted(ACTIVATIONS))}).")
    if network and not rule.in_networks:
        raise ValueError(f"{where}: `{class_name}` converts one module at a time "
                         f"(refbraid.interop.convert_module); whole ODE-nets take "
                         f"{', '.join(supported(role, True))} as {role} modules.")
    return rule


def activation_name(module, where: str) -> str:
    """refbraid's name of a torch activation module (exact GELU only)."""
    name = type(module).__name__
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}: unsupported activation `{name}`; supported: "
                         f"{', '.join(sorted(ACTIVATIONS))}.")
    if name == "GELU" and getattr(module, "approximate", "none") != "none":
        raise ValueError(f"{where}: GELU(approximate={module.approximate!r}) is not supported; "
                         f"refbraid's gelu is the exact (erf) one, approximate='none'.")
    return ACTIVATIONS[name]


def _shape(weights: dict, key: str) -> tuple[int, ...]:
    return tuple(int(s) for s in weights[key].shape)


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ValueError(f"{where}: {what}")


def _dims(w: dict, key: str, layout: str, where: str) -> tuple[int, ...]:
    """The shape of weight ``key``, which must have as many axes as ``layout`` names."""
    shape = _shape(w, key)
    n = len(layout.split(","))
    _need(len(shape) == n, where, f"the weight `{key}` has shape {shape}, this module's is "
          f"({layout}): does the spec name the right `module`?")
    return shape


# ----------------------------------------------------------------------------- Linear
def _linear_options(m) -> dict:
    _need(m.bias is not None, "Linear", "bias=False is not supported (refbraid's dense "
          "layers have a bias).")
    return {}


def _dense_lift(w, act, in_shape, opt):
    C, K = _dims(w, "W", "out, in", "Linear opening")
    _need(tuple(in_shape) == (K,), "Linear opening", f"input shape {tuple(in_shape)} does not "
          f"match in_features {K}.")
    return DenseLift(K, C, act)


def _dense_step(w, act, in_shape, opt):
    C, K = _dims(w, "W", "out, in", "Linear step")
    _need(C == K and tuple(in_shape) == (C,), "Linear step",
          f"a step must map the state to itself: Linear({K}, {C}) on state shape "
          f"{tuple(in_shape)}.")
    return DenseStep(C, act)


def _classifier(w, act, in_shape, opt):
    n, K = _dims(w, "W", "out, in", "Linear closing")
    _need(act == "identity", "Linear closing", f"no activation after the closing Linear "
          f"(got {act}): the loss takes the logits.")
    _need(prod(in_shape) == K, "Linear closing", f"in_features {K} does not match the "
          f"flattened state {tuple(in_shape)} (= {prod(in_shape)}).")
    return Classifier(tuple(in_shape), n)


register(ModuleRule("Linear", {"W": "weight", "b": "bias"},
                    {"opening": _dense_lift, "step": _dense_step, "closing": _classifier},
                    _linear_options))


# ----------------------------------------------------------------------------- Conv2d
def _conv2d_options(m) -> dict:
    ok = (tuple(m.kernel_size) == (3, 3) and tuple(m.padding) == (1, 1)
          and tuple(m.stride) == (1, 1) and tuple(m.dilation) == (1, 1) and m.groups == 1
          and m.padding_mode == "zeros" and m.bias is not None)
    _need(ok, "Conv2d", f"only 3×3 kernels, padding 1, stride 1, dilation 1, groups 1, zero "
          f"padding and a bias are supported, got kernel_size={m.kernel_size}, "
          f"padding={m.padding}, stride={m.stride}, dilation={m.dilation}, groups={m.groups}, "
          f"padding_mode={m.padding_mode!r}, bias={m.bias is not None}.")
    return {}


def _conv_shape(w, in_shape, where):
    C, Cin, kh, kw = _dims(w, "W", "C_out, C_in, 3, 3", where)
    _need((kh, kw) == (3, 3), where, f"only 3×3 kernels are supported, got {kh}×{kw}.")
    _need(len(in_shape) == 3 and in_shape[0] == Cin, where, f"input shape {tuple(in_shape)} "
          f"must be (C={Cin}, H, W).")
    return C, Cin


def _conv_lift(w, act, in_shape, opt):
    C, Cin = _conv_shape(w, in_shape, "Conv2d opening")
    return ConvLift(Cin, C, in_shape[1], in_shape[2], act)


def _conv_step(w, act, in_shape, opt):
    C, Cin = _conv_shape(w, in_shape, "Conv2d step")
    _need(C == Cin, "Conv2d step", f"a step must map the state to itself: {Cin} → {C} channels.")
    return ConvStep(C, in_shape[1], in_shape[2], act)


register(ModuleRule("Conv2d", {"W": "weight", "b": "bias"},
                    {"opening": _conv_lift, "step": _conv_step}, _conv2d_options))


# ----------------------------------------------------------------------------- LayerNorm
def _layernorm_options(m) -> dict:
    _need(len(m.normalized_shape) == 1 and m.elementwise_affine
          and getattr(m, "bias", 1) is not None, "LayerNorm",
          f"only a 1-D normalized_shape with elementwise_affine=True and a bias is supported, "
          f"got normalized_shape={tuple(m.normalized_shape)}, "
          f"elementwise_affine={m.elementwise_affine}.")
    return {"eps": float(m.eps)}


def _layernorm(w, act, in_shape, opt):
    (E,) = _shape(w, "gamma")
    seq = in_shape[0] if len(in_shape) == 2 else 1
    return LayerNorm(E, seq, opt.get("eps", 1e-5))


register(ModuleRule("LayerNorm", {"gamma": "weight", "beta": "bias"}, {"layer": _layernorm},
                    _layernorm_options))


# ----------------------------------------------------------------------------- attention
_ATTN = {"W_in": "in_proj_weight", "b_in": "in_proj_bias", "W_out": "out_proj.weight",
         "b_out": "out_proj.bias"}


def _mha_check(m, where: str) -> None:
    _need(m.batch_first and m._qkv_same_embed_dim and m.in_proj_bias is not None
          and m.bias_k is None and not m.add_zero_attn and (m.dropout == 0 or not m.training),
          where, "only batch_first=True, kdim = vdim = embed_dim, bias=True, no bias_kv or "
          "zero attention, and dropout 0 (or eval mode) are supported.")


def _mha_options(m) -> dict:
    _mha_check(m, "MultiheadAttention")
    return {"heads": int(m.num_heads)}


def _attention(w, act, in_shape, opt):
    E = _shape(w, "W_out")[0]
    return MultiheadAttention(E, opt["heads"], in_shape[0], causal=opt.get("causal", False))


register(ModuleRule("MultiheadAttention", dict(_ATTN), {"layer": _attention}, _mha_options))


def _transformer_options(m, where: str) -> dict:
    import torch.nn.functional as F  # noqa: N812 (only reached with a torch module in hand)

    act = m.activation
    exact_gelu = act is F.gelu or (type(act).__name__ == "GELU"
                                   and getattr(act, "approximate", "none") == "none")
    drop = [d.p for n, d in m.named_children() if n.startswith("dropout")]
    _need(m.norm_first and exact_gelu and (not m.training or not any(drop)), where,
          "only norm_first=True, activation='gelu' (exact) and dropout 0 (or eval mode) are "
          f"supported, got norm_first={m.norm_first}, activation={act}, dropout={drop}.")
    _mha_check(m.self_attn, f"{where}.self_attn")
    return {"heads": int(m.self_attn.num_heads), "eps": float(m.norm1.eps)}


def _sub(prefix: str, keys: dict[str, str], torch_prefix: str) -> dict[str, str]:
    return {f"{prefix}.{k}": f"{torch_prefix}.{v}" for k, v in keys.items()}


_LN = {"gamma": "weight", "beta": "bias"}
_MLP = {"mlp.W1": "linear1.weight", "mlp.b1": "linear1.bias", "mlp.W2": "linear2.weight",
        "mlp.b2": "linear2.bias"}
_ENCODER = {**_sub("ln1", _LN, "norm1"), **_sub("sa", _ATTN, "self_attn"),
            **_sub("ln2", _LN, "norm2"), **_MLP}
# torch's decoder: norm1 → self-attention, norm2 → cross-attention, norm3 → feed-forward;
# refbraid's: ln1 → sa, ln3 → ca, ln2 → mlp (docs/references.md §1)
_DECODER = {**_sub("ln1", _LN, "norm1"), **_sub("sa", _ATTN, "self_attn"),
            **_sub("ln3", _LN, "norm2"), **_sub("ca", _ATTN, "multihead_attn"),
            **_sub("ln2", _LN, "norm3"), **_MLP}


def _encoder_step(w, act, in_shape, opt):
    T, E = in_shape
    return EncoderStep(E, opt["heads"], _shape(w, "mlp.W1")[0], T,
                       causal=opt.get("causal", False), eps=opt.get("eps", 1e-5))


def _decoder_options(m) -> dict:
    opt = _transformer_options(m, "TransformerDecoderLayer")
    _mha_check(m.multihead_attn, "TransformerDecoderLayer.multihead_attn")
    return opt


def _decoder_step(w, act, in_shape, opt):
    T, E = in_shape
    if "memory_len" not in opt:
        raise ValueError("TransformerDecoderLayer step: give `memory_len` (the encoder output's "
                         "length S) in the options or spec.")
    return DecoderStep(E, opt["heads"], _shape(w, "mlp.W1")[0], T, opt["memory_len"],
                       causal=opt.get("causal", True), eps=opt.get("eps", 1e-5))


# whole transformer / GRU models live in refbraid/sequence/ (embeddings, memory, MGRIT over
# the sequence): these layers convert one module at a time (convert_module)
register(ModuleRule("TransformerEncoderLayer", _ENCODER, {"step": _encoder_step},
                    lambda m: _transformer_options(m, "TransformerEncoderLayer"), False))
register(ModuleRule("TransformerDecoderLayer", _DECODER, {"step": _decoder_step},
                    _decoder_options, False))


# ----------------------------------------------------------------------------- GRU cell
def _gru_options(m) -> dict:
    _need(m.bias, "GRUCell", "bias=False is not supported.")
    return {}


def _gru_step(w, act, in_shape, opt):
    threeH, I = _shape(w, "W_ih")
    return GRUCell(I, threeH // 3, opt.get("scheme", "classic"))


register(ModuleRule("GRUCell", {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih",
                                "b_hh": "bias_hh"}, {"step": _gru_step}, _gru_options, False))
