"""Generated sequence tasks for the GRU and transformer models (deterministic from the seed).

=================  ===========  ============  =========  ========================================
name               input        labels        classes    rule
=================  ===========  ============  =========  ========================================
seq-memory         (L, I) real  (n,)          4          class c is written at position 0 as
                                                         2·e_c, the other L − 1 positions are
                                                         N(0, 1) noise: remember the first input
seq-match          (T,) tokens  (n,)          2          is the first token repeated later?
seq-duplicates     (T,) tokens  (n, T)        2          tag each token 1 if the same token
                                                         occurs at another position, else 0
seq-reverse        (T,) tokens  (n, T)        V          output the source reversed:
                                                         y[t] = x[T − 1 − t]
=================  ===========  ============  =========  ========================================

Sizes: seq-memory L = 16, I = 4; seq-match and seq-duplicates T = 10 with V = 8 and 12
(about 54 % of seq-duplicates' tokens have a duplicate: the majority tag is the chance level);
seq-reverse T = 8, V = 8. Every task has 2000 sequences unless ``n_samples`` says otherwise.

seq-memory needs memory over the whole sequence (the GRU must carry the first input through
L − 1 noisy steps). seq-match and seq-duplicates need attention: the answer at a token depends
on the identity of tokens at other positions, which no per-token map and no bag of pooled
token embeddings can express (for seq-match, a pooled linear head sees the counts of each
token, but not which one came first). seq-reverse is the small encoder–decoder task.

Token sets hold integer ids; :class:`TokenDataset` keeps them unnormalised (``mean`` 0,
``std`` 1), and the training casts inputs to the run's float dtype, which holds small integers
exactly (the transformer's opening casts them back). Per-token tasks have labels of shape
(n, T): :class:`TokenDataset` accepts (n,) or (n, T) labels; per-token labels may be IGNORE
(−1), a token that is not scored (the prompt of a language model, refbraid.data.language).

Shape legend: n samples, L sequence length, I input features, T tokens, V vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dataset import VAL_FRACTION, Dataset, check_finite, check_labels, make_dataset, split_indices

SEQUENCE_SETS = ("seq-memory", "seq-match", "seq-duplicates", "seq-reverse")
N_SAMPLES = 2000  # default number of sequences of every task
MEMORY_LENGTH, MEMORY_FEATURES, MEMORY_CLASSES = 16, 4, 4
MEMORY_MARK = 2.0  # amplitude of the class marker at position 0
MATCH_LENGTH, MATCH_VOCAB = 10, 8
DUP_LENGTH, DUP_VOCAB = 10, 12  # P(a token has a duplicate) = 1 − (11/12)^9 ≈ 0.54
REVERSE_LENGTH, REVERSE_VOCAB = 8, 8
IGNORE = -1  # a per-token label that is not scored (refbraid.sequence.losses.IGNORE)


@dataclass(frozen=True)
class TokenDataset(Dataset):
    """A :class:`Dataset` of integer token sequences whose labels are (n,) or per token (n, T)."""

    def __post_init__(self):
        for part in ("train", "val"):
            x, y = getattr(self, f"x_{part}"), getattr(self, f"y_{part}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(f"data set {self.name!r}: `x_{part}` must have shape (n, "
                                 f"{', '.join(map(str, self.input_shape))}), got {x.shape}.")
            if y.shape not in ((x.shape[0],), tuple(x.shape)):
                raise ValueError(f"data set {self.name!r}: `y_{part}` must have shape "
                                 f"({x.shape[0]},) or {tuple(x.shape)}, got {y.shape}.")
            check_finite(self.name, f"x_{part}", x)
            scored = y[y != IGNORE] if y.ndim == 2 else y  # per token: IGNORE is allowed
            check_labels(self.name, f"y_{part}", scored, self.n_classes)

    @property
    def per_token(self) -> bool:
        """Whether every token has its own label (labels (n, T))."""
        return self.y_train.ndim == 2

    def astype(self, dtype) -> TokenDataset:
        """The same tokens stored in ``dtype`` (exact for ids below 2^24 in float32)."""
        dtype = np.dtype(dtype)
        return TokenDataset(self.name, self.x_train.astype(dtype), self.y_train,
                            self.x_val.astype(dtype), self.y_val, self.n_classes,
                            self.input_shape, self.mean.astype(dtype), self.std.astype(dtype),
                            dict(self.info))


def _check_n(n_samples) -> int:
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) \
            or n_samples < 2:
        raise ValueError(f"`n_samples` must be an integer >= 2, got {n_samples!r}.")
    return int(n_samples)


def token_dataset(name: str, tokens: np.ndarray, labels: np.ndarray, n_classes: int,
                  vocab_size: int, rng: np.random.Generator,
                  val_fraction: float = VAL_FRACTION) -> TokenDataset:
    """Split integer tokens (n, T) and labels (n,) or (n, T) with a seeded permutation."""
    train, val = split_indices(tokens.shape[0], val_fraction, rng)
    one = np.ones(1)
    info = {"vocab_size": int(vocab_size), "seq_len": int(tokens.shape[1]),
            "per_token": labels.ndim == 2}
    return TokenDataset(name, tokens[train], labels[train].astype(np.int64), tokens[val],
                        labels[val].astype(np.int64), int(n_classes), (tokens.shape[1],),
                        0 * one, one, info)


# ----------------------------------------------------------------------------- the rules
def memory_task(n: int, rng: np.random.Generator, length: int = MEMORY_LENGTH,
                features: int = MEMORY_FEATURES, classes: int = MEMORY_CLASSES):
    """x (n, L, I): x[:, 0] = MARK·e_c, x[:, 1:] ~ N(0, 1); y = c uniform in [0, classes)."""
    if classes > features:
        raise ValueError(f"`classes` ({classes}) must not exceed `features` ({features}).")
    y = rng.integers(0, classes, size=n)
    x = rng.standard_normal((n, length, features))
    x[:, 0] = 0.0
    x[np.arange(n), 0, y] = MEMORY_MARK
    return x, y


def match_labels(tokens: np.ndarray) -> np.ndarray:
    """y[b] = 1 if tokens[b, 0] occurs again in tokens[b, 1:], else 0."""
    return (tokens[:, 1:] == tokens[:, :1]).any(axis=1).astype(np.int64)


def match_task(n: int, rng: np.random.Generator, length: int = MATCH_LENGTH,
               vocab: int = MATCH_VOCAB):
    """Tokens uniform over the vocabulary, balanced: half the sequences repeat their first
    token (at a uniform later position), the other half avoid it."""
    tokens = rng.integers(0, vocab, size=(n, length))
    want = rng.permutation(np.arange(n) % 2)  # the label each sequence gets
    for b in range(n):
        first = tokens[b, 0]
        rest = tokens[b, 1:]
        if want[b]:
            if not (rest == first).any():
                rest[rng.integers(0, length - 1)] = first
        else:
            others = np.setdiff1d(np.arange(vocab), [first])
            hit = rest == first
            rest[hit] = rng.choice(others, size=int(hit.sum()))
    return tokens, match_labels(tokens)


def duplicate_tags(tokens: np.ndarray) -> np.ndarray:
    """tag[b, t] = 1 if tokens[b, t] == tokens[b, s] for some s ≠ t, else 0; shape (n, T)."""
    same = tokens[:, :, None] == tokens[:, None, :]  # n,T,T
    return (same.sum(axis=2) > 1).astype(np.int64)


def duplicates_task(n: int, rng: np.random.Generator, length: int = DUP_LENGTH,
                    vocab: int = DUP_VOCAB):
    tokens = rng.integers(0, vocab, size=(n, length))
    return tokens, duplicate_tags(tokens)


def reverse_task(n: int, rng: np.random.Generator, length: int = REVERSE_LENGTH,
                 vocab: int = REVERSE_VOCAB):
    tokens = rng.integers(0, vocab, size=(n, length))
    return tokens, tokens[:, ::-1].copy()


# ----------------------------------------------------------------------------- loaders
def load_sequence_task(name: str, n_samples: int | None = None, seed: int = 0,
                       val_fraction: float = VAL_FRACTION) -> Dataset:
    """The generated task ``name`` (one of :data:`SEQUENCE_SETS`), ``n_samples`` sequences."""
    n = _check_n(N_SAMPLES if n_samples is None else n_samples)
    rng = np.random.default_rng(seed)
    if name == "seq-memory":
        x, y = memory_task(n, rng)
        return make_dataset(name, x, y, MEMORY_CLASSES, seed=rng, val_fraction=val_fraction,
                            info={"marker": MEMORY_MARK})
    if name == "seq-match":
        tokens, y = match_task(n, rng)
        return token_dataset(name, tokens, y, 2, MATCH_VOCAB, rng, val_fraction)
    if name == "seq-duplicates":
        tokens, y = duplicates_task(n, rng)
        return token_dataset(name, tokens, y, 2, DUP_VOCAB, rng, val_fraction)
    if name == "seq-reverse":
        tokens, y = reverse_task(n, rng)
        return token_dataset(name, tokens, y, REVERSE_VOCAB, REVERSE_VOCAB, rng, val_fraction)
    raise ValueError(f"`name` must be one of {SEQUENCE_SETS}, got {name!r}.")
