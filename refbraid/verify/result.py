"""What one check leaves behind, the tolerances it is held to, and the table that shows them.

Every check reduces to one number, a relative error, compared with a tolerance:

* the dot-product test ``<J u, w> = <u, Jᵀ w>``, relative to the size of the terms summed::

      err = |Σ_j (J u)_j w_j − Σ_i u_i (Jᵀw)_i| / max(Σ_j |(J u)_j w_j|, Σ_i |u_i (Jᵀw)_i|)

  (the Cauchy–Schwarz scale of the inner products: cancellation inside a sum is round-off of
  the test, not an error of the adjoint; a wrong adjoint term is O(1) of this scale);

* arrays against a reference (backend vs NumPy, refbraid vs PyTorch), normwise::

      err = max_i |a_i − r_i| / max_i |r_i|

* finite differences at a sampled index k of an argument with adjoint gradient g::

      err_k = |fd_k − g_k| / max(|fd_k|, |g_k|, noise_k / tol)

  where noise_k is the round-off of the difference itself (refbraid.verify.probes): an entry
  that is zero (a dead relu unit) or so small that tol·|g_k| is below what the difference can
  resolve is held to that round-off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Tolerances per dtype and kind of check (REFBRAID standards: adjoints ≤1e-12 by the
#: dot-product test and ≤1e-7 by central differences in float64; backends ≤1e-12 / ≤1e-5).
TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"dot": 1e-12, "fd": 1e-7, "numpy": 1e-12, "torch": 1e-12},
    "float32": {"dot": 1e-5, "numpy": 1e-5, "torch": 1e-5},
}
_TINY = 1e-300  # keeps 0/0 (two exact zeros) at 0


@dataclass(frozen=True)
class CheckResult:
    """One check of one layer on one backend and dtype; ``detail`` says where it failed."""

    layer: str
    check: str
    backend: str
    dtype: str
    max_rel_error: float
    tol: float
    passed: bool
    detail: str = ""

    def __str__(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        where = f": {self.detail}" if self.detail else ""
        return (f"{status} {self.layer} {self.check} [{self.backend}, {self.dtype}] "
                f"rel err {self.max_rel_error:.2e} (tol {self.tol:.0e}){where}")


def tolerance(dtype, kind: str) -> float:
    """The tolerance of a check ``kind`` ('dot', 'fd', 'numpy', 'torch') in ``dtype``."""
    name = np.dtype(dtype).name
    if name not in TOLERANCES:
        raise ValueError(f"`dtype` must be one of {tuple(TOLERANCES)}, got {name!r}.")
    if kind not in TOLERANCES[name]:
        raise ValueError(f"no {kind!r} check is defined in {name} "
                         f"(defined: {tuple(TOLERANCES[name])}).")
    return TOLERANCES[name][kind]


def result(layer: str, check: str, backend: str, dtype, err: float, tol: float,
           detail: str = "") -> CheckResult:
    """A CheckResult that passes when ``err ≤ tol`` (NaN and inf always fail)."""
    err = float(err)
    passed = bool(np.isfinite(err) and err <= tol)
    return CheckResult(layer, check, backend, np.dtype(dtype).name, err, tol, passed,
                       "" if passed else detail)


def dot_rel_error(lhs_terms: np.ndarray, rhs_terms: np.ndarray) -> tuple[float, float, float]:
    """(err, Σ lhs_terms, Σ rhs_terms) of the dot-product test, err relative to Σ|terms|."""
    lhs, rhs = float(np.sum(lhs_terms)), float(np.sum(rhs_terms))
    scale = max(float(np.sum(np.abs(lhs_terms))), float(np.sum(np.abs(rhs_terms))), _TINY)
    return abs(lhs - rhs) / scale, lhs, rhs


def array_rel_error(a: np.ndarray, ref: np.ndarray) -> tuple[float, tuple[int, ...]]:
    """max_i |a_i − ref_i| / max_i |ref_i| and the index of the largest difference."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if a.shape != ref.shape:
        return float("inf"), ()
    if a.size == 0:
        return 0.0, ()
    diff = np.abs(a - ref)
    if not np.all(np.isfinite(diff)):
        return float("inf"), tuple(int(i) for i in np.argwhere(~np.isfinite(diff))[0])
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[worst]) / max(float(np.abs(ref).max()), _TINY), tuple(map(int, worst))


def compare_arrays(layer: str, check: str, backend: str, dtype, label: str, a: np.ndarray,
                   ref: np.ndarray, tol: float, sources: tuple[str, str]) -> CheckResult:
    """``array_rel_error(a, ref) ≤ tol``; on failure the detail names ``label``, the index and
    both values, ``sources`` naming where ``a`` and ``ref`` came from."""
    err, idx = array_rel_error(a, ref)
    if a.shape != ref.shape:
        detail = f"`{label}` has shape {a.shape} from {sources[0]}, {ref.shape} from {sources[1]}"
    else:
        detail = (f"`{label}`{list(idx)}: {sources[0]} {a[idx]:.17g} vs "
                  f"{sources[1]} {ref[idx]:.17g}")
    return result(layer, check, backend, dtype, err, tol, detail)


# ----------------------------------------------------------------------------- table
_COLUMNS = ("layer", "check", "backend", "dtype", "max rel err", "tol", "result")


def format_table(results: list[CheckResult]) -> str:
    """A plain-text table (layer × check × max relative error, PASS/FAIL) and a summary line.

    Failed rows carry their ``detail`` (argument, index, values) on the line below.
    """
    rows = [(r.layer, r.check, r.backend, r.dtype, f"{r.max_rel_error:.2e}", f"{r.tol:.0e}",
             "PASS" if r.passed else "FAIL") for r in results]
    widths = [max([len(c)] + [len(row[i]) for row in rows]) for i, c in enumerate(_COLUMNS)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(_COLUMNS), line("-" * w for w in widths)]
    for r, row in zip(results, rows, strict=True):
        out.append(line(row))
        if not r.passed and r.detail:
            out.append(f"    ^ {r.detail}")
    n_failed = sum(not r.passed for r in results)
    verdict = "all pass" if n_failed == 0 else f"{n_failed} FAILED"
    out.append(f"{len(results)} checks, {verdict}")
    return "\n".join(out)
