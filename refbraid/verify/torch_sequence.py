"""PyTorch equivalents of the transformer and GRU layers, for refbraid.verify.torch_reference.

Each builder returns ``(module, {refbraid parameter name: torch Parameter})`` for one layer
kind; torch_reference merges :data:`SEQUENCE_EQUIVALENTS` into its table. Where torch has the
layer itself, the module is torch's; where it has not (an ODE step of size h, the implicit GRU),
the module composes ``torch.nn`` modules and torch ops into the same formula:

=============================  ================================================================
refbraid                       torch
=============================  ================================================================
LayerNorm(E)                   nn.LayerNorm(E, eps)
MLP(E, F)                      Sequential(Linear(E, F), GELU(), Linear(F, E))
MultiheadAttention (self)      nn.MultiheadAttention(E, nh, batch_first=True)(x, x, x,
                               attn_mask = triu(ones(T, T), 1) when causal)
MultiheadAttention (cross)     same module, (x, m, m) with m = memory.expand(B, S, E)
EncoderStep(h)                 y + h (a + c),  a = SA(LN1 y),  c = MLP(LN2 (y + a))
DecoderStep(h)                 y + h (a + c + e),  a = SA(LN1 y),  u = y + a,
                               c = CA(LN3 u, m),  e = MLP(LN2 (u + c))
GRUCell classic (dt = h)       y + h (nn.GRUCell(x, y) − y)   (GRUCell = z⊙y + (1−z)⊙n)
GRUCell implicit (dt = h)      (y + h (1−z)⊙n) / (1 + h (1−z)), gates by hand (F.linear,
                               sigmoid, tanh) on nn.GRUCell's weights
PooledClassifier               Linear(E, K)(mean over T)
TokenClassifier                Linear(E, K) token by token
LMHead                         Sequential(LayerNorm(E), Linear(E, V)) token by token
=============================  ================================================================

Data entries of a layer's params (GRU ``x`` (1, I), cross-attention and decoder ``memory``
(1, S, E)) become ``nn.Parameter`` leaves of the wrapper module, expanded over the batch in
``forward``, so autograd returns their gradients summed over the batch, as refbraid's adjoint
does; the harness compares them as ``torch:dx`` / ``torch:dmemory`` like any weight.

Shape legend: B batch, T tokens, S memory tokens, E width, F MLP hidden width, nh heads,
K classes, I GRU input features, H hidden size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..layers import (
    MLP,
    DecoderStep,
    EncoderStep,
    GRUCell,
    LayerNorm,
    LMHead,
    MultiheadAttention,
    PooledClassifier,
    TokenClassifier,
)

DTYPE = torch.float64
#: layer type -> builder(layer, h) returning (module, {refbraid name: torch Parameter})
SEQUENCE_EQUIVALENTS: dict[type, Callable[..., tuple[nn.Module, dict[str, nn.Parameter]]]] = {}


def _register(kind: type):
    def wrap(builder):
        SEQUENCE_EQUIVALENTS[kind] = builder
        return builder
    return wrap


def _data(shape) -> nn.Parameter:
    """A leaf for a data entry (GRU input, attention memory); refbraid's value is copied in."""
    return nn.Parameter(torch.zeros(shape, dtype=DTYPE))


def _prefixed(params: dict[str, nn.Parameter], prefix: str) -> dict[str, nn.Parameter]:
    return {f"{prefix}.{k}": v for k, v in params.items()}


# ----------------------------------------------------------------------------- sub-layers
def _layernorm(layer: LayerNorm) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    m = nn.LayerNorm(layer.dim, eps=layer.eps, dtype=DTYPE)
    return m, {"gamma": m.weight, "beta": m.bias}


def _mlp(layer: MLP) -> tuple[nn.Module, dict[str, nn.Parameter]]:
    first = nn.Linear(layer.dim, layer.hidden, dtype=DTYPE)
    second = nn.Linear(layer.hidden, layer.dim, dtype=DTYPE)
    m = nn.Sequential(first, nn.GELU(approximate="none"), second)
    return m, {"W1": first.weight, "b1": first.bias, "W2": second.weight, "b2": second.bias}


class Attention(nn.Module):
    """nn.MultiheadAttention on (x, x, x), causal or not, or on (x, m, m) with m the memory."""

    def __init__(self, layer: MultiheadAttention):
        super().__init__()
        self.attn = nn.MultiheadAttention(layer.dim, layer.heads, batch_first=True, dtype=DTYPE)
        self.causal = layer.causal

    def forward(self, x, memory=None):
        T = x.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1) if self.causal else None
        kv = x if memory is None else memory.expand(x.shape[0], -1, -1)  # B,S,E
        return self.attn(x, kv, kv, attn_mask=mask, need_weights=False)[0]

    def weights(self) -> dict[str, nn.Parameter]:
        a = self.attn
        return {"W_in": a.in_proj_weight, "b_in": a.in_proj_bias,
                "W_out": a.out_proj.weight, "b_out": a.out_proj.bias}


class CrossAttention(nn.Module):
    """Attention to a memory held as a parameter (the layer's ``memory`` data entry)."""

    def __init__(self, layer: MultiheadAttention):
        super().__init__()
        self.inner, self.memory = Attention(layer), _data((1, layer.memory_len, layer.dim))

    def forward(self, x):
        return self.inner(x, self.memory)


@_register(LayerNorm)
def _layernorm_builder(layer: LayerNorm, h: float):
    return _layernorm(layer)


@_register(MLP)
def _mlp_builder(layer: MLP, h: float):
    return _mlp(layer)


@_register(MultiheadAttention)
def _attention(layer: MultiheadAttention, h: float):
    if layer.cross:
        m = CrossAttention(layer)
        return m, {**m.inner.weights(), "memory": m.memory}
    m = Attention(layer)
    return m, m.weights()


# ----------------------------------------------------------------------------- ODE steps
class TransformerStep(nn.Module):
    """y + h (a + c [+ e]) from torch sub-modules named as refbraid's parameter prefixes."""

    def __init__(self, step: EncoderStep | DecoderStep, h: float):
        super().__init__()
        self.h, self.decoder = h, isinstance(step, DecoderStep)
        self.names: dict[str, nn.Parameter] = {}
        for prefix, part in step.parts().items():
            if isinstance(part, MultiheadAttention):
                module = Attention(part)
                weights = module.weights()
            else:
                module, weights = (_layernorm if isinstance(part, LayerNorm) else _mlp)(part)
            self.add_module(prefix, module)
            self.names.update(_prefixed(weights, prefix))
        if self.decoder:
            self.memory = _data((1, step.memory_len, step.dim))
            self.names["memory"] = self.memory

    def forward(self, y):
        a = self.sa(self.ln1(y))  # φ1(y)
        u = y + a
        if not self.decoder:
            return y + self.h * (a + self.mlp(self.ln2(u)))
        c = self.ca(self.ln3(u), self.memory)  # φ3(u)
        e = self.mlp(self.ln2(u + c))  # φ2(v)
        return y + self.h * (a + c + e)


@_register(EncoderStep)
def _encoder_step(step: EncoderStep, h: float):
    m = TransformerStep(step, h)
    return m, m.names


@_register(DecoderStep)
def _decoder_step(step: DecoderStep, h: float):
    m = TransformerStep(step, h)
    return m, m.names


class GRUStep(nn.Module):
    """One GRU step of size h on y (B, H) with input ``x`` (1, I), broadcast over B."""

    def __init__(self, cell: GRUCell, h: float):
        super().__init__()
        self.cell = nn.GRUCell(cell.input_size, cell.hidden_size, dtype=DTYPE)
        self.x, self.h, self.implicit = _data((1, cell.input_size)), h, cell.implicit

    def forward(self, y):
        x = self.x.expand(y.shape[0], -1)  # B,I
        if not self.implicit:
            return y + self.h * (self.cell(x, y) - y)
        c = self.cell
        gx_r, gx_z, gx_n = nn.functional.linear(x, c.weight_ih, c.bias_ih).chunk(3, dim=1)
        gh_r, gh_z, gh_n = nn.functional.linear(y, c.weight_hh, c.bias_hh).chunk(3, dim=1)
        r, z = torch.sigmoid(gx_r + gh_r), torch.sigmoid(gx_z + gh_z)
        n = torch.tanh(gx_n + r * gh_n)
        return (y + self.h * (1 - z) * n) / (1 + self.h * (1 - z))

    def weights(self) -> dict[str, nn.Parameter]:
        c = self.cell
        return {"W_ih": c.weight_ih, "W_hh": c.weight_hh, "b_ih": c.bias_ih,
                "b_hh": c.bias_hh, "x": self.x}


@_register(GRUCell)
def _gru_cell(cell: GRUCell, h: float):
    m = GRUStep(cell, h)
    return m, m.weights()


# ----------------------------------------------------------------------------- heads
class MeanOverTokens(nn.Module):
    """(B, T, E) → (B, E): the mean over the tokens."""

    def forward(self, x):
        return x.mean(dim=1)


@_register(PooledClassifier)
def _pooled_classifier(layer: PooledClassifier, h: float):
    inner = nn.Linear(layer.dim, layer.n_classes, dtype=DTYPE)
    return nn.Sequential(MeanOverTokens(), inner), {"W": inner.weight, "b": inner.bias}


@_register(TokenClassifier)
def _token_classifier(layer: TokenClassifier, h: float):
    inner = nn.Linear(layer.dim, layer.n_classes, dtype=DTYPE)
    return inner, {"W": inner.weight, "b": inner.bias}


@_register(LMHead)
def _lm_head(layer: LMHead, h: float):
    norm, norm_weights = _layernorm(layer.norm)
    inner = nn.Linear(layer.dim, layer.vocab_size, dtype=DTYPE)
    return nn.Sequential(norm, inner), {**_prefixed(norm_weights, "ln"), "W": inner.weight,
                                        "b": inner.bias}
