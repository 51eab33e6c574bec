"""Layer-parallel gradient: MGRIT forward solve, MGRIT adjoint solve, gradient from the last.

The ODE block of a :class:`~refbraid.network.Network` is the time-stepping problem
(docs/references.md §1–2, TorchBraid's coarse levels)::

    forward   y[0] = opening(x),        y[i] = Φ(y[i-1]; i-1 → i)
              Φ(y; a → b) = y + (b − a)·h·F(θ_a, y)    (coarse: step (b−a)h, weights of layer a)
    adjoint   λ[N] = ∂L/∂y[N],          λ[i] = Ψ(λ[i+1]; i+1 → i)
              Ψ(λ; b → a) = Φ'(y[a]; a → b)ᵀ λ          (linearised at the forward state y[a])
    gradient  ∂L/∂θ_n = (∂Φ(y[n]; n → n+1)/∂θ_n)ᵀ λ[n+1],   n = 0..N-1

Both recurrences are solved by :func:`refbraid.mgrit.solve` (the adjoint on the reversed grid).
The gradient of layer n needs only ``y[n]`` and ``λ[n+1]``, and it is what the *fine* adjoint
step n+1 → n yields besides ``λ[n]`` (``step.adjoint(..., grads=True)``). The solve's last
relaxation on the finest level makes every fine step from the final iterate (F-relaxation into
the F-points, the residual's step into the C-points), so :class:`CapturingAdjoint` keeps the
gradient rows from it, linearised at the forward caches :class:`CachingForward` kept from the
forward solve's last relaxation: no extra pass over the layers, as TorchBraid takes its
gradient from the final relaxation. Since every layer uses the fine adjoint, a converged MGRIT
adjoint gives sequential backprop's gradient to round-off. With inexact solves, the gradient
is that of the approximate trajectory: the error ``refbraid verify --layer-parallel`` measures.

With one MGRIT level both solves are sequential substitutions and the result equals
:func:`refbraid.network.backprop` to round-off.

Where it sits: the layer-parallel peer of :mod:`refbraid.network`'s sequential backprop; the
step functions :class:`refbraid.mgrit.Problem` takes are :mod:`refbraid.propagators`' (re-exported
here). The sequence models (:mod:`refbraid.sequence`) and
training (:mod:`refbraid.training`) both build on it; it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .backends import Backend, get_backend
from .backends.capture_state import is_recording_graph
from .backends.host import loss_value
from .input_checks import check_inputs
from .mgrit import GradientWorkspace, MGRITResult, MGRITSettings, Problem, solve
from .mgrit.transfer import SpatialCoarsening
from .network import Network, Params, group, set_rows_from
from .propagators import (  # noqa: F401  (the propagators: re-exported)
    AdjointPropagator,
    CachingForward,
    CapturingAdjoint,
    ForwardPropagator,
    batchable,
)
from .relative_error import relative_gradient_error  # noqa: F401  (re-exported)


def _default_forward() -> MGRITSettings:
    # TorchBraid's examples: 3 levels, cfactor 4, 2 forward iterations (skip + 1 cycle here).
    return MGRITSettings.torchbraid(max_iter=1)


def _default_backward() -> MGRITSettings:
    # ... and 1 backward iteration (the skipped down-cycle, then relaxation and measurement).
    return MGRITSettings.torchbraid(max_iter=0)


@dataclass(frozen=True)
class LayerParallelSettings:
    """MGRIT settings for the forward and the adjoint solve (TorchBraid's defaults).

    ``spatial`` (a :class:`~refbraid.mgrit.transfer.SpatialCoarsening`, or None) makes the
    listed coarse levels run on coarser feature maps: the forward solve uses its (R, P), the
    adjoint solve the transposed pair (docs/coarsening.md).
    """

    forward: MGRITSettings = field(default_factory=_default_forward)
    backward: MGRITSettings = field(default_factory=_default_backward)
    spatial: SpatialCoarsening | None = None

    def __post_init__(self):
        for name in ("forward", "backward"):
            if not isinstance(getattr(self, name), MGRITSettings):
                raise TypeError(f"`{name}` must be an MGRITSettings, got {getattr(self, name)!r}.")
        if self.spatial is not None and not isinstance(self.spatial, SpatialCoarsening):
            raise TypeError(f"`spatial` must be a SpatialCoarsening or None, got "
                            f"{self.spatial!r}.")

    @property
    def forward_transfer(self) -> SpatialCoarsening | None:
        return self.spatial

    @property
    def backward_transfer(self) -> SpatialCoarsening | None:
        return None if self.spatial is None else self.spatial.transposed()

    @classmethod
    def exact(cls) -> LayerParallelSettings:
        """One level each way: sequential substitution, the exactness baseline."""
        one = MGRITSettings(levels=1)
        return cls(forward=one, backward=one)

    @classmethod
    def with_iterations(cls, forward: int, backward: int, **common) -> LayerParallelSettings:
        """TorchBraid-like hierarchy with fixed iteration counts (tolerances off)."""
        base = dict(abs_tol=None, rel_tol=None, skip_first_down=False)
        base.update(common)
        return cls(
            forward=MGRITSettings.torchbraid(max_iter=forward, **base),
            backward=MGRITSettings.torchbraid(max_iter=backward, **base),
        )


# ----------------------------------------------------------------------------- the two problems
def forward_problem(net: Network, steps: dict[str, Any], y0, bk: Backend) -> Problem:
    return Problem(step=ForwardPropagator(net, steps, bk), u0=y0, n_steps=net.n_layers)


def adjoint_problem(net: Network, steps: dict[str, Any], states, lam_N, bk: Backend) -> Problem:
    prop = AdjointPropagator(net, steps, states, bk)
    return Problem(step=prop, u0=lam_N, n_steps=net.n_layers, direction="backward")


def as_settings(settings: LayerParallelSettings | None) -> LayerParallelSettings:
    """``settings``, TorchBraid's defaults for None; TypeError naming ``settings`` otherwise."""
    if settings is None:
        return LayerParallelSettings()
    if not isinstance(settings, LayerParallelSettings):
        raise TypeError(f"`settings` must be a LayerParallelSettings, got "
                        f"{type(settings).__name__}.")
    return settings


# ----------------------------------------------------------------------------- the gradient
@dataclass
class LayerParallelInfo:
    """What one layer-parallel gradient leaves behind: both MGRIT records and the trajectories."""

    forward: MGRITResult
    backward: MGRITResult
    states: Any
    adjoints: Any
    logits: Any

    def stats(self) -> dict[str, float]:
        """Numbers for the training log: final fine C-point residual norms and cycles of each
        solve, and Φ applications of both solves (the parameter gradient comes with them)."""
        f, b = self.forward, self.backward
        return {"fwd_res": float(f.norms[-1]), "fwd_iters": float(f.iterations),
                "bwd_res": float(b.norms[-1]), "bwd_iters": float(b.iterations),
                "phi_calls": float(f.total_steps + b.total_steps)}


def captured_gradient(adjoint: CapturingAdjoint, steps: dict[str, Any], layers) -> dict:
    """The stacked ``steps.*`` gradient rows ``(∂Φ_a/∂θ_a)ᵀ λ[a+1]`` of ``layers`` that the
    adjoint solve's final relaxation captured (rows of other layers stay zero; where
    ``layers`` are all of them, nothing is zeroed first: on a GPU a launch per weight)."""
    missing = [int(a) for a in layers if int(a) not in adjoint.grads]
    if missing:  # cannot happen: the final relaxation makes every fine adjoint step
        raise RuntimeError(f"no captured gradient for layers {missing[:8]}.")
    rows = [int(a) for a in layers]
    xp, captured = adjoint.bk.xp, len(set(rows))
    dsteps = {k: (xp.empty_like(v) if captured == v.shape[0] else xp.zeros_like(v))
              for k, v in steps.items()}
    if is_recording_graph():  # a row assignment each would be one graph node per row
        rows = place_batched_runs(dsteps, rows, adjoint.grad_batches)
    for k, v in dsteps.items():
        set_rows_from(v, rows, [adjoint.grads[a][k] for a in rows])
    return dsteps


def strided_runs(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``(j, a)`` pairs sorted by ``j`` cut into maximal runs along which ``j`` steps by 1 and
    ``a`` by one constant nonzero stride: each run is ``d[j0 : j1 + 1]`` ↔ ``a0, a0 + s, …``."""
    runs: list[list[tuple[int, int]]] = []
    for j, a in pairs:
        run = runs[-1] if runs else None
        if run and j == run[-1][0] + 1 and a != run[-1][1] and \
                (len(run) == 1 or a - run[-1][1] == run[1][1] - run[0][1]):
            run.append((j, a))
        else:
            runs.append([(j, a)])
    return runs


def place_batched_runs(dsteps: dict[str, Any], rows: list[int], batches: dict) -> list[int]:
    """Write the gradient rows of ``rows`` that batched adjoint calls made, one strided block
    per run of a batch (:func:`strided_runs`): ``dsteps[k][a0 : a1 + 1 : s] = d[k][j0 : j1 +
    1]`` (reversed when ``s < 0``), one launch per run and parameter instead of one per row.
    ``batches``: layer a → (the batch's gradient dict d, row j), for the rows whose latest
    gradient came from a batched call (:class:`CapturingAdjoint`). Returns the rows left
    (per-step gradients, runs of one), to be placed row by row."""
    by_batch: dict[int, tuple[dict, list[tuple[int, int]]]] = {}
    rest = []
    for a in rows:
        if a in batches:
            d, j = batches[a]
            by_batch.setdefault(id(d), (d, []))[1].append((j, a))
        else:
            rest.append(a)
    for d, pairs in by_batch.values():
        for run in strided_runs(sorted(pairs)):
            if len(run) < 2:
                rest.extend(a for _, a in run)
                continue
            (j0, a0), (j1, a1) = run[0], run[-1]
            s = run[1][1] - a0
            if s > 0:
                target, source = slice(a0, a1 + 1, s), slice(j0, j1 + 1)
            else:  # a falls as j rises: the same rows, both read backwards
                target, source = slice(a1, a0 + 1, -s), slice(j1, j0 - 1 if j0 else None, -1)
            for k, v in dsteps.items():
                v[target, ...] = d[k][source, ...]
    return rest


def mgrit_forward(net: Network, params: Params, x, settings: MGRITSettings,
                  bk: Backend | str = "numpy", propagator: ForwardPropagator | None = None,
                  transfer=None):
    """The network's forward pass with the ODE block solved by MGRIT.

    Returns (logits, the MGRIT result — its ``solution`` is y[0..N] —, (opening cache,
    closing cache)). This is the network a layer-parallel run trains, so it is also the one
    its accuracy is measured with (as TorchBraid does). ``propagator`` (e.g. a
    :class:`CachingForward`) replaces the plain :class:`ForwardPropagator`; ``transfer`` is
    the spatial transfer (``LayerParallelSettings.forward_transfer``). ``params`` and ``x``
    are checked first (:func:`refbraid.input_checks.check_inputs`).
    """
    bk = get_backend(bk)
    check_inputs(net, params, x)
    return _mgrit_forward(net, params, x, settings, bk, propagator, transfer)


def _mgrit_forward(net: Network, params: Params, x, settings: MGRITSettings, bk: Backend,
                   propagator: ForwardPropagator | None = None, transfer=None, workspace=None):
    """:func:`mgrit_forward` without the checks (for callers that have made them)."""
    y0, open_cache = net.opening.forward(group(params, "opening"), x, bk)
    prop = propagator or ForwardPropagator(net, group(params, "steps"), bk)
    fwd = solve(Problem(prop, y0, net.n_layers, transfer=transfer), settings, workspace=workspace)
    logits, close_cache = net.closing.forward(group(params, "closing"), fwd.solution[-1, ...], bk)
    return logits, fwd, (open_cache, close_cache)


def layer_parallel_gradient(
    net: Network,
    params: Params,
    x,
    labels,
    settings: LayerParallelSettings | None = None,
    bk: Backend | str = "numpy",
    workspace: GradientWorkspace | None = None,
) -> tuple[float, Params, LayerParallelInfo]:
    """Loss and gradient with MGRIT forward and adjoint solves (see the module docstring).

    Returns (loss, grads keyed like params, info). ``workspace``: arrays both solves reuse (a
    GradientWorkspace; the next call with it overwrites info's trajectories). The loss is
    evaluated on the MGRIT forward solution, the gradient is the exact gradient of that
    approximate forward pass when the adjoint solve has converged. ``params``, ``x`` and
    ``labels`` are checked first (:func:`refbraid.input_checks.check_inputs`).
    """
    bk = get_backend(bk)
    settings = as_settings(settings)
    check_inputs(net, params, x, labels)
    steps = group(params, "steps")
    forward = CachingForward(net, steps, bk)
    logits, fwd, (open_cache, close_cache) = _mgrit_forward(
        net, params, x, settings.forward, bk, forward, settings.forward_transfer,
        workspace and workspace.forward)
    states = fwd.solution  # (N + 1, *S)
    loss, probs = bk.softmax_cross_entropy(logits, labels)
    dlogits = bk.softmax_cross_entropy_adjoint(probs, labels, 1.0)
    lam_N, dclose = net.closing.adjoint(group(params, "closing"), close_cache, dlogits, bk)
    restriction = settings.spatial.restriction if settings.spatial else "average"
    adjoint = CapturingAdjoint(net, steps, states, forward.caches, bk, restriction,
                               forward.origins)
    bwd = solve(Problem(adjoint, lam_N, net.n_layers, direction="backward",
                        transfer=settings.backward_transfer), settings.backward,
                workspace=workspace and workspace.backward)
    adjoints = bwd.solution  # (N + 1, *S), fine order
    dsteps = captured_gradient(adjoint, steps, range(net.n_layers))
    _, dopen = net.opening.adjoint(group(params, "opening"), open_cache, adjoints[0, ...], bk)
    grads = {f"opening.{k}": v for k, v in dopen.items()}
    grads.update({f"steps.{k}": v for k, v in dsteps.items()})
    grads.update({f"closing.{k}": v for k, v in dclose.items()})
    info = LayerParallelInfo(fwd, bwd, states, adjoints, logits)
    return loss_value(loss), {k: grads[k] for k in params}, info
