"""Exercise checks on space (lessons 10, 12): the 2×2 average restriction R of spatial
coarsening and its transpose, and the adjoint of the halo exchange of a row-split image.

Oracles: ``refbraid.mgrit.spatial`` (``restrict``, ``restrict_adjoint``: the transfers the
spatially coarsened MGRIT uses) and ``refbraid.space.halo.SpatialHalo`` run on simulated
ranks (``refbraid.parallel.comm.run_ranks``: threads of this process, no MPI needed). The
transpose checks first run the dot-product test ``<A x, w> = <x, Aᵀ w>`` against the
package's forward map, which needs no reference answer, then point at the worst entry.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..mgrit.spatial import restrict, restrict_adjoint
from ..parallel.comm import run_ranks
from ..space.halo import SpatialHalo
from ..verify.result import dot_rel_error
from .checking import Verdict, Wrong, as_array, call, compare, run_check

TOL = 1e-12  # float64: a right answer agrees to round-off
DOT_TOL = 1e-12


def _scale_hint(got: np.ndarray, expected: np.ndarray, what: str) -> str:
    """", yours is c × <what> everywhere" when ``got`` is a multiple of ``expected``."""
    c = float(np.vdot(got, expected) / max(float(np.vdot(expected, expected)), 1e-300))
    if abs(c - 1.0) > 1e-6 and np.allclose(got, c * expected, rtol=1e-9, atol=0.0):
        return f"; yours is {c:.4g} × {what} everywhere"
    return ""


# ----------------------------------------------------------------------------- lesson 10
RESTRICT_SHAPES = ((2, 3, 8, 6), (1, 2, 4, 10))  # (B, C, H, W) fine feature maps


def check_restrict_average(restrict_average: Callable, quiet: bool = False) -> Verdict:
    """Lesson 10: ``restrict_average(x)``, x (B, C, H, W) with H, W even → (B, C, H/2, W/2),
    the mean of each 2×2 block: ``(R x)[i, j] = (x[2i,2j] + x[2i+1,2j] + x[2i,2j+1] +
    x[2i+1,2j+1]) / 4`` (refbraid.mgrit.spatial.restrict, kind "average")."""

    def body() -> str:
        rng = np.random.default_rng(10)
        worst = 0.0
        for shape in RESTRICT_SHAPES:
            x = rng.standard_normal(shape)
            expected = restrict(x, "average")
            got = as_array("R x", call(restrict_average, x.copy()), expected.shape)
            try:
                err = compare("R x", got, expected, TOL,
                              f"fine shape {shape}: sample {{0}}, channel {{1}}, coarse cell "
                              f"({{2}}, {{3}})")
            except Wrong as wrong:
                raise Wrong(f"{wrong}{_scale_hint(got, expected, 'the 2×2 average')}") from None
            worst = max(worst, err)
        return (f"R x matches refbraid.mgrit.spatial.restrict for {len(RESTRICT_SHAPES)} shapes "
                f"(max rel err {worst:.1e})")

    return run_check("10 2×2 average restriction R", body, quiet)


def check_restrict_average_transpose(restrict_average_transpose: Callable,
                                     quiet: bool = False) -> Verdict:
    """Lesson 10: ``restrict_average_transpose(v)``, v (B, C, h, w) → (B, C, 2h, 2w), the
    exact transpose Rᵀ of the 2×2 average: ``<R x, v> = <x, Rᵀ v>`` for every x and v."""

    def body() -> str:
        rng = np.random.default_rng(11)
        v = rng.standard_normal((2, 3, 3, 4))
        expected = restrict_adjoint(v, "average")
        got = as_array("Rᵀ v", call(restrict_average_transpose, v.copy()), expected.shape)
        worst = 0.0
        for _ in range(3):  # the dot-product test needs no reference answer
            x = rng.standard_normal(expected.shape)
            err, lhs, rhs = dot_rel_error(restrict(x, "average") * v, x * got)
            if not err <= DOT_TOL:
                raise Wrong(f"dot-product test fails: <R x, v> = {lhs:.6g} but <x, yours> = "
                            f"{rhs:.6g} (rel err {err:.1e}): yours is not the transpose of "
                            f"the 2×2 average{_scale_hint(got, expected, 'Rᵀ')}")
            worst = max(worst, err)
        compare("Rᵀ v", got, expected, TOL, "sample {0}, channel {1}, fine cell ({2}, {3})")
        return (f"<R x, v> = <x, Rᵀ v> (max rel err {worst:.1e}) and Rᵀ v matches "
                f"refbraid.mgrit.spatial.restrict_adjoint")

    return run_check("10 transpose of the restriction Rᵀ", body, quiet)


# ----------------------------------------------------------------------------- lesson 12
HALO_SPLITS = ((3,), (2, 3, 1), (1, 1, 2, 1))  # rows per rank: one rank, uneven, one-row blocks
HALO_BATCH, HALO_CHANNELS, HALO_COLUMNS = 2, 2, 3


def _on_ranks(counts: tuple[int, ...], apply: Callable, arrays: list[np.ndarray]):
    """``apply(SpatialHalo(comm), arrays[rank])`` on ``len(counts)`` simulated ranks."""
    return run_ranks(len(counts), lambda comm: apply(SpatialHalo(comm), arrays[comm.rank]))


def _first_wrong(got: list[np.ndarray], expected: list[np.ndarray],
                 counts: tuple[int, ...]) -> str:
    """"; first wrong: rank p, row r ..." for the first rank whose answer differs, at its worst
    entry, saying which neighbour took that row as a ghost."""
    bad = [q for q in range(len(counts))
           if not np.allclose(got[q], expected[q], rtol=0.0, atol=1e-12)]
    if not bad:  # cannot happen for an answer that fails the dot-product test; be safe
        return ""
    p = bad[0]
    idx = np.unravel_index(int(np.argmax(np.abs(got[p] - expected[p]))), got[p].shape)
    row = int(idx[2])
    ghosts = []
    if row == counts[p] - 1 and p < len(counts) - 1:
        ghosts.append(f"rank {p + 1} took it as its ghost row above")
    if row == 0 and p > 0:
        ghosts.append(f"rank {p - 1} took it as its ghost row below")
    role = f" ({'; '.join(ghosts)})" if ghosts else " (no neighbour reads this row)"
    return (f"; first wrong: rank {p}, row {row} of its {counts[p]}{role}: at sample "
            f"{idx[0]}, channel {idx[1]}, column {idx[3]} yours {got[p][idx]:.6g} vs "
            f"{expected[p][idx]:.6g}")


def check_halo_adjoint(halo_adjoint: Callable, quiet: bool = False) -> Verdict:
    """Lesson 12: ``halo_adjoint(dy_halo, counts)`` → list of P arrays; rank p owns
    ``counts[p]`` rows and ``dy_halo[p]`` is (B, C, n_p + 2, W) (a ghost row above and below
    its own). The adjoint of the halo exchange: ``dy_p = dy_halo_p[1:−1]``, plus each ghost
    row added back into the row it was copied from (the last row of rank p − 1, the first of
    rank p + 1); ghosts beyond the image were zeros and go nowhere."""

    def body() -> str:
        rng = np.random.default_rng(12)
        worst = 0.0
        for counts in HALO_SPLITS:
            case = f"split {list(counts)} rows over {len(counts)} rank(s)"
            shapes = [(HALO_BATCH, HALO_CHANNELS, n, HALO_COLUMNS) for n in counts]
            ys = [rng.standard_normal(s) for s in shapes]
            ws = [rng.standard_normal((b, c, n + 2, w)) for b, c, n, w in shapes]
            halos = _on_ranks(counts, lambda op, y: op.forward(y), ys)  # H y, rank by rank
            expected = _on_ranks(counts, lambda op, w: op.adjoint(w), ws)
            got = call(halo_adjoint, [w.copy() for w in ws], tuple(counts))
            if not isinstance(got, (list, tuple)) or len(got) != len(counts):
                raise Wrong(f"{case}: return a list of {len(counts)} arrays (one per rank), "
                            f"got {type(got).__name__}"
                            + (f" of length {len(got)}" if hasattr(got, "__len__") else ""))
            got = [as_array(f"dy[{p}]", g, shapes[p]) for p, g in enumerate(got)]
            err, lhs, rhs = dot_rel_error(np.concatenate([(h * w).ravel() for h, w in
                                                          zip(halos, ws, strict=True)]),
                                          np.concatenate([(y * g).ravel() for y, g in
                                                          zip(ys, got, strict=True)]))
            if not err <= DOT_TOL:
                raise Wrong(f"{case}: dot-product test fails: Σ_p <(H y)_p, w_p> = {lhs:.6g} "
                            f"but Σ_p <y_p, yours_p> = {rhs:.6g} (rel err {err:.1e}): not the "
                            f"adjoint of the halo exchange{_first_wrong(got, expected, counts)}")
            for p in range(len(counts)):
                compare(f"dy[{p}]", got[p], expected[p], TOL,
                        f"{case}, rank {p}: sample {{0}}, channel {{1}}, row {{2}}, "
                        f"column {{3}}")
            worst = max(worst, err)
        return (f"dot-product test passes (max rel err {worst:.1e}) and every rank matches "
                f"SpatialHalo.adjoint, for {len(HALO_SPLITS)} splits, uneven ones included")

    return run_check("12 adjoint of the halo exchange", body, quiet)
