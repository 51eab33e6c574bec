"""The fused and batched GPU kernels: equal to the reference, and compiled for real targets.

* refbraid.backends.cupy_fused: each fused kernel's NumPy path (what runs off a GPU, and what
  the launch counter charges one launch for) gives the reference kernels' bits, every
  activation, float32 and float64; its CUDA source compiles with NVIDIA's NVRTC for sm_75,
  sm_80 and sm_90 in double and float (no GPU needed; skipped without NVRTC); so do the
  layer-norm, softmax, attention-head, GRU and convolution kernels
  (refbraid.backends.cupy_layernorm, cupy_softmax, cupy_heads, cupy_gru, cupy_conv_columns,
  cupy_conv_direct).
* refbraid.backends.numba_cuda_batched on device-resident arrays (the simulator's device):
  every row bit-identical to the per-step cuda calls; its new adjoint kernel compiles with
  ``numba.cuda.compile_ptx`` for compute capability 9.0 outside the simulator.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from refbraid.backends import reference, reference_batched
from refbraid.backends.cupy_fused import (
    ACT_ADJOINT_KERNEL,
    ACTIVATION,
    BIAS_ACT_EULER,
    EULER_ACT,
    KERNELS,
    SCALED_ACT_ADJOINT,
)
from refbraid.backends.reference import ACTIVATIONS


def _data(dtype, *shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_each_fused_kernel_gives_the_reference_bits_off_a_gpu(act, dtype):
    y, z, dy = (_data(dtype, 3, 5, seed=s) for s in range(3))
    h = 0.37
    np.testing.assert_array_equal(EULER_ACT(act, y, z, h), reference.euler_act(y, z, h, act))
    np.testing.assert_array_equal(ACTIVATION(act, z), reference.activation(z, act))
    np.testing.assert_array_equal(ACT_ADJOINT_KERNEL(act, z, dy),
                                  reference.activation_adjoint(z, dy, act))
    Y, W, b = _data(dtype, 4, 3, 5), _data(dtype, 4, 5, 5, seed=1), _data(dtype, 4, 5, seed=2)
    hs = np.array([0.1, 0.1, 0.2, 0.1])
    Y_next, Z = reference_batched.dense_step_batched(Y, W, b, hs, act)
    P = np.matmul(Y, W.transpose(0, 2, 1))
    z_got, y_got = BIAS_ACT_EULER(act, P, b[:, None, :], Y, hs.astype(dtype)[:, None, None])
    np.testing.assert_array_equal(z_got, Z)
    np.testing.assert_array_equal(y_got, Y_next)
    dY = _data(dtype, 4, 3, 5, seed=3)
    S = SCALED_ACT_ADJOINT(act, Z, dY, hs.astype(dtype)[:, None, None])
    dY_prev, dW, db = reference_batched.dense_step_batched_adjoint(Y, Z, dY, W, hs, act)
    np.testing.assert_array_equal(np.matmul(S, W) + dY, dY_prev)
    np.testing.assert_array_equal(np.matmul(S.transpose(0, 2, 1), Y), dW)
    np.testing.assert_array_equal(np.sum(S, axis=1), db)


def _nvrtc_compile(source: str, arch: str) -> str:
    """The PTX NVRTC makes of ``source`` for ``arch`` (``compute_90``: what CuPy compiles)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={arch}".encode()])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise AssertionError(f"{arch}: {log.decode(errors='replace')}\n{source}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\0 ").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_usable() -> bool:
    try:
        from cuda.bindings import nvrtc

        return nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:
        return False


#: the most threads per block CuPy may give an ElementwiseKernel (the hardware's limit; CuPy
#: chooses the block, so every element-wise body must fit the largest)
ELEMENTWISE_THREADS = 1024


@pytest.mark.skipif(not _nvrtc_usable(), reason="needs NVIDIA's NVRTC (pip install "
                    "'numba-cuda[cu13]' brings it)")
@pytest.mark.parametrize("T", ["double", "float"])
def test_every_fused_kernel_compiles_and_fits_its_blocks_on_real_gpus(T):
    """NVRTC compiles each kernel's CUDA C for compute capability 7.5, 8.0 and 9.0, and
    ptxas (through nvJitLink) says its registers and shared memory fit the block it is
    launched with (tests/cuda_compile/ptxas.py): the RawKernels' own block sizes, the
    hardware's largest for the element-wise bodies, whose block CuPy chooses."""
    from cuda_compile.ptxas import block_fits, ptxas_resources

    from refbraid.backends import (
        cupy_conv_columns,
        cupy_conv_direct,
        cupy_gru,
        cupy_heads,
        cupy_layernorm,
        cupy_residual,
        cupy_softmax,
        ordered_sums,
    )

    unfit = []
    for cc in ((7, 5), (8, 0), (9, 0)):
        arch = f"compute_{cc[0]}{cc[1]}"
        compiled = []
        for kernel in KERNELS:
            threads = getattr(kernel, "THREADS", ELEMENTWISE_THREADS)
            for act in ACTIVATIONS:
                compiled.append((f"{kernel.name}_{act}", threads,
                                 _nvrtc_compile(kernel.cuda_kernel(act, T), arch)))
        for module in (cupy_layernorm, cupy_gru, cupy_softmax, cupy_heads, cupy_conv_columns,
                       cupy_conv_direct, cupy_residual, ordered_sums):
            for name in module.KERNELS:
                compiled.append((name, module.THREADS,
                                 _nvrtc_compile(module.cuda_source(name, T), arch)))
        side = cupy_conv_direct.MAX_WEIGHT_SIDE  # the weight gradient's most taps and registers
        compiled.append((f"conv_weight_grad {side}x{side}", cupy_conv_direct.THREADS,
                         _nvrtc_compile(cupy_conv_direct.cuda_source("conv_weight_grad", T, side),
                                        arch)))
        for act in ACTIVATIONS:  # h σ'(z) ⊙ dy formed as the threads read it
            compiled.append((f"conv_weight_grad {side}x{side} scale {act}",
                             cupy_conv_direct.THREADS,
                             _nvrtc_compile(cupy_conv_direct.cuda_source(
                                 "conv_weight_grad", T, side, act=act, scale=True), arch)))
        for epilogue, act, g, scale in [
                ("add", "identity", False, False), ("add", "identity", True, False),
                *(("step", a, g, False) for a in ACTIVATIONS for g in (False, True)),
                *(("add", a, g, True) for a in ACTIVATIONS for g in (False, True))]:
            compiled.append((f"conv_direct {epilogue} {act} {g} scale={scale}",
                             cupy_conv_direct.THREADS,
                             _nvrtc_compile(cupy_conv_direct.cuda_source(
                                 "conv_direct", T, epilogue=epilogue, act=act, add_g=g,
                                 scale=scale), arch)))
        for name, threads, ptx in compiled:
            registers, shared = ptxas_resources(ptx, cc)
            if not block_fits(registers, shared, threads):
                unfit.append(f"{name} sm_{cc[0]}{cc[1]} {T}: {threads} threads × {registers} "
                             f"registers, {shared} bytes of shared memory")
    assert not unfit, "blocks that would not launch:\n" + "\n".join(unfit)


def test_the_device_resident_batched_dense_step_equals_per_step_cuda_calls():
    from refbraid.backends import get_backend, numba_cuda_batched
    from refbraid.backends.host import to_host
    from refbraid.backends.numba_cuda import simulated
    from refbraid.layers import DenseStep

    if not simulated():
        pytest.skip("the simulator's device arrays")
    bk = get_backend("cuda")
    for dtype in (np.float32, np.float64):
        layer, k = DenseStep(5, "tanh"), 3
        Y, dY = _data(dtype, k, 4, 5), _data(dtype, k, 4, 5, seed=1)
        params = {"W": _data(dtype, k, 5, 5, seed=2), "b": _data(dtype, k, 5, seed=3)}
        h = np.array([0.1, 0.25, 0.1])
        dev = {n: bk.asarray(v) for n, v in params.items()}
        Yd, dYd = bk.asarray(Y), bk.asarray(dY)
        assert numba_cuda_batched.applies("tanh", Yd, dev["W"], dev["b"])
        Y_next, Z = layer.forward_batched(dev, Yd, h, bk)
        dY_prev, d = layer.adjoint_batched(dev, Yd, Z, dYd, h, bk)
        for j in range(k):
            p = {n: v[j, ...] for n, v in dev.items()}
            y_next, cache = layer.forward(p, Yd[j, ...], float(h[j]), bk)
            dy, dp = layer.adjoint(p, cache, dYd[j, ...], float(h[j]), bk)
            np.testing.assert_array_equal(to_host(Y_next)[j], to_host(y_next))
            np.testing.assert_array_equal(to_host(dY_prev)[j], to_host(dy))
            for n in dp:
                np.testing.assert_array_equal(to_host(d[n])[j], to_host(dp[n]), err_msg=n)


_COMPILE = textwrap.dedent("""
    import numba
    from numba import cuda
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv.nvvm import NVVM
    NVVM()
    from refbraid.backends.numba_cuda_batched import _scaled_adjoint_rows_kernel as k
    class Target:  # device functions ask for the current GPU: answer with the target
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: Target()
    for t in (numba.float32, numba.float64):
        sig = (t[::1], t[::1], t[::1], numba.int64, numba.int64, t[::1])
        cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    print("compiled")
""")


def test_the_new_batched_adjoint_kernel_compiles_for_compute_capability_9():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    run = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=300)
    if "compiled" not in run.stdout and ("NVVM" in run.stderr or "libnvvm" in run.stderr):
        pytest.skip("needs NVIDIA's NVVM (pip install 'numba-cuda[cu13]')")
    assert "compiled" in run.stdout, run.stderr[-3000:]


def test_the_compile_checked_fused_source_is_what_cupy_compiles():
    """On a GPU CuPy's ``ElementwiseKernel`` compiles :meth:`Fused.source` inside its own
    loop, with ``T`` typedef'd; the NVRTC compile check above compiles ``cuda_kernel``. The
    two must not differ in anything the body could lean on: no macro or header of ours (a
    ``#define M_SQRT2`` here once let the check pass a GELU body NVRTC refused on an H200)."""
    from refbraid.backends import cupy_fused

    for kernel in KERNELS:
        if kernel is cupy_fused.ADD_COLUMN_SUMS:  # a RawKernel: cuda_kernel is what runs
            continue
        for act in ACTIVATIONS:
            text = kernel.cuda_kernel(act, "float")
            assert kernel.source(act) in text
            assert "#" not in text, f"{kernel.name} {act}: a preprocessor line CuPy lacks"
