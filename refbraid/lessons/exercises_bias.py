"""Exercise check on gradient bias (lesson 11): the bias of a layer-parallel gradient, the noise
of the mini-batch gradient it is judged against, and their ratio — the numbers the
``--bias-control`` controllers act on.

Oracle: ``refbraid.bias_control.bias_and_noise`` (the measurement ``refbraid train
--bias-control`` makes), fed with given gradients instead of backprop calls::

    bias  = ‖g_LP − g‖₂
    noise = √( Σ_i ‖g_i − ḡ‖² / (M (M − 1)) ),   ḡ = mean_i g_i   (M micro-batch gradients g_i)
    ratio = bias / noise
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..bias_control import bias_and_noise
from .checking import Verdict, Wrong, call, run_check

TOL = 1e-12
#: (parameters P, micro-batches M, how far g_LP is from g)
CASES = ((7, 4, 0.3), (20, 2, 1e-3), (5, 8, 2.0))


def _oracle(g_lp: np.ndarray, g: np.ndarray, micro: np.ndarray) -> dict:
    """bias_and_noise on a one-parameter-array 'model' whose backprop returns given gradients:
    the whole batch (M samples) gives ``g``, sample i alone gives ``micro[i]``."""
    M = micro.shape[0]

    def backprop(params, x, labels):
        rows = [int(i) for i in x[:, 0]]
        return 0.0, {"w": g if len(rows) == M else micro[rows[0]]}, None

    x = np.arange(M, dtype=float)[:, None]
    return bias_and_noise(backprop, {"w": g}, x, np.zeros(M, dtype=np.int64), {"w": g_lp}, M,
                          _NumpyHost())


class _NumpyHost:
    """The one backend method the oracle needs on host arrays."""

    @staticmethod
    def to_numpy(a):
        return np.asarray(a)


def check_bias_noise_ratio(bias_noise_ratio: Callable, quiet: bool = False) -> Verdict:
    """Lesson 11: ``bias_noise_ratio(g_lp, g, micro)`` with flat gradients g_lp, g (P,) and the
    micro-batch gradients ``micro`` (M, P) → ``(bias, noise, ratio)`` as in the module
    docstring (noise: the standard error of the mean of the M micro-batch gradients)."""

    def body() -> str:
        rng = np.random.default_rng(11)
        for P, M, scale in CASES:
            g = rng.standard_normal(P)
            g_lp = g + scale * rng.standard_normal(P)
            micro = g + rng.standard_normal((M, P))
            want = _oracle(g_lp, g, micro)
            got = call(bias_noise_ratio, g_lp.copy(), g.copy(), micro.copy())
            try:
                bias, noise, ratio = (float(v) for v in got)
            except (TypeError, ValueError):
                raise Wrong(f"return three numbers (bias, noise, ratio), got {got!r}") from None
            case = f"P = {P} parameters, M = {M} micro-batches"
            for name, value in (("bias", bias), ("noise", noise), ("ratio", ratio)):
                key = "bias_ratio" if name == "ratio" else name
                err = abs(value - want[key]) / abs(want[key])
                if not err <= TOL:
                    hint = ""
                    if name == "noise":
                        spread = np.sqrt(((micro - micro.mean(axis=0)) ** 2).sum() / (M - 1))
                        if abs(noise - spread) <= 1e-9 * spread:
                            hint = (" — yours is the spread of one micro-batch gradient; the "
                                    "noise of their mean is smaller by √M")
                    raise Wrong(f"{case}: {name} {value:.6g}, expected {want[key]:.6g} "
                                f"(rel err {err:.1e}){hint}")
        return f"bias, noise and their ratio right in all {len(CASES)} cases"

    return run_check("11 bias against mini-batch noise", body, quiet)
