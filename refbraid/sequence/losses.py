"""The loss of a sequence model: softmax cross-entropy per sequence or per token.

    per sequence  logits (B, K),    labels (B,):    L = −(1/B) Σ_b log p[b, y_b]
    per token     logits (B, T, K), labels (B, T):  L = −(1/|S|) Σ_{(b,t) ∈ S} log p[b, t, y_bt]

with p = softmax over the last axis and S the scored tokens: every token, or those whose label
is not :data:`IGNORE` (−1; a language model scores only the answer, not the random prompt).
dlogits = (p − onehot(y)) / (B or |S|) on scored tokens, 0 elsewhere, as torch's
``cross_entropy(logits.reshape(-1, K), labels.reshape(-1), ignore_index=-1)``.

Shape legend: B batch, T tokens, K classes.
"""

from __future__ import annotations

from ..backends import get_backend
from ..backends.dtypes import dtype_kind
from ..backends.host import host_float, host_range
from ..layers import token_cross_entropy, token_cross_entropy_adjoint

IGNORE = -1  #: a per-token label that is not scored (torch's ``ignore_index``)


def check_labels(logits, labels) -> tuple[int, int] | None:
    """Raise unless labels are integers of shape logits.shape[:-1] in [0, K) (per token: or
    :data:`IGNORE`, with at least one token scored). Returns the labels' (min, max), reduced
    where the labels live (two numbers through the host door, not the batch), or None for
    an empty batch."""
    want = tuple(logits.shape[:-1])
    if getattr(labels, "shape", None) != want:
        raise ValueError(f"`labels` must have shape {want}, got {getattr(labels, 'shape', None)}.")
    if dtype_kind(labels.dtype) not in "iu":
        raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}.")
    if not labels.size:
        return None
    K = logits.shape[-1]
    lo, hi = host_range(labels)  # min and max on the device: two numbers come to the host
    low = IGNORE if logits.ndim == 3 else 0
    if lo < low or hi >= K:
        raise ValueError(f"`labels` must lie in [{low}, {K}), got range [{lo}, {hi}].")
    if hi == IGNORE:
        raise ValueError("`labels` must score at least one token (all are IGNORE = -1).")
    return lo, hi


def cross_entropy(logits, labels, bk):
    """(L, dL/dlogits) for (B, K) or per-token (B, T, K) logits (module docstring)."""
    label_range = check_labels(logits, labels)
    bk = get_backend(bk)
    if logits.ndim == 3:
        if label_range is not None and label_range[0] == IGNORE:
            return _scored_cross_entropy(logits, labels, bk)
        loss, probs = token_cross_entropy(logits, labels, bk)
        return host_float(loss), token_cross_entropy_adjoint(probs, labels, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    return host_float(loss), bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)


def _scored_cross_entropy(logits, labels, bk):
    """Mean cross-entropy over the scored tokens S = {labels ≠ IGNORE}; dlogits 0 elsewhere.

    Array API only (no integer-array indexing, so it runs on device arrays): the scored rows
    are gathered with ``take``; dlogits row r is row ``slot[r]`` of [dS; 0] — its place in S,
    or the appended zero row for an unscored token."""
    xp = bk.xp
    K = logits.shape[-1]
    rows = xp.reshape(logits, (-1, K))  # BT,K
    flat = xp.reshape(labels, (-1,))
    is_scored = flat != IGNORE
    scored = xp.nonzero(is_scored)[0]  # |S|
    y = xp.take(flat, scored)
    loss, probs = bk.softmax_cross_entropy(xp.take(rows, scored, axis=0), y)
    d_scored = bk.softmax_cross_entropy_adjoint(probs, y, 1.0)  # |S|,K
    place = xp.cumulative_sum(xp.astype(is_scored, scored.dtype)) - 1  # BT: index in S
    slot = xp.where(is_scored, place, scored.shape[0])
    padded = xp.concat([d_scored, xp.zeros_like(d_scored[:1, :])], axis=0)  # |S|+1,K
    return host_float(loss), xp.reshape(xp.take(padded, slot, axis=0), logits.shape)
