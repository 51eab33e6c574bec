"""Exercise check on comparing gradients (lesson 13): the relative error per parameter, per
group and in total that ``refbraid compare`` prints.

Oracle: ``refbraid.interop.compare.gradient_errors`` on a real case, refbraid's layer-parallel
gradient (two levels, one cycle each way: visibly inexact) against exact backprop on a small
Peaks network, and on the same case with one reference parameter all zeros (where the error
is absolute). No PyTorch needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..data import load_peaks
from ..interop.compare import gradient_errors
from ..layer_parallel import LayerParallelSettings, layer_parallel_gradient
from ..mgrit import MGRITSettings
from ..network import GROUPS, backprop, init_params
from ..training.models import build_network
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
