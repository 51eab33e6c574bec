"""Where the time of one layer-parallel gradient goes: a cProfile table (one process).

    python benchmarks/profile_layer_parallel.py [--layers 512] [--width 32] [--batch 64] [--top 20]

Dense ResNet (as benchmarks/bench_training.py), TorchBraid's settings, NumPy backend, one
thread. Prints the median time of serial backprop and of the layer-parallel gradient, the
time ratio, the work ratio (Φ applications LP / serial) and their quotient (the overhead
column of bench_training.py), then the profile of ``--runs`` gradients sorted by own time.
Times are CPU seconds of this process (the machine this was written on is shared).

First line: the MGRIT inner loop's own cost per step application, measured with a step that
does almost nothing (``u * 1.0`` on a 1-element state, N = 4,096, TorchBraid's settings with
FCF on every level, 3 cycles): (solve time - N_Φ · bare step time) / N_Φ.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np

from refbraid import Network, backprop, get_backend, init_params
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep


def median_time(fn, repeat: int) -> float:
    """Median CPU time of this process (``time.process_time``: one thread, so the wall time
    of an idle machine, without the waits of a loaded one)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def inner_loop_overhead(repeat: int) -> tuple[float, float]:
    """(µs of solver work per step application, µs of the bare step) on a trivial problem."""
    from refbraid.mgrit import MGRITSettings, Problem, solve

    def step(u, start, stop):
        return u * 1.0

    problem = Problem(step, np.zeros(1), 4096)
    s = MGRITSettings.torchbraid(relax="FCF", max_iter=3, abs_tol=None)
    t_solve = median_time(lambda: solve(problem, s), repeat)
    n_phi = solve(problem, s).total_steps
    u = np.zeros(1)
    t_step = median_time(lambda: [step(u, 0, 1) for _ in range(n_phi)], repeat)
    return 1e6 * (t_solve - t_step) / n_phi, 1e6 * t_step / n_phi


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=512)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--runs", type=int, default=5, help="gradients under the profiler")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)
    over, bare = inner_loop_overhead(args.repeat)
    print(f"MGRIT inner loop: {over:.2f} µs per step application beyond the step itself "
          f"(bare trivial step {bare:.2f} µs)")
    bk = get_backend("numpy")
    C, N = args.width, args.layers
    net = Network(DenseLift(2, C), DenseStep(C, "tanh"), Classifier((C,), 5), N, 3.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((args.batch, 2)), rng.integers(0, 5, args.batch)
    settings = LayerParallelSettings()

    def lp():
        return layer_parallel_gradient(net, params, x, y, settings, bk)

    t_serial = median_time(lambda: backprop(net, params, x, y, bk), args.repeat)
    t_lp = median_time(lp, args.repeat)
    phi = int(lp()[2].stats()["phi_calls"])
    work = phi / (2 * N)
    print(f"N={N}, width {C}, batch {args.batch}; load {os.getloadavg()[0]:.2f}; "
          f"median of {args.repeat}")
    print(f"serial {1e3 * t_serial:.2f} ms, layer-parallel {1e3 * t_lp:.2f} ms, time ratio "
          f"{t_lp / t_serial:.2f}, work ratio {work:.2f}, overhead {t_lp / t_serial / work:.2f}")
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for _ in range(args.runs):
        lp()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
