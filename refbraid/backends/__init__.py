"""One dispatch point for the kernel backends.

``get_backend(name)`` returns a :class:`Backend`: the array module plus every kernel named in
:data:`KERNELS`, each with the signature of the NumPy reference in
:mod:`refbraid.backends.reference` (and :mod:`refbraid.backends.reference_spatial` for the
3-D convolution, pooling and batch norm). A backend module overrides the kernels it accelerates
and lists them in its ``OVERRIDES`` tuple; every other kernel is the reference one (written
against the array API, so it runs on the backend's arrays too).

=========  =====================================================================
name       what runs
=========  =====================================================================
numpy      the readable reference (NumPy; BLAS for matrix products)
numba      Numba ``njit`` CPU kernels for the fused element-wise and stencil work
cuda       Numba CUDA kernels (tiled shared-memory matmul, fused activation, conv),
           device-resident: ``xp`` is CuPy on a GPU, ``array_api_strict`` on a
           non-default device under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``),
           NumPy with copies per kernel on a GPU without CuPy
           (:mod:`refbraid.backends.numba_cuda_memory`)
cupy       the reference kernels on CuPy arrays (needs a GPU), with hand-written ones
           where they launch fewer kernels: fused element-wise chains
           (:mod:`refbraid.backends.cupy_fused`), im2col convolutions
           (:mod:`refbraid.backends.cupy_conv`), layer norm, softmax, the attention's
           head split and merge and the GRU cell (:mod:`refbraid.backends.cupy_sequence`)
strict     tests only: the cupy code path on ``array_api_strict`` arrays on a
           non-default device (:mod:`refbraid.backends.strict_device`)
=========  =====================================================================
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from . import reference, reference_batched, reference_conv_step, reference_spatial
from .host import to_host

BACKENDS = ("numpy", "numba", "cuda", "cupy")
#: Backends for tests only (not offered by the CLI).
TEST_BACKENDS = ("strict",)

#: Kernels every backend provides (reference signature in refbraid.backends.reference).
KERNELS = (
    "activation",
    "activation_adjoint",
    "euler_act",
    "matmul",
    "linear",
    "linear_adjoint",
    "conv2d",
    "conv2d_adjoint",
    "softmax_cross_entropy",
    "softmax_cross_entropy_adjoint",
    # transformer kernels (attention, layer norm, embedding, GRU)
    "bmm",
    "split_heads",
    "merge_heads",
    "softmax",
    "softmax_adjoint",
    "layernorm",
    "layernorm_adjoint",
    "embedding",
    "embedding_adjoint",
    "gru_cell",
    "gru_cell_adjoint",
    # spatial kernels (refbraid.backends.reference_spatial): 3-D conv, pooling, batch norm
    "conv3d",
    "conv3d_adjoint",
    "conv_stride2",
    "conv_stride2_adjoint",
    "avgpool",
    "avgpool_adjoint",
    "maxpool",
    "maxpool_adjoint",
    "batchnorm_stats",
    "batchnorm_apply",
    "batchnorm_adjoint",
    # whole dense ODE steps (refbraid.backends.reference_batched): one step, and k at once
    # (MGRIT's batched sweeps)
    "dense_step",
    "dense_step_adjoint",
    "dense_step_batched",
    "dense_step_batched_adjoint",
    # k 'same' 2-D convolutions at once (refbraid.backends.reference_batched; the conv step's
    # batched sweeps)
    "conv2d_batched",
    "conv2d_adjoint_batched",
    # whole conv ODE steps, one and k at once (refbraid.backends.reference_conv_step)
    "conv_step",
    "conv_step_adjoint",
    "conv_step_batched",
    "conv_step_batched_adjoint",
)

#: The reference modules, whose functions every backend starts from.
_REFERENCE_MODULES = (reference, reference_spatial, reference_batched, reference_conv_step)

#: Modules whose OVERRIDES make up each backend, later modules taking precedence.
_MODULES = {
    "numpy": ("refbraid.backends.reference",),
    "numba": (
        "refbraid.backends.numba_cpu",  # activations, Euler update
        "refbraid.backends.numba_cpu_dense",  # linear, softmax cross-entropy
        "refbraid.backends.numba_cpu_conv",  # conv2d
        "refbraid.backends.numba_cpu_conv_step",  # the 3×3 conv ODE step whole
        "refbraid.backends.numba_cpu_attention",  # softmax, embedding
        "refbraid.backends.numba_cpu_layernorm",  # layer norm
        "refbraid.backends.numba_cpu_conv3d",  # conv3d
        "refbraid.backends.numba_cpu_pool",  # 2×2(×2) pooling
        "refbraid.backends.numba_cpu_batchnorm",  # batch norm
        "refbraid.backends.numba_cpu_batched",  # k dense steps at once
    ),
    "cuda": (
        "refbraid.backends.numba_cuda",  # activations, Euler update
        "refbraid.backends.numba_cuda_dense",  # matmul, linear
        "refbraid.backends.numba_cuda_conv",  # conv2d
        "refbraid.backends.numba_cuda_conv_batched",  # k conv2d at once
        "refbraid.backends.numba_cuda_conv_step",  # one conv ODE step whole
        "refbraid.backends.numba_cuda_attention",  # bmm, softmax, layer norm, GRU cell
        "refbraid.backends.numba_cuda_conv3d",  # conv3d
        "refbraid.backends.numba_cuda_pool",  # 2×2(×2) pooling
        "refbraid.backends.numba_cuda_batchnorm",  # batch norm
        "refbraid.backends.numba_cuda_batched",  # k dense steps at once
        "refbraid.backends.numba_cuda_step",  # the dense step's adjoint, fused
    ),
    "cupy": (
        "refbraid.backends.cupy_gpu",  # fused element-wise chains, convolutions
        "refbraid.backends.cupy_dense",  # the dense ODE step, one or k at once
        "refbraid.backends.cupy_sequence",  # layer norm, softmax, GRU cell
    ),
    "strict": ("refbraid.backends.strict_device",),
}


@dataclass(frozen=True)
class Backend:
    """A named set of kernels and the array module they compute on."""

    name: str
    xp: ModuleType
    kernels: dict[str, Callable[..., Any]] = field(repr=False)
    overrides: tuple[str, ...] = ()
    device: Any = None  # where asarray puts arrays; None: the namespace's default device

    def __getattr__(self, kernel: str) -> Callable[..., Any]:
        try:
            return self.kernels[kernel]
        except KeyError:
            raise AttributeError(f"backend {self.name!r} has no kernel {kernel!r}") from None

    def asarray(self, a, dtype=None):
        """Move host data to this backend's array type (on its device), ``dtype`` a NumPy
        dtype or name; no copy when already there."""
        if dtype is not None and self.xp is not np:
            dtype = getattr(self.xp, np.dtype(dtype).name)
        if self.device is None:
            return self.xp.asarray(a, dtype=dtype)
        return self.xp.asarray(a, dtype=dtype, device=self.device)

    def to_numpy(self, a) -> np.ndarray:
        """Bring an array back to the host as a NumPy array (:func:`host.to_host`)."""
        return to_host(a)


_cache: dict[str, Backend] = {}


def get_backend(name: str | Backend = "numpy") -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`); a Backend passes through."""
    if isinstance(name, Backend):
        return name
    if name not in BACKENDS + TEST_BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS}, got {name!r}.")
    if name in _cache:
        return _cache[name]
    if name == "cuda":
        _refuse_incompatible_numpy()
    backend = assemble(name)
    _cache[name] = backend
    if name == "cuda" and backend.overrides:
        _warn_if_host_arrays()
    return backend


def assemble(name: str, xp: ModuleType | None = None) -> Backend:
    """The backend ``name`` built afresh (not cached): the reference kernels, then the
    OVERRIDES of each of its modules (:data:`_MODULES`; a module that is not installed is
    skipped), the array module and device the modules name — or ``xp`` instead (a counting
    stand-in's; the modules' own ``xp`` is then never imported)."""
    kernels = {k: getattr(m, k) for m in _REFERENCE_MODULES for k in KERNELS if hasattr(m, k)}
    overrides: tuple[str, ...] = ()
    module_xp, device = np, None
    for module_name in _MODULES[name]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:  # a missing dependency, not a missing optional module
                raise
            continue
        own = tuple(getattr(module, "OVERRIDES", ()))
        kernels.update({k: getattr(module, k) for k in own})
        overrides += own
        if xp is None:
            module_xp = getattr(module, "xp", module_xp)
        device = getattr(module, "DEVICE", device)
    return Backend(name=name, xp=module_xp if xp is None else xp, kernels=kernels,
                   overrides=overrides, device=device)


def with_host_arrays(bk: Backend) -> Backend:
    """``bk`` computing on NumPy arrays, for code that handles host arrays only (the MPI
    trainer): the ``cuda`` backend in host-array mode — its kernels copy their NumPy inputs
    to the device and the outputs back on every call (refbraid.backends.numba_cuda_memory).
    Every other backend is returned unchanged."""
    if bk.name != "cuda" or bk.xp is np:
        return bk
    return Backend(bk.name, np, bk.kernels, bk.overrides)


def batched_sweeps_on(bk: Backend) -> bool:
    """Whether MGRIT's sweeps may take batched steps on ``bk`` (docs/batched.md): numpy and
    numba yes (measured); cuda (``numba_cuda_batched.SWITCHED_ON``) and cupy yes by launch
    counts (:mod:`refbraid.backends.device_batching`); any other backend no."""
    if bk.name == "cuda":
        from . import numba_cuda_batched

        return bool(numba_cuda_batched.SWITCHED_ON)
    if bk.name == "cupy":
        from .device_batching import SWITCHED_ON

        return bool(SWITCHED_ON["cupy"])
    return bk.name in ("numpy", "numba")


def _warn_if_host_arrays() -> None:
    """A RuntimeWarning when the ``cuda`` backend runs on a GPU in host-array mode (no CuPy:
    every kernel copies in and out; :mod:`refbraid.backends.numba_cuda_memory`)."""
    from .numba_cuda_memory import MODE, mode_note

    if MODE == "host":
        import warnings

        warnings.warn(mode_note(), RuntimeWarning, stacklevel=3)


def _refuse_incompatible_numpy() -> None:
    """ImportError naming the versions when numba-cuda cannot compile with this NumPy."""
    try:
        from .numba_cuda import numpy_incompatibility
    except ImportError:  # pragma: no cover - numba without cuda support
        return
    why = numpy_incompatibility()
    if why is not None:
        raise ImportError(why)


def require_usable(name: str) -> None:
    """Raise ValueError, naming ``--backend`` and what to do, unless backend ``name`` can run
    here (``cuda``: a GPU or Numba's simulator; ``cupy``: a GPU and the cupy package)."""
    if name == "cuda":
        _refuse_incompatible_numpy()
    if name not in ("cuda", "cupy") or name in available_backends():
        return
    if name == "cuda":
        raise ValueError(
            "`--backend cuda` needs an NVIDIA GPU and its driver, and none was found here. Set "
            "NUMBA_ENABLE_CUDASIM=1 to run the same CUDA kernels in Numba's simulator (slow: "
            "for testing), or use `--backend numba` for fast CPU kernels.")
    raise ValueError(
        "`--backend cupy` needs an NVIDIA GPU and CuPy (pip install cupy-cuda12x or "
        "'refbraid[gpu]'), and none is usable here; use `--backend numba` on a CPU, or "
        "`--backend cuda` with NUMBA_ENABLE_CUDASIM=1 to test GPU kernels in a simulator.")


def available_backends() -> list[str]:
    """Backends that can run here (``cupy`` only with a GPU; ``cuda`` with a GPU or simulator)."""
    names = ["numpy", "numba"]
    try:
        from .numba_cuda import is_usable as cuda_usable

        if cuda_usable():
            names.append("cuda")
    except ImportError:  # pragma: no cover - numba without cuda support
        pass
    try:
        from .cupy_gpu import is_usable as cupy_usable

        if cupy_usable():
            names.append("cupy")
    except ImportError:
        pass
    return names
