"""Every Numba CUDA kernel of the ``cuda`` backend compiles for real GPUs — compute
capability 7.5, 8.0 and 9.0 — for every signature the backends launch it with, and launches:
its registers and shared memory fit the largest block it is launched with.

Numba's CUDA simulator runs a kernel as Python, so a kernel the compiler refuses (a shared
array whose shape is not a compile-time constant, a type the simulator never checks) passes
every simulated test and fails on the first GPU. Here the simulator only *records*: the
verification catalogue in float64 and float32, the two small networks, the tiled bmm and the
batched dense step run on the ``cuda`` backend while every launch's kernel and argument
types are written down (argument layouts as the GPU path passes them: C-contiguous). A
second process without the simulator then compiles each (kernel, signature) to PTX for each
target with ``numba.cuda.compile_ptx`` and NVIDIA's NVVM from PyPI (``numba-cuda[cu13]``;
no GPU, no driver), then assembles the PTX for the target with ptxas (through nvJitLink,
also from PyPI), which says how many registers a thread and how much shared memory a block
take: a block of T threads needs T × registers ≤ 65536 (the register file of one block on
these GPUs), or the launch fails with ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`` — as a
1024-thread column sum (70 registers a thread) did on an H200. The simulator records each
launch's block size; the workload includes the largest blocks the backend makes.
tests/cuda_compile/compile_targets.py is that process.

Without NVVM the test skips, unless ``REFBRAID_REQUIRE_NVVM=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refbraid import backends

TARGETS = ("7.5", "8.0", "9.0")
WORKER = Path(__file__).parent / "cuda_compile" / "compile_targets.py"

numba = pytest.importorskip("numba")
if not numba.config.ENABLE_CUDASIM:
    pytest.skip("records launches in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1); on a GPU "
                "the kernels are compiled by running them", allow_module_level=True)
pytest.importorskip("numba.cuda")

from numba.cuda.errors import normalize_kernel_dimensions  # noqa: E402
from numba.cuda.simulator import kernel as sim_kernel  # noqa: E402
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray  # noqa: E402


def cuda_modules() -> list:
    """refbraid.backends.numba_cuda* (every module of the ``cuda`` backend's kernels)."""
    return [importlib.import_module(f"refbraid.backends.{m.name}")
            for m in pkgutil.iter_modules(backends.__path__) if m.name.startswith("numba_cuda")]


def defined_kernels() -> set[tuple[str, str]]:
    """(module, name) of every kernel and kernel factory the cuda modules define."""
    found = set()
    for mod in cuda_modules():
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue  # imported from elsewhere: counted where it is defined
            if isinstance(obj, sim_kernel.FakeCUDAKernel) and not obj._device:
                found.add((mod.__name__, name))
            elif getattr(obj, "is_kernel_factory", False):
                found.add((mod.__name__, name))
    return found


def _numba_type(arg):
    a = arg._ary if isinstance(arg, FakeCUDAArray) else arg
    t = numba.typeof(a)
    if isinstance(t, numba.types.Array):  # the GPU path passes C-contiguous arrays
        t = t.copy(layout="C", readonly=False)
    return t


@contextlib.contextmanager
def recorded_launches():
    """Within the block every simulated kernel launch records (module, name, made_by,
    argtypes) in the yielded dict, with the most threads per block it was launched with."""
    seen: dict = {}
    original = sim_kernel.FakeCUDAKernel.__call__

    def call(self, *args):
        if not self._device and not sim_kernel._kernel_context:
            made_by = getattr(self, "made_by", None)
            key = (self.fn.__module__, self.fn.__name__, made_by,
                   tuple(_numba_type(a) for a in args))
            _, block = normalize_kernel_dimensions(self.grid_dim, self.block_dim)
            seen[key] = max(seen.get(key, 0), math.prod(block))
        return original(self, *args)

    sim_kernel.FakeCUDAKernel.__call__ = call
    try:
        yield seen
    finally:
        sim_kernel.FakeCUDAKernel.__call__ = original


def run_workload() -> None:
    """What the backends launch: the catalogue in both dtypes, the networks, the tiled bmm
    and the dense step's fused adjoint, batched and one step (tiled and per-element GEMMs),
    the batched convolution (with and without bias and weight gradients) and the fused conv
    step, batched and one, in both dtypes."""
    from refbraid.verify.checks import check_network
    from refbraid.verify.suite import catalog, check_entry, default_networks

    for dtype in (np.float64, np.float32):
        for name, layer in catalog():
            check_entry(name, layer, "cuda", dtype)
    for name, net in default_networks():
        check_network(net, "cuda", np.float64, name=name)
    bk, rng = backends.get_backend("cuda"), np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        bk.bmm(bk.asarray(rng.standard_normal((1, 16, 2)), dtype),
               bk.asarray(rng.standard_normal((1, 2, 16)), dtype))
        for B, C in ((16, 16), (2, 3)):  # host arrays: the batched kernels' mode
            Y, W = rng.standard_normal((2, B, C)).astype(dtype), \
                rng.standard_normal((2, C, C)).astype(dtype)
            b, h = rng.standard_normal((2, C)).astype(dtype), np.full(2, 0.5)
            Y_next, Z = bk.dense_step_batched(Y, W, b, h, "tanh")
            for grads in (True, False):  # without: dY_next added in the GEMM's epilogue
                bk.dense_step_batched_adjoint(Y, Z, Y_next, W, h, "tanh", grads)
            for grads in (True, False):  # one step's fused adjoint (numba_cuda_step)
                bk.dense_step_adjoint(Y[0], Z[0], Y_next[0], W[0], 0.5, "tanh", grads)
        X, Wc = rng.standard_normal((2, 1, 2, 3, 4)).astype(dtype), \
            rng.standard_normal((2, 3, 2, 3, 3)).astype(dtype)  # k conv2d at once
        for bias in (rng.standard_normal((2, 3)).astype(dtype), None):
            Zc = bk.conv2d_batched(X, Wc, bias)
        for grads in (True, False):
            bk.conv2d_adjoint_batched(X, Wc, Zc, grads)
        Ws = rng.standard_normal((2, 2, 2, 3, 3)).astype(dtype)  # the fused conv step
        Yn, Zs = bk.conv_step_batched(X, Ws, rng.standard_normal((2, 2)).astype(dtype),
                                      np.array([0.5, 0.25]), "tanh")
        for grads in (True, False):
            bk.conv_step_batched_adjoint(X, Zs, Yn, Ws, np.array([0.5, 0.25]), "tanh", grads)
        y1, z1 = bk.conv_step(X[0], Ws[0], rng.standard_normal(2).astype(dtype), 0.5, "relu")
        for grads in (True, False):  # one fused conv step (numba_cuda_conv_step)
            bk.conv_step_adjoint(X[0], z1, y1, Ws[0], 0.5, "relu", grads)
        _largest_column_sum_blocks(rng, dtype)


def _largest_column_sum_blocks(rng, dtype) -> None:
    """The column sums at a GPU's batch (B = 1024, C = 32: the most threads per block they
    make, ``column_sum_geometry``), launched alone: the whole step at that size would take
    the simulator minutes."""
    from refbraid.backends import numba_cuda_dense, numba_cuda_step
    from refbraid.backends.numba_cuda_memory import KernelCall

    B, C = 1024, 32
    assert numba_cuda_dense.column_sum_geometry(B, C) == (32, numba_cuda_dense.ROW_GROUPS)
    p, dy_next, s = (rng.standard_normal((1, B, C)).astype(dtype) for _ in range(3))
    call = KernelCall(p, dy_next, s)
    P, S = call.arg(p, dtype, (B * C,)), call.arg(s, dtype, (B * C,))
    numba_cuda_step.add_column_sums(call, P, dy_next, S, dtype, 1, B, C)
    width, groups = numba_cuda_dense.column_sum_geometry(B, C)
    out = call.out(C, dtype)
    numba_cuda_dense._column_sum_kernel[1, width * groups](call.arg(p[0], dtype), out.arg,
                                                           width, groups)


def _launched(records) -> set[tuple[str, str]]:
    out = set()
    for module, name, made_by, *_ in records:
        out.add((made_by[0], made_by[1]) if made_by else (module, name))
    return out


@pytest.fixture(scope="module")
def records():
    with recorded_launches() as seen:
        run_workload()
    return sorted(((*key, threads) for key, threads in seen.items()), key=repr)


def test_the_workload_launches_every_kernel_of_the_cuda_backend(records):
    missing = defined_kernels() - _launched(records)
    assert not missing, f"kernels never launched by run_workload (add them): {sorted(missing)}"
    dtypes = {t.dtype.name for *_, sig, _ in records for t in sig if hasattr(t, "dtype")}
    assert {"float32", "float64"} <= dtypes


def test_every_kernel_compiles_and_fits_its_blocks_on_real_gpu_targets(records, tmp_path):
    path = tmp_path / "records.pkl"
    path.write_bytes(pickle.dumps(records))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    runs = {cc: subprocess.Popen([sys.executable, str(WORKER), str(path), cc], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for cc in TARGETS}  # one process per target (compile_targets.py says why)
    out = {cc: run.communicate(timeout=900)[0] for cc, run in runs.items()}
    codes = {cc: run.returncode for cc, run in runs.items()}
    if set(codes.values()) == {3} and os.environ.get("REFBRAID_REQUIRE_NVVM") != "1":
        pytest.skip(f"NVVM is not installed (pip install 'numba-cuda[cu13]'): {out[TARGETS[0]]}")
    for cc in TARGETS:
        assert codes[cc] == 0, f"cc {cc}:\n{out[cc]}"
        assert f"compiled {len(records)}/{len(records)} " in out[cc], out[cc]
        assert f"launchable {len(records)}/{len(records)} " in out[cc], out[cc]
