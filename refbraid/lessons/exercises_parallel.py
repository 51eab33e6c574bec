"""Exercise checks on parallel execution (lessons 06, 09, 12): which layers a rank owns, the
α–β cost of the allreduce that data parallelism pays per step, and DASO's stale merge.

Oracles: ``refbraid.parallel.layout.partition`` (the block layout MPI runs use),
``refbraid.scaling.predict.ring_allreduce`` (the model ``refbraid scale`` predicts with) and
``refbraid.distributed.daso.stale_merge`` (what ``refbraid train --dp-groups`` applies).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..distributed.daso import stale_merge
from ..parallel.layout import partition
from ..scaling.predict import ring_allreduce
from .checking import Verdict, Wrong, as_array, call, compare, run_check

# ----------------------------------------------------------------------------- lesson 06
BLOCK_CASES = (  # (layers N, cfactor, levels, ranks P): even and uneven splits
    (64, 4, 3, 4), (64, 4, 3, 3), (96, 2, 3, 5), (48, 4, 2, 5), (64, 4, 2, 1),
)


def check_block_starts(block_starts: Callable, quiet: bool = False) -> Verdict:
    """Lesson 06: ``block_starts(n_layers, cfactor, levels, ranks)`` → the first layer of each
    rank's contiguous block (a list of ``ranks`` ints): blocks start at coarsest-grid points
    (multiples of ``cfactor**(levels-1)``) and the K coarsest intervals are split as evenly
    as possible, the first ``K % ranks`` ranks taking one more."""

    def body() -> str:
        for n, cf, levels, ranks in BLOCK_CASES:
            coarsest = np.arange(0, n + 1, cf ** (levels - 1))
            expected = list(partition(coarsest, n, ranks).starts)
            got = call(block_starts, n, cf, levels, ranks)
            try:
                got = [int(s) for s in got]
            except (TypeError, ValueError):
                raise Wrong(f"return a list of {ranks} layer indices, got {got!r}") from None
            if got != expected:
                case = f"N = {n}, cfactor {cf}, {levels} levels, P = {ranks}"
                if len(got) != len(expected):
                    raise Wrong(f"{case}: {len(got)} starts for {ranks} ranks")
                q = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True))
                         if a != b)
                raise Wrong(f"{case}: rank {q} starts at layer {got[q]}, expected "
                            f"{expected[q]} (all: yours {got}, expected {expected})")
        return (f"block starts right for all {len(BLOCK_CASES)} cases, uneven splits included")

    return run_check("06 which layers a rank owns", body, quiet)


# ----------------------------------------------------------------------------- lesson 09
ALLREDUCE_CASES = (  # (bytes, ranks, α seconds, β seconds per byte)
    (4e6, 2, 2.4e-6, 0.085e-9), (4e6, 8, 2.4e-6, 0.085e-9), (1e3, 64, 1e-5, 1e-9),
    (1e9, 1024, 5e-6, 0.04e-9), (8.0, 1, 1e-6, 1e-9),
)


def check_allreduce_time(allreduce_time: Callable, quiet: bool = False) -> Verdict:
    """Lesson 09: ``allreduce_time(nbytes, ranks, alpha, beta)`` → seconds of a ring allreduce
    of ``nbytes`` over ``ranks`` in the α–β model (a reduce-scatter then an all-gather)."""

    def body() -> str:
        worst = 0.0
        for nbytes, ranks, alpha, beta in ALLREDUCE_CASES:
            expected = ring_allreduce(nbytes, ranks, alpha, beta)
            got = call(allreduce_time, nbytes, ranks, alpha, beta)
            try:
                got = float(got)
            except (TypeError, ValueError):
                raise Wrong(f"return one number of seconds, got {type(got).__name__}") from None
            err = abs(got - expected) / max(abs(expected), 1e-300) if expected else abs(got)
            if not err <= 1e-9:
                latency = 2 * (ranks - 1) * alpha
                raise Wrong(f"{nbytes:g} bytes on {ranks} ranks (α = {alpha:g} s, β = {beta:g} "
                            f"s/B): yours {got:.6g} s vs {expected:.6g} s (rel err {err:.1e}); "
                            f"the latency part alone is {latency:.3g} s")
            worst = max(worst, err)
        return (f"allreduce times right in all {len(ALLREDUCE_CASES)} cases, one rank to 1,024 "
                f"(max rel err {worst:.1e})")

    return run_check("09 ring-allreduce time", body, quiet)


# ----------------------------------------------------------------------------- lesson 12
MERGE_CASES = ((2, 2), (4, 1), (2, 0), (8, 4), (1, 3))  # (nodes G, wait w)


def _merge_hint(got: np.ndarray, theta: np.ndarray, total: np.ndarray, nodes: int,
                wait: int) -> str:
    """Names a recognisable wrong weighting when ``got`` is one."""
    guesses = {"the plain average Σθ_h / G (the local model is left out)": total / nodes,
               "(w·θ + Σθ_h) / (G + w): the local model must weigh as 2w stale copies, not w":
               (wait * theta + total) / (nodes + wait),
               "(2w·θ + Σθ_h) / G: divide by G + 2w, the number of copies weighed":
               (2 * wait * theta + total) / nodes}
    for text, guess in guesses.items():
        if np.allclose(got, guess, rtol=1e-12, atol=0.0):
            return f"; yours is {text}"
    return ""


def check_stale_merge(stale_merge_fn: Callable, quiet: bool = False) -> Verdict:
    """Lesson 12: ``stale_merge(theta_now, sent_sum, n_nodes, wait)`` → DASO's merge of a
    global average that arrives ``wait`` = w batches late: ``(2w·θ_now + Σ_h θ_h) /
    (G + 2w)`` (the local model weighs as 2w stale copies; w = 0 the plain average)."""

    def body() -> str:
        rng = np.random.default_rng(12)
        worst = 0.0
        for nodes, wait in MERGE_CASES:
            theta = rng.standard_normal((4, 3))
            total = theta * 0.9 + rng.standard_normal((4, 3)) * nodes  # Σ_h θ_h (as sent)
            expected = stale_merge(theta, total, nodes, wait)
            got = call(stale_merge_fn, theta.copy(), total.copy(), nodes, wait)
            got = as_array("θ", got, expected.shape)
            try:
                err = compare("θ", got, expected, 1e-12, f"G = {nodes} nodes, w = {wait}: "
                              "entry ({0}, {1})")
            except Wrong as wrong:
                raise Wrong(f"{wrong}{_merge_hint(got, theta, total, nodes, wait)}") from None
            worst = max(worst, err)
        return (f"stale merge right in all {len(MERGE_CASES)} cases, w = 0 (blocking) included "
                f"(max rel err {worst:.1e})")

    return run_check("12 DASO's stale merge", body, quiet)
