"""How suite ``gpu`` times its cases (:mod:`benchmarks.gpu`'s worker), row by row: each row
``(case, size, dtype, backend, ms, ratio, check)``, streamed as it is measured.

* :func:`layer_rows`: each layer's ``op.forward`` then ``op.adjoint`` on each backend, then
  PyTorch CUDA's equivalent (:func:`torch_layer`); ``check`` against the NumPy reference;
* :func:`step_rows`: one ``mgrit_gradient`` call on the default ResNet;
* :func:`gradient_rows`: whole gradients (layer-parallel per-step and batched, refbraid serial,
  PyTorch eager serial, :func:`torch_ode_backprop`), and on ``cupy`` the A/B rows
  (:func:`cupy_matmul_row`, :func:`im2col_rows`) and the CUDA-graph replays
  (:func:`graphed_rows`); ``check`` by :func:`largest_relative_difference`.

The one timer is :func:`median_ms` (:func:`benchmarks.harness.measure`, each call followed by
a device synchronisation, :func:`synchronise`); :func:`backend` adds ``cuda-host`` (the cuda
kernels on NumPy arrays) to refbraid's backends. A case that raises gives its row as
:func:`failed_row` and the others go on.
"""

from __future__ import annotations

import os
from unittest.mock import patch

import numpy as np

from benchmarks.gpu_cases import (
    GRADIENT_CASES,
    TINY_GRADIENT_CASES,
    gradient_case,
    gradient_settings,
)
from benchmarks.gpu_layers import H, layer_op, layers
from benchmarks.harness import measure
from refbraid.backends import Backend, get_backend
from refbraid.backends.host import to_host
from refbraid.models import build_network
from refbraid.network import init_params, to_backend
from refbraid.training.gradients import mgrit_gradient
from refbraid.verify.checks import example_input


def backend(name: str) -> Backend:
    """The backend called ``name``; ``cuda-host``: the cuda kernels on NumPy arrays (each
    kernel call copies in and out: the host-array mode of refbraid.backends.numba_cuda_memory)."""
    if name != "cuda-host":
        return get_backend(name)
    cuda = get_backend("cuda")
    return Backend("cuda-host", np, cuda.kernels, cuda.overrides)


def synchronise(name: str) -> None:
    """Wait for the device, so that a time covers the work and not only its launch."""
    if name == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    elif name in ("cuda", "cuda-host"):
        from numba import cuda

        cuda.synchronize()
    elif name == "torch":
        import torch

        torch.cuda.synchronize()


def median_ms(fn, name: str, warmup: int, repeats: int) -> float:
    """The one timer (:func:`~benchmarks.harness.measure`) on ``fn`` then a device
    synchronisation: median milliseconds."""
    def synced():
        fn()
        synchronise(name)

    return 1e3 * measure(synced, repeats, warmup).median()


def torch_layer(layer, x: np.ndarray, w: np.ndarray, dtype):
    """A closure running PyTorch CUDA forward + backward of ``layer``'s equivalent, or None."""
    try:
        import torch

        from refbraid.verify.torch_reference import torch_equivalent
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    try:
        module, _ = torch_equivalent(layer, H)
    except (KeyError, TypeError):
        return None
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    module = module.to("cuda", tdtype)
    xt = torch.tensor(x, device="cuda", dtype=tdtype if x.dtype.kind == "f" else None,
                      requires_grad=x.dtype.kind == "f")
    wt = torch.tensor(w, device="cuda", dtype=tdtype)

    def run():
        out = module(xt)
        out.backward(wt)

    return run


def failed_row(case: str, size: str, dtype, bname: str, err: Exception) -> tuple:
    """The row of a case that raised: no time, ``check`` the error (the run goes on; the
    runner reports it and exits 1: :func:`benchmarks.gpu.run`)."""
    msg = (str(err).strip().splitlines() or [""])[0][:200]
    return (case, size, np.dtype(dtype).name, bname, float("nan"), float("nan"),
            f"FAILED: {type(err).__name__}: {msg}")


def layer_rows(backends, dtype, tiny, warmup, repeats):
    """Each layer's forward then adjoint, row by row; a backend that raises on a layer gives
    that row as :func:`failed_row` and the others go on."""
    for name, layer, batch in layers(tiny):
        rng = np.random.default_rng(0)
        op = layer_op(layer)
        shape = tuple(getattr(layer, "state_shape", None) or layer.in_shape)
        params = layer.init(rng, dtype)
        x = example_input(layer, rng, batch, shape, dtype)
        want, _ = op.forward(params, x, get_backend("numpy"))
        w = np.asarray(rng.standard_normal(want.shape), dtype=dtype)
        size = f"B={batch} " + "x".join(map(str, shape))
        base = None
        for bname in backends:
            try:
                bk = backend(bname)
                p, xb, wb = to_backend(params, bk), bk.asarray(x), bk.asarray(w)
                out, _ = op.forward(p, xb, bk)
                check = float(np.max(np.abs(to_host(out) - want)) / np.max(np.abs(want)))

                def run(bk=bk, p=p, xb=xb, wb=wb, op=op):
                    _, cache = op.forward(p, xb, bk)
                    op.adjoint(p, cache, wb, bk)

                ms = median_ms(run, bname, warmup, repeats)
            except Exception as err:  # reported as the row; the run goes on
                yield failed_row(name, size, dtype, bname, err)
                continue
            base = ms if base is None else base
            yield (name, size, np.dtype(dtype).name, bname, ms, ms / base, f"{check:.1e}")
        if not tiny and base is not None:
            run = torch_layer(layer, x, w, dtype)
            if run is not None:
                ms = median_ms(run, "torch", warmup, repeats)
                yield (name, size, np.dtype(dtype).name, "torch", ms, ms / base, "-")


def step_rows(backends, dtype, tiny, warmup, repeats):
    n_layers, width, batch = (8, 4, 4) if tiny else (64, 256, 1024)
    net = build_network("resnet", (2,), 5, n_layers, width, 3.0)
    settings = gradient_settings(tiny)
    rng = np.random.default_rng(0)
    params = init_params(net, 0, dtype)
    x, y = np.asarray(rng.standard_normal((batch, 2)), dtype=dtype), rng.integers(0, 5, batch)
    size, rows, base = f"N={n_layers} C={width} B={batch}", [], None
    for bname in backends:
        try:
            bk = backend(bname)
            gradient = mgrit_gradient(net, settings, bk)
            p, xb, yb = to_backend(params, bk), bk.asarray(x), bk.asarray(y)
            ms = median_ms(lambda g=gradient, p=p, xb=xb, yb=yb: g(p, xb, yb), bname, warmup,
                           repeats)
        except Exception as err:  # reported as the row; the run goes on
            rows.append(failed_row("layer-parallel step", size, dtype, bname, err))
            continue
        base = ms if base is None else base
        rows.append(("layer-parallel step", size, np.dtype(dtype).name, bname, ms, ms / base,
                     "-"))
    return rows


def torch_ode_backprop(model, n_layers, width, batch, side, dtype, device="cuda"):
    """One PyTorch eager serial backprop of the ODE body, as a no-argument callable: N steps
    ``z ← z + h·tanh(W z + b)`` (dense: ``z W^T + b``; conv: a 3×3 convolution, padding 1,
    C → C channels), then ``z.sum().backward()``; random weights on ``device``."""
    import torch

    tdt = torch.float64 if dtype == np.float64 else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (width, width) if model == "dense" else (width, width, 3, 3)
    Ws = [(torch.randn(*shape, device=device, dtype=tdt, generator=gen) * 0.01)
          .requires_grad_() for _ in range(n_layers)]
    bs = [torch.zeros(width, device=device, dtype=tdt, requires_grad=True)
          for _ in range(n_layers)]
    state = (batch, width) if model == "dense" else (batch, width, side, side)
    xt, h = torch.randn(*state, device=device, dtype=tdt, generator=gen), 3.0 / n_layers

    def layer(z, W, b):
        if model == "dense":
            return z @ W.T + b
        return torch.nn.functional.conv2d(z, W, b, padding=1)

    def forward():
        z = xt
        for W, b in zip(Ws, bs, strict=True):
            z = z + h * torch.tanh(layer(z, W, b))
        return z

    def step():
        forward().sum().backward()

    step.forward, step.x, step.weights, step.biases = forward, xt, Ws, bs  # for the tests
    return step


def _torch_serial(model, n_layers, width, batch, side, dtype, warmup, repeats):
    """:func:`torch_ode_backprop` on the GPU, in ms (median), or None without PyTorch CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    step = torch_ode_backprop(model, n_layers, width, batch, side, dtype)
    return median_ms(step, "torch", warmup, repeats)


def largest_relative_difference(got, want) -> float:
    """``max_k max|got[k] − want[k]| / max|want[k]|`` over the gradients' arrays (the rows'
    ``check``)."""
    return max(float(np.max(np.abs(to_host(got[k]) - to_host(want[k]))))
               / max(float(np.max(np.abs(to_host(want[k])))), 1e-300) for k in want)


def gradient_rows(backends, dtype, tiny, warmup, repeats):
    """One whole gradient of the dense ResNet and of the conv ODE-net (:data:`GRADIENT_CASES`;
    TorchBraid's MGRIT settings): refbraid layer-parallel with per-step and with batched sweeps
    (:func:`refbraid.backends.device_batching.sweeps_batched`), refbraid serial backprop, and
    PyTorch eager serial backprop, row by row as each is measured (a run cut short keeps
    what it finished); ``ratio`` against refbraid serial on the same backend,
    ``check`` the largest relative gradient difference batched vs per-step; a backend that
    raises on a case gives :func:`failed_row` and the others go on. The conv cases
    skip ``cuda-host`` (what residency buys shows per layer) and, at tiny sizes, the CUDA
    simulator (its conv kernels are tested elsewhere; the strict stand-in runs the case)."""
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.training.gradients import sequential_gradient

    settings = gradient_settings(tiny)
    dt = np.dtype(dtype).name
    for case in TINY_GRADIENT_CASES if tiny else GRADIENT_CASES:
        net, params, x, y, size = gradient_case(*case, dtype)
        serial = None
        for bname in backends:
            if case[0] == "conv" and (bname == "cuda-host" or (tiny and bname == "cuda")):
                continue
            try:
                bk = backend(bname)
                p, xb, yb = to_backend(params, bk), bk.asarray(x), bk.asarray(y)
                lp, sq = mgrit_gradient(net, settings, bk), sequential_gradient(net, bk)
                ser = median_ms(lambda sq=sq, p=p, xb=xb, yb=yb: sq(p, xb, yb), bname, warmup,
                                repeats)
                found = {}
                for on in (False, True):
                    with sweeps_batched(on):
                        found[on] = (median_ms(lambda lp=lp, p=p, xb=xb, yb=yb: lp(p, xb, yb),
                                               bname, warmup, repeats), lp(p, xb, yb)[1])
                (per, g_p), (bat, g_b) = found[False], found[True]
                diff = largest_relative_difference(g_b, g_p)
            except Exception as err:  # reported as the row; the run goes on
                yield failed_row("LP batched", size, dtype, bname, err)
                continue
            serial = serial or ser
            yield from [("LP per-step", size, dt, bname, per, per / ser, "-"),
                        ("LP batched", size, dt, bname, bat, bat / ser, f"{diff:.1e}"),
                        ("refbraid serial", size, dt, bname, ser, 1.0, "-")]
            if bname == "cupy":
                yield from cupy_matmul_row(lp, bk, (p, xb, yb), g_p, size, dt, ser, warmup,
                                           repeats)
                yield from graphed_rows(net, settings, bk, (p, xb, yb), g_p, size, dt, ser,
                                        warmup, repeats)
                if case[0] == "conv":
                    yield from im2col_rows(net, settings, bk, (p, xb, yb), g_p, size, dt, ser,
                                           warmup, repeats)
        ms = None if tiny else _torch_serial(*case, dtype, warmup, repeats)
        if ms is not None and serial is not None:
            yield ("torch eager serial", size, dt, "torch", ms, ms / serial, "-")


def cupy_matmul():
    """Within the block the cupy backend's batched products go through CuPy's ``matmul``
    (``REFBRAID_CUPY_GEMM=cupy``, :func:`refbraid.backends.cupy_blas.product`), as before
    refbraid's strided-batched GEMM took them."""
    from refbraid.backends.cupy_blas import GEMM_ENV

    return patch.dict(os.environ, {GEMM_ENV: "cupy"})


def im2col_convolutions():
    """Within the block the cupy backend's convolutions are column matrices and GEMMs
    (``REFBRAID_CUPY_CONV=im2col``, :mod:`refbraid.backends.cupy_conv`), as before the
    direct kernels took them."""
    from refbraid.backends.cupy_conv import CONV_ENV

    return patch.dict(os.environ, {CONV_ENV: "im2col"})


def cupy_matmul_row(lp, bk, args, g_per_step, size, dt, ser, warmup, repeats):
    """The batched layer-parallel gradient again with CuPy's ``matmul`` for its batched
    products (:func:`cupy_matmul`): the A/B of refbraid's strided-batched GEMM, in the same
    process; ``check`` against the per-step gradient."""
    from refbraid.backends.device_batching import sweeps_batched

    try:
        with sweeps_batched(True), cupy_matmul():
            ms = median_ms(lambda: lp(*args), bk.name, warmup, repeats)
            diff = largest_relative_difference(lp(*args)[1], g_per_step)
    except Exception as err:  # reported as the row; the run goes on
        yield failed_row("LP batched, CuPy matmul", size, np.dtype(dt), bk.name, err)
        return
    yield ("LP batched, CuPy matmul", size, dt, bk.name, ms, ms / ser, f"{diff:.1e}")


def im2col_rows(net, settings, bk, args, g_per_step, size, dt, ser, warmup, repeats):
    """The conv network's gradients again with column-matrix convolutions
    (:func:`im2col_convolutions`): the A/B of the direct kernels in the same process —
    batched layer-parallel and serial backprop, eager and replayed from CUDA graphs;
    ``check`` against the (direct) per-step and serial gradients."""
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.training.gradients import sequential_gradient

    lp, sq = mgrit_gradient(net, settings, bk), sequential_gradient(net, bk)
    for case, fn in (("LP batched", lp), ("refbraid serial", sq)):
        try:
            want = g_per_step if fn is lp else sq(*args)[1]
            with sweeps_batched(True), im2col_convolutions():
                ms = median_ms(lambda fn=fn: fn(*args), bk.name, warmup, repeats)
                diff = largest_relative_difference(fn(*args)[1], want)
        except Exception as err:  # reported as the row; the run goes on
            yield failed_row(f"{case}, im2col conv", size, np.dtype(dt), bk.name, err)
            continue
        yield (f"{case}, im2col conv", size, dt, bk.name, ms, ms / ser, f"{diff:.1e}")
    with im2col_convolutions():
        yield from graphed_rows(net, settings, bk, args, g_per_step, size, dt, ser, warmup,
                                repeats, ", im2col conv")


def graphed_rows(net, settings, bk, args, g_per_step, size, dt, ser, warmup, repeats,
                 label: str = ""):
    """The same gradients replayed from CUDA graphs
    (:func:`refbraid.training.captured_gradient.captured_gradient`): layer-parallel with
    batched sweeps and serial backprop, each recorded once (outside the timing) and timed per
    call with its checks, input copies and result copies; ``check`` against the eager
    per-step and serial gradients; ``label`` ends each case's name. A recording that fails
    gives :func:`failed_row`."""
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.training.captured_gradient import captured_gradient
    from refbraid.training.gradients import sequential_gradient

    for case, graph_settings in ((f"LP batched, CUDA graph{label}", settings),
                                 (f"refbraid serial, CUDA graph{label}", "serial")):
        try:
            with sweeps_batched(True):
                g = captured_gradient(net, bk, graph_settings)
                ms = median_ms(lambda g=g: g(*args), bk.name, warmup, repeats)
                want = g_per_step if graph_settings != "serial" else \
                    sequential_gradient(net, bk)(*args)[1]
                diff = largest_relative_difference(g(*args)[1], want)
        except Exception as err:  # reported as the row; the run goes on
            yield failed_row(case, size, np.dtype(dt), bk.name, err)
            continue
        yield (case, size, dt, bk.name, ms, ms / ser, f"{diff:.1e}")
