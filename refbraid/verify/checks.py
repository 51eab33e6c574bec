"""The checks every adjoint must pass: dot-product test, central differences, backend vs NumPy.

For a map ``out = f(θ, x)`` (an :class:`~refbraid.verify.ops.StepOp`, ``LayerOp`` or
``NetworkOp``), a random cotangent ``w`` (shape of ``out``) and the backend's adjoint
``(dx, dθ) = adjoint(w)``, each differentiable argument ``a`` (the input, then every
parameter array but those the layer holds fixed, its ``constant_entries``) is checked three
ways:

1. dot-product test ``<J_a u, w> = <u, J_aᵀ w>`` for a random direction ``u``; ``J_a u`` is
   the complex-step tangent on the NumPy reference in complex128 (refbraid.verify.probes),
   ``J_aᵀ w`` the backend's adjoint: state and each parameter separately (``dot:a``);
2. central differences of ``<f, w>`` at ``N_FD`` sampled entries of ``a`` against the
   backend's adjoint, float64 only (``fd:a``); the differences evaluate the NumPy reference
   (the backend's own forward is tied to it by check 3, and the CUDA simulator is too slow for
   hundreds of evaluations); samples with a relu kink within the step are replaced;
3. backend against the NumPy reference at the same dtype: ``out`` and every adjoint output
   (``numpy:out``, ``numpy:da``), skipped on the reference itself.

Shape legend: B batch; the rest of each shape is the layer's own (``state_shape``,
``in_shape``/``out_shape``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..input_checks import check_batch
from ..layers.init import check_positive_int
from ..network import Network, init_params
from .ops import LayerOp, NetworkOp, StepOp
from .probes import Args, central_difference, complex_step_tangent
from .result import (
    CheckResult,
    array_rel_error,
    compare_arrays,
    dot_rel_error,
    result,
    tolerance,
)

N_FD = 4  # sampled entries per argument for central differences
KINK_TOL = 1e-3  # one-sided differences disagreeing by more than this (relative) = a kink


def _on(bk: Backend, params: Args) -> dict[str, Any]:
    return {k: bk.asarray(v) for k, v in params.items()}


def run_forward(op, params: Args, x: np.ndarray, bk: Backend):
    """(out on the host, cache) of ``op`` on backend ``bk`` from host arrays."""
    out, cache = op.forward(_on(bk, params), bk.asarray(x), bk)
    return bk.to_numpy(out), cache


def run_adjoint(op, params: Args, cache, w: np.ndarray, bk: Backend) -> Args:
    """The adjoint outputs on the host, keyed by argument: the input first, then θ."""
    dx, dparams = op.adjoint(_on(bk, params), cache, bk.asarray(w), bk)
    grads = {op.input_name: bk.to_numpy(dx)} if op.differentiate_input else {}
    grads.update({k: bk.to_numpy(v) for k, v in (dparams or {}).items()})
    return grads


def constant_entries(op) -> tuple[str, ...]:
    """Params entries held fixed (no gradient): the op's own ``constant_entries`` (a network)
    or its layer's (a step or plain layer; e.g. batch norm's running statistics in eval)."""
    owner = op if hasattr(op, "constant_entries") else (
        getattr(op, "step", None) or getattr(op, "layer", None))
    return tuple(getattr(owner, "constant_entries", ()))


def _layout_errors(op, params: Args, x: np.ndarray, grads: Args) -> list[str]:
    """What is wrong with the keys and shapes the adjoint returned (empty when nothing)."""
    want = ({op.input_name: x.shape} if op.differentiate_input else {})
    fixed = constant_entries(op)
    want.update({k: v.shape for k, v in params.items() if k not in fixed})
    if set(grads) != set(want):
        return [f"adjoint returned arguments {sorted(grads)}, expected {sorted(want)}"]
    return [f"`d{k}` has shape {grads[k].shape}, expected {s}"
            for k, s in want.items() if grads[k].shape != s]


def check_op(op, name: str, params: Args, x: np.ndarray, backend: str | Backend = "numpy",
             dtype=np.float64, seed: int = 0, n_fd: int = N_FD) -> list[CheckResult]:
    """Run the three checks on ``op`` at the point (params, x) (host arrays in ``dtype``)."""
    bk, ref = get_backend(backend), get_backend("numpy")
    tol_dot, tol_ref = tolerance(dtype, "dot"), tolerance(dtype, "numpy")
    rng = np.random.default_rng([seed, 7])
    out, cache = run_forward(op, params, x, bk)
    w = np.asarray(rng.standard_normal(out.shape), dtype=dtype)  # cotangent, shape of out
    grads = run_adjoint(op, params, cache, w, bk)
    problems = _layout_errors(op, params, x, grads)
    if problems:
        return [result(name, "adjoint:layout", bk.name, dtype, np.inf, 0.0, "; ".join(problems))]
    args = {**params, op.input_name: x}

    def f_on(b: Backend) -> Callable[[Args], np.ndarray]:
        def f(a: Args) -> np.ndarray:
            p = {k: a[k] for k in params}
            return run_forward(op, p, a[op.input_name], b)[0]
        return f

    results = []
    for arg, g in grads.items():  # 1. dot-product test against the complex-step tangent
        u = rng.standard_normal(g.shape)
        tangent = complex_step_tangent(f_on(ref), args, arg, u)  # J u
        err, lhs, rhs = dot_rel_error(tangent * w, u * g)
        results.append(result(name, f"dot:{arg}", bk.name, dtype, err, tol_dot,
                              f"`{arg}`: <J u, w> = {lhs:.17g} but <u, Jᵀw> = {rhs:.17g}"))
    if np.dtype(dtype) == np.float64:  # 2. central differences of the reference map
        tol_fd = tolerance(dtype, "fd")
        f0 = out if bk.name == "numpy" else f_on(ref)(args)
        for arg, g in grads.items():
            err, detail = _fd_worst(f_on(ref), args, arg, g, w, f0, rng, n_fd, tol_fd)
            results.append(result(name, f"fd:{arg}", bk.name, dtype, err, tol_fd, detail))
    if bk.name != "numpy":  # 3. backend against the reference
        out_r, cache_r = run_forward(op, params, x, ref)
        grads_r = run_adjoint(op, params, cache_r, w, ref)
        for label, a, r in [("out", out, out_r)] + [(f"d{k}", grads[k], grads_r[k]) for k in grads]:
            results.append(compare_arrays(name, f"numpy:{label}", bk.name, dtype, label, a, r,
                                          tol_ref, (bk.name, "numpy")))
    return results


def _fd_worst(f, args: Args, arg: str, g: np.ndarray, w: np.ndarray, f0: np.ndarray,
              rng: np.random.Generator, n_fd: int, tol: float) -> tuple[float, str]:
    """Worst relative error of central differences at ``n_fd`` entries away from kinks.

    err_k = |fd_k − g_k| / max(|fd_k|, |g_k|, noise_k / tol): an entry so small that the
    round-off of its difference (noise_k, see probes.Difference) exceeds tol·|g_k| is held to
    that round-off instead. An entry is replaced by another when a relu kink lies within its
    step: its one-sided differences disagree (kink > KINK_TOL, a kink near the centre) or
    halving the step changes fd_k by more than tol (a kink near the end of the step).
    """
    worst, detail, done, kinks = 0.0, "", 0, 0
    for flat in rng.permutation(g.size):
        if done == n_fd:
            break
        idx = tuple(int(i) for i in np.unravel_index(int(flat), g.shape))
        fd = central_difference(f, args, arg, idx, w, f0)
        half = central_difference(f, args, arg, idx, w, f0, fraction=0.5)
        gk = float(g[idx])
        size = max(abs(fd.value), abs(gk), half.noise / tol)
        if fd.kink > KINK_TOL * size or abs(fd.value - half.value) > tol * size:
            kinks += 1
            continue
        err = abs(fd.value - gk) / size
        if err >= worst:
            worst = err
            detail = f"`{arg}`{list(idx)}: adjoint {gk:.17g} vs central difference {fd.value:.17g}"
        done += 1
    if done == 0 and g.size:
        return np.inf, (f"`{arg}`: none of {kinks} sampled entries gave a converged central "
                        "difference (kinks or strong curvature within the step)")
    return worst, detail


# ----------------------------------------------------------------------------- entry points
def example_input(layer, rng: np.random.Generator, batch: int, shape, dtype) -> np.ndarray:
    """layer.example_input(rng, batch) when the layer has one, else N(0, 1) of (B, *shape)."""
    if hasattr(layer, "example_input"):
        x = np.asarray(layer.example_input(rng, batch))
        return x.astype(dtype) if x.dtype.kind == "f" else x
    if getattr(layer, "discrete_input", False):
        return rng.integers(0, 2, size=(batch, *shape))
    return np.asarray(rng.standard_normal((batch, *shape)), dtype=dtype)


def _require(obj, what: str, argument: str, attributes: tuple[str, ...]) -> None:
    missing = [a for a in attributes if not hasattr(obj, a)]
    if missing:
        raise TypeError(f"`{argument}` must be {what} (with {', '.join(attributes)}); "
                        f"{type(obj).__name__} lacks {', '.join(missing)}.")


def _check_h(h: float) -> float:
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not np.isfinite(h) or h <= 0:
        raise ValueError(f"`h` must be a positive finite number, got {h!r}.")
    return float(h)


def check_step(step, backend: str | Backend = "numpy", dtype=np.float64, batch: int = 3,
               seed: int = 0, h: float = 0.3, *, name: str | None = None,
               n_fd: int = N_FD) -> list[CheckResult]:
    """Check an ODE step ``y_next = Φ(θ, y)``: dot-product and FD tests of ``adjoint``,
    ``adjoint(grads=False)`` against ``grads=True`` (``nograd:dy``), backend vs NumPy."""
    _require(step, "an ODE step", "step", ("state_shape", "init", "forward", "adjoint"))
    check_positive_int("batch", batch)
    check_positive_int("n_fd", n_fd)
    h = _check_h(h)
    name = name or type(step).__name__
    tol_ref = tolerance(dtype, "numpy")
    bk = get_backend(backend)
    rng = np.random.default_rng(seed)
    params = step.init(rng, dtype)
    y = example_input(step, rng, batch, tuple(step.state_shape), dtype)
    results = check_op(StepOp(step, h), name, params, y, bk, dtype, seed, n_fd)
    # the state-only adjoint (what an MGRIT adjoint sweep calls) must give the same dy
    _, cache = run_forward(StepOp(step, h), params, y, bk)
    dy_next = bk.asarray(np.asarray(rng.standard_normal(y.shape), dtype=dtype))
    p = _on(bk, params)
    full, _ = step.adjoint(p, cache, dy_next, h, bk, grads=True)
    bare, _ = step.adjoint(p, cache, dy_next, h, bk, grads=False)
    err, idx = array_rel_error(bk.to_numpy(bare), bk.to_numpy(full))
    results.append(result(name, "nograd:dy", bk.name, dtype, err, tol_ref,
                          f"`dy`{list(idx)}: grads=False and grads=True disagree"))
    return results


def check_layer(layer, backend: str | Backend = "numpy", dtype=np.float64, batch: int = 3,
                seed: int = 0, *, name: str | None = None,
                n_fd: int = N_FD) -> list[CheckResult]:
    """Check a plain layer ``out = f(θ, x)``: dot-product and FD tests, backend vs NumPy.

    A layer with ``discrete_input = True`` (integer x) gets no dx checks; its inputs come
    from ``layer.example_input(rng, batch)`` when it has one.
    """
    _require(layer, "a plain layer", "layer", ("in_shape", "init", "forward", "adjoint"))
    check_positive_int("batch", batch)
    check_positive_int("n_fd", n_fd)
    name = name or type(layer).__name__
    rng = np.random.default_rng(seed)
    params = layer.init(rng, dtype)
    x = example_input(layer, rng, batch, tuple(layer.in_shape), dtype)
    return check_op(LayerOp(layer), name, params, x, backend, dtype, seed, n_fd)


def check_network(net: Network, backend: str | Backend = "numpy", dtype=np.float64,
                  batch: int = 4, seed: int = 0, *, name: str | None = None,
                  n_fd: int = N_FD) -> list[CheckResult]:
    """Check the loss gradient of a whole network (sequential backprop, refbraid.network).

    Every parameter array: dot-product test against the complex-step directional derivative
    of the loss, central differences of the loss at sampled entries; backend vs NumPy.
    """
    if not isinstance(net, Network):
        raise TypeError(f"`net` must be a refbraid.network.Network, got {type(net).__name__}.")
    check_positive_int("batch", batch)
    check_positive_int("n_fd", n_fd)
    rng = np.random.default_rng(seed)
    params = init_params(net, rng, dtype)
    x = example_input(net.opening, rng, batch, tuple(net.opening.in_shape), dtype)
    labels = rng.integers(0, net.closing.out_shape[0], size=batch)
    check_batch(net, x, labels)
    op = NetworkOp(net, labels)
    return check_op(op, name or "network", params, x, backend, dtype, seed, n_fd)
