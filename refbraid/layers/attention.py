"""Multi-head scaled dot-product attention, as ``torch.nn.MultiheadAttention(E, nh,
batch_first=True)`` (dropout 0): self-attention, or cross-attention to a memory.

Forward (docs/references.md §1); queries come from x, keys and values from x (self-attention) or
from the memory m (cross-attention); ``W_in = [W_q; W_k; W_v]`` stacks three (E, E) blocks::

    q = x W_qᵀ + b_q,   k = m W_kᵀ + b_k,   v = m W_vᵀ + b_v        # B,T,E and B,S,E (m = x: S = T)
    split heads:  q → (B·nh, T, d),  k, v → (B·nh, S, d),  d = E/nh
    s = q kᵀ / √d                                                  # B·nh,T,S
    p = softmax over S of s, masked keys excluded (p = 0 there)    # B·nh,T,S
    o = p v,  merged back to (B, T, E)
    y = o W_outᵀ + b_out                                           # B,T,E

Adjoint (reverse order; ``softmax_adjoint`` is dx = p ⊙ (dp − Σ p ⊙ dp))::

    do = dy W_out,    dW_out = dyᵀ o,   db_out = Σ dy
    dp = do vᵀ,       dv = pᵀ do
    ds = softmax_adjoint(p, dp) / √d
    dq = ds k,        dk = dsᵀ q
    dx = dq W_q (+ dk W_k + dv W_v for self-attention),   dm = dk W_k + dv W_v (cross)
    dW_in = [dqᵀ x; dkᵀ m; dvᵀ m],   db_in = Σ [dq | dk | dv]

Parameters, and how they map onto torch's module (copy across with no transposes):

==============  ==========  ==========================================================
refbraid        shape       torch.nn.MultiheadAttention
==============  ==========  ==========================================================
``W_in``        (3E, E)     ``in_proj_weight`` (rows: W_q, W_k, W_v)
``b_in``        (3E,)       ``in_proj_bias``
``W_out``       (E, E)      ``out_proj.weight``
``b_out``       (E,)        ``out_proj.bias``
``memory``      (B|1, S, E) cross-attention only: the ``key``/``value`` argument (data)
==============  ==========  ==========================================================

Data entries of the params dict (not weights; the caller puts them in):

* ``memory`` (cross-attention): the sequence attended to. Its adjoint is returned in dparams
  under the same name, so a network can sum it over the layers that share one memory. A
  leading size 1 broadcasts over the batch (and its adjoint is then summed over the batch);
  ``init`` makes such a (1, S, E) stand-in so the layer verifies on its own.
* ``key_padding_mask`` (optional): bool (B, S), True = that key is padding and is ignored,
  as torch's ``key_padding_mask``. It has no adjoint.

Masks: ``causal=True`` (self-attention only) hides keys after the query position, as torch's
``attn_mask = triu(ones(T, T), 1).bool()``. A query whose keys are all masked gets p = 0 and
output ``b_out`` (torch returns NaN there).

Shape legend: B batch, T query tokens, S key tokens, E width (``dim``), nh heads, d = E/nh,
G = B·nh batched matrices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..backends.dtypes import dtype_kind
from ..backends.portable import arange_on, contiguous
from ..backends.reference import array_namespace
from .init import check_adjoint, check_dtype, check_positive_int, uniform_fan_in


def _t(a):
    """Transpose the last two axes of a batch of matrices."""
    return array_namespace(a).permute_dims(a, (0, 2, 1))


@dataclass(frozen=True)
class MultiheadAttention:
    """``nh``-head attention of width ``dim``; cross-attention when ``memory_len`` is set."""

    dim: int
    heads: int
    seq_len: int = 1
    causal: bool = False
    memory_len: int | None = None  # None: self-attention; S: cross-attention to (B, S, E)

    #: params entries that are data, not weights (module docstring); checked by ``_check``
    data_entries: ClassVar[tuple[str, ...]] = ("memory", "key_padding_mask")

    def __post_init__(self):
        check_positive_int("dim", self.dim)
        check_positive_int("heads", self.heads)
        check_positive_int("seq_len", self.seq_len)
        if self.dim % self.heads:
            raise ValueError(f"`dim` ({self.dim}) must be divisible by `heads` ({self.heads}).")
        if not isinstance(self.causal, bool):
            raise TypeError(f"`causal` must be a bool, got {self.causal!r}.")
        if self.memory_len is not None:
            check_positive_int("memory_len", self.memory_len)
            if self.causal:
                raise ValueError("`causal` masking applies to self-attention only "
                                 f"(got causal=True with memory_len={self.memory_len}).")

    @property
    def cross(self) -> bool:
        """True for cross-attention (keys and values from ``params["memory"]``)."""
        return self.memory_len is not None

    @property
    def scale(self) -> float:
        """1/√d, d = E/nh: the score scale of scaled dot-product attention."""
        return 1.0 / math.sqrt(self.dim // self.heads)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.seq_len, self.dim)

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """Weights as torch initialises them (Xavier-uniform W_in, U(±1/√E) W_out, zero
        biases); cross-attention adds a standard-normal (1, S, E) stand-in ``memory``."""
        E = self.dim
        bound = math.sqrt(6.0 / (E + 3 * E))  # xavier_uniform_ on the (3E, E) in_proj_weight
        params = {
            "W_in": rng.uniform(-bound, bound, size=(3 * E, E)).astype(dtype),
            "b_in": np.zeros(3 * E, dtype=dtype),
            "W_out": uniform_fan_in(rng, (E, E), E, dtype),
            "b_out": np.zeros(E, dtype=dtype),
        }
        if self.cross:
            params["memory"] = rng.standard_normal((1, self.memory_len, E)).astype(dtype)
        return params

    # ------------------------------------------------------------------------- masks
    def mask(self, xp, B: int, T: int, S: int, key_padding_mask=None, like=None):
        """Boolean (B·nh, T, S) mask (True = not attended), or None when nothing is masked;
        made on the device of ``like`` (an input array) when given."""
        mask = None
        if self.causal:  # key j after query i: j > i (the strict upper triangle)
            rows = arange_on(like, T) if like is not None else xp.arange(T)
            cols = arange_on(like, S) if like is not None else xp.arange(S)
            mask = (cols[None, :] > rows[:, None])[None, None, ...]  # 1,1,T,S
        if key_padding_mask is not None:
            kpm = key_padding_mask[:, None, None, :]  # B,1,1,S
            mask = kpm if mask is None else (mask | kpm)
        if mask is None:
            return None
        return xp.reshape(xp.broadcast_to(mask, (B, self.heads, T, S)), (B * self.heads, T, S))

    def _check(self, params, x):
        """Validate x, the memory and the padding mask; returns (memory, S, mask or None)."""
        if getattr(x, "ndim", None) != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"`x` must have shape (batch, tokens, {self.dim}), "
                             f"got {getattr(x, 'shape', type(x).__name__)}.")
        check_dtype("x", x, params)
        B = x.shape[0]
        if self.cross:
            if "memory" not in params:
                raise ValueError("cross-attention needs a `memory` entry (B, S, E) in params.")
            m = params["memory"]
            if m.ndim != 3 or m.shape[0] not in (1, B) or m.shape[2] != self.dim:
                raise ValueError(f"`memory` must have shape (1 or {B}, S, {self.dim}), "
                                 f"got {tuple(m.shape)}.")
            S = m.shape[1]
        else:
            m, S = x, x.shape[1]
        kpm = params.get("key_padding_mask")
        if kpm is not None and (dtype_kind(kpm.dtype) != "b" or tuple(kpm.shape) != (B, S)):
            raise ValueError(f"`key_padding_mask` must be a bool array of shape ({B}, {S}), "
                             f"got {kpm.dtype} {tuple(kpm.shape)}.")
        return m, S, kpm

    # ------------------------------------------------------------------------- forward
    def forward(self, params, x, bk):
        """y = softmax(q kᵀ/√d, masked) v, heads merged, W_out; returns (y, cache)."""
        mem, S, kpm = self._check(params, x)
        xp = bk.xp
        B, T, E = x.shape
        nh = self.heads
        x2 = xp.reshape(x, (B * T, E))  # BT,E
        W_in, b_in = params["W_in"], params["b_in"]
        if self.cross:
            Bm = mem.shape[0]
            m2 = xp.reshape(mem, (Bm * S, E))  # BmS,E
            q2 = bk.linear(x2, contiguous(W_in[:E, :]), b_in[:E])  # BT,E
            kv2 = bk.linear(m2, contiguous(W_in[E:, :]), b_in[E:])  # BmS,2E
            (q,) = bk.split_heads(q2, B, T, nh)  # G,T,d
            k, v = (self._broadcast(xp, a, B) for a in bk.split_heads(kv2, Bm, S, nh, 2))
        else:
            Bm, m2 = B, None
            qkv = bk.linear(x2, W_in, b_in)  # BT,3E
            q, k, v = bk.split_heads(qkv, B, T, nh, 3)  # G,T,d each
        s = bk.bmm(q, contiguous(_t(k)))  # G,T,S: q kᵀ, scaled by 1/√d in the softmax
        p = bk.softmax(s, self.mask(xp, B, T, S, kpm, like=x), self.scale)  # G,T,S
        o2 = bk.merge_heads([bk.bmm(p, v)], B, nh)  # BT,E
        y = bk.linear(o2, params["W_out"], params["b_out"])  # BT,E
        return xp.reshape(y, (B, T, E)), (x2, m2, q, k, v, p, o2, (B, T, S, Bm))

    def _broadcast(self, xp, a, B: int):
        """(Bm·nh, S, d) keys/values of a batch-1 memory repeated for all B samples."""
        G = B * self.heads
        if a.shape[0] == G:
            return a
        return xp.reshape(xp.broadcast_to(a[None, ...], (B, *a.shape)), (G, *a.shape[1:]))

    def _unbroadcast(self, a, B: int, Bm: int):
        """Adjoint of _broadcast: sum the per-sample copies back onto the memory's batch."""
        if Bm == B:
            return a
        xp = array_namespace(a)
        return xp.sum(xp.reshape(a, (B, self.heads, *a.shape[1:])), axis=0)

    # ------------------------------------------------------------------------- adjoint
    def adjoint(self, params, cache, dout, bk, grads: bool = True):
        """Reverse of forward (module docstring); returns (dx, dparams), with ``memory`` in
        dparams for cross-attention; dparams is None without ``grads`` (dx only)."""
        x2, m2, q, k, v, p, o2, (B, T, S, Bm) = cache
        xp = bk.xp
        E, nh = self.dim, self.heads
        check_adjoint("dout", dout, (B, T, E))
        W_in = params["W_in"]
        do2, dW_out, db_out = _linear_adjoint(bk, o2, params["W_out"], xp.reshape(dout, (B * T, E)),
                                              grads)
        (do,) = bk.split_heads(do2, B, T, nh)  # G,T,d
        dp = bk.bmm(do, contiguous(_t(v)))  # G,T,S
        ds = bk.softmax_adjoint(p, dp, self.scale)  # G,T,S
        dq = bk.bmm(ds, k)  # G,T,d
        if self.cross:
            dq2 = bk.merge_heads([dq], B, nh)  # BT,E
            dx2, dW_q, db_q = _linear_adjoint(bk, x2, contiguous(W_in[:E, :]), dq2, grads)
            if not grads:  # the keys and values come from the memory, not from x
                return xp.reshape(dx2, (B, T, E)), None
        dv = bk.bmm(contiguous(_t(p)), do)  # G,S,d
        dk = bk.bmm(contiguous(_t(ds)), q)  # G,S,d
        if not self.cross:
            dqkv = bk.merge_heads([dq, dk, dv], B, nh)  # BT,3E
            dx2, dW_in, db_in = _linear_adjoint(bk, x2, W_in, dqkv, grads)
            if not grads:
                return xp.reshape(dx2, (B, T, E)), None
            return xp.reshape(dx2, (B, T, E)), {"W_in": dW_in, "b_in": db_in, "W_out": dW_out,
                                          "b_out": db_out}
        dkv = bk.merge_heads([self._unbroadcast(dk, B, Bm), self._unbroadcast(dv, B, Bm)], Bm,
                             nh)  # BmS,2E
        dm2, dW_kv, db_kv = bk.linear_adjoint(m2, contiguous(W_in[E:, :]), dkv)
        return xp.reshape(dx2, (B, T, E)), {
            "W_in": xp.concat([dW_q, dW_kv], axis=0),
            "b_in": xp.concat([db_q, db_kv], axis=0),
            "W_out": dW_out,
            "b_out": db_out,
            "memory": xp.reshape(dm2, (Bm, S, E)),
        }


def _linear_adjoint(bk, x, W, dz, grads: bool):
    """(dx, dW, db) = (dz W, dzᵀ x, Σ dz) of z = x Wᵀ + b; only dx (and None, None) when
    ``grads`` is False (the state-only adjoint of an MGRIT sweep)."""
    if grads:
        return bk.linear_adjoint(x, W, dz)
    return bk.matmul(dz, W), None, None
