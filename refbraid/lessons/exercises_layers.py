"""Exercise checks on forward Euler, layers and their adjoints (lessons 00, 01, 02, 07, 08).

Each check builds its inputs with a fixed seed, calls the student's function and compares
with refbraid's own layer (NumPy reference backend); the adjoint checks first run the
dot-product test ``<J_a u, w> = <u, (Jᵀ w)_a>`` for every argument ``a`` (``J_a u`` the
complex-step tangent of the forward map, refbraid.verify.probes), which needs no reference
answer at all, then point at the worst entry.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backends import get_backend
from ..layers import Classifier, DenseLift, DenseStep, GRUCell, LayerNorm
from ..network import Network, forward, init_params
from ..verify.probes import complex_step_tangent
from ..verify.result import dot_rel_error
from .checking import Verdict, Wrong, as_array, call, compare, run_check

TOL = 1e-10  # float64: a right answer agrees to round-off
DOT_TOL = 1e-10  # the dot-product test's relative tolerance (complex step: exact to round-off)


def _adjoint_test(forward_map: Callable[[dict], np.ndarray], args: dict[str, np.ndarray],
                  w: np.ndarray, grads: dict[str, np.ndarray], rng) -> float:
    """Dot-product test of ``grads`` (yours) as the adjoint of ``forward_map`` at ``args``."""
    worst = 0.0
    for name, g in grads.items():
        u = rng.standard_normal(args[name].shape)
        tangent = complex_step_tangent(forward_map, args, name, u)  # J_name u
        err, lhs, rhs = dot_rel_error(tangent * w, u * g)
        if not err <= DOT_TOL:
            raise Wrong(f"dot-product test fails for `d{name}`: <J·u, w> = {lhs:.6g} but "
                        f"<u, d{name}> = {rhs:.6g} (rel err {err:.1e}): `d{name}` is not the "
                        f"adjoint of the forward map with respect to `{name}`")
        worst = max(worst, err)
    return worst


# ----------------------------------------------------------------------------- lesson 00
def check_euler_steps(euler_steps: Callable, quiet: bool = False) -> Verdict:
    """Lesson 00: ``euler_steps(y0, lam, T, N)`` → ``y[0..N]``, shape (N+1,), forward Euler for
    ``y' = λ y`` on ``[0, T]`` with ``h = T/N``: ``y[n+1] = y[n] + h λ y[n]``. The answer is
    known in closed form, ``y[n] = (1 + h λ)ⁿ y0``; checked for several λ, T and N."""

    def body() -> str:
        cases = ((1.0, -1.0, 3.0, 8), (2.0, -0.5, 1.0, 5), (-1.5, 0.7, 2.0, 12))
        err = 0.0
        for y0, lam, T, N in cases:
            h = T / N
            expected = y0 * (1.0 + h * lam) ** np.arange(N + 1)
            got = as_array("y", call(euler_steps, y0, lam, T, N), expected.shape)
            err = max(err, compare("y", got, expected, TOL,
                                   f"y0 = {y0}, λ = {lam}, T = {T}, N = {N}: step {{0}}; "
                                   f"h = T/N = {h:.6g}"))
        return (f"all {len(cases)} cases match y[n] = (1 + hλ)ⁿ y0 (max rel err {err:.1e})")

    return run_check("00 forward Euler", body, quiet)


# ----------------------------------------------------------------------------- lesson 01
def check_resnet_forward(resnet_forward: Callable, quiet: bool = False) -> Verdict:
    """Lesson 01: ``resnet_forward(x, W, b, h)`` → all states ``y[0..N]``, shape (N+1, B, C),
    of ``y[n+1] = y[n] + h tanh(y[n] W[n]ᵀ + b[n])``, ``y[0] = x``; W (N,C,C), b (N,C)."""

    def body() -> str:
        N, B, C, T = 6, 3, 4, 1.5
        net = Network(DenseLift(C, C, "identity"), DenseStep(C, "tanh"), Classifier((C,), 2),
                      n_layers=N, T=T)
        params = init_params(net, seed=11)
        params["opening.W"], params["opening.b"] = np.eye(C), np.zeros(C)
        x = np.random.default_rng(1).standard_normal((B, C))
        _, states, _ = forward(net, params, x)
        expected = np.stack(states)  # N+1,B,C
        got = call(resnet_forward, x.copy(), params["steps.W"].copy(),
                   params["steps.b"].copy(), net.h)
        got = as_array("states", got, expected.shape)
        err = 0.0
        for n in range(N + 1):  # the first layer that goes wrong is where to look
            where = f"y[{n}]" + (" = x, the input" if n == 0 else f", after layer {n - 1}")
            err = max(err, compare(f"states[{n}]", got[n], expected[n], TOL,
                                   where + ": sample {0}, feature {1}"))
        return (f"all {N + 1} states match refbraid.forward (max rel err {err:.1e}): a ResNet "
                f"layer is one forward-Euler step")

    return run_check("01 ResNet forward = forward Euler", body, quiet)


# ----------------------------------------------------------------------------- lesson 02
def check_dense_step_adjoint(dense_step_adjoint: Callable, quiet: bool = False) -> Verdict:
    """Lesson 02: ``dense_step_adjoint(W, b, y, dy_next, h)`` → ``(dy, dW, db)``, the adjoint of
    ``y_next = y + h tanh(y Wᵀ + b)``: ``s = h tanh'(z) ⊙ dy_next``, ``dy = dy_next + s W``,
    ``dW = sᵀ y``, ``db = Σ_batch s``."""

    def body() -> str:
        rng = np.random.default_rng(2)
        B, C, h = 5, 4, 0.3
        layer, bk = DenseStep(C, "tanh"), get_backend("numpy")
        p = layer.init(rng)
        y, w = rng.standard_normal((B, C)), rng.standard_normal((B, C))
        out = call(dense_step_adjoint, p["W"].copy(), p["b"].copy(), y.copy(), w.copy(), h)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise Wrong(f"return the tuple (dy, dW, db); got {type(out).__name__}")
        mine = {}
        for (name, shape), value in zip((("y", (B, C)), ("W", (C, C)), ("b", (C,))), out,
                                        strict=True):
            compare(f"d{name}", value, np.zeros(shape), np.inf)  # shape and finiteness
            mine[name] = np.asarray(value, float)

        def step(a):
            return a["y"] + h * np.tanh(a["y"] @ a["W"].T + a["b"])

        args = {"y": y, "W": p["W"], "b": p["b"]}
        dot = _adjoint_test(step, args, w, mine, rng)
        _, cache = layer.forward(p, y, h, bk)
        dy, grads = layer.adjoint(p, cache, w, h, bk)
        err = max(compare("dy", mine["y"], dy, TOL, "sample {0}, feature {1}"),
                  compare("dW", mine["W"], grads["W"], TOL, "row {0}, column {1}"),
                  compare("db", mine["b"], grads["b"], TOL, "feature {0}"))
        return (f"dy, dW, db pass the dot-product test (rel err {dot:.1e}) and match "
                f"refbraid's DenseStep.adjoint (max rel err {err:.1e})")

    return run_check("02 dense step adjoint", body, quiet)


# ----------------------------------------------------------------------------- lesson 07
def check_layernorm_adjoint(layernorm_adjoint: Callable, quiet: bool = False) -> Verdict:
    """Lesson 07: ``layernorm_adjoint(x, gamma, dy, eps)`` → ``(dx, dgamma, dbeta)``, the
    adjoint of ``y = γ ⊙ (x − μ)/√(σ² + eps) + β`` over the last axis of x (B, T, E)."""

    def body() -> str:
        rng = np.random.default_rng(7)
        B, T, E, eps = 2, 3, 5, 1e-5
        layer, bk = LayerNorm(E, T, eps), get_backend("numpy")
        gamma, beta = 1 + 0.5 * rng.standard_normal(E), rng.standard_normal(E)
        x, w = rng.standard_normal((B, T, E)), rng.standard_normal((B, T, E))
        out = call(layernorm_adjoint, x.copy(), gamma.copy(), w.copy(), eps)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise Wrong(f"return the tuple (dx, dgamma, dbeta); got {type(out).__name__}")
        shapes = {"x": (B, T, E), "gamma": (E,), "beta": (E,)}
        mine = {}
        for (name, shape), value in zip(shapes.items(), out, strict=True):
            compare(f"d{name}", value, np.zeros(shape), np.inf)  # shape and finiteness
            mine[name] = np.asarray(value, float)

        def norm(a):
            mu = a["x"].mean(axis=-1, keepdims=True)
            var = ((a["x"] - mu) ** 2).mean(axis=-1, keepdims=True)
            return a["gamma"] * (a["x"] - mu) / np.sqrt(var + eps) + a["beta"]

        dot = _adjoint_test(norm, {"x": x, "gamma": gamma, "beta": beta}, w, mine, rng)
        params = {"gamma": gamma, "beta": beta}
        _, cache = layer.forward(params, x, bk)
        dx, grads = layer.adjoint(params, cache, w, bk)
        err = max(compare("dx", mine["x"], dx, TOL, "sample {0}, token {1}, feature {2}"),
                  compare("dgamma", mine["gamma"], grads["gamma"], TOL, "feature {0}"),
                  compare("dbeta", mine["beta"], grads["beta"], TOL, "feature {0}"))
        return (f"dx, dgamma, dbeta pass the dot-product test (rel err {dot:.1e}) and match "
                f"refbraid's LayerNorm.adjoint (max rel err {err:.1e})")

    return run_check("07 layer-norm adjoint", body, quiet)


# ----------------------------------------------------------------------------- lesson 08
def check_implicit_gru_step(implicit_gru_step: Callable, quiet: bool = False) -> Verdict:
    """Lesson 08: ``implicit_gru_step(x, h, W_ih, W_hh, b_ih, b_hh, dt)`` → ``h_new`` (B, H):
    torch's GRU gates (order r, z, n) and ``h_new = (h + dt (1−z) ⊙ n) / (1 + dt (1−z))``."""

    def body() -> str:
        rng = np.random.default_rng(8)
        B, I, H = 4, 3, 5
        cell, bk = GRUCell(I, H, "implicit"), get_backend("numpy")
        p = cell.init(rng)
        p["x"] = rng.standard_normal((B, I))
        h = rng.standard_normal((B, H))
        worst = 0.0
        for dt in (0.5, 1.0, 8.0):  # 8: a coarse MGRIT step, where the classic cell fails
            expected, _ = cell.forward(p, h, dt, bk)
            got = call(implicit_gru_step, p["x"].copy(), h.copy(), p["W_ih"].copy(),
                       p["W_hh"].copy(), p["b_ih"].copy(), p["b_hh"].copy(), dt)
            where = f"dt = {dt:g}, sample {{0}}, unit {{1}}"
            worst = max(worst, compare("h_new", got, expected, TOL, where))
        return (f"h_new matches refbraid's implicit GRUCell for dt = 0.5, 1 and 8 (max rel err "
                f"{worst:.1e})")

    return run_check("08 implicit GRU step", body, quiet)
