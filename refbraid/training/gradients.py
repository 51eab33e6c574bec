"""How a training step gets its gradient: the one place that chooses.

* :func:`sequential_gradient` — sequential backprop (the baseline, ``--serial``);
* :func:`mgrit_gradient` — layer-parallel: MGRIT forward and adjoint solves
  (:mod:`refbraid.layer_parallel`), with solver statistics, optionally the gradient
  error against backprop every k steps, and the MGRIT forward pass it trains (``.logits``);
* under ``mpiexec``, the one :mod:`refbraid.distributed.choose` picks for the run's flags
  (:func:`mpi_gradient`: the family's engine adapter, DASO, data × space × depth, the bias
  controller around it);
* ``--mgopt-levels``: one MG/Opt cycle per step (:mod:`refbraid.training.mgopt_step`).

Every gradient is a callable ``gradient(params, x, labels) -> (loss, grads, stats)``;
:func:`select_gradient` picks one from a :class:`~refbraid.training.config.TrainConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends import Backend, get_backend
from ..backends.device_batching import DeviceCopies, copies_cached, gathers_cached, on_device
from ..distributed import choose
from ..distributed.choose import MPIRun
from ..layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    mgrit_forward,
    relative_gradient_error,
)
from ..mgrit import GradientWorkspace, MGRITSettings, build_hierarchy
from ..mgrit.transfer import SpatialCoarsening
from ..network import Network, backprop, forward
from .config import TrainConfig

Params = dict[str, Any]
GradientFn = Callable[[Params, Any, Any], "tuple[float, Params, dict[str, Any]]"]


def sequential_gradient(net: Network, bk: Backend | str = "numpy") -> GradientFn:
    """The baseline gradient: sequential backprop (:func:`refbraid.network.backprop`)."""
    bk = get_backend(bk)

    def gradient(params, x, labels):
        loss, grads, info = _backprop(net, params, x, labels, bk)
        _record_batch_stats(net, info, bk)
        return loss, grads, {}

    return gradient


def _record_batch_stats(net, info, bk: Backend) -> None:
    """Once per training step: a model with batch norm folds the batch statistics of this
    step's (final fine) forward sweep into its running statistics (TorchBraid's rule)."""
    record = getattr(net, "record_batch_stats", None)
    if record is not None:
        record(info, bk)


def _backprop(net, params, x, labels, bk: Backend):
    """Sequential backprop of a Network, or of a sequence model (its own ``backprop``)."""
    if isinstance(net, Network):
        return backprop(net, params, x, labels, bk)
    return net.backprop(params, x, labels, bk)


def layer_parallel_settings(config: TrainConfig) -> LayerParallelSettings:
    """The MGRIT settings of the forward and adjoint solves from the ``refbraid train`` flags."""
    if config.levels == 1:
        return LayerParallelSettings.exact()

    def one(max_iter: int, tol: float) -> MGRITSettings:
        return MGRITSettings(levels=config.levels, cfactor=config.cfactor, max_iter=max_iter,
                             abs_tol=tol, rel_tol=None, relax=config.relax_per_level,
                             cycle=config.cycle, skip_first_down=config.skip_down, min_coarse=1)

    spatial = None
    if config.spatial_levels:
        spatial = SpatialCoarsening(config.spatial_level_tuple)
    return LayerParallelSettings(forward=one(config.fwd_iters, config.fwd_tol),
                                 backward=one(config.bwd_iters, config.bwd_tol),
                                 spatial=spatial)


def mgrit_gradient(net: Network, settings: LayerParallelSettings, bk: Backend | str = "numpy",
                   check_every: int = 0) -> GradientFn:
    """The layer-parallel gradient (MGRIT forward + adjoint solves), with solver stats.

    With ``check_every = k > 0``, every k-th call also runs sequential backprop and reports
    ``grad_error`` = ‖g_MGRIT − g_backprop‖ / ‖g_backprop‖ in the stats.
    """
    bk = get_backend(bk)
    calls = 0
    workspace = GradientWorkspace()  # the solves' arrays, reused by every call (info is
    # read only inside the call: the next call may overwrite its trajectories)
    copies = DeviceCopies()  # batched sweeps' index arrays: each copied to the device once

    def gradient(params, x, labels):
        nonlocal calls
        calls += 1
        with copies_cached(copies), gathers_cached(on_device(bk)):
            return _gradient(params, x, labels)

    def _gradient(params, x, labels):
        if isinstance(net, Network):
            loss, grads, info = layer_parallel_gradient(net, params, x, labels, settings, bk,
                                                        workspace)
        else:  # a sequence model (refbraid.sequence) brings its own MGRIT gradient
            loss, grads, info = net.layer_parallel_gradient(params, x, labels, settings, bk)
        _record_batch_stats(net, info, bk)
        stats = info.stats()
        if check_every and calls % check_every == 0:
            _, exact, _ = _backprop(net, params, x, labels, bk)
            stats["grad_error"] = relative_gradient_error(grads, exact, bk)
        return loss, grads, stats

    def logits(params, x):
        if not isinstance(net, Network):
            spatial = {"spatial": settings.spatial} if settings.spatial is not None else {}
            return net.mgrit_logits(params, x, settings.forward, bk, **spatial)
        return mgrit_forward(net, params, x, settings.forward, bk,
                             transfer=settings.forward_transfer)[0]

    gradient.logits = logits  # the forward pass this gradient trains: used for accuracy
    return gradient


def select_gradient(config: TrainConfig, net: Network, bk: Backend, multilevel: bool = True
                    ) -> tuple[str, GradientFn]:
    """The one place that chooses how gradients are computed: (name, gradient).

    ``--serial``: sequential backprop; otherwise layer-parallel MGRIT with the settings of
    :func:`layer_parallel_settings` (checked against the network depth here, before training).
    ``--mgopt-levels``: one MG/Opt cycle per step (:mod:`refbraid.training.mgopt_step`), whose
    levels use the choice above (``multilevel=False``).
    """
    if multilevel and config.mgopt_levels:  # one MG/Opt cycle in depth per step
        from .mgopt_step import check_mgopt, mgopt_gradient

        check_mgopt(config, net)
        fine = select_gradient(config, net, bk, multilevel=False)  # errors if unfit
        return "mgopt", mgopt_gradient(config, net, fine,
                                       lambda n: depth_gradient(config, n, bk)[1])
    if mpi_run(config).distributed():  # under mpiexec (or split): refbraid.distributed's
        settings = LayerParallelSettings.exact() if config.serial else \
            layer_parallel_settings(config)
        return mpi_gradient(config, net, settings, bk)
    if config.cuda_graphs:
        return graphed_gradient(config, net, bk)
    if config.serial:
        return "sequential", sequential_gradient(net, bk)
    settings = layer_parallel_settings(config)
    check_levels_fit(config, net)
    if config.bias_control != "off":
        return "layer-parallel-bias-control", controlled_gradient(net, settings, bk, config)
    return "layer-parallel", mgrit_gradient(net, settings, bk, config.check_gradient_every)


def graphed_gradient(config: TrainConfig, net: Network, bk: Backend) -> tuple[str, GradientFn]:
    """``--cuda-graphs``: the serial or layer-parallel gradient replayed from CUDA graphs
    (:mod:`refbraid.training.captured_gradient`), with the eager MGRIT forward pass for
    accuracy. ValueError unless the backend is ``cupy``."""
    from .captured_gradient import captured_gradient

    if bk.name != "cupy":
        raise ValueError(f"`--cuda-graphs` needs `--backend cupy` (CUDA graphs are recorded "
                         f"from CuPy's stream), got `--backend {bk.name}`.")
    if config.serial:
        return "sequential-cuda-graph", captured_gradient(net, bk, "serial")
    settings = layer_parallel_settings(config)
    check_levels_fit(config, net)
    gradient = captured_gradient(net, bk, settings)
    gradient.logits = mgrit_gradient(net, settings, bk).logits
    return "layer-parallel-cuda-graph", gradient


def check_levels_fit(config: TrainConfig, net) -> None:
    """ValueError naming ``--levels``, ``--cfactor`` and the grid unless the MGRIT hierarchy
    fits the time grid (the layers; the sequence positions for the GRUs)."""
    settings = layer_parallel_settings(config)
    try:
        build_hierarchy(net.n_layers, settings.forward.cfactors, settings.forward.min_coarse)
    except ValueError as err:
        if config.model in ("gru", "implicit-gru"):  # MGRIT over the sequence positions
            grid = (f"the sequence length {net.seq_len} of `--data {config.data}` (the "
                    f"{config.model} model runs MGRIT over the sequence positions)")
            longer = "data with longer sequences"
        else:
            grid, longer = f"`--layers {config.layers}`", "more layers"
        raise ValueError(f"`--levels {config.levels}` with `--cfactor {config.cfactor}` does not "
                         f"fit {grid}: {err} Use fewer levels, a smaller cfactor, {longer}, "
                         f"or --serial.") from None


def depth_gradient(config: TrainConfig, net: Network, bk: Backend) -> tuple[str, GradientFn]:
    """(name, gradient) for ``net`` (a shallower copy: MG/Opt's coarse levels, nested
    initialisation) with the run's settings; sequential backprop where the MGRIT hierarchy
    does not fit its depth."""
    try:
        return select_gradient(config, net, bk, multilevel=False)
    except ValueError:
        return "sequential", sequential_gradient(net, bk)


def controlled_gradient(net, settings: LayerParallelSettings, bk: Backend,
                        config: TrainConfig):
    """The layer-parallel gradient under ``--bias-control`` (refbraid.bias_control)."""
    from ..bias_control import BiasControl, ControlledGradient

    control = BiasControl(config.bias_control, config.bias_every, config.bias_threshold,
                          config.bias_micro, config.bias_max_iters, config.bias_signal,
                          config.bias_residual)

    def backprop_fn(params, x, labels):
        return _backprop(net, params, x, labels, bk)

    workspace = GradientWorkspace()  # as mgrit_gradient: ``info`` is read inside the call only

    def layer_parallel_fn(params, x, labels, s):
        if isinstance(net, Network):
            return layer_parallel_gradient(net, params, x, labels, s, bk, workspace=workspace)
        return net.layer_parallel_gradient(params, x, labels, s, bk)

    def sequential_logits(params, x):
        if isinstance(net, Network):
            return forward(net, params, x, bk, keep=False)[0]
        return net.logits(params, x, bk)

    def mgrit_logits(params, x, s):
        if isinstance(net, Network):
            return mgrit_forward(net, params, x, s, bk, transfer=settings.forward_transfer)[0]
        spatial = {"spatial": settings.spatial} if settings.spatial is not None else {}
        return net.mgrit_logits(params, x, s, bk, **spatial)

    say = (lambda *a, **k: None) if config.quiet else print
    layers = getattr(net, "layers", net.n_layers)  # all steps (a GPT's buffers included)
    return ControlledGradient(backprop_fn, layer_parallel_fn, (sequential_logits, mgrit_logits),
                              settings, control, layers, bk, say=say,
                              serial_steps=layers - net.n_layers,
                              record=lambda info: _record_batch_stats(net, info, bk))


# ----------------------------------------------------------------------------- under mpiexec
def mpi_run(config: TrainConfig) -> MPIRun:
    """The flags that choose an MPI gradient (:mod:`refbraid.distributed.choose`)."""
    return MPIRun(config.model, config.data_parallel, config.space_parallel, config.dp_groups,
                  config.global_sync_every, config.epochs, config.bias_control != "off",
                  bool(config.mgopt_levels))


def mpi_backend(config: TrainConfig, net, bk: Backend, say=None) -> Backend:
    """The backend of a run under mpiexec (:func:`refbraid.distributed.choose.mpi_backend`)."""
    return choose.mpi_backend(mpi_run(config), net, bk, say)


def mpi_gradient(config: TrainConfig, net, settings: LayerParallelSettings,
                 bk: Backend) -> tuple[str, Any]:
    """(name, gradient) under mpiexec: :func:`refbraid.distributed.choose.mpi_gradient`, with
    this run's bias controller. Collective: every rank calls it."""
    return choose.mpi_gradient(mpi_run(config), net, settings, bk,
                               lambda: controlled_gradient(net, settings, bk, config))
