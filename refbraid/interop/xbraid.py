"""XBraid / TorchBraid settings and residual conventions, expressed in refbraid's terms.

Settings. :class:`TorchBraidSettings` holds a layer-parallel run's MGRIT settings in the words
TorchBraid's ``LayerParallel`` and XBraid use (``setMaxLevels``, ``setCFactor``,
``setFwdMaxIters``, ``setFwdNumRelax``, ``setSkipDowncycle``, ``setFwdFinalFCRelax``,
``setFwdAbsTol``, ...); :meth:`TorchBraidSettings.to_refbraid` maps them to a
:class:`~refbraid.layer_parallel.LayerParallelSettings`, and refuses, naming the setting, what
refbraid cannot do. The full table is docs/xbraid_mapping.md. Iterations::

    XBraid max_iters = k   ↔  refbraid max_iter = k − 1   with skip_downcycle (the skipped
                                                           first cycle counts in XBraid)
                           ↔  refbraid max_iter = k       without it
    XBraid nrelax = ν on level ℓ  ↔  relax 'F' (ν = 0) or 'FCF' with cf_sweeps = ν (ν ≥ 1)

Residuals (:func:`xbraid_stats`). Both codes measure the fine C-point residual
``‖r‖ = (Σ_c ‖Φ(u[c−1]) − u[c]‖²)^½`` (XBraid ``tnorm = 2``, TorchBraid's spatial norm is
``torch.norm``) after the relaxation of level 0 and before the coarse correction. They differ
in which measurements they report:

* refbraid records a measurement at the start of every cycle *and* the last one (the final
  relaxation every solve ends with: the F-sweep that makes the returned F-points);
* XBraid stops on ``max_iters`` at the top of an iteration, so that last relaxation (its
  final FC relaxation or the F-relaxation of its access) is not reported: its norms are
  refbraid's ``records[:-1]``; a solve that stops on the tolerance reports all of them;
* XBraid numbers its iterations from the skipped one: refbraid's record j is XBraid's
  iteration ``j + skip``, and ``braid_GetNumIter`` is ``result.iterations + skip``;
* TorchBraid's ``getFwdStats()`` / ``getBwdStats()`` return ``(iterations, last norm)``, with
  −1 for the norm when nothing was measured (one backward iteration after a skipped
  down-cycle: the default adjoint solve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

from ..layer_parallel import LayerParallelSettings
from ..mgrit import MGRITResult, MGRITSettings

PerLevel = Union[int, tuple[int, ...]]  # noqa: UP007 (runtime alias, py3.10)

#: XBraid / TorchBraid settings refbraid has no counterpart for, with what refbraid does instead
UNSUPPORTED = {
    "relax_only_cg": "the coarsest level is always solved exactly (sequential substitution)",
    "crelax_wt": "C-relaxation is unweighted (CWt = 1)",
    "spatial_coarsening": "no spatial coarsening between levels (XBraid SetSpatialCoarsen)",
    "tnorm": "the temporal norm is the 2-norm over C-points (XBraid tnorm = 2)",
    "seq_soln": "the initial guess is u0 everywhere, the skipped down-cycle or FMG",
    "storage": "refbraid keeps every fine point (XBraid storage = -1 would match)",
}


def _levels(name: str, value, n: int) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        vals = tuple(value)
        if len(vals) < n:
            raise ValueError(f"`{name}` needs one entry per coarsening level (max_levels − 1 "
                             f"= {n}), got {value!r}.")
        vals = vals[:n]
    else:
        vals = (value,) * n
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"`{name}` entries must be integers >= 0, got {value!r}.")
    return vals


@dataclass(frozen=True)
class TorchBraidSettings:
    """A layer-parallel run's MGRIT settings in TorchBraid / XBraid terms (their defaults in
    TorchBraid's examples: docs/references.md §6).

    max_levels       XBraid max_levels (1: serial)
    cfactor          cfactor, one value or one per level (XBraid SetCFactor(level, m))
    fwd_max_iters    forward iterations, counting the skipped one (TorchBraid's "2")
    bwd_max_iters    backward iterations (TorchBraid's "1")
    fwd_nrelax       nrelax per level: 0 = F, ν = F then ν × CF; TorchBraid: (0, 1, 1, ...)
    bwd_nrelax       the same for the adjoint solve
    skip_downcycle   XBraid skip: no work on the first down-cycle
    fwd_finalrelax   setFwdFinalFCRelax() (off in TorchBraid unless asked)
    bwd_finalrelax   the adjoint's final FC relaxation (TorchBraid's BackwardODENetApp always
                     sets it; False gives XBraid without TorchBraid)
    abs_tol          XBraid absolute tolerance (None: off)
    rel_tol          XBraid relative tolerance (relative to the first measured norm; None: off)
    fmg              XBraid SetFMG: F-cycles
    min_coarse       XBraid min_coarse
    unsupported      names of other settings the run uses (keys of :data:`UNSUPPORTED`)
    """

    max_levels: int = 3
    cfactor: PerLevel = 4
    fwd_max_iters: int = 2
    bwd_max_iters: int = 1
    fwd_nrelax: PerLevel = (0, 1)
    bwd_nrelax: PerLevel = (0, 1)
    skip_downcycle: bool = True
    fwd_finalrelax: bool = False
    bwd_finalrelax: bool = True
    abs_tol: float | None = 1e-9
    rel_tol: float | None = None
    fmg: bool = False
    min_coarse: int = 2
    unsupported: tuple[str, ...] = field(default=())

    def _solve(self, direction: str, max_iters: int, nrelax, final: bool) -> MGRITSettings:
        n = self.max_levels - 1
        if isinstance(max_iters, bool) or not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"`{direction}_max_iters` must be an integer >= 1 (XBraid counts "
                             f"the skipped first cycle as iteration 1), got {max_iters!r}.")
        max_iter = max_iters - 1 if self.skip_downcycle else max_iters
        if n == 0:
            return MGRITSettings(levels=1)
        nu = _levels(f"{direction}_nrelax", nrelax, n)
        return MGRITSettings(
            levels=self.max_levels,
            cfactor=_levels("cfactor", self.cfactor, n),
            max_iter=max_iter,
            abs_tol=self.abs_tol,
            rel_tol=self.rel_tol,
            relax=tuple("F" if v == 0 else "FCF" for v in nu),
            cf_sweeps=tuple(max(v, 1) for v in nu),
            cycle="F" if self.fmg else "V",
            skip_first_down=self.skip_downcycle,
            min_coarse=self.min_coarse,
            final_fc_relax=final,
        )

    def to_refbraid(self) -> LayerParallelSettings:
        """The same solves as refbraid settings (ValueError naming what cannot be mapped)."""
        for name in self.unsupported:
            if name not in UNSUPPORTED:
                raise ValueError(f"`unsupported` entry {name!r} is not a known XBraid setting; "
                                 f"known: {sorted(UNSUPPORTED)}.")
        if self.unsupported:
            name = self.unsupported[0]
            raise ValueError(f"XBraid setting `{name}` cannot be mapped to refbraid: "
                             f"{UNSUPPORTED[name]}.")
        if isinstance(self.max_levels, bool) or not isinstance(self.max_levels, int) \
                or self.max_levels < 1:
            raise ValueError(f"`max_levels` must be an integer >= 1, got {self.max_levels!r}.")
        return LayerParallelSettings(
            forward=self._solve("fwd", self.fwd_max_iters, self.fwd_nrelax, self.fwd_finalrelax),
            backward=self._solve("bwd", self.bwd_max_iters, self.bwd_nrelax,
                                 self.bwd_finalrelax),
        )

    @classmethod
    def from_mapping(cls, values: dict) -> TorchBraidSettings:
        """From a dict (a TOML/JSON settings file): unknown keys are refused by name."""
        known = set(cls.__dataclass_fields__)
        bad = [k for k in values if k not in known and k not in UNSUPPORTED]
        if bad:
            raise ValueError(f"unknown setting(s) {bad}; TorchBraid/XBraid settings refbraid "
                             f"maps: {sorted(known - {'unsupported'})}; refused by name: "
                             f"{sorted(UNSUPPORTED)}.")
        given = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()
                 if k in known}
        extra = tuple(k for k in values if k in UNSUPPORTED)
        return cls(**given, unsupported=tuple(given.get("unsupported", ())) + extra)


@dataclass(frozen=True)
class XBraidStats:
    """One solve's residuals as XBraid prints them and TorchBraid's get*Stats return them."""

    iterations: int  # braid_GetNumIter (the skipped first cycle counts)
    iteration_numbers: tuple[int, ...]  # XBraid's number of each reported norm
    norms: tuple[float, ...]  # braid_GetRNorms: fine C-point 2-norms, as printed
    last: float  # getFwdStats()/getBwdStats()[1]: the last norm, −1 if none was measured

    def as_dict(self) -> dict:
        return {"iterations": self.iterations, "iteration_numbers": list(self.iteration_numbers),
                "norms": list(self.norms), "last": self.last}


def xbraid_stats(result: MGRITResult) -> XBraidStats:
    """XBraid's view of a refbraid solve (module docstring): which measurements it reports,
    how it numbers them and counts iterations. One level: XBraid runs one serial "iteration"
    and measures nothing (−1)."""
    skip = 1 if result.start == "skip" else 0
    if len(result.hierarchy) == 1:
        return XBraidStats(1, (), (), -1.0)
    records = result.records if result.status == "converged" else result.records[:-1]
    numbers = tuple(r.iteration + skip for r in records)
    norms = tuple(float(r.norm) for r in records)
    last = norms[-1] if norms else -1.0
    return XBraidStats(result.iterations + skip, numbers, norms, last)


def refbraid_history(result: MGRITResult) -> dict:
    """refbraid's own record of a solve: per iteration the fine norm (XBraid's point of
    measurement, every record including the final relaxation), the post-cycle norm
    (PyMGRIT's convention) and every coarse level's first FAS residual norm per cycle."""
    levels = len(result.hierarchy)

    def clean(values):
        return [None if not math.isfinite(float(v)) else float(v) for v in values]

    return {
        "iterations": int(result.iterations),
        "status": result.status,
        "start": result.start,
        "norms": clean(result.norms),
        "post_cycle_norms": clean(result.post_cycle_norms),
        "level_norms": {str(lvl): clean(result.level_norms(lvl))
                        for lvl in range(1, max(levels - 1, 1))},
        "step_counts": [int(c) for c in result.step_counts],
    }
