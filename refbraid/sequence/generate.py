"""Text from a causal language model: greedy and temperature sampling, perplexity, exact match.

Generation runs the model's whole window of L tokens for every new token and reads the logits
at the last written position t (the causal mask makes them depend on tokens ≤ t only, so what
fills the rest of the window does not matter)::

    for j = 0, 1, …, n − 1:   t = P + j − 1,   z = logits(window)[:, t] / τ
        greedy (τ = 0):        tok[P + j] = argmax z
        sampled (τ > 0):       tok[P + j] ~ softmax(z)          (Gumbel-max with a seeded rng)

No key/value cache: each new token costs a full forward pass, O(n L²) attention in all, which
is what a reference implementation wants (the cached decoder is an optimisation of this).

    perplexity = exp(mean cross-entropy over the scored answer tokens)
    exact match = fraction of prompts whose n generated tokens all equal the answer

Shape legend: B prompts, P prompt tokens, n new tokens, L window (``model.seq_len``), V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..backends import Backend, get_backend
from ..backends.dtypes import numpy_dtype


def generate(model, params, prompt: np.ndarray, n_new: int, bk: Backend | str = "numpy",
             temperature: float = 0.0, rng: np.random.Generator | None = None,
             logits_fn: Callable | None = None) -> np.ndarray:
    """The prompt (B, P) followed by ``n_new`` generated tokens: (B, P + n_new) int64.

    ``logits_fn(params, window)`` replaces the sequential forward (e.g. the MGRIT forward a
    layer-parallel run trains); ``temperature`` 0 is greedy, > 0 samples with ``rng``.
    """
    bk = get_backend(bk)
    prompt = np.asarray(prompt)
    if prompt.ndim != 2 or prompt.dtype.kind not in "iu":
        raise ValueError(f"`prompt` must be integer token ids of shape (batch, tokens), got "
                         f"{prompt.dtype} {prompt.shape}.")
    B, P = prompt.shape
    L = model.seq_len
    if P > L:
        raise ValueError(f"`prompt` has {P} tokens, more than the model's window of {L}: give "
                         f"at most {L} prompt tokens.")
    if isinstance(n_new, bool) or not isinstance(n_new, (int, np.integer)) or n_new < 1 \
            or P < 1 or P + n_new > L + 1:
        raise ValueError(f"`n_new` must be an integer in [1, {L + 1 - P}] for a prompt of {P} "
                         f"tokens and a window of {L}, got {n_new!r}.")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature >= 0):
        raise ValueError(f"`temperature` must be a finite number >= 0, got {temperature!r}.")
    if temperature > 0 and rng is None:
        raise ValueError("`rng` is required to sample with `temperature` > 0.")
    forward = logits_fn or (lambda p, w: model.logits(p, w, bk))
    dtype = numpy_dtype(params["opening.W"].dtype).type
    out = np.zeros((B, P + n_new), dtype=np.int64)
    out[:, :P] = prompt
    for j in range(n_new):
        t = P + j - 1
        window = np.zeros((B, L), dtype=np.int64)
        window[:, : min(P + j, L)] = out[:, : min(P + j, L)]
        z = bk.to_numpy(forward(params, bk.asarray(window.astype(dtype))))[:, t]  # B,V
        if temperature == 0:
            out[:, P + j] = z.argmax(axis=1)
        else:
            gumbel = -np.log(-np.log(rng.uniform(size=z.shape)))
            out[:, P + j] = (z / temperature + gumbel).argmax(axis=1)
    return out


def exact_match(model, params, inputs: np.ndarray, targets: np.ndarray, prompt_len: int,
                bk: Backend | str = "numpy", logits_fn: Callable | None = None
                ) -> tuple[float, np.ndarray]:
    """(fraction of sequences whose greedy answer is all right, the generated sequences).

    ``inputs`` (B, L) are the model's windows and ``targets`` (B, L) the next tokens: the
    prompt is ``inputs[:, :P]`` (P = ``prompt_len``) and the answer ``targets[:, P − 1:]``,
    L − P + 1 tokens, generated greedily from the prompt alone."""
    inputs, targets = np.asarray(inputs).astype(np.int64), np.asarray(targets)
    want = targets[:, prompt_len - 1 :]
    seqs = generate(model, params, inputs[:, :prompt_len], want.shape[1], bk,
                    logits_fn=logits_fn)
    return float((seqs[:, prompt_len:] == want).all(axis=1).mean()), seqs


def perplexity(loss: float) -> float:
    """exp(mean cross-entropy per scored token)."""
    return float(math.exp(loss)) if math.isfinite(loss) else float("inf")
