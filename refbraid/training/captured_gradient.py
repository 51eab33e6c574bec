"""A gradient replayed from a CUDA graph: one launch per gradient on the ``cupy`` backend.

:func:`captured_gradient` wraps serial backprop (``settings="serial"``) or the
layer-parallel gradient (MGRIT forward and adjoint solves; ``settings`` None: TorchBraid's)
of a :class:`~refbraid.network.Network`. The first call with a given set of shapes and
dtypes records the gradient into a CUDA graph (:func:`refbraid.backends.graphs.record`) that
reads fixed input arrays; each call copies its parameters, batch and labels into those,
replays the graph and reads the results:

    check_inputs(params, x, labels)             eager: shapes, dtypes, finite values, labels
    static ← params, x, labels                  one copy each (skipped for the same array)
    graph.replay()                              every launch of the gradient, one host call
    loss ← host(loss), grads ← copies           the outputs, copied: the next replay rewrites
    MGRIT: settle() both solves                 norms and status read (one transfer a solve)

The gradient is the eager one's, launch for launch, with one difference in the
layer-parallel case: a recorded solve cannot stop early on a tolerance (it cannot read the
residual norm while it runs), so it always runs its ``max_iter`` cycles; a solve whose norm
met ``abs_tol``/``rel_tol`` earlier reports ``'converged'`` there and returns a further
iterated solution. With TorchBraid's settings in training the tolerance is never met early,
and the numbers are the eager gradient's (the ``gpu`` tests check both). Which sweeps run
(per step or batched, :func:`refbraid.backends.device_batching.sweeps_batched`) is what was
in force when the shape was recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends import Backend, get_backend
from ..backends.device_batching import DeviceCopies, copies_cached, gathers_cached, on_device
from ..backends.graphs import Recording, record
from ..backends.host import host_float
from ..input_checks import check_inputs
from ..layer_parallel import (
    LayerParallelInfo,
    LayerParallelSettings,
    as_settings,
    layer_parallel_gradient,
)
from ..mgrit import GradientWorkspace
from ..network import Network, backprop

Params = dict[str, Any]


def _fits(net) -> None:
    """ValueError unless ``net`` is a network a graph can record as it is."""
    if not isinstance(net, Network):
        raise ValueError(f"`net` must be a refbraid Network for a captured gradient, got "
                         f"{type(net).__name__} (sequence models run eagerly).")
    if getattr(net, "record_batch_stats", None) is not None:
        raise ValueError("a network with batch normalisation updates its running statistics "
                         "on the host after each step: its gradient runs eagerly.")
    if getattr(net.opening, "discrete_input", False):
        raise ValueError("a network reading token ids checks their range inside its forward "
                         "pass: its gradient runs eagerly.")


class CapturedGradient:
    """``gradient(params, x, labels) -> (loss, grads, stats)`` replayed from CUDA graphs
    (module docstring); one recording per set of input shapes and dtypes."""

    def __init__(self, net: Network, bk: Backend, settings: LayerParallelSettings | None):
        self.net, self.bk, self.settings = net, bk, settings
        self.recordings: dict[tuple, tuple[Recording, dict, Any, Any]] = {}

    def _body(self) -> Callable:
        """A fresh eager gradient (its own workspace and caches) for one recording."""
        net, bk, settings = self.net, self.bk, self.settings
        if settings is None:
            return lambda p, x, y: backprop(net, p, x, y, bk)
        workspace, copies = GradientWorkspace(), DeviceCopies()  # as mgrit_gradient's

        def layer_parallel(p, x, y):
            with copies_cached(copies), gathers_cached(on_device(bk)):
                return layer_parallel_gradient(net, p, x, y, settings, bk, workspace)

        return layer_parallel

    def _recording(self, params: Params, x, labels):
        key = (tuple((k, tuple(v.shape), str(v.dtype)) for k, v in params.items()),
               tuple(x.shape), str(x.dtype), tuple(labels.shape), str(labels.dtype))
        found = self.recordings.get(key)
        if found is None:
            xp = self.bk.xp
            static = {k: xp.array(v, copy=True) for k, v in params.items()}
            sx, sy = xp.array(x, copy=True), xp.array(labels, copy=True)
            body = self._body()
            try:
                recording = record(lambda: body(static, sx, sy), xp)
            except ValueError:
                raise
            except Exception as err:  # what a capture refused: say which gradient and why
                raise RuntimeError(
                    f"recording the gradient as a CUDA graph failed ({type(err).__name__}: "
                    f"{err}); the eager gradient (without --cuda-graphs) computes the same "
                    f"numbers.") from err
            found = (recording, static, sx, sy)
            self.recordings[key] = found
        return found

    def __call__(self, params: Params, x, labels):
        check_inputs(self.net, params, x, labels)
        rec, static, sx, sy = self._recording(params, x, labels)
        for k, v in params.items():
            if v is not static[k]:
                static[k][...] = v
        for mine, given in ((sx, x), (sy, labels)):
            if given is not mine:
                mine[...] = given
        loss, grads, info = rec.replay()
        grads = {k: v.copy() for k, v in grads.items()}
        stats: dict[str, float] = {}
        if isinstance(info, LayerParallelInfo):
            info.forward.settle()
            info.backward.settle()
            stats = info.stats()
        return host_float(loss), grads, stats


def captured_gradient(net: Network, bk: Backend | str = "cupy",
                      settings: LayerParallelSettings | None | str = "serial"
                      ) -> CapturedGradient:
    """Serial backprop (``settings="serial"``) or the layer-parallel gradient with
    ``settings`` (None: TorchBraid's) of ``net``, replayed from CUDA graphs on ``bk``
    (``cupy``, or the CuPy stand-in); module docstring."""
    bk = get_backend(bk)
    _fits(net)
    if settings == "serial":
        return CapturedGradient(net, bk, None)
    return CapturedGradient(net, bk, as_settings(settings))
