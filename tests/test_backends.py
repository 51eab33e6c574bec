"""One catalogue drives every backend: each kernel in KERNELS, on numpy, numba, cuda (the
simulator in CI) and cupy (GPU only), against the NumPy reference on the same inputs.

Agreement is measured in the max norm, ``max|got − want| ≤ rtol · max|want|`` per output,
with rtol 1e-12 in float64 and 1e-5 in float32; outputs must keep the reference's dtype.
Shapes include odd and non-multiple-of-16 sizes, size-1 axes, non-contiguous inputs,
Cin ≠ Cout convolutions with k = 1, 3, 5 (3×3 also on 1-pixel images and lines), and rows
long enough for the fast backends' SIMD loops and their remainders. Cases marked ``big``
(28×28 images, 37×45 matrices) do not run in the CUDA simulator, which runs one Python thread
per CUDA thread.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import BACKEND_PARAMS, CUDA_SIMULATED, backend_or_skip

from refbraid.backends import BACKENDS, KERNELS, available_backends, get_backend, reference

RTOL = {np.float64: 1e-12, np.float32: 1e-5}
ACTS = ("tanh", "relu", "gelu", "identity")


# ----------------------------------------------------------------------------- the catalogue
@dataclass(frozen=True)
class Case:
    """A kernel call: ``build(rng, dtype)`` returns its positional arguments."""

    kernel: str
    name: str
    build: Callable[[np.random.Generator, type], tuple]
    big: bool = False  # too large for the CUDA simulator


def _r(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _elementwise_cases() -> list[Case]:
    shapes = {"7x13": (7, 13), "2x3x5x5": (2, 3, 5, 5), "1": (1,)}
    cases = []
    for act in ACTS:
        for sname, shape in shapes.items():
            cases += [
                Case("activation", f"{act}-{sname}", lambda g, d, s=shape, a=act: (_r(g, s, d), a)),
                Case("activation_adjoint", f"{act}-{sname}",
                     lambda g, d, s=shape, a=act: (_r(g, s, d), _r(g, s, d), a)),
                Case("euler_act", f"{act}-{sname}",
                     lambda g, d, s=shape, a=act: (_r(g, s, d), _r(g, s, d), 0.37, a)),
            ]
        # transposed (non-contiguous) views
        cases += [
            Case("activation", f"{act}-transposed", lambda g, d, a=act: (_r(g, (5, 6), d).T, a)),
            Case("activation_adjoint", f"{act}-transposed",
                 lambda g, d, a=act: (_r(g, (5, 6), d).T, _r(g, (6, 5), d), a)),
            Case("euler_act", f"{act}-transposed",
                 lambda g, d, a=act: (_r(g, (6, 5), d), _r(g, (5, 6), d).T, 0.25, a)),
        ]
    cases.append(Case("activation", "gelu-big", lambda g, d: (_r(g, (64, 129), d), "gelu"), True))
    return cases


def _dense_cases() -> list[Case]:
    shapes = {"5x11to9": (5, 11, 9), "20x24to17": (20, 24, 17), "1x1to1": (1, 1, 1)}
    cases = []
    for sname, (B, K, C) in shapes.items():
        cases += [
            Case("matmul", sname, lambda g, d, B=B, K=K, C=C: (_r(g, (B, K), d), _r(g, (K, C), d))),
            Case("linear", sname,
                 lambda g, d, B=B, K=K, C=C: (_r(g, (B, K), d), _r(g, (C, K), d), _r(g, C, d))),
            Case("linear_adjoint", sname,
                 lambda g, d, B=B, K=K, C=C: (
                     _r(g, (B, K), d), _r(g, (C, K), d), _r(g, (B, C), d))),
        ]
    cases += [
        Case("linear", "no-bias", lambda g, d: (_r(g, (3, 4), d), _r(g, (6, 4), d), None)),
        Case("matmul", "37x45to33", lambda g, d: (_r(g, (37, 45), d), _r(g, (45, 33), d)), True),
        Case("linear", "37x45to33",
             lambda g, d: (_r(g, (37, 45), d), _r(g, (33, 45), d), _r(g, 33, d)), True),
        Case("linear_adjoint", "37x45to33",
             lambda g, d: (_r(g, (37, 45), d), _r(g, (33, 45), d), _r(g, (37, 33), d)), True),
    ]
    return cases


def _conv_cases() -> list[Case]:
    # (B, Cin, Cout, H, W, k)
    shapes = {
        "2x3to3-6x6-k3": (2, 3, 3, 6, 6, 3),
        "2x3to5-6x7-k3": (2, 3, 5, 6, 7, 3),
        "1x2to4-5x5-k5": (1, 2, 4, 5, 5, 5),
        "3x2to2-4x3-k1": (3, 2, 2, 4, 3, 1),
        # 3×3 edge shapes of the direct kernels: 1-pixel images, lines, odd channel counts
        "1x1to1-1x1-k3": (1, 1, 1, 1, 1, 3),
        "2x5to1-7x1-k3": (2, 5, 1, 7, 1, 3),
        "3x1to6-1x9-k3": (3, 1, 6, 1, 9, 3),
    }
    cases = []
    for sname, (B, C, O, H, W, k) in shapes.items():
        cases += [
            Case("conv2d", sname, lambda g, d, B=B, C=C, O=O, H=H, W=W, k=k: (
                _r(g, (B, C, H, W), d), _r(g, (O, C, k, k), d), _r(g, O, d))),
            Case("conv2d_adjoint", sname, lambda g, d, B=B, C=C, O=O, H=H, W=W, k=k: (
                _r(g, (B, C, H, W), d), _r(g, (O, C, k, k), d), _r(g, (B, O, H, W), d))),
        ]
    cases += [
        Case("conv2d", "no-bias",
             lambda g, d: (_r(g, (2, 3, 4, 4), d), _r(g, (2, 3, 3, 3), d), None)),
        Case("conv2d", "4x8to16-28x28-k3",
             lambda g, d: (_r(g, (4, 8, 28, 28), d), _r(g, (16, 8, 3, 3), d), _r(g, 16, d)), True),
        Case("conv2d_adjoint", "4x8to16-28x28-k3",
             lambda g, d: (_r(g, (4, 8, 28, 28), d), _r(g, (16, 8, 3, 3), d),
                           _r(g, (4, 16, 28, 28), d)), True),
        # long vector loops with remainders, channel counts off the kernels' blocks of 4 and 8
        Case("conv2d", "3x7to5-19x23-k3",
             lambda g, d: (_r(g, (3, 7, 19, 23), d), _r(g, (5, 7, 3, 3), d), _r(g, 5, d)), True),
        Case("conv2d_adjoint", "3x7to5-19x23-k3",
             lambda g, d: (_r(g, (3, 7, 19, 23), d), _r(g, (5, 7, 3, 3), d),
                           _r(g, (3, 5, 19, 23), d)), True),
    ]
    return cases


def _loss_cases() -> list[Case]:
    def probs(g, d, B, C):
        return reference.softmax_cross_entropy(_r(g, (B, C), d), g.integers(0, C, B))[1]

    cases = []
    for B, C in ((6, 4), (1, 1), (17, 10)):
        cases += [
            Case("softmax_cross_entropy", f"{B}x{C}",
                 lambda g, d, B=B, C=C: (3 * _r(g, (B, C), d), g.integers(0, C, B))),
            Case("softmax_cross_entropy_adjoint", f"{B}x{C}",
                 lambda g, d, B=B, C=C: (probs(g, d, B, C), g.integers(0, C, B), 0.7)),
        ]
    return cases


def _transformer_cases() -> list[Case]:
    def mask(g, shape):
        m = g.random(shape) < 0.3
        m[0, 0, :] = True  # one fully masked row
        return m

    def ln_cache(g, d, shape):
        x = _r(g, shape, d)
        gamma = _r(g, shape[-1], d)
        _, mean, rstd = reference.layernorm(x, gamma, _r(g, shape[-1], d), 1e-5)
        return x, mean, rstd, gamma, _r(g, shape, d)

    def gru_inputs(g, d, B, H, implicit):
        gx, gh, h = _r(g, (B, 3 * H), d), _r(g, (B, 3 * H), d), _r(g, (B, H), d)
        _, gates = reference.gru_cell(gx, gh, h, 0.5, implicit)
        return gates, gh, h, _r(g, (B, H), d), 0.5, implicit

    cases = [
        Case("bmm", "3x5x7to4", lambda g, d: (_r(g, (3, 5, 7), d), _r(g, (3, 7, 4), d))),
        Case("bmm", "2x17x20to18", lambda g, d: (_r(g, (2, 17, 20), d), _r(g, (2, 20, 18), d))),
        Case("softmax", "3x5x7", lambda g, d: (3 * _r(g, (3, 5, 7), d), None)),
        Case("softmax", "masked-2x4x6", lambda g, d: (_r(g, (2, 4, 6), d), mask(g, (2, 4, 6)))),
        Case("softmax_adjoint", "3x5x7", lambda g, d: (
            reference.softmax(_r(g, (3, 5, 7), d), None), _r(g, (3, 5, 7), d))),
        Case("softmax", "scaled-3x5x7", lambda g, d: (3 * _r(g, (3, 5, 7), d), None, 0.37)),
        Case("softmax", "scaled-masked-2x4x6",
             lambda g, d: (_r(g, (2, 4, 6), d), mask(g, (2, 4, 6)), 0.5)),
        Case("softmax_adjoint", "scaled-3x5x7", lambda g, d: (
            reference.softmax(_r(g, (3, 5, 7), d), None), _r(g, (3, 5, 7), d), 0.37)),
        # the attention's heads: B 2, L 3, 2 heads of d 4, one to three stacked blocks
        Case("split_heads", "q-6x8", lambda g, d: (_r(g, (6, 8), d), 2, 3, 2)),
        Case("split_heads", "qkv-6x24", lambda g, d: (_r(g, (6, 24), d), 2, 3, 2, 3)),
        Case("merge_heads", "q-4x3x4", lambda g, d: ([_r(g, (4, 3, 4), d)], 2, 2)),
        Case("merge_heads", "kv-4x3x4",
             lambda g, d: ([_r(g, (4, 3, 4), d) for _ in range(2)], 2, 2)),
        Case("merge_heads", "qkv-4x3x4",
             lambda g, d: ([_r(g, (4, 3, 4), d) for _ in range(3)], 2, 2)),
        Case("layernorm", "3x5x8", lambda g, d: (
            _r(g, (3, 5, 8), d), _r(g, 8, d), _r(g, 8, d), 1e-5)),
        Case("layernorm", "4x13", lambda g, d: (
            _r(g, (4, 13), d), _r(g, 13, d), _r(g, 13, d), 1e-5)),
        Case("layernorm_adjoint", "3x5x8", lambda g, d: ln_cache(g, d, (3, 5, 8))),
        # rows long enough for the SIMD loops (and their remainders), mean far from 0
        Case("softmax", "4x8x67", lambda g, d: (5 + 3 * _r(g, (4, 8, 67), d), None)),
        Case("softmax", "masked-2x8x40", lambda g, d: (_r(g, (2, 8, 40), d), mask(g, (2, 8, 40)))),
        Case("softmax_adjoint", "4x8x67", lambda g, d: (
            reference.softmax(_r(g, (4, 8, 67), d), None), _r(g, (4, 8, 67), d))),
        Case("layernorm", "4x8x131", lambda g, d: (
            4 + _r(g, (4, 8, 131), d), _r(g, 131, d), _r(g, 131, d), 1e-5)),
        Case("layernorm_adjoint", "4x8x131", lambda g, d: ln_cache(g, d, (4, 8, 131))),
        Case("embedding", "3x5-V7xE6", lambda g, d: (g.integers(0, 7, (3, 5)), _r(g, (7, 6), d))),
        Case("embedding_adjoint", "3x5-V7xE6",
             lambda g, d: (g.integers(0, 7, (3, 5)), _r(g, (3, 5, 6), d), 7)),
    ]
    for implicit in (False, True):
        tag = "implicit" if implicit else "classic"
        cases += [
            Case("gru_cell", f"{tag}-4x5", lambda g, d, i=implicit: (
                _r(g, (4, 15), d), _r(g, (4, 15), d), _r(g, (4, 5), d), 0.5, i)),
            Case("gru_cell_adjoint", f"{tag}-4x5",
                 lambda g, d, i=implicit: gru_inputs(g, d, 4, 5, i)),
        ]
    return cases


def _spatial_cases() -> list[Case]:
    """3-D conv (k = 1, 3, Cin ≠ Cout, 1-voxel and odd volumes), pooling on even and odd
    2-D/3-D sizes, batch norm in training and evaluation form (reference_spatial)."""
    from refbraid.backends import reference_spatial as RS

    cases = []
    for sname, (B, C, O, D, H, W, k) in {"2x3to2-3x4x5-k3": (2, 3, 2, 3, 4, 5, 3),
                                         "1x2to3-1x1x1-k3": (1, 2, 3, 1, 1, 1, 3),
                                         "2x3to4-2x3x2-k1": (2, 3, 4, 2, 3, 2, 1)}.items():
        cases += [
            Case("conv3d", sname, lambda g, d, B=B, C=C, O=O, D=D, H=H, W=W, k=k: (
                _r(g, (B, C, D, H, W), d), _r(g, (O, C, k, k, k), d), _r(g, O, d))),
            Case("conv3d_adjoint", sname, lambda g, d, B=B, C=C, O=O, D=D, H=H, W=W, k=k: (
                _r(g, (B, C, D, H, W), d), _r(g, (O, C, k, k, k), d),
                _r(g, (B, O, D, H, W), d))),
        ]
    cases.append(Case("conv3d", "no-bias", lambda g, d: (
        _r(g, (2, 2, 3, 3, 3), d), _r(g, (2, 2, 3, 3, 3), d), None)))
    for shape, O, k in (((2, 3, 5, 4), 4, 3), ((2, 2, 3, 4, 5), 3, 3), ((1, 2, 4, 3), 3, 1)):
        sname = "x".join(map(str, shape)) + f"to{O}-k{k}"
        w_shape = (O, shape[1], *(k,) * (len(shape) - 2))
        out = (shape[0], O, *(-(-n // 2) for n in shape[2:]))
        cases += [
            Case("conv_stride2", sname, lambda g, d, s=shape, w=w_shape, O=O: (
                _r(g, s, d), _r(g, w, d), _r(g, O, d))),
            Case("conv_stride2_adjoint", sname, lambda g, d, s=shape, w=w_shape, o=out: (
                _r(g, s, d), _r(g, w, d), _r(g, o, d))),
        ]
    for shape in ((2, 3, 4, 6), (2, 3, 5, 7), (2, 2, 4, 4, 6), (1, 2, 3, 5, 4)):
        sname = "x".join(map(str, shape))
        out = RS.pooled_shape(shape)
        cases += [
            Case("avgpool", sname, lambda g, d, s=shape: (_r(g, s, d),)),
            Case("avgpool_adjoint", sname, lambda g, d, s=shape, o=out: (_r(g, o, d), s)),
            Case("maxpool", sname, lambda g, d, s=shape: (_r(g, s, d),)),
            Case("maxpool_adjoint", sname, lambda g, d, s=shape, o=out: (
                _r(g, o, d), RS.maxpool(_r(g, s, d))[1], s)),
        ]
    for shape in ((4, 3, 5, 5), (3, 2, 3, 4, 2)):
        sname = "x".join(map(str, shape))
        C = shape[1]

        def bn_args(g, d, s=shape, C=C):
            x = 2 + _r(g, s, d)
            mean, rstd = RS.batchnorm_stats(x, 1e-5)
            return x, mean, rstd, _r(g, C, d)

        cases += [
            Case("batchnorm_stats", sname, lambda g, d, s=shape: (3 + _r(g, s, d), 1e-5)),
            Case("batchnorm_apply", sname, lambda g, d, f=bn_args, C=C: (
                *f(g, d), _r(g, C, d))),
        ]
        for batch_stats in (True, False):
            cases.append(Case("batchnorm_adjoint", f"{sname}-{'train' if batch_stats else 'eval'}",
                              lambda g, d, f=bn_args, s=shape, t=batch_stats: (
                                  *f(g, d), _r(g, s, d), t)))
    return cases


def _batched_cases() -> list[Case]:
    """Whole dense steps: one (B, C), and k at once (MGRIT's batched sweeps: stacked states,
    weights, step sizes)."""
    shapes = {"3x4x5": (3, 4, 5), "1x1x1": (1, 1, 1), "2x5x20": (2, 5, 20)}
    cases = []
    for act in ACTS:
        for sname, (B, C) in {"4x5": (4, 5), "1x1": (1, 1), "5x20": (5, 20)}.items():
            cases += [
                Case("dense_step", f"{act}-{sname}", lambda g, d, B=B, C=C, a=act: (
                    _r(g, (B, C), d), _r(g, (C, C), d), _r(g, C, d), 0.375, a)),
                Case("dense_step_adjoint", f"{act}-{sname}", lambda g, d, B=B, C=C, a=act: (
                    _r(g, (B, C), d), _r(g, (B, C), d), _r(g, (B, C), d), _r(g, (C, C), d),
                    0.375, a)),
            ]
        for sname, (k, B, C) in shapes.items():
            h = [0.25 + 0.125 * j for j in range(k)]  # a list: every backend takes it as is
            cases += [
                Case("dense_step_batched", f"{act}-{sname}",
                     lambda g, d, k=k, B=B, C=C, h=h, a=act: (
                         _r(g, (k, B, C), d), _r(g, (k, C, C), d), _r(g, (k, C), d), h, a)),
                Case("dense_step_batched_adjoint", f"{act}-{sname}",
                     lambda g, d, k=k, B=B, C=C, h=h, a=act: (
                         _r(g, (k, B, C), d), _r(g, (k, B, C), d), _r(g, (k, B, C), d),
                         _r(g, (k, C, C), d), h, a)),
            ]
    return cases


def _conv_batched_cases() -> list[Case]:
    """k convolutions at once (the conv step's batched sweeps): row j with W[j], b[j]."""
    shapes = {"2x2x3to4-5x6-k3": (2, 2, 3, 4, 5, 6, 3), "1x1x1to1-1x1-k3": (1, 1, 1, 1, 1, 1, 3),
              "3x1x2to1-4x1-k1": (3, 1, 2, 1, 4, 1, 1)}  # (k, B, Cin, Cout, H, W, s)
    cases = [Case("conv2d_batched", "no-bias", lambda g, d: (
        _r(g, (2, 1, 2, 3, 3), d), _r(g, (2, 2, 2, 3, 3), d), None))]
    for sname, (k, B, C, O, H, W, s) in shapes.items():
        cases += [
            Case("conv2d_batched", sname, lambda g, d, k=k, B=B, C=C, O=O, H=H, W=W, s=s: (
                _r(g, (k, B, C, H, W), d), _r(g, (k, O, C, s, s), d), _r(g, (k, O), d))),
            Case("conv2d_adjoint_batched", sname,
                 lambda g, d, k=k, B=B, C=C, O=O, H=H, W=W, s=s: (
                     _r(g, (k, B, C, H, W), d), _r(g, (k, O, C, s, s), d),
                     _r(g, (k, B, O, H, W), d))),
        ]
    return cases


def _conv_step_cases() -> list[Case]:
    """Whole conv ODE steps (C → C channels), one (B, C, H, W) and k at once."""
    cases = []
    for act in ACTS:
        for sname, (k, B, C, H, W, s) in {"2x2x3-4x5-k3": (2, 2, 3, 4, 5, 3),
                                          "2x2x4-5x6-k3": (2, 2, 4, 5, 6, 3),
                                          "1x1x1-1x1-k3": (1, 1, 1, 1, 1, 3),
                                          "3x1x2-3x1-k1": (3, 1, 2, 3, 1, 1),
                                          "2x3x2-4x3-k5": (2, 3, 2, 4, 3, 5)}.items():
            h = [0.25 + 0.125 * j for j in range(k)]
            cases += [
                Case("conv_step", f"{act}-{sname}", lambda g, d, B=B, C=C, H=H, W=W, s=s, a=act: (
                    _r(g, (B, C, H, W), d), _r(g, (C, C, s, s), d), _r(g, C, d), 0.375, a)),
                Case("conv_step_adjoint", f"{act}-{sname}",
                     lambda g, d, B=B, C=C, H=H, W=W, s=s, a=act: (
                         *(_r(g, (B, C, H, W), d) for _ in range(3)), _r(g, (C, C, s, s), d),
                         0.375, a)),
                Case("conv_step_batched", f"{act}-{sname}",
                     lambda g, d, k=k, B=B, C=C, H=H, W=W, s=s, h=h, a=act: (
                         _r(g, (k, B, C, H, W), d), _r(g, (k, C, C, s, s), d),
                         _r(g, (k, C), d), h, a)),
                Case("conv_step_batched_adjoint", f"{act}-{sname}",
                     lambda g, d, k=k, B=B, C=C, H=H, W=W, s=s, h=h, a=act: (
                         *(_r(g, (k, B, C, H, W), d) for _ in range(3)),
                         _r(g, (k, C, C, s, s), d), h, a)),
            ]
    return cases


CASES = _elementwise_cases() + _dense_cases() + _conv_cases() + _loss_cases()
CASES += _transformer_cases() + _spatial_cases() + _batched_cases() + _conv_batched_cases()
CASES += _conv_step_cases()


def _catalogue_params():
    params = []
    for bp in BACKEND_PARAMS:
        name, bid = bp.values[0], bp.id
        for case in CASES:
            if case.big and name == "cuda" and CUDA_SIMULATED:
                continue
            for dtype in (np.float64, np.float32):
                cid = f"{case.kernel}-{case.name}-{np.dtype(dtype).name}-{bid}"
                params.append(pytest.param(name, case, dtype, id=cid))
    return params


# ----------------------------------------------------------------------------- comparison
def _leaves(out):
    return list(out) if isinstance(out, tuple) else [out]


def assert_matches(got, want, rtol: float, what: str) -> None:
    """Every output of ``got`` equals ``want`` in the max norm (relative), with its dtype."""
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, reference has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{what} output {k}: shape {g.shape}, reference {w.shape}"
        assert g.dtype == w.dtype, f"{what} output {k}: dtype {g.dtype}, reference {w.dtype}"
        if w.size == 0:
            continue
        if w.dtype.kind in "iub":  # an index (max pooling's arg-max): exactly equal
            assert np.array_equal(g, w), f"{what} output {k}: integer outputs differ"
            continue
        err = np.abs(g.astype(np.float64) - w.astype(np.float64))
        scale = max(float(np.abs(w).max()), np.finfo(w.dtype).tiny)
        worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
        assert float(err.max()) <= rtol * scale, (
            f"{what} output {k}: max error {float(err.max()):.3e} at index {worst} "
            f"> {rtol:g} × max|ref| = {rtol * scale:.3e}"
        )


def _to_backend(bk, a):
    if isinstance(a, np.ndarray):
        return bk.asarray(a)
    return a


def _host(bk, out):
    if isinstance(out, tuple):
        return tuple(_host(bk, o) for o in out)
    if hasattr(out, "shape") and not isinstance(out, (np.ndarray, np.generic)):
        return bk.to_numpy(out)
    return out


@pytest.mark.parametrize(("backend_name", "case", "dtype"), _catalogue_params())
def test_kernel_matches_reference(backend_name, case, dtype):
    bk = backend_or_skip(backend_name)
    args = case.build(np.random.default_rng(1234), dtype)
    want = getattr(get_backend("numpy"), case.kernel)(*args)  # reference and reference_spatial
    got = _host(bk, getattr(bk, case.kernel)(*[_to_backend(bk, a) for a in args]))
    what = f"{case.kernel}[{case.name}] on {backend_name} ({np.dtype(dtype).name})"
    assert_matches(got, want, RTOL[dtype], what)


# ----------------------------------------------------------------------------- dispatch
def test_catalogue_covers_every_kernel():
    missing = sorted(set(KERNELS) - {c.kernel for c in CASES})
    assert not missing, f"kernels with no catalogue case: {missing}"


def test_unknown_backend_raises_naming_backend():
    with pytest.raises(ValueError, match="`backend`") as info:
        get_backend("nope")
    assert "'nope'" in str(info.value)


@pytest.mark.parametrize("backend_name", BACKEND_PARAMS)
def test_backend_lists_only_known_kernels(backend_name):
    bk = backend_or_skip(backend_name)
    assert bk.name in BACKENDS
    assert set(bk.overrides) <= set(KERNELS), set(bk.overrides) - set(KERNELS)
    for k in KERNELS:
        assert callable(getattr(bk, k)), k
    if backend_name in ("numba", "cuda"):  # the fast backends really override the hot kernels
        assert {"euler_act", "linear", "conv2d", "conv2d_adjoint"} <= set(bk.overrides)


def test_available_backends_include_the_cpu_and_simulated_ones():
    names = available_backends()
    assert names[:2] == ["numpy", "numba"]
    if CUDA_SIMULATED:
        assert "cuda" in names


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("backend_name", ["numba", "cuda"])
def test_bad_shapes_raise_value_error_naming_the_argument(backend_name):
    bk = get_backend(backend_name)
    rng = np.random.default_rng(0)
    x, W, b = _r(rng, (3, 4), np.float64), _r(rng, (5, 4), np.float64), _r(rng, 5, np.float64)
    with pytest.raises(ValueError, match="`W`"):
        bk.linear(x, W.T.copy(), b)
    with pytest.raises(ValueError, match="`b`"):
        bk.linear(x, W, b[:4])
    with pytest.raises(ValueError, match="`dz`"):
        bk.linear_adjoint(x, W, _r(rng, (3, 4), np.float64))
    xi = _r(rng, (1, 2, 4, 4), np.float64)
    with pytest.raises(ValueError, match="`W`.*odd"):
        bk.conv2d(xi, _r(rng, (2, 2, 2, 2), np.float64), None)
    with pytest.raises(ValueError, match="`W`"):
        bk.conv2d(xi, _r(rng, (2, 3, 3, 3), np.float64), None)
    with pytest.raises(ValueError, match="`x`"):
        bk.conv2d(xi[0], _r(rng, (2, 2, 3, 3), np.float64), None)
    with pytest.raises(ValueError, match="`activation`.*'swish'"):
        bk.activation(x, "swish")
    with pytest.raises(TypeError, match="`h`"):
        bk.euler_act(x, x, "0.1", "tanh")


def test_numba_loss_rejects_bad_labels():
    bk = get_backend("numba")
    logits = np.zeros((3, 4))
    with pytest.raises(ValueError, match="`labels`.*\\[0, 4\\)"):
        bk.softmax_cross_entropy(logits, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="`labels`.*shape"):
        bk.softmax_cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(TypeError, match="`labels`"):
        bk.softmax_cross_entropy(logits, np.array([0.0, 1.0, 2.0]))


# ----------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("backend_name", ["numba", "cuda"])
@pytest.mark.parametrize("act", ACTS)
def test_complex_inputs_take_the_reference_path(backend_name, act):
    """The verifier's complex steps must see exactly the reference (no silent real cast)."""
    bk = get_backend(backend_name)
    rng = np.random.default_rng(3)
    z = rng.standard_normal((4, 5)) + 1e-20j * rng.standard_normal((4, 5))
    np.testing.assert_array_equal(bk.activation(z, act), reference.activation(z, act))
    dy = rng.standard_normal((4, 5)).astype(complex)
    np.testing.assert_array_equal(
        bk.activation_adjoint(z, dy, act), reference.activation_adjoint(z, dy, act)
    )


@pytest.mark.parametrize("backend_name", ["numba", "cuda"])
@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_mixed_dtypes_promote_like_numpy(backend_name, act):
    bk = get_backend(backend_name)
    rng = np.random.default_rng(5)
    y, z = _r(rng, (3, 4), np.float32), _r(rng, (3, 4), np.float64)
    got, want = bk.euler_act(y, z, 0.5, act), reference.euler_act(y, z, 0.5, act)
    assert got.dtype == want.dtype == np.float64
    assert_matches(got, want, 1e-12, "euler_act float32 + float64")
    # a Python float h keeps float32; a NumPy float64 scalar h promotes (NEP 50)
    z32 = z.astype(np.float32)
    for h in (0.5, np.float64(0.5)):
        got, want = bk.euler_act(y, z32, h, act), reference.euler_act(y, z32, h, act)
        assert got.dtype == want.dtype, (type(h), got.dtype, want.dtype)
        assert_matches(got, want, 1e-5, f"euler_act float32 with h of type {type(h).__name__}")


@pytest.mark.parametrize("chunk_bytes", [1, 2 * 3 * 25 * 25 * 8])
def test_numba_conv_chunks_agree(monkeypatch, chunk_bytes):
    """im2col (k ≠ 3): one image per GEMM, and two per GEMM with a remainder of one (B = 3)."""
    from refbraid.backends import numba_cpu_conv, numba_cpu_im2col

    monkeypatch.setattr(numba_cpu_im2col, "IM2COL_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(7)
    x, W = _r(rng, (3, 3, 5, 5), np.float64), _r(rng, (4, 3, 5, 5), np.float64)
    b = _r(rng, 4, np.float64)
    dz = _r(rng, (3, 4, 5, 5), np.float64)
    assert numba_cpu_im2col._chunk(x, 5) == (1 if chunk_bytes == 1 else 2)
    assert_matches(numba_cpu_conv.conv2d(x, W, b), reference.conv2d(x, W, b), 1e-12,
                   "conv2d chunked")
    assert_matches(
        numba_cpu_conv.conv2d_adjoint(x, W, dz), reference.conv2d_adjoint(x, W, dz), 1e-12,
        "conv2d_adjoint chunked",
    )


# ----------------------------------------------------------------------------- cuda specifics
def test_cuda_accepts_device_arrays():
    from numba import cuda

    bk = get_backend("cuda")
    rng = np.random.default_rng(11)
    x, W, b = _r(rng, (3, 5), np.float64), _r(rng, (4, 5), np.float64), _r(rng, 4, np.float64)
    got = bk.linear(cuda.to_device(x), cuda.to_device(W), cuda.to_device(b))
    assert isinstance(got, np.ndarray)
    assert_matches(got, reference.linear(x, W, b), 1e-12, "linear on device arrays")
    z = _r(rng, (2, 3, 4), np.float64)
    got = bk.euler_act(cuda.to_device(z), cuda.to_device(z), 0.5, "gelu")
    assert_matches(got, reference.euler_act(z, z, 0.5, "gelu"), 1e-12, "euler_act on device")
    with pytest.raises(TypeError, match="dtype"):
        bk.linear(cuda.to_device(x), cuda.to_device(W.astype(np.float32)), None)


def test_cuda_is_usable_and_matches_the_environment():
    from refbraid.backends import numba_cuda

    assert numba_cuda.is_usable() is True  # a GPU, or the simulator CI enables
    assert numba_cuda.simulated() == CUDA_SIMULATED


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_cuda_module_imports_without_numba_cuda():
    """Blocking ``numba.cuda`` leaves a usable package: cuda backend = reference kernels."""
    code = (
        "import sys; sys.modules['numba.cuda'] = None\n"
        "import refbraid.backends.numba_cuda as m\n"
        "assert m.is_usable() is False and m.OVERRIDES == (), m.OVERRIDES\n"
        "from refbraid.backends import numba_cuda_conv, numba_cuda_dense\n"
        "assert numba_cuda_dense.OVERRIDES == numba_cuda_conv.OVERRIDES == ()\n"
        "from refbraid.backends import available_backends, get_backend\n"
        "assert 'cuda' not in available_backends()\n"
        "assert get_backend('cuda').overrides == (), get_backend('cuda').overrides\n"
        "print('ok')\n"
    )
    result = _run_python(code)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


# ----------------------------------------------------------------------------- cupy specifics
def test_cupy_module_is_safe_without_a_gpu():
    from refbraid.backends import cupy_dense, cupy_gpu

    usable = cupy_gpu.is_usable()
    assert isinstance(usable, bool)
    from refbraid.backends import KERNELS

    # the fused kernels (cupy_fused), the dense steps' among them
    assert set(cupy_gpu.OVERRIDES) | set(cupy_dense.OVERRIDES) <= set(KERNELS)
    assert not set(cupy_gpu.OVERRIDES) & set(cupy_dense.OVERRIDES)
    if importlib.util.find_spec("cupy") is None:
        assert usable is False
        with pytest.raises(ImportError, match="cupy"):
            cupy_gpu.xp  # noqa: B018 - the lazy attribute raises
    else:  # pragma: no cover - machines with CuPy
        assert cupy_gpu.xp.__name__ == "cupy"
