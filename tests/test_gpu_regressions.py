"""One regression test per cause of the first GPU run's failures (an NVIDIA H200, CuPy 14.2,
numba-cuda 0.30.4; docs/gpu.md), each runnable without a GPU:

1. CuPy arrays have no ``__array_namespace__``: the namespace lookup answered NumPy and
   every new array made "where ``like`` lives" was a host array (the CuPy-like stand-in,
   :mod:`refbraid.backends.cupy_standin`, has CuPy's manners; tests/strict runs the whole
   stand-in catalogue on it).
2. A kernel the simulator runs and the compiler refuses: tests/test_cuda_compile.py.
3. numba-cuda 0.30.4 needs ``numpy.row_stack``, which NumPy 2.5 removed: the ``cuda``
   backend says so in one line naming both versions, and the ``cuda`` extra pins NumPy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("array_api_compat")
pytest.importorskip("array_api_strict")

from refbraid import backends
from refbraid.backends import cupy_standin, portable, reference, reference_spatial


def test_a_cupy_array_gets_cupys_namespace_and_new_arrays_on_the_device(cupylike):
    x = cupylike.asarray(np.arange(24.0).reshape(1, 2, 3, 4))
    assert not hasattr(x, "__array_namespace__")  # as CuPy 14's arrays
    assert portable.namespace(x) is cupylike.xp
    assert reference.array_namespace(x) is cupylike.xp
    for made in (portable.zeros_on(x, (2,)), portable.empty_on(x, (2,)),
                 portable.full_on(x, (2,), 1.0), portable.arange_on(x, 3),
                 portable.asarray_on(x, [1, 2]), portable.copy_of(x),
                 portable.contiguous(x), reference._pad_hw(x, 1)):
        assert isinstance(made, cupy_standin.ndarray), type(made)


def test_reference_kernels_that_make_arrays_run_on_cupy_arrays(cupylike):
    """The kernels the H200 run failed in first: padding, pooling, the loss adjoint."""
    rng = np.random.default_rng(0)
    x, W = rng.standard_normal((2, 2, 4, 4)), rng.standard_normal((3, 2, 3, 3))
    want = reference.conv2d(x, W, None)
    got = reference.conv2d(cupylike.asarray(x), cupylike.asarray(W), None)
    np.testing.assert_allclose(cupylike.to_numpy(got), want, rtol=1e-13)
    out, index = reference_spatial.maxpool(cupylike.asarray(x))
    np.testing.assert_array_equal(cupylike.to_numpy(out), reference_spatial.maxpool(x)[0])
    probs, labels = np.full((3, 4), 0.25), np.array([0, 3, 1])
    np.testing.assert_allclose(
        cupylike.to_numpy(reference.softmax_cross_entropy_adjoint(cupylike.asarray(probs),
                                                                  cupylike.asarray(labels))),
        reference.softmax_cross_entropy_adjoint(probs, labels))


def test_the_namespace_of_other_libraries():
    import array_api_strict

    assert portable.namespace(np.ones(2)) is np
    assert portable.namespace(np.float64(1.0)) is np
    assert portable.namespace(1.0) is np and portable.namespace(None) is np
    assert portable.namespace(array_api_strict.ones(2)) is array_api_strict
    torch = pytest.importorskip("torch")
    xp = portable.namespace(torch.ones(2))
    assert hasattr(xp, "permute_dims") and xp.__name__.startswith("array_api_compat")
    with pytest.raises(TypeError):
        portable.namespace(np.ones(2), array_api_strict.ones(2))


def test_the_cuda_backend_names_the_versions_when_numpy_is_too_new(monkeypatch):
    """numba-cuda 0.30.4 with NumPy ≥ 2.5: one line naming both, not an AttributeError from
    inside numba-cuda shown as a bug in refbraid."""
    numba_cuda = pytest.importorskip("refbraid.backends.numba_cuda")
    if numba_cuda.cuda is None:
        pytest.skip("numba-cuda is not installed")
    from importlib.util import find_spec

    source = Path(find_spec("numba.cuda.np.arrayobj").origin).read_text(encoding="utf-8")
    if "np.row_stack" not in source:
        pytest.skip("this numba-cuda does not use numpy.row_stack")
    monkeypatch.setattr(numba_cuda, "simulated", lambda: False)  # as on a GPU
    monkeypatch.delattr(np, "row_stack")  # as NumPy 2.5
    monkeypatch.setattr(backends, "_cache", {})
    for ask in (lambda: backends.get_backend("cuda"), lambda: backends.require_usable("cuda")):
        with pytest.raises(ImportError, match=r"numba-cuda \S+ needs numpy.row_stack, which "
                                              r"NumPy \S+ no longer has; install numpy<2.5"):
            ask()
    monkeypatch.undo()
    assert numba_cuda.numpy_incompatibility() is None  # this NumPy is fine


def test_the_cuda_extra_pins_a_numpy_numba_cuda_can_run():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    cuda = project["project"]["optional-dependencies"]["cuda"]
    assert any(r.replace(" ", "").startswith("numpy") and "<2.5" in r for r in cuda), cuda
