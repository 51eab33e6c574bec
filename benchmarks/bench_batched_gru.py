"""Does the GRU's batched step pay? MGRIT solves over the sequence, per-step against batched.

    python benchmarks/bench_batched_gru.py [--lengths 256 512 1024] [--batches 8 64]
        [--hidden 32] [--backends numpy numba] [--repeat 5]

The GRU models (``gru``, ``implicit-gru``) run MGRIT over the sequence positions with one set
of weights shared by every position. The batched step (``GRUCell.forward_batched`` /
``adjoint_batched``, used by ``GRUForward`` / ``GRUAdjoint.batched_step``) applies the cell
to the k intervals of a sweep at once: the input and hidden products as ``matmul`` of the
stacked (k, B, ·) arrays with the shared weights, the gate algebra on all k·B rows in one
kernel call. This times, for each backend, sequence length L and batch B (hidden size H,
8 input features, 1 thread, CPU seconds of this process, median of ``--repeat``):

* the MGRIT forward solve over the sequence (TorchBraid's settings: 3 levels, cfactor 4,
  F then FCF, one cycle) with the batched step (what the gradient runs) and with
  ``batched_step`` removed (one call per interval);
* the adjoint solve (TorchBraid's settings: no cycle, the relaxation and the coarse solve),
  linearised at the sequential forward trajectory, both ways;
* the whole layer-parallel gradient (both solves, the loss and the weight-gradient sweep,
  which is per position either way), batched against per-step.

``max |Δ|`` is the largest difference between the two solutions (0: bit-identical). The
decision (``GRUCell.batched_sweeps_pay``) and the tables: docs/batched.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402
from cpu_timing import median_time  # noqa: E402

from refbraid import get_backend  # noqa: E402
from refbraid.layer_parallel import LayerParallelSettings  # noqa: E402
from refbraid.layers import GRUCell  # noqa: E402
from refbraid.mgrit import Problem, sequential_solve, solve  # noqa: E402
from refbraid.network import group  # noqa: E402
from refbraid.sequence import GRUModel  # noqa: E402
from refbraid.sequence.gru_model import GRUAdjoint  # noqa: E402


def solve_pair(problem: Problem, settings, repeat: int) -> tuple[float, float, float]:
    """(per-step s, batched s, max |Δ|) of one MGRIT solve."""
    assert problem.batched_step is not None
    per_step = dataclasses.replace(problem, batched_step=None)
    t_p = median_time(lambda: solve(per_step, settings), repeat)
    t_b = median_time(lambda: solve(problem, settings), repeat)
    d = np.max(np.abs(solve(per_step, settings).solution - solve(problem, settings).solution))
    return t_p, t_b, float(d)


def rows(backend: str, L: int, B: int, H: int, repeat: int, scheme: str) -> str:
    bk = get_backend(backend)
    model = GRUModel(L, 8, H, 10, scheme=scheme)
    rng = np.random.default_rng(0)
    params = model.init_params(rng)
    cell = group(params, "cell")
    x = rng.standard_normal((B, L, 8))
    y = rng.integers(0, 10, B)
    s = LayerParallelSettings()
    fwd = model.forward_problem(cell, x, bk)
    states = sequential_solve(fwd)
    adj = Problem(step=GRUAdjoint(model, cell, x, states, bk), u0=rng.standard_normal((B, H)),
                  n_steps=L, direction="backward")
    fp, fb, fd = solve_pair(fwd, s.forward, repeat)
    ap, ab, ad = solve_pair(adj, s.backward, repeat)

    def grad():
        return model.layer_parallel_gradient(params, x, y, s, bk)

    gb = median_time(grad, repeat)
    with mock.patch.object(GRUCell, "batched_sweeps_pay", False):
        gp = median_time(grad, repeat)
    return (f"{backend:<6} {L:>5} {B:>4} {1e3 * fp:>9.1f} {1e3 * fb:>9.1f} {fp / fb:>6.2f} "
            f"{fd:>8.1e}  {1e3 * ap:>9.1f} {1e3 * ab:>9.1f} {ap / ab:>6.2f} {ad:>8.1e}  "
            f"{1e3 * gp:>9.1f} {1e3 * gb:>9.1f} {gp / gb:>6.2f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--backends", nargs="+", default=["numpy", "numba"],
                    choices=("numpy", "numba"))
    ap.add_argument("--scheme", default="classic", choices=("classic", "implicit"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"GRU ({args.scheme}, coarse levels implicit), H = {args.hidden}, 8 inputs; MGRIT over "
          f"the sequence, TorchBraid's settings; CPU ms, median of {args.repeat}; "
          f"load {os.getloadavg()[0]:.2f}")
    head = (f"{'bk':<6} {'L':>5} {'B':>4} {'fwd per':>9} {'fwd bat':>9} {'speed':>6} "
            f"{'max |Δ|':>8}  {'adj per':>9} {'adj bat':>9} {'speed':>6} {'max |Δ|':>8}  "
            f"{'grad per':>9} {'grad bat':>9} {'speed':>6}")
    print(head)
    print("-" * len(head))
    for backend in args.backends:
        for L in args.lengths:
            for B in args.batches:
                print(rows(backend, L, B, args.hidden, args.repeat, args.scheme), flush=True)
    print("max |Δ| = 0: batched and per-step solves are bit-identical.")


if __name__ == "__main__":
    main()
