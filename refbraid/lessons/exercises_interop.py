"""Exercise checks on comparing with other codes (lesson 13): the relative error per
parameter, per group and in total that ``refbraid compare`` prints, and which residual norms
XBraid (TorchBraid) prints for a solve and how it numbers them.

Oracles: ``refbraid.interop.compare.gradient_errors`` on a real case, refbraid's layer-parallel
gradient (two levels, one cycle each way: visibly inexact) against exact backprop on a small
Peaks network, and on the same case with one reference parameter all zeros (where the error
is absolute); ``refbraid.interop.xbraid.xbraid_stats`` on real two-level MGRIT solves of
``refbraid.mgrit.problems.nonlinear_ode`` (skipped first cycle or not, stopped on max_iter or
on the tolerance). No PyTorch needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..data import load_peaks
from ..interop.compare import gradient_errors
from ..interop.xbraid import xbraid_stats
from ..layer_parallel import LayerParallelSettings, layer_parallel_gradient
from ..mgrit import MGRITSettings, solve
from ..mgrit.problems import nonlinear_ode
from ..models import build_network
from ..network import GROUPS, backprop, init_params
from .checking import Verdict, Wrong, call, run_check

TOL = 1e-12


def gradient_pair() -> tuple[dict, dict]:
    """(layer-parallel gradient, exact gradient) of a 16-layer width-4 tanh ResNet on Peaks,
    two levels, cfactor 4, one forward and one adjoint cycle."""
    data = load_peaks(100, seed=0)
    net = build_network("resnet", data.input_shape, data.n_classes, 16, 4, 2.0, "tanh")
    params = init_params(net, 0)
    x, labels = data.x_train[:16], data.y_train[:16]
    _, exact, _ = backprop(net, params, x, labels)
    one = MGRITSettings(levels=2, cfactor=4, max_iter=1, abs_tol=None, rel_tol=None)
    _, lp, _ = layer_parallel_gradient(net, params, x, labels, LayerParallelSettings(one, one))
    return dict(lp), dict(exact)


def _order(keys) -> list[str]:
    """Parameters first, then groups, then "total": the first wrong one is the one to fix."""
    params = [k for k in keys if "." in k]
    return [*params, *[g for g in GROUPS if g in keys], "total"]


def check_gradient_errors(gradient_errors_fn: Callable, quiet: bool = False) -> Verdict:
    """Lesson 13: ``gradient_errors(g, ref)`` → a dict: for every parameter name p,
    ``‖g_p − ref_p‖₂ / ‖ref_p‖₂``; for every group (opening, steps, closing: the name before
    the first ".") and for "total", the same with the squares summed over the group's (all)
    parameters first; absolute (no division) where the reference is all zeros."""

    def body() -> str:
        lp, exact = gradient_pair()
        zeroed = dict(exact, **{"closing.b": np.zeros_like(exact["closing.b"])})
        cases = (("layer-parallel vs exact gradient", lp, exact),
                 ("same, with `closing.b` of the reference all zeros", lp, zeroed))
        for case, g, ref in cases:
            expected = gradient_errors(g, ref)
            got = call(gradient_errors_fn, {k: v.copy() for k, v in g.items()},
                       {k: v.copy() for k, v in ref.items()})
            if not isinstance(got, Mapping):
                raise Wrong(f"return a dict of errors, got {type(got).__name__}")
            for key in _order(expected):
                if key not in got:
                    raise Wrong(f"{case}: no entry {key!r} (expected one per parameter, per "
                                f"group {list(GROUPS)} and 'total')")
                try:
                    value = float(got[key])
                except (TypeError, ValueError):
                    raise Wrong(f"{case}: {key!r} must be a number, got "
                                f"{type(got[key]).__name__}") from None
                want = expected[key]
                err = abs(value - want) / max(abs(want), 1e-300)
                if not err <= TOL:
                    hint = (" (a group's error sums the squared differences and the squared "
                            "reference over all its parameters before dividing; it is not "
                            "the mean of their errors)" if "." not in key else
                            " (the reference is all zeros here: the error is absolute)"
                            if not np.any(ref[key]) else "")
                    raise Wrong(f"{case}: `{key}`: yours {value:.6g} vs expected {want:.6g} "
                                f"(rel err {err:.1e}){hint}")
        return (f"errors right per parameter, per group and in total ({len(expected)} numbers, "
                f"2 cases): total layer-parallel error {expected['total']:.3g}, as `refbraid "
                f"compare` prints it")

    return run_check("13 relative gradient error per parameter", body, quiet)


XBRAID_CASES = (  # (skip the first down-cycle, max_iter, abs_tol): how each solve stops
    (True, 2, None), (False, 3, None), (True, 20, 1e-9), (True, 0, None), (False, 20, 1e-9),
)


def _xbraid_case(skip: bool, max_iter: int, abs_tol: float | None):
    """A two-level, cfactor-4 solve of the 32-step nonlinear ODE with these settings."""
    settings = MGRITSettings(levels=2, cfactor=4, max_iter=max_iter, abs_tol=abs_tol,
                             rel_tol=None, skip_first_down=skip)
    return solve(nonlinear_ode(32, T=2.0, dim=3, seed=3), settings)


def check_xbraid_report(xbraid_report: Callable, quiet: bool = False) -> Verdict:
    """Lesson 13: ``xbraid_report(norms, iterations, status, skipped)`` → ``(num_iter,
    iteration_numbers, printed_norms, last)`` as XBraid reports a solve refbraid recorded:
    ``norms[j]`` is refbraid's measurement j (every cycle's and the final relaxation's),
    ``iterations`` its cycle count, ``status`` "converged" or "max_iter", ``skipped`` whether
    the first down-cycle was skipped. XBraid counts the skipped cycle
    (``braid_GetNumIter`` = iterations + skip), numbers measurement j as j + skip, does not
    report the final relaxation's measurement when it stops on max_iter, and TorchBraid's
    ``getFwdStats()[1]`` is the last printed norm, −1 when none was."""

    def body() -> str:
        for skip, max_iter, tol in XBRAID_CASES:
            result = _xbraid_case(skip, max_iter, tol)
            want = xbraid_stats(result)
            norms = [float(v) for v in result.norms]
            case = (f"{'skipped' if skip else 'cold'} first cycle, max_iter {max_iter}, "
                    f"status '{result.status}' after {result.iterations} cycle(s), "
                    f"{len(norms)} refbraid measurement(s)")
            got = call(xbraid_report, list(norms), int(result.iterations), result.status, skip)
            try:
                num_iter, numbers, printed, last = got
                num_iter, last = int(num_iter), float(last)
                numbers, printed = [int(i) for i in numbers], [float(v) for v in printed]
            except (TypeError, ValueError):
                raise Wrong(f"return (num_iter, iteration_numbers, printed_norms, last), got "
                            f"{got!r}") from None
            if num_iter != want.iterations:
                raise Wrong(f"{case}: braid_GetNumIter: yours {num_iter}, XBraid's "
                            f"{want.iterations} (does the skipped first cycle count?)")
            if len(printed) != len(want.norms):
                raise Wrong(f"{case}: yours prints {len(printed)} norm(s), XBraid "
                            f"{len(want.norms)} (which measurement does XBraid not report "
                            f"when it stops on max_iter?)")
            if numbers != list(want.iteration_numbers):
                raise Wrong(f"{case}: iteration numbers: yours {numbers}, XBraid's "
                            f"{list(want.iteration_numbers)}")
            if printed != list(want.norms):
                j = next(i for i, (a, b) in enumerate(zip(printed, want.norms, strict=True))
                         if a != b)
                raise Wrong(f"{case}: printed norm {j}: yours {printed[j]:.6g}, XBraid's "
                            f"{want.norms[j]:.6g}")
            if last != want.last:
                raise Wrong(f"{case}: getFwdStats()[1]: yours {last:.6g}, TorchBraid's "
                            f"{want.last:.6g}" + (" (nothing was printed: −1)"
                                                  if not want.norms else ""))
        return (f"XBraid's iteration count, numbering, printed norms and last norm right for "
                f"all {len(XBRAID_CASES)} solves (skipped or cold start, max_iter or tolerance, "
                f"nothing printed)")

    return run_check("13 XBraid's iteration count and printed norms", body, quiet)
