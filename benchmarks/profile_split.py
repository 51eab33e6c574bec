"""Where one rank's untraced time goes: a cProfile of training steps, split by owner.

Used by ``bench_two_rank_breakdown.py --profile DIR`` (one ``.prof`` file per rank and
dtype). Every function's own time (cProfile's ``tottime``) is charged to the part of
refbraid that owns it: a refbraid function to its package (``mgrit``, ``backends``,
``parallel``, ``layers``, ``training``, …); a NumPy or built-in function (``np.zeros``,
``ndarray.take``, ``np.stack``, an MPI call) to the refbraid package that called it, in
proportion to the time each caller spent in it. So "mgrit" is the MGRIT solver's own
bookkeeping — the whole-array copies, adds, norms, stacks and allocations it makes between
step applications — and "backends" the step kernels with their wrappers.

The owners' shares add up to the profiled time (ms per step). The profile clocks CPU time
(``time.process_time``): on a shared machine a rank that is descheduled charges nothing, and
MPICH's receives poll, so "parallel" is the time spent waiting in messages and reductions.
Under the profiler every Python call costs more than without, so read the split as
proportions, not as absolute times.
"""

from __future__ import annotations

import collections
import pstats

#: the owners reported, in print order (anything else is "other")
OWNERS = ("backends", "layers", "mgrit", "layer_parallel", "parallel", "training", "network",
          "other")


def _owner(filename: str) -> str | None:
    """The refbraid part that owns a function defined in ``filename`` (None: not refbraid)."""
    if "/refbraid/" not in filename:
        return None
    part = filename.split("/refbraid/", 1)[1].split("/", 1)[0]
    part = part.removesuffix(".py")
    return part if part in OWNERS else "other"


def split_by_owner(stats: pstats.Stats, steps: int) -> dict[str, float]:
    """ms per step of own time charged to each owner (module docstring). A non-refbraid
    function's time goes to its callers' owners, found by walking up the callers (a NumPy
    helper called by a NumPy helper called by mgrit is mgrit's)."""
    table = stats.stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    memo: dict[tuple, dict[str, float]] = {}

    def shares(func, depth=0) -> dict[str, float]:
        """Fractions of ``func``'s time owed to each owner (sums to 1)."""
        if func in memo:
            return memo[func]
        owner = _owner(func[0])
        if owner is not None:
            return {owner: 1.0}
        callers = table.get(func, (0, 0, 0.0, 0.0, {}))[4]
        weights = {c: v[2] for c, v in callers.items()}  # callee's own time under c
        total = sum(weights.values())
        if depth > 20 or not callers or total <= 0.0:
            return {"other": 1.0}
        memo[func] = {"other": 1.0}  # breaks recursion cycles
        out: dict[str, float] = collections.Counter()
        for c, w in weights.items():
            for o, f in shares(c, depth + 1).items():
                out[o] += f * w / total
        memo[func] = dict(out)
        return memo[func]

    ms: dict[str, float] = collections.Counter()
    for func, (_, _, tottime, _, _) in table.items():
        for o, f in shares(func).items():
            ms[o] += 1e3 * tottime * f / steps
    return {o: ms.get(o, 0.0) for o in OWNERS}


def top_functions(stats: pstats.Stats, steps: int, owner: str, n: int = 6) -> list[str]:
    """The ``n`` refbraid functions of ``owner`` with the most own time, 'name ms/step'."""
    rows = [(tt, f) for f, (_, _, tt, _, _) in stats.stats.items() if _owner(f[0]) == owner]
    rows.sort(reverse=True)
    return [f"{f[2]}:{f[1]} {1e3 * tt / steps:.1f}" for tt, f in rows[:n]]


def profile_lines(paths: list[str], steps: int, labels: list[str]) -> list[str]:
    """The table ms per step by owner, one column per profile in ``paths`` (headed by
    ``labels``), and the MGRIT solver's largest own-time functions in each."""
    per = [pstats.Stats(p) for p in paths]
    splits = [split_by_owner(s, steps) for s in per]
    head = f"{'owner (cProfile)':<16}" + "".join(f" {lab:>9}" for lab in labels)
    lines = [head, "-" * len(head)]
    for o in OWNERS:
        lines.append(f"{o:<16}" + "".join(f" {s[o]:>9.1f}" for s in splits))
    lines.append(f"{'total':<16}" + "".join(f" {sum(s.values()):>9.1f}" for s in splits))
    for lab, s in zip(labels, per, strict=True):
        top = top_functions(s, steps, "mgrit")
        if top:
            lines.append(f"{lab}: mgrit own time, ms/step: " + ", ".join(top))
    return lines
