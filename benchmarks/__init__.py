"""refbraid's benchmarks: a few suites, one runner, one timer, one table and one JSON file.

    python -m benchmarks quick                      # every quick suite, one table (minutes)
    python -m benchmarks full step scaling          # chosen suites at their full sizes
    python -m benchmarks quick kernels --json k.json

Suites (each a module here, each case a function of it):

    kernels   one layer forward + adjoint: numpy vs numba vs PyTorch CPU   (kernels.py)
    solver    MGRIT vs a sequential solve, and vs PyMGRIT on its problems   (solver.py)
    step      the layer-parallel training step vs serial, 1 and 2 ranks     (step.py)
    scaling   the virtual cluster's predictions vs ``mpiexec`` measurements (scaling.py)
    counts    launches, critical path, copies, syncs per gradient, counted without a GPU
              (counts.py; deterministic)
    gpu       layers and gradients on a GPU vs PyTorch CUDA (gpu.py; not in ``quick``)

``fingerprint.py`` is no benchmark: it hashes what MGRIT computes, to prove a change
bit-identical (``python benchmarks/fingerprint.py > before.txt``).

Why a hand-written runner and not ``asv`` or ``pytest-benchmark``: the numbers worth having
here are *ratios measured in the same run* (layer-parallel ÷ serial, numba ÷ PyTorch,
2 ranks ÷ 1 rank), taken inside ``mpiexec`` workers as the slowest rank's time, in fresh
processes with glibc malloc pinned, sometimes in CPU time. ``asv`` times one function per
benchmark across commits in its own environments and cannot launch MPI ranks or form a ratio
of two timings; ``pytest-benchmark`` times one callable per test in the test process (its
calibration loop, wall clock only) and would need the same MPI launching and ratio code
around it. What is left for a library to do — a median after warm-ups, a table, a JSON file —
is ``harness.py``'s ~150 lines.

Importing this package sets the thread counts of BLAS, OpenMP and Numba to 1 in this process
and (inherited) in every process it starts, before NumPy is imported by a suite.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"
