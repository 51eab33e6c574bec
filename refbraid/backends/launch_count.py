"""Launches, copies, synchronisations and the critical path of one gradient on a GPU backend,
counted on the CPU (:mod:`.launch_model` defines each count).

``counting_backend("cupy")`` is the ``cupy`` backend's code (the reference kernels and the
cupy overrides) on the CuPy-like stand-in (:mod:`.cupy_standin`), which counts while a tracker
is active (:mod:`.standin_array`): every CuPy operation the backend would execute is one
counted launch, and the arithmetic is NumPy's.
``counting_backend("cuda")`` is the ``cuda`` backend in Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1`` before Numba is imported) with its glue arrays on the same
stand-in: each Numba kernel launch and each glue operation is counted (the glue is
CuPy on a GPU), and the Numba kernels read and write the counting arrays' memory in place.

:func:`count` runs a function under a tracker and returns its
:class:`~refbraid.backends.launch_model.Tally`; :func:`gradient_counts` builds the dense,
conv, transformer or GRU network (CI-sized widths), and counts one gradient of serial backprop,
layer-parallel with per-step sweeps, and layer-parallel with batched sweeps
(:func:`refbraid.backends.device_batching.sweeps_batched`). Everything is deterministic:
counts, not times.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from . import Backend, cupy_standin, get_backend
from .cupy_standin import ndarray
from .launch_model import Tally, current, tracking

MODELS = ("dense", "conv", "transformer", "gru")
MODES = ("serial", "lp-per-step", "lp-batched")


def counting_backend(name: str) -> Backend:
    """``"cupy"`` or ``"cuda"`` with arrays on the CuPy stand-in (module docstring); use
    inside :func:`counting` (cuda: the simulator's kernels are pointed at the counted memory
    there)."""
    from . import assemble

    if name == "cupy":
        return assemble("cupy", cupy_standin.module())
    if name == "cuda":
        from .numba_cuda import simulated

        if not simulated():
            raise ValueError("counting the `cuda` backend needs Numba's CUDA simulator: set "
                             "NUMBA_ENABLE_CUDASIM=1 before importing numba.")
        cuda = get_backend("cuda")
        return Backend("cuda", cupy_standin.module(), cuda.kernels, cuda.overrides)
    raise ValueError(f"`name` must be 'cupy' or 'cuda', got {name!r}.")


def _is_counted(a) -> bool:
    return isinstance(a, ndarray)


@contextmanager
def _numba_on_counted_memory() -> Iterator[None]:
    """Point the cuda backend's kernel wrappers (numba_cuda_memory) at the CuPy stand-in,
    and report each simulated kernel launch: it reads its array arguments and writes those
    that are outputs of the wrapper call (``KernelCall.out``) not yet handed back."""
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from . import numba_cuda_memory as mem

    live: set[int] = set()  # memory addresses of outputs being written
    saved = {k: getattr(mem, k) for k in ("xp", "DEVICE", "is_backend_array", "_view")}
    out, result = mem.KernelCall.out, mem.KernelCall.result
    launch = sim_kernel.FakeCUDAKernel.__call__

    def counted_out(call, shape, dtype):
        o = out(call, shape, dtype)
        if isinstance(o.array, ndarray):
            live.add(o.array._a.__array_interface__["data"][0])
        return o

    def counted_result(call, output, shape=None, dtype=None):
        if isinstance(output.array, ndarray):
            live.discard(output.array._a.__array_interface__["data"][0])
        return result(call, output, shape, dtype)

    def counted_launch(kernel, *args):
        t = current()
        if t is not None and not kernel._device and not sim_kernel._kernel_context:
            arrays = [a._ary for a in args if isinstance(a, FakeCUDAArray)]
            writes = [a for a in arrays if a.__array_interface__["data"][0] in live]
            reads = [a for a in arrays if a.__array_interface__["data"][0] not in live]
            t.launch(reads, writes, getattr(kernel.fn, "__name__", "numba kernel"))
        return launch(kernel, *args)

    arg = mem.KernelCall.arg

    def counted_arg(call, a, dtype, shape=None):
        # on a GPU (MODE "cupy") every input is made C-contiguous before the kernel sees it
        # (after a cast, which is a contiguous copy already): the copy counted here too
        if call.on_device and isinstance(a, ndarray) and a.dtype == np.dtype(dtype):
            a = cupy_standin.ascontiguousarray(a)
        return arg(call, a, dtype, shape)

    mem.KernelCall.arg = counted_arg
    mem.xp, mem.DEVICE = cupy_standin.module(), None
    original = mem.is_backend_array
    importers = [m for n, m in sys.modules.items()  # modules that imported it by name
                 if n.startswith("refbraid.backends.numba_cuda")
                 and getattr(m, "is_backend_array", None) is original]
    for m in importers:
        m.is_backend_array = _is_counted
    mem._view = lambda a: FakeCUDAArray(a._a)
    mem.KernelCall.out, mem.KernelCall.result = counted_out, counted_result
    sim_kernel.FakeCUDAKernel.__call__ = counted_launch
    try:
        yield
    finally:
        for m in importers:
            m.is_backend_array = original
        for k, v in saved.items():
            setattr(mem, k, v)
        mem.KernelCall.out, mem.KernelCall.result, mem.KernelCall.arg = out, result, arg
        sim_kernel.FakeCUDAKernel.__call__ = launch


@contextmanager
def counting(name: str) -> Iterator[Backend]:
    """``with counting("cupy") as bk:`` — the counting backend, ready to run (cuda: the
    simulator's kernels on counted memory for the duration)."""
    bk = counting_backend(name)
    with cupy_standin.install(replace_real=True):
        if name == "cuda":
            with _numba_on_counted_memory():
                yield bk
        else:
            yield bk


def count(fn: Callable[[], object]) -> Tally:
    """The :class:`Tally` of the device events ``fn()`` causes."""
    with tracking() as tracker:
        fn()
    return tracker.tally


# ----------------------------------------------------------------------------- the networks
def build_model(model: str, n_layers: int, rng: np.random.Generator):
    """(net, params, x, labels) of a CI-sized network: width 4, batch 4, N layers (the GRU:
    N sequence positions; the transformer: N encoder layers, 4 tokens, 1 head)."""
    from ..models import build_network
    from ..network import init_params

    if model == "dense":
        net = build_network("resnet", (2,), 3, n_layers, 4, 1.0)
        x = rng.standard_normal((4, 2))
    elif model == "conv":
        net = build_network("conv", (1, 4, 4), 3, n_layers, 2, 1.0)
        x = rng.standard_normal((4, 1, 4, 4))
    elif model == "transformer":
        from ..sequence import TransformerModel

        net, x = TransformerModel(5, 4, 3, n_layers, 4, 1, 4, 1.0), rng.integers(0, 5, (4, 4))
    elif model == "gru":
        from ..sequence import GRUModel

        net, x = GRUModel(n_layers, 2, 4, 3, "classic"), rng.standard_normal((4, n_layers, 2))
    else:
        raise ValueError(f"`model` must be one of {MODELS}, got {model!r}.")
    params = init_params(net, 1) if model in ("dense", "conv") else net.init_params(rng)
    return net, params, x, rng.integers(0, 3, 4)


def default_settings():
    """TorchBraid's MGRIT settings (3 levels, cfactor 4, 2 forward and 1 adjoint iteration:
    refbraid's defaults), as in the GPU measurements."""
    from ..layer_parallel import LayerParallelSettings

    return LayerParallelSettings()


def _model(model: str, n_layers: int):
    """:func:`build_model` with the counts' one seed."""
    return build_model(model, n_layers, np.random.default_rng(0))


def gradient_counts(name: str, model: str, n_layers: int, mode: str, settings=None) -> Tally:
    """The :class:`Tally` of one gradient of ``model`` with ``n_layers`` on backend ``name``
    (``cupy`` or ``cuda``), ``mode`` one of :data:`MODES` (:func:`network_counts` of the
    CI-sized :func:`build_model`)."""
    return network_counts(name, *_model(model, n_layers), mode, settings)


def network_counts(name: str, net, params, x, labels, mode: str, settings=None) -> Tally:
    """The :class:`Tally` of one gradient of ``net`` at ``params`` on the batch (x, labels),
    on backend ``name`` (``cupy`` or ``cuda``), ``mode`` one of :data:`MODES`. Inputs are
    moved to the device before counting (their copies are not the gradient's)."""
    from ..network import to_backend
    from ..training.gradients import mgrit_gradient, sequential_gradient
    from .device_batching import sweeps_batched

    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    with counting(name) as bk:
        p, xb, yb = to_backend(params, bk), bk.asarray(x), bk.asarray(labels)
        if mode == "serial":
            grad = sequential_gradient(net, bk)
            return count(lambda: grad(p, xb, yb))
        grad = mgrit_gradient(net, settings or default_settings(), bk)
        with sweeps_batched(mode == "lp-batched"):
            return count(lambda: grad(p, xb, yb))


#: The gradients :func:`graph_counts` counts replayed from a CUDA graph.
GRAPH_MODES = ("serial", "lp-batched")


@contextmanager
def _recorded(built, mode: str, settings=None):
    """A gradient of the network ``built`` = (net, params, x, labels) captured on ``cupy``'s
    counting stand-in (:func:`refbraid.training.captured_gradient.captured_gradient`;
    ``mode`` one of :data:`GRAPH_MODES`), recorded by a first call that is not counted;
    yields it and its arguments."""
    from ..network import to_backend
    from ..training.captured_gradient import captured_gradient
    from .device_batching import sweeps_batched

    if mode not in GRAPH_MODES:
        raise ValueError(f"`mode` must be one of {GRAPH_MODES}, got {mode!r}.")
    net, params, x, labels = built
    with counting("cupy") as bk, sweeps_batched(mode == "lp-batched"):
        args = to_backend(params, bk), bk.asarray(x), bk.asarray(labels)
        grad = captured_gradient(net, bk, "serial" if mode == "serial" else
                                 settings or default_settings())
        grad(*args)  # the recording
        yield grad, args


def graph_counts(model: str, n_layers: int, mode: str, settings=None) -> Tally:
    """The host's events of one gradient of ``model`` replayed from a CUDA graph on ``cupy``
    (:func:`_recorded`): the replay is one launch, the rest is the call's input checks, input
    copies and result copies."""
    with _recorded(_model(model, n_layers), mode, settings) as (grad, args):
        return count(lambda: grad(*args))


def graph_nodes(model: str, n_layers: int, mode: str, settings=None) -> int:
    """The kernel nodes of the CUDA graph :func:`graph_counts` replays: the launches its
    recording made (the device works through them at each replay; the host issues one)."""
    return graph_work(*_model(model, n_layers), mode, settings).launches


def graph_work(net, params, x, labels, mode: str, settings=None) -> Tally:
    """What the device works through at each replay of a gradient of ``net`` recorded as a
    CUDA graph on ``cupy`` (``mode`` one of :data:`GRAPH_MODES`): the recording's
    :class:`Tally` — its launches are the graph's kernel nodes, its bytes those they move."""
    with _recorded((net, params, x, labels), mode, settings) as (grad, _):
        (recording, *_), = grad.recordings.values()
        return recording.work


def table(names=("cupy",), models=MODELS, sizes=(64, 256), settings=None) -> list[dict]:
    """One row per (backend, model, N, mode): :meth:`Tally.row` plus the keys."""
    rows = []
    for name in names:
        for model in models:
            for n in sizes:
                for mode in MODES:
                    t = gradient_counts(name, model, n, mode, settings)
                    rows.append({"backend": name, "model": model, "N": n, "mode": mode,
                                 **t.row()})
    return rows


def plot_launch_counts(rows: list[dict], title: str = "one gradient"):
    """A Figure of launches (solid) and critical path (dashed) per gradient against N, one
    colour per gradient mode; ``rows`` as :func:`table` returns (one backend and model)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for mode, colour in zip(MODES, ("black", "tab:orange", "tab:blue"), strict=True):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["N"])
        if not mine:
            continue
        n = [r["N"] for r in mine]
        ax.plot(n, [r["launches"] for r in mine], "o-", color=colour, label=f"{mode}: launches")
        ax.plot(n, [r["critical_path"] for r in mine], "s--", color=colour,
                label=f"{mode}: critical path")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("layers N")
    ax.set_ylabel("kernel launches per gradient")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
