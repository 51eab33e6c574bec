"""After training a causal language model: perplexity, exact match of generated answers, samples.

For the validation set of a language task (:mod:`refbraid.data.language`)::

    perplexity  = exp(mean cross-entropy over the scored answer tokens)   (teacher forcing)
    exact match = fraction of prompts whose greedily generated answer is all right

each with the sequential forward and, for a layer-parallel run, with the MGRIT forward the run
trained (``logits_fn``); three prompts with their generated answers are printed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from ..backends import Backend
from ..data import Dataset
from ..sequence import exact_match, perplexity
from .evaluate import evaluate

N_SAMPLES_SHOWN = 3
MAX_PROMPTS = 400  # generation runs L forward passes per prompt: score a subset


def language_report(net, params, data: Dataset, bk: Backend,
                    logits_fn: Callable | None = None) -> dict[str, Any]:
    """Perplexity and exact match on (up to MAX_PROMPTS of) the validation set."""
    P = int(data.info["prompt_len"])
    x, y = data.x_val[:MAX_PROMPTS], data.y_val[:MAX_PROMPTS]
    report: dict[str, Any] = {"prompts": int(x.shape[0])}
    forwards = {"sequential": None}
    if logits_fn is not None:
        forwards["mgrit"] = logits_fn
    for name, fn in forwards.items():
        loss, acc = evaluate(net, params, x, y, bk, logits_fn=fn)
        match, seqs = exact_match(net, params, x, y, P, bk, logits_fn=fn)
        report[name] = {"perplexity": perplexity(loss), "token_acc": acc, "exact_match": match}
        if name == "sequential":
            report["samples"] = [" ".join(map(str, s[:P])) + " | " + " ".join(map(str, s[P:]))
                                 for s in seqs[:N_SAMPLES_SHOWN]]
            report["answers"] = [" ".join(map(str, a)) for a in
                                 np.asarray(y[:N_SAMPLES_SHOWN, P - 1 :])]
    return report


def print_language_report(report: dict[str, Any], stream: TextIO) -> None:
    for name in ("sequential", "mgrit"):
        if name in report:
            r = report[name]
            print(f"{name} forward on {report['prompts']} validation prompts: perplexity "
                  f"{r['perplexity']:.3f}, answer-token acc {100 * r['token_acc']:.1f}%, exact "
                  f"match of generated answers {100 * r['exact_match']:.1f}%", file=stream)
    for sample, answer in zip(report["samples"], report["answers"], strict=True):
        print(f"  prompt | generated: {sample}    (answer {answer})", file=stream)
