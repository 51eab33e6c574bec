"""MGRIT settings: one frozen, validated dataclass.

Level ``0`` is the finest; levels ``0..L-2`` relax and coarsen, level ``L-1`` (the coarsest)
is solved exactly by forward substitution. Per-level settings (``cfactor``, ``relax``,
``cf_sweeps``) are either one value for every level or a tuple with one entry per
coarsening level ``0..L-2``.

The defaults are neutral (two-level Parareal-like F-relaxation); TorchBraid's example defaults
(docs/references.md §6) are :meth:`MGRITSettings.torchbraid`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Union

RELAXATIONS = ("F", "FCF")
CYCLES = ("V", "F")
ON_DIVERGENCE = ("raise", "flag")

PerLevelInt = Union[int, tuple[int, ...]]  # noqa: UP007 (runtime alias, py3.10)
PerLevelStr = Union[str, tuple[str, ...]]  # noqa: UP007


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _per_level(name: str, value, n: int, check) -> tuple:
    """Broadcast ``value`` (scalar or tuple) to ``n`` levels, checking each entry."""
    if isinstance(value, (tuple, list)):
        if len(value) != n:
            raise ValueError(
                f"`{name}` needs one entry per coarsening level (levels - 1 = {n}), got {value!r}."
            )
        values = tuple(value)
    else:
        values = (value,) * n
    for v in values:
        check(name, v, value)
    return values


def _check_cfactor(name, v, given):
    if not _is_int(v) or v < 2:
        raise ValueError(f"`{name}` must be an integer >= 2 (or a tuple of them), got {given!r}.")


def _check_relax(name, v, given):
    if v not in RELAXATIONS:
        raise ValueError(
            f"`{name}` must be one of {RELAXATIONS} (or a tuple of them), got {given!r}."
        )


def _check_sweeps(name, v, given):
    if not _is_int(v) or v < 1:
        raise ValueError(f"`{name}` must be an integer >= 1 (or a tuple of them), got {given!r}.")


def _check_tol(name: str, v) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"`{name}` must be a positive finite number or None (off), got {v!r}.")


@dataclass(frozen=True)
class MGRITSettings:
    """Everything that configures an MGRIT solve (validated on construction).

    levels          number of grid levels L (1 = sequential solve); the grid must allow it
    cfactor         coarsening factor m ≥ 2, or one per coarsening level
    max_iter        at most this many cycles after the first residual measurement
    abs_tol         stop when ‖r‖ ≤ abs_tol (None: off)
    rel_tol         stop when ‖r‖ ≤ rel_tol·‖r_first‖ (None: off); both off → run max_iter
    relax           'F' or 'FCF' per coarsening level
    cf_sweeps       number of CF sweeps after the first F-sweep on 'FCF' levels (1 = FCF)
    cycle           'V' or 'F' (F-cycle: the coarse problem gets an F-cycle then a V-cycle)
    skip_first_down cold start: no down-leg in the first cycle — coarsest solve of the injected
                    problem, interpolated up (Parareal's coarse initial guess)
    fmg             cold start: nested iteration (coarsest solve, then one V-cycle per level
                    on the way up) — the FMG initial guess
    min_coarse      minimum number of intervals on the coarsest grid
    keep_iterates   store every level's iterate at every residual measurement
    keep_residuals  store the C-point residual vectors (norms are always stored)
    on_divergence   'raise' (MGRITDiverged) or 'flag' (result.status == 'diverged')
    max_growth      divergence when ‖r‖ > max_growth·‖r_first‖ (or ‖r‖ is NaN/inf)
    final_fc_relax  XBraid's final FC relaxation (TorchBraid's convention): after the last
                    measurement every fine C-point is overwritten, ``u[c] ← Φ(u[c-1]) + g[c]``
                    (= ``u[c] + r[c]``, no extra step), so the returned C-points are those of
                    a final F- then C-relaxation instead of the coarse-corrected ones
    fused           run the cycle with its bookkeeping fused into the sweeps (the C-point
                    residual by the sweep that produces it, restriction and FAS right-hand
                    side in one pass, the correction applied by the next F-sweep:
                    :mod:`refbraid.mgrit.fused`); the same numbers bit for bit, fewer passes
                    over whole states. False: the textbook cycle of cycle.py, step by step

    ``final_fc_relax`` is off by default: the returned iterate is then the one whose residual
    is the last reported norm (record.py), and refbraid's results do not change; TorchBraid
    switches it on for every adjoint solve (and for the forward one with
    ``setFwdFinalFCRelax``), see docs/xbraid_mapping.md. Its C-points are no closer to the
    exact solution in general, only different: the gradient then matches TorchBraid's.

    ``skip_first_down`` and ``fmg`` only build the initial iterate of a cold start; a warm start
    (``u_init``) is used as given. Their cost is counted; ``max_iter`` counts the cycles after.
    """

    levels: int = 2
    cfactor: PerLevelInt = 2
    max_iter: int = 20
    abs_tol: float | None = 1e-10
    rel_tol: float | None = None
    relax: PerLevelStr = "F"
    cf_sweeps: PerLevelInt = 1
    cycle: str = "V"
    skip_first_down: bool = False
    fmg: bool = False
    min_coarse: int = 2
    keep_iterates: bool = False
    keep_residuals: bool = True
    on_divergence: str = "raise"
    max_growth: float = 1e8
    final_fc_relax: bool = False
    fused: bool = True

    def __post_init__(self):
        if not _is_int(self.levels) or self.levels < 1:
            raise ValueError(f"`levels` must be an integer >= 1, got {self.levels!r}.")
        n = self.levels - 1
        object.__setattr__(
            self, "_cfactors", _per_level("cfactor", self.cfactor, n, _check_cfactor)
        )
        if n == 0 and not isinstance(self.cfactor, (tuple, list)):
            _check_cfactor("cfactor", self.cfactor, self.cfactor)
        object.__setattr__(self, "_relax", _per_level("relax", self.relax, n, _check_relax))
        object.__setattr__(
            self, "_sweeps", _per_level("cf_sweeps", self.cf_sweeps, n, _check_sweeps)
        )
        if not _is_int(self.max_iter) or self.max_iter < 0:
            raise ValueError(f"`max_iter` must be an integer >= 0, got {self.max_iter!r}.")
        _check_tol("abs_tol", self.abs_tol)
        _check_tol("rel_tol", self.rel_tol)
        if self.cycle not in CYCLES:
            raise ValueError(f"`cycle` must be one of {CYCLES}, got {self.cycle!r}.")
        for name in ("skip_first_down", "fmg", "keep_iterates", "keep_residuals",
                     "final_fc_relax", "fused"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be a bool, got {getattr(self, name)!r}.")
        if self.skip_first_down and self.fmg:
            raise ValueError("`skip_first_down` and `fmg` are two initial guesses: choose one.")
        if not _is_int(self.min_coarse) or self.min_coarse < 1:
            raise ValueError(f"`min_coarse` must be an integer >= 1, got {self.min_coarse!r}.")
        if self.on_divergence not in ON_DIVERGENCE:
            raise ValueError(
                f"`on_divergence` must be one of {ON_DIVERGENCE}, got {self.on_divergence!r}."
            )
        g = self.max_growth
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not g > 1:
            raise ValueError(f"`max_growth` must be a number > 1, got {g!r}.")

    # per-level accessors ------------------------------------------------------------------
    @property
    def cfactors(self) -> tuple[int, ...]:
        """Coarsening factor of each level 0..L-2."""
        return self._cfactors

    def relax_on(self, level: int) -> str:
        return self._relax[level]

    def sweeps_on(self, level: int) -> int:
        """Number of CF sweeps after the first F-sweep on ``level`` (0 for F-relaxation)."""
        return self._sweeps[level] if self._relax[level] == "FCF" else 0

    def replace(self, **changes) -> MGRITSettings:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)

    @classmethod
    def torchbraid(cls, **changes) -> MGRITSettings:
        """TorchBraid's example defaults (docs/references.md §6): 3 levels, cfactor 4, 2 iterations,
        skip the first down-cycle, F on the finest and FCF on coarse levels, absolute tolerance.

        refbraid counts the skipped first cycle as the construction of the initial iterate, so
        TorchBraid's "2 iterations" (skipped cycle + one full cycle) is ``max_iter=1`` here.
        """
        base = dict(
            levels=3,
            cfactor=4,
            max_iter=1,
            abs_tol=1e-9,
            rel_tol=None,
            relax=("F", "FCF"),
            skip_first_down=True,
            min_coarse=1,
        )
        base.update(changes)
        if "levels" in changes and "relax" not in changes:
            base["relax"] = tuple("F" if lvl == 0 else "FCF" for lvl in range(base["levels"] - 1))
        return cls(**base)
