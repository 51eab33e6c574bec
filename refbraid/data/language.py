"""A generated formal language for the causal language model: reverse a string.

Every sequence is ``BOS x_1 … x_k SEP x_k … x_1`` with the ``x_i`` uniform over ``SYMBOLS``
symbols (ids 0..13), ``SEP`` = 14 and ``BOS`` = 15: a vocabulary of 16. The model reads the
sequence without its last token and predicts the next token at every position (inputs and
targets shifted by one, length L = 2k + 1)::

    s        = BOS x_1 … x_k SEP y_1 … y_k          (2k + 2 tokens, y_j = x_{k+1-j})
    inputs   = s[0 : 2k+1],   targets = s[1 : 2k+2]
    targets[i] = IGNORE (−1) for i ≤ k   (the random prompt and the fixed SEP are not scored)

so the loss, the per-token accuracy and the perplexity exp(loss) are over the k answer tokens
(perplexity 1 is perfect, 14 is guessing among the symbols). Generation reads the prompt
``BOS x SEP`` and writes k tokens; exact match counts answers with all k right.

Reversal needs attention and depth: answer token j sits at position k + 1 + j and must copy
the symbol at position k + 1 − j, a different offset for every j, which only attention over the
(causally visible) prompt can fetch; no per-token map can.
"""

from __future__ import annotations

import numpy as np

from .dataset import VAL_FRACTION
from .sequences import IGNORE, TokenDataset, token_dataset

LANGUAGE_SETS = ("lm-reverse",)
SYMBOLS = 14
SEP, BOS = SYMBOLS, SYMBOLS + 1
VOCAB = SYMBOLS + 2
ANSWER_LENGTH = 5  # k
N_SAMPLES = 2000


def reverse_sequences(n: int, rng: np.random.Generator, k: int = ANSWER_LENGTH) -> np.ndarray:
    """Full sequences s (n, 2k + 2): BOS x SEP reverse(x)."""
    x = rng.integers(0, SYMBOLS, size=(n, k))
    s = np.empty((n, 2 * k + 2), dtype=np.int64)
    s[:, 0], s[:, 1 : k + 1], s[:, k + 1] = BOS, x, SEP
    s[:, k + 2 :] = x[:, ::-1]
    return s


def next_token_pairs(s: np.ndarray, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs s[:, :-1], targets s[:, 1:]) with targets[:, :prompt_len − 1] = IGNORE."""
    inputs, targets = s[:, :-1].copy(), s[:, 1:].copy()
    targets[:, : prompt_len - 1] = IGNORE
    return inputs, targets


def prompt_length(k: int = ANSWER_LENGTH) -> int:
    """Tokens before the answer: BOS, k symbols, SEP."""
    return k + 2


def load_language_task(name: str, n_samples: int | None = None, seed: int = 0,
                       val_fraction: float = VAL_FRACTION) -> TokenDataset:
    """The generated language task ``name`` (one of :data:`LANGUAGE_SETS`)."""
    if name not in LANGUAGE_SETS:
        raise ValueError(f"`name` must be one of {LANGUAGE_SETS}, got {name!r}.")
    n = N_SAMPLES if n_samples is None else n_samples
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"`n_samples` must be an integer >= 2, got {n!r}.")
    rng = np.random.default_rng(seed)
    inputs, targets = next_token_pairs(reverse_sequences(int(n), rng), prompt_length())
    data = token_dataset(name, inputs, targets, VOCAB, VOCAB, rng, val_fraction)
    data.info.update({"language_model": True, "prompt_len": prompt_length(),
                      "answer_len": ANSWER_LENGTH})
    return data
