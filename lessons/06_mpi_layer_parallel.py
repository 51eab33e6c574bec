# %% [markdown]
# # Lesson 06 — Layer-parallel training over MPI
#
# Lesson 05 solved the forward and adjoint recurrences of a ResNet with MGRIT in one process.
# Here the layers really are spread over processes: with `mpiexec -n P` every **rank** owns a
# contiguous block of layers, and the only things that travel are a few boundary values.
#
#     rank 0: opening, layers [0, b1)    rank 1: layers [b1, b2)   …   rank P-1: … , closing
#
# * the forward MGRIT solve: rank q computes y[i] for i in its block; relaxation is local, and
#   the step from the previous block's last point into this block's first arrives as a
#   **ghost** message: rank q-1 makes that step (it owns the layer: t_a → t_{a+m} uses θ_a,
#   on every level) and sends its result;
# * the adjoint solve runs on the reversed grid: rank q owns λ[i] for i in (b_q, b_{q+1}], one
#   point later than its states, so its adjoint steps (into λ[a], with θ_a and y[a]) are its
#   own layers too, and the step into λ[b_q] is sent to rank q-1;
# * so a rank applies only its own layers and computes only their gradients: no weights,
#   states or gradients travel, only the ghosts (XBraid, and TorchBraid on it, step a ghost
#   on the receiving rank, which then needs the sender's boundary layer);
# * every exchange is a linear operator whose adjoint is the reversed exchange
#   (docs/references.md §5): `tests/mpi/test_ops.py` proves each with the distributed dot-product
#   test ⟨A x, y⟩ = ⟨x, Aᵀ y⟩.
#
# The lesson launches a small program on P ranks with `mpiexec -n P python -m mpi4py`,
# checks that every rank count gives the single-process gradient, and compares the measured
# speedup with a cost model (docs/references.md §4).
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/06_mpi_layer_parallel.py`, it saves
# them to `lesson_figures/06/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import json
import time

import numpy as np
from matplotlib.figure import Figure

from refbraid.distributed.ownership import BlockPlan
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.lessons import show, small
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.parallel.launch import run_mpi

SMALL = small()

N = 64 if SMALL else 256  # layers
RANKS = (1, 2) if SMALL else (1, 2, 3, 4)
REPEAT = 2 if SMALL else 5
settings = LayerParallelSettings()  # TorchBraid's: 3 levels, cfactor 4, 2 fwd / 1 bwd iterations

# %% [markdown]
# ## Who owns what
#
# `BlockPlan` is pure bookkeeping (no MPI): the blocks start at coarsest-grid points (every
# 16th layer here), so every F-interval of every level lies on one rank. Its table lists,
# per rank, the layers it owns, the adjoints it owns, and the rows that cross ranks.

# %%
P_SHOW = max(RANKS)
plan = BlockPlan.build(N, settings, P_SHOW)
print(plan.table())

# %% [markdown]
# ## The program every rank runs
#
# It is ordinary Python: `distributed_gradient` splits `COMM_WORLD` (here into one group of
# P layer ranks) and returns a callable with the trainer's signature
# `(params, x, labels) -> (loss, grads, stats)`. Every rank passes the same batch and gets the
# same loss and gradient; rank 0 checks it against the single-process layer-parallel
# gradient and reports timings, Φ applications and messages of every rank.

# %%
DEMO = """
import json, statistics, sys, time
import numpy as np
from refbraid.network import init_params
from refbraid.distributed.network import distributed_gradient
from refbraid.layer_parallel import layer_parallel_gradient, relative_gradient_error
from refbraid.models import build_network

N, REPEAT = int(sys.argv[1]), int(sys.argv[2])
net = build_network("resnet", (2,), 5, N, 32, 3.0, "tanh")    # a deep, narrow ResNet
params = init_params(net, 0)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((64, 2)), rng.integers(0, 5, 64)
grad = distributed_gradient(net)                 # COMM_WORLD; TorchBraid's MGRIT settings
world, comm = grad.topo.world, grad.topo.layer
loss, g, stats = grad(params, x, y)              # the same on every rank
times = []
for _ in range(REPEAT):
    world.barrier()
    t0 = time.perf_counter()
    grad(params, x, y)
    times.append(max(world.allgather(time.perf_counter() - t0)))
sends, wait = comm.counters["sends"], comm.counters["wait_s"]
solves = grad.last_solves
mine = {"layers": [int(grad.owned[0]), int(grad.owned[-1])],
        "phi": stats["rank_phi_calls"],
        "coarsest": solves["forward"].step_counts[-1] + solves["backward"].step_counts[-1],
        "sends": sends / (REPEAT + 1), "wait_s": wait / (REPEAT + 1)}
ranks = world.gather(mine)
if world.rank == 0:
    _, g0, _ = layer_parallel_gradient(net, params, x, y)
    print("RESULT " + json.dumps({"P": world.size, "seconds": statistics.median(times),
                                  "error": relative_gradient_error(g, g0), "ranks": ranks}))
"""


def launch(P: int) -> dict:
    run = run_mpi(P, ["-c", DEMO, str(N), str(REPEAT)], timeout=300).check()
    line = next(ln for ln in run.output.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


results = {P: launch(P) for P in RANKS}
for P, r in results.items():
    print(f"P = {P}: {1e3 * r['seconds']:7.1f} ms per gradient, relative error vs one process "
          f"{r['error']:.1e}")

# the baseline every parallel run must beat: sequential backprop, in this process
net = build_network("resnet", (2,), 5, N, 32, 3.0, "tanh")
params = init_params(net, 0)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((64, 2)), rng.integers(0, 5, 64)
backprop(net, params, x, y)
times = []
for _ in range(REPEAT):
    t0 = time.perf_counter()
    backprop(net, params, x, y)
    times.append(time.perf_counter() - t0)
t_seq = float(np.median(times))
print(f"sequential backprop: {1e3 * t_seq:7.1f} ms per gradient")

# %% [markdown]
# ## Measured speedup against a cost model
#
# docs/references.md §4: the time of a solve is the work of the busiest rank plus what cannot run
# in parallel. Calibrate one number on the 1-rank run, the time per Φ application
# `t_Φ = T_1 / calls_1` (kernels and all MGRIT bookkeeping), then predict P ranks from the
# counted applications of every rank:
#
#     T_P ≈ t_Φ · ( max_q (calls_q − coarsest_q) + Σ_q coarsest_q ) + max_q msgs_q · t_msg
#
# The coarsest level is solved as a pipeline through the ranks, so its steps add up instead
# of splitting. `t_msg` ≈ 20 µs per neighbour message on one machine.
#
# Sequential backprop needs about 3N matrix products, MGRIT with TorchBraid's settings about
# 9N, so P ranks must first win back a factor of ~3: on 2 ranks MGRIT is slower than
# sequential training, and the model says how many ranks it takes to break even. With more
# ranks than cores (P = 3, 4 on a 2-core laptop) the measurement falls behind the model.

# %%
T_MSG = 20e-6
one = results[1]
t_phi = one["seconds"] / one["ranks"][0]["phi"]
model = {}
for P, r in results.items():
    busy = max(q["phi"] - q["coarsest"] for q in r["ranks"])
    pipe = sum(q["coarsest"] for q in r["ranks"])
    msgs = max(q["sends"] for q in r["ranks"])
    model[P] = t_phi * (busy + pipe) + msgs * T_MSG
print(f"{'P':>3} {'measured':>9} {'model':>9} {'speedup':>8} {'model':>7} {'vs backprop':>12}")
for P, r in results.items():
    print(f"{P:>3} {1e3 * r['seconds']:8.1f}ms {1e3 * model[P]:8.1f}ms "
          f"{one['seconds'] / r['seconds']:8.2f} {one['seconds'] / model[P]:7.2f} "
          f"{t_seq / r['seconds']:12.2f}")
c1 = one["ranks"][0]


def predict(P: int) -> float:
    """The model for P evenly loaded ranks, ~10 neighbour messages per gradient."""
    return t_phi * ((c1["phi"] - c1["coarsest"]) / P + c1["coarsest"]) + 10 * T_MSG


even = next((P for P in range(1, 257) if predict(P) < t_seq), None)
print(f"MGRIT on one rank costs {one['seconds'] / t_seq:.1f}× sequential backprop; the model "
      f"breaks even with backprop from P = {even} ranks (given that many cores)")

# %% [markdown]
# ## Pictures: layers, messages, speedup

# %%
fig = Figure(figsize=(13, 4), layout="constrained")
ax1, ax2, ax3 = fig.subplots(1, 3)
for q in range(P_SHOW):
    own, lam = plan.owned_layers(q), plan.backward_points(q)
    ax1.barh(q + 0.18, own[-1] - own[0] + 1, left=own[0], height=0.32, color=f"C{q}",
             label="layers θ, states y" if q == 0 else None)
    ax1.barh(q - 0.18, lam[-1] - lam[0] + 1, left=lam[0], height=0.32, color=f"C{q}",
             alpha=0.45, hatch="//", label="adjoints λ" if q == 0 else None)
    ghosts = sorted(set(plan.weight_rows(q)) - set(own))  # none when the blocks mirror
    if ghosts:
        ax1.plot(ghosts, [q + 0.18] * len(ghosts), "kx", label=f"ghost θ (rank {q})")
ax1.set_yticks(range(P_SHOW))
ax1.set_ylabel("rank")
ax1.set_xlabel("layer")
ax1.set_title(f"ownership, N = {N}, P = {P_SHOW}")
ax1.legend(loc="lower right", fontsize=8)
last = results[max(RANKS)]["ranks"]
ax2.bar(range(len(last)), [q["sends"] for q in last], color="C0", label="messages sent")
ax2b = ax2.twinx()
ax2b.plot(range(len(last)), [1e3 * q["wait_s"] for q in last], "o-", color="C3")
ax2b.set_ylabel("ms waiting for a neighbour", color="C3")
ax2.set_xlabel("rank")
ax2.set_ylabel("neighbour messages per gradient")
ax2.set_title(f"messages and waiting, P = {max(RANKS)}")
ps = list(results)
ax3.plot(ps, [one["seconds"] / results[p]["seconds"] for p in ps], "o-", label="measured")
ax3.plot(ps, [one["seconds"] / model[p] for p in ps], "s--", label="model")
ax3.plot(ps, ps, ":", color="0.5", label="ideal (P)")
ax3.axhline(one["seconds"] / t_seq, color="C2", ls="-.", label="sequential backprop")
ax3.set_xlabel("ranks P")
ax3.set_ylabel("speedup over 1 rank")
ax3.set_title("speedup vs model")
ax3.legend()
show(fig, "06_mpi_layer_parallel")

# %%
for P, r in results.items():
    assert r["error"] <= 1e-12, f"P = {P}: the distributed gradient must match one process"
    covered = [i for q in r["ranks"] for i in range(q["layers"][0], q["layers"][1] + 1)]
    assert covered == list(range(N)), "the ranks' blocks must cover every layer once"


# %% [markdown]
# ## Exercise: which layers does a rank own?
#
# Under MPI, each rank owns a contiguous block of layers that starts at a coarsest-grid point
# (a multiple of `cfactor^(levels−1)`), so no F-interval is split between ranks. With K
# coarsest intervals and P ranks, rank q gets `⌊K/P⌋` intervals, one more when
# `q < K mod P`. Write `block_starts(n_layers, cfactor, levels, ranks)` returning the first
# layer of every rank's block. The check compares with `refbraid.parallel.layout.partition`
# (what `BlockPlan` above uses), uneven splits included.

# %%
from refbraid.lessons import exercises


def block_starts(n_layers, cfactor, levels, ranks):
    """The first layer of each rank's block (a list of `ranks` ints)."""
    raise NotImplementedError  # your code here


exercises.check_block_starts(block_starts)
