"""The loss of a sequence model: softmax cross-entropy per sequence or per token.

    per sequence  logits (B, K),    labels (B,):    L = −(1/B) Σ_b log p[b, y_b]
    per token     logits (B, T, K), labels (B, T):  L = −(1/BT) Σ_{b,t} log p[b, t, y_bt]

with p = softmax over the last axis; dlogits = (p − onehot(y)) / (B or BT), as torch's
``cross_entropy`` on (flattened) logits.

Shape legend: B batch, T tokens, K classes.
"""

from __future__ import annotations

from ..backends.dtypes import dtype_kind
from ..backends.host import host_float, to_host
from ..layers import token_cross_entropy, token_cross_entropy_adjoint


def check_labels(logits, labels) -> None:
    """Raise unless labels are integers of shape logits.shape[:-1] in [0, K)."""
    want = tuple(logits.shape[:-1])
    if getattr(labels, "shape", None) != want:
        raise ValueError(f"`labels` must have shape {want}, got {getattr(labels, 'shape', None)}.")
    if dtype_kind(labels.dtype) not in "iu":
        raise TypeError(f"`labels` must be integer class indices, got dtype {labels.dtype}.")
    K = logits.shape[-1]
    host_labels = to_host(labels)  # the label ids: checked on the host
    if host_labels.size and (int(host_labels.min()) < 0 or int(host_labels.max()) >= K):
        raise ValueError(f"`labels` must lie in [0, {K}), got range "
                         f"[{int(host_labels.min())}, {int(host_labels.max())}].")


def cross_entropy(logits, labels, bk):
    """(L, dL/dlogits) for (B, K) or per-token (B, T, K) logits (module docstring)."""
    check_labels(logits, labels)
    if logits.ndim == 3:
        loss, probs = token_cross_entropy(logits, labels, bk)
        return host_float(loss), token_cross_entropy_adjoint(probs, labels, bk)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    return host_float(loss), bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
