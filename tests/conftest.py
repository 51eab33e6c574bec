"""Test configuration shared by every test file.

Runs before any test module imports Numba, so the environment set here takes effect:

* ``NUMBA_ENABLE_CUDASIM=1`` unless already set: the CUDA kernels run in Numba's simulator,
  so CI tests them without a GPU. On a GPU machine run ``NUMBA_ENABLE_CUDASIM=0 pytest``.
* one thread for BLAS, OpenMP and Numba (the CI machine has 2 cores, shared).
* matplotlib's non-interactive Agg backend.

Backends: :data:`BACKEND_PARAMS` lists numpy, numba, cuda (test id ``cudasim`` when
simulated) and cupy; use ``@pytest.mark.parametrize("backend_name", BACKEND_PARAMS)`` with
:func:`backend_or_skip`, or the ``backend`` fixture (a :class:`refbraid.backends.Backend`).
Only cupy may skip, and only when no GPU is present. On a GPU machine,
``NUMBA_ENABLE_CUDASIM=0 pytest -m gpu`` runs every test of the cupy and cuda backends and
tests/test_gpu.py (README, "GPU").
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import matplotlib

matplotlib.use("Agg")

import pytest

from refbraid.backends import Backend, get_backend

#: True when the ``cuda`` backend runs in Numba's CUDA simulator.
CUDA_SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

#: The backends that need a real GPU carry the ``gpu`` marker: ``pytest -m gpu`` selects them
#: (cupy always; cuda unless simulated) together with tests/test_gpu.py.
BACKEND_PARAMS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("numba", id="numba"),
    pytest.param("cuda", id="cudasim" if CUDA_SIMULATED else "cuda",
                 marks=() if CUDA_SIMULATED else pytest.mark.gpu),
    pytest.param("cupy", id="cupy", marks=pytest.mark.gpu),
]


def backend_or_skip(name: str) -> Backend:
    """The backend called ``name``; skips the test for ``cupy`` when no GPU can run CuPy."""
    if name == "cupy":
        from refbraid.backends.cupy_gpu import is_usable

        if not is_usable():
            pytest.skip("the cupy backend needs CuPy and a CUDA GPU; none is present here")
    return get_backend(name)


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> Backend:
    """Every backend in turn (cupy skipped without a GPU)."""
    return backend_or_skip(request.param)
