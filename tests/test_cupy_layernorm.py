"""The ``cupy`` backend's layer norm: one launch forward, three for the adjoint.

On the counting device (the CuPy stand-in) each kernel of :mod:`refbraid.backends.cupy_layernorm`
runs the reference path and is charged one launch: NumPy's bits, for γ of shape (N,) and
broadcast per group of rows (MGRIT's batched sweeps: (k, 1, 1, N)); any other broadcast takes
the reference operations. The CUDA source compiles for real GPUs (tests/test_gpu_fused.py);
its arithmetic runs only on a GPU (``pytest -m gpu``: the catalogue and the transformer's
layer-parallel step against NumPy), which no stand-in can replace.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.backends import get_backend, launch_count, reference
from refbraid.backends.cupy_layernorm import rows_per_gamma
from refbraid.backends.host import to_host
from refbraid.backends.launch_model import tracking

NUMPY = get_backend("numpy")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gamma_shape", [(6,), (3, 1, 1, 6)], ids=["shared", "per-row-group"])
def test_layernorm_has_the_reference_bits_in_one_and_three_launches(dtype, gamma_shape):
    rng = np.random.default_rng(0)
    x, dy = (rng.standard_normal((3, 2, 4, 6)).astype(dtype) for _ in range(2))
    gamma, beta = (rng.standard_normal(gamma_shape).astype(dtype) for _ in range(2))
    want = reference.layernorm(x, gamma, beta, 1e-5)
    want_adj = reference.layernorm_adjoint(x, want[1], want[2], gamma, dy)
    with launch_count.counting("cupy") as bk:
        d = bk.asarray
        with tracking() as forward:
            got = bk.layernorm(d(x), d(gamma), d(beta), 1e-5)
        with tracking() as adjoint:
            got_adj = bk.layernorm_adjoint(d(x), got[1], got[2], d(gamma), d(dy))
        got, got_adj = [to_host(a) for a in got], [to_host(a) for a in got_adj]
    assert forward.tally.launches == 1 and "layernorm_rows" in forward.tally.by_name
    assert adjoint.tally.launches == 3, adjoint.tally.by_name
    for name, g, w in zip(("y", "mean", "rstd", "dx", "dgamma", "dbeta"), got + got_adj,
                          list(want) + list(want_adj), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)


def test_rows_per_gamma():
    x = np.zeros((3, 2, 4, 6))
    assert rows_per_gamma(x, np.zeros(6)) == 24
    assert rows_per_gamma(x, np.zeros((1, 6))) == 24
    assert rows_per_gamma(x, np.zeros((3, 1, 1, 6))) == 8
    assert rows_per_gamma(x, np.zeros((3, 2, 1, 6))) == 4
    assert rows_per_gamma(x, np.zeros((4, 6))) is None  # per position: not a row group
    assert rows_per_gamma(x, np.zeros((3, 2, 4, 5))) is None
    assert rows_per_gamma(np.zeros((5, 6)), np.zeros((5, 6))) == 1


def test_other_broadcasts_take_the_reference_operations():
    rng = np.random.default_rng(1)
    x, gamma, beta = rng.standard_normal((2, 4, 6)), rng.standard_normal((4, 6)), np.zeros(6)
    want = reference.layernorm(x, gamma, beta, 1e-5)
    with launch_count.counting("cupy") as bk:
        with tracking() as t:
            got = bk.layernorm(bk.asarray(x), bk.asarray(gamma), bk.asarray(beta), 1e-5)
        got = [to_host(a) for a in got]
    assert "layernorm_rows" not in t.tally.by_name and t.tally.launches > 5
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("grads", [True, False])
def test_the_batched_transformer_step_sums_per_layer_in_three_launches(grads):
    """layers/transformer_batched.py's layer norm on cupy: one call with γ broadcast per
    layer (k, 1, 1, E); the adjoint's dγ, dβ per layer (k, E) as the NumPy batched step sums
    them, bit for bit; 3 launches, 1 without the weight gradients."""
    from refbraid.layers.transformer_batched import _layernorm, _layernorm_adjoint

    rng = np.random.default_rng(2)
    X, dY = rng.standard_normal((3, 2, 4, 6)), rng.standard_normal((3, 2, 4, 6))
    gamma, beta = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    Y, mean, rstd = _layernorm(NUMPY, X, gamma, beta, 1e-5)
    want = _layernorm_adjoint(NUMPY, X, mean, rstd, gamma, dY, grads)
    with launch_count.counting("cupy") as bk:
        d = bk.asarray
        with tracking() as forward:
            got_fwd = _layernorm(bk, d(X), d(gamma), d(beta), 1e-5)
        with tracking() as adjoint:
            got = _layernorm_adjoint(bk, d(X), got_fwd[1], got_fwd[2], d(gamma), d(dY), grads)
        got_fwd = [to_host(a) for a in got_fwd]
        got = [None if a is None else to_host(a) for a in got]
    assert forward.tally.launches == 1
    assert adjoint.tally.launches == (3 if grads else 1), adjoint.tally.by_name
    for g, w in zip(got_fwd, (Y, mean, rstd), strict=True):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)
