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
from ..backends.host import host_float, to_host
from ..layers import token_cross_entropy, token_cross_entropy_adjoint

IGNORE = -1  #: a per-token label that is not scored (torch's ``ignore_index``)


def check_labels(logits, labels) -> None:
    """Raise unless labels are integers of shape logits.shape[:-1] in [0, K) (per token: or
    :data:`IGNORE`, with at least one token scored)."""
    want = tuple(logits.shape[:-1])
    if getattr(labels, "shape", None) != want:
        raise ValueError(f"`labels` must have shape {want}, got {getattr(labels, 'shape', None)}.")
    if dtype_kind(labels.dtype) not in "iu":
        raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}.")
    K = logits.shape[-1]
    host_labels = to_host(labels)  # the label ids: checked on the host
    low = IGNORE if logits.ndim == 3 else 0
    if host_labels.size and (int(host_labels.min()) < low or int(host_labels.max()) >= K):
        raise ValueError(f"`labels` must lie in [{low}, {K}), got range "
                         f"[{int(host_labels.min())}, {int(host_labels.max())}].")
    if host_labels.size and int(host_labels.max()) == IGNORE:
        raise ValueError("`labels` must score at least one token (all are IGNORE = -1).")


def cross_entropy(logits, labels, bk):
    """(L, dL/dlogits) for (B, K) or per-token (B, T, K) logits (module docstring)."""
    check_labels(logits, labels)
    bk = get_backend(bk)
    if logits.ndim == 3:
        if labels.size and int(to_host(labels).min()) == IGNORE:
            return _scored_cross_entropy(logits, labels, bk)
        loss, probs = token_cross_entropy(logits, labels, bk)
        return host_float(loss), token_cross_entropy_adjoint(probs, labels, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    return host_float(loss), bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)


def _scored_cross_entropy(logits, labels, bk):
    """Mean cross-entropy over the scored tokens S = {labels ≠ IGNORE}; dlogits 0 elsewhere."""
    xp = bk.xp
    K = logits.shape[-1]
    rows = logits.reshape(-1, K)  # BT,K
    flat = labels.reshape(-1)
    scored = xp.nonzero(flat != IGNORE)[0]  # |S|
    y = xp.ascontiguousarray(flat[scored])
    loss, probs = bk.softmax_cross_entropy(xp.ascontiguousarray(rows[scored]), y)
    drows = xp.zeros_like(rows)
    drows[scored] = bk.softmax_cross_entropy_adjoint(probs, y, 1.0)
    return host_float(loss), drows.reshape(logits.shape)
