"""The device stand-ins for the tests in this folder: ``strict``
(refbraid.backends.strict_device, array-api-strict arrays on a non-default device) and
``cupy`` on the CuPy-like stand-in (refbraid.backends.cupy_standin, a fake ``cupy`` module
found by array-api-compat the way CuPy is). The ``standin`` fixture runs a test on both, the
``strict`` fixture on the strict one only.

Every test here runs inside both stand-ins' ``forbid_host_conversions()``: an implicit
conversion of a device array (``float``, ``bool``, ``numpy.asarray``, f-strings, DLPack,
pickling) fails the test; only ``refbraid.backends.host.to_host`` brings values to the host.
"""

import pytest

pytest.importorskip("array_api_strict")
pytest.importorskip("array_api_compat")

from refbraid.backends import cupy_standin, get_backend, strict_device


@pytest.fixture(autouse=True)
def _no_implicit_host_conversions():
    with strict_device.forbid_host_conversions(), cupy_standin.forbid_host_conversions():
        yield


@pytest.fixture
def strict():
    """The ``strict`` backend: reference kernels on array-api-strict arrays on ``device1``."""
    return get_backend("strict")


@pytest.fixture(params=["strict", "cupy-standin"])
def standin(request):
    """Each device stand-in in turn: ``strict``, then the ``cupy`` backend on the CuPy-like
    stand-in (installed as ``cupy`` for the test's duration)."""
    if request.param == "strict":
        yield get_backend("strict")
        return
    if cupy_standin.real_cupy_imported():  # a GPU machine's full run: CuPy itself is here
        pytest.skip("a real CuPy is imported in this process; the CuPy-like stand-in runs in "
                    "CPU-only test runs (the GPU run tests CuPy itself)")
    with cupy_standin.standin_backend() as bk:
        yield bk
