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
``NUMBA_ENABLE_CUDASIM=0 pytest -m gpu -n 0`` runs every test of the cupy and cuda backends
and tests/test_gpu.py (README, "One GPU").

Selections (``pyproject.toml``; docs/testing.md): pytest-xdist runs the tests on every core
(``-n auto``), and the default ``-m "not slow and not mpi"`` leaves out the markers below;
``-m "not mpi"`` and ``-m mpi -n 0 -v`` run the rest (CI runs both). Markers:

* ``slow``: an end-to-end run (training, a lesson, a fault injected into a real process);
* ``mpi``: launches ``mpiexec``;
* ``gpu``: needs a real CUDA GPU;
* ``docs``: opens the built documentation site in headless Chromium;
* ``lesson_script``: a lesson run end to end as a Python script, the default selection's check
  of the lessons; CI runs every lesson once, as a notebook (tests/test_lessons_notebooks.py),
  and deselects these (``and not lesson_script``).

Under ``mpiexec`` (tests/mpi) every rank is one pytest process: no xdist workers there.
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


@pytest.fixture
def cupylike() -> Backend:
    """The ``cupy`` backend on the CuPy-like stand-in (refbraid.backends.cupy_standin)."""
    from refbraid.backends import cupy_standin

    if cupy_standin.real_cupy_imported():
        pytest.skip("a real CuPy is imported in this process (the GPU run tests CuPy itself)")
    with cupy_standin.standin_backend() as bk:
        yield bk


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> Backend:
    """Every backend in turn (cupy skipped without a GPU)."""
    return backend_or_skip(request.param)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` means no workers under ``mpiexec``: every rank is one pytest process."""
    from refbraid.parallel.mpi import launched_by_mpiexec

    return 0 if launched_by_mpiexec() else None


#: Tests marked ``slow`` here rather than in their files: end-to-end runs that took 25 s or more
#: each in a timed run (``pytest --durations``; 2 cores shared with other work, so several
#: times an idle machine's seconds). Matched as node-id prefixes.
SLOW_TESTS = (
    "tests/test_lessons.py::test_lesson_runs_in_small_mode_and_saves_its_figure",  # every lesson
    "tests/test_lesson_10.py::test_lesson_10_runs_in_small_mode_and_saves_its_figure",
    "tests/test_cudasim_training_step.py::test_host_array_mode_copies_inside_the_kernels_only",
    "tests/test_train_cli.py::test_checkpoint_and_resume_through_the_cli",
    "tests/test_verify_cli.py::test_verify_torch",
)


def pytest_collection_modifyitems(config, items):
    """Mark the tests of :data:`SLOW_TESTS` ``slow`` (deselected by the default selection)."""
    for item in items:
        if item.nodeid.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
