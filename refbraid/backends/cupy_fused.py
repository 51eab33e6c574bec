"""Fused element-wise kernels of the ``cupy`` backend: one launch where the reference makes
three to five.

The reference kernels (:mod:`refbraid.backends.reference`) are one CuPy operation per
array-API call: ``y + h σ(z)`` is three launches (σ, ×h, +y), tanh's adjoint four. On a GPU
each is a launch of a few microseconds around a kernel of less (docs/gpu_layer_parallel.md).
Here each is one CuPy ``ElementwiseKernel`` whose body is the reference's arithmetic in the
same order (T is the array dtype; the step size is cast to T first, as NumPy casts a Python
float against a T array)::

    euler_act           out = y + (T)h · σ(z)                        (per-step forward)
    act_adjoint         dz  = σ'(z) · dy                              (per-step adjoint)
    bias_act_euler      z = p + b,  y_next = y + (T)h · σ(z)          (batched forward, p = Y Wᵀ)
    scaled_act_adjoint  s = (T)h · (σ'(z) · dy)                       (batched adjoint)

with σ, σ' in :data:`ACT` / :data:`ACT_ADJOINT` (tanh, relu, gelu, identity). On CuPy arrays
the CUDA source runs (compiled by CuPy on first use; the source is compiled for sm_90 with
NVRTC in tests/test_cupy_fused.py, no GPU needed). On any other array (NumPy, the CuPy
stand-in of :mod:`refbraid.backends.cupy_standin`) :meth:`Fused.__call__` runs the
NumPy-equivalent reference path — the same operations, one at a time — and reports ONE
launch to the launch counter: what the fused kernel costs a GPU.

Round-off: on NumPy the reference path gives the reference kernels' bits (tested); on a GPU
the CUDA math library's tanh/erf/exp and the compiler's fused multiply-adds change the last
bits (as every CuPy operation already does against NumPy): within 4 ulp per element.

:func:`fused` switches the fused kernels off (``with fused(False):``) to count or time the
reference operations instead (``benchmarks/count_launches.py --unfused``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .launch_model import current

_ON: list[bool] = [True]


@contextmanager
def fused(on: bool) -> Iterator[None]:
    """``with fused(False):`` — the cupy backend runs its reference operations instead."""
    _ON.append(bool(on))
    try:
        yield
    finally:
        _ON.pop()


def is_on() -> bool:
    return _ON[-1]


#: σ(z) in CUDA C (T the dtype), as reference.activation computes it.
ACT = {"tanh": "tanh(z)", "relu": "max(z, (T)0)", "identity": "z",
       "gelu": "(T)0.5 * z * ((T)1 + erf(z / (T)M_SQRT2))"}
#: σ'(z) · dy in CUDA C, as reference.activation_adjoint computes it.
ACT_ADJOINT = {
    "tanh": "((T)1 - tanh(z) * tanh(z)) * dy",
    "relu": "(z > (T)0 ? dy : (T)0)",
    "identity": "dy",
    "gelu": "((T)0.5 * ((T)1 + erf(z / (T)M_SQRT2)) "
            "+ z * (exp((T)-0.5 * z * z) / (T)2.5066282746310002)) * dy",
}


def _act(z, act):
    from .reference import activation

    return activation(z, act)


def _act_adjoint(z, dy, act):
    from .reference import activation_adjoint

    return activation_adjoint(z, dy, act)


class Fused:
    """One fused kernel: its CuPy ``ElementwiseKernel`` (params, body per activation) and
    the NumPy-equivalent ``reference(act, *inputs) -> outputs``."""

    def __init__(self, name: str, in_params: str, out_params: str, body: str, reference):
        self.name, self.in_params, self.out_params = name, in_params, out_params
        self.body, self.reference = body, reference
        self._kernels: dict[str, object] = {}

    def source(self, act: str) -> str:
        """The element-wise operation for activation ``act``."""
        return self.body.replace("SIGMA_PRIME_DY", ACT_ADJOINT[act]).replace("SIGMA", ACT[act])

    def cuda_kernel(self, act: str, T: str = "double") -> str:
        """A complete CUDA C kernel of :meth:`source` over contiguous arrays of ``T`` (what
        CuPy generates, reduced to the arithmetic; for compile checks)."""
        params = [p.split() for p in (self.in_params + ", " + self.out_params).split(",")]
        args = ", ".join(f"{'double' if t == 'float64' else 'T'}* {n}_" for t, n in params)
        loads = " ".join(f"{'double' if t == 'float64' else 'T'}& {n} = {n}_[i];"
                         for t, n in params)
        return (f"typedef {T} T;\n#define M_SQRT2 1.4142135623730951\n"
                f'extern "C" __global__ void {self.name}_{act}({args}, long long n) {{\n'
                f"  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                f"  if (i >= n) return;\n  {loads}\n  {self.source(act)};\n}}\n")

    def __call__(self, act: str, *args):
        if _real_cupy(args[0]):
            return self._cupy(act, *args)  # pragma: no cover - needs a GPU
        return self._counted(act, *args)

    def _counted(self, act, *args):
        from .standin_array import ndarray as DeviceArray

        device = any(isinstance(a, DeviceArray) for a in args)
        raw = [a._a if isinstance(a, DeviceArray) else a for a in args]
        outs = self.reference(act, *raw)
        outs = outs if isinstance(outs, tuple) else (outs,)
        t = current()
        if device and t is not None:
            for o in outs:
                t.fresh(o)
            t.launch([r for r in raw if isinstance(r, np.ndarray)], list(outs), self.name)
        if device:
            outs = tuple(DeviceArray(o) for o in outs)
        return outs if len(outs) > 1 else outs[0]

    def _cupy(self, act, *args):  # pragma: no cover - needs a GPU
        import cupy

        kernel = self._kernels.get(act)
        if kernel is None:
            kernel = cupy.ElementwiseKernel(self.in_params, self.out_params, self.source(act),
                                            f"refbraid_{self.name}_{act}")
            self._kernels[act] = kernel
        return kernel(*args)


def _real_cupy(a) -> bool:
    """True for an array of an imported CuPy that can build kernels (not a stand-in)."""
    cupy = sys.modules.get("cupy")
    return (cupy is not None and hasattr(cupy, "ElementwiseKernel")
            and isinstance(a, getattr(cupy, "ndarray", ())))


# The NumPy-equivalent paths, written against the array API (they also run on stand-ins): a
# Python float h is cast to T by the multiplication, as in the reference kernels.
def _euler_act_ref(act, y, z, h):
    return y + h * _act(z, act)  # reference.euler_act


def _bias_act_euler_ref(act, p, b, y, h):
    z = p + b
    out = _act(z, act) * h  # reference_batched._dense_forward: σ(Z), ×h, +Y
    return z, out + y


def _scaled_act_adjoint_ref(act, z, dy, h):
    return _act_adjoint(z, dy, act) * h  # reference_batched._dense_adjoint: S *= h


EULER_ACT = Fused("euler_act", "T y, T z, T h", "T out", "out = y + h * SIGMA",
                  _euler_act_ref)
ACT_ADJOINT_KERNEL = Fused("act_adjoint", "T z, T dy", "T dz", "dz = SIGMA_PRIME_DY",
                           lambda act, z, dy: _act_adjoint(z, dy, act))
BIAS_ACT_EULER = Fused("bias_act_euler", "T p, T b, T y, T h", "T z, T out",
                       "z = p + b; out = y + h * SIGMA", _bias_act_euler_ref)
SCALED_ACT_ADJOINT = Fused("scaled_act_adjoint", "T z, T dy, T h", "T s",
                           "s = h * (SIGMA_PRIME_DY)", _scaled_act_adjoint_ref)

#: Every fused kernel (the compile check walks this).
KERNELS = (EULER_ACT, ACT_ADJOINT_KERNEL, BIAS_ACT_EULER, SCALED_ACT_ADJOINT)

