# %% [markdown]
# # Lesson 09 — Where layer-parallel training pays off
#
# Lessons 05 and 06 showed that MGRIT gives the backprop gradient once it has converged, and
# that with TorchBraid's settings it does about three times the work of sequential backprop.
# Three times the work can still be faster — if enough ranks share it. How many is enough,
# and what does each rank do meanwhile? Here we
#
# 1. trace a real 2-rank MGRIT solve through a network (every step, message and reduction
#    with its time) and set it beside its **virtual twin**: the same code on a virtual cluster
#    whose clocks advance by measured step costs (docs/references.md §4);
# 2. predict strong scaling to 1,024 ranks for a deep dense and a conv network, and find the
#    **crossover** — the number of ranks where layer-parallel training beats serial;
# 3. ask seed 002's question: for a given batch and network, which parallelism wins —
#    data-parallel (DP), layer-parallel (LP), or both (DP × LP)?
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/09_where_layer_parallel_pays_off.py`, it saves
# them to `lesson_figures/09/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.
# The same numbers for any training configuration: `refbraid scale` (try
# `refbraid scale --layers 4096`).

# %%
import numpy as np

from refbraid.backends import get_backend
from refbraid.layer_parallel import ForwardPropagator, LayerParallelSettings
from refbraid.lessons import show, small
from refbraid.mgrit import Problem, solve
from refbraid.models import build_network
from refbraid.network import group, init_params
from refbraid.parallel.comm import run_traced
from refbraid.parallel.costs import StepCosts
from refbraid.parallel.plots import plot_timeline
from refbraid.parallel.trace import STEP
from refbraid.scaling.plots import plot_scaling
from refbraid.scaling.predict import DEFAULT_ALPHA, DEFAULT_BETA, calibrate, predict, serial_time
from refbraid.scaling.schedule import simulate_solve
from refbraid.scaling.virtual_step import simulate_gradient_schedule
from refbraid.training.config import TrainConfig

SMALL = small()

# %% [markdown]
# ## 1. A real 2-rank solve and its virtual twin
#
# The network is lesson 05's: 64 tanh layers of width 16 (Peaks), a batch of 64, TorchBraid's
# MGRIT settings. `run_traced` runs the MGRIT forward solve on 2 ranks — threads of this
# process talking through the same communicator interface MPI uses — and records every event.
# Python runs one thread at a time (the threads take turns at the interpreter lock, and a
# waiting thread may wait for its turn long after its message has arrived), so this timeline
# shows the **schedule** — the same events in the same order — not a speed-up; an `mpiexec`
# run has the same schedule with real parallelism, and the virtual twin shows its timing.

# %%
N, WIDTH, BATCH = 64, 16, 64
bk = get_backend("numpy")
net = build_network("resnet", (2,), 5, N, WIDTH, 3.0, "tanh")
params = init_params(net, 0)
x = np.random.default_rng(0).standard_normal((BATCH, 2))
y0, _ = net.opening.forward(group(params, "opening"), x, bk)
problem = Problem(step=ForwardPropagator(net, group(params, "steps"), bk), u0=y0, n_steps=N)
settings = LayerParallelSettings().forward

results, real = run_traced(2, lambda comm: solve(problem, settings, comm=comm))
steps = [e for e in real if e.kind == STEP]
costs = StepCosts(forward=tuple(
    float(np.mean([e.duration for e in steps if e.level == level]))
    for level in range(3)))
print("measured seconds per step by level:", ", ".join(f"{c * 1e6:.1f} µs" for c in costs.forward))
twin = simulate_solve(problem, settings, 2, costs, DEFAULT_ALPHA, DEFAULT_BETA)
for r in range(2):  # the virtual twin computed exactly the same numbers
    assert np.array_equal(results[r].solution, twin.results[r].solution)
assert real.step_counts() == twin.trace.step_counts()
print(f"real: {1e3 * real.end:.2f} ms (2 threads taking turns at the interpreter lock);  "
      f"virtual twin: {1e3 * twin.wall_time:.2f} ms on 2 independent ranks")
show(plot_timeline(real, title="real run: 2 ranks as threads (measured)"),
     "09_where_layer_parallel_pays_off_real")
show(plot_timeline(twin.trace, twin.critical_path,
                   title="its virtual twin: 2 ranks, measured step costs"),
     "09_where_layer_parallel_pays_off")

# %% [markdown]
# Read the virtual timeline from the left: both ranks relax their own layers at once (dark
# blue, level 0), then the coarse levels (lighter blues) run as a **pipeline** — rank 1 waits
# (hatched) until rank 0 has passed it the coarse solution. Every residual norm is a
# reduction (purple) that makes each rank wait for the slowest. The red line is the critical
# path: the chain of events that sets the end time. Shortening anything off that path gains
# nothing.
#
# ## 2. Strong scaling to 1,024 ranks
#
# `calibrate` measures this machine for a training configuration: serial training steps, a
# traced one-process layer-parallel gradient (step costs per level and direction, with the
# solver's bookkeeping spread over the steps), and α, β for messages (given here, so the
# lesson needs no `mpiexec`). `predict` then runs the real MGRIT schedule of one training step
# on P = 1, 2, 4, … virtual ranks (cost-only: shapes, no arithmetic) — data parallelism uses
# seed 002's ring-allreduce model.

# %%
deep = 256 if SMALL else 4096
dense = calibrate(TrainConfig(layers=deep, samples=500), max_ranks=1024,
                  alpha=DEFAULT_ALPHA, beta=DEFAULT_BETA)
dense_rows = predict(dense, max_ranks=1024)
conv_layers = 32 if SMALL else 128
conv = calibrate(TrainConfig(data="digits", model="conv", layers=conv_layers, width=4,
                             samples=300, batch_size=50), max_ranks=1024,
                 alpha=DEFAULT_ALPHA, beta=DEFAULT_BETA)
conv_rows = predict(conv, max_ranks=1024)


def crossover(machine, rows):
    """The smallest P whose layer-parallel step beats serial training (None: none)."""
    t0 = serial_time(machine)
    return next((r.ranks for r in rows if r.layer_parallel and r.layer_parallel < t0), None)


for name, machine, rows in (("dense", dense, dense_rows), ("conv", conv, conv_rows)):
    best = max((r for r in rows if r.layer_parallel), key=lambda r: serial_time(machine)
               / r.layer_parallel)
    print(f"{name} N = {machine.n_layers}: serial {1e3 * serial_time(machine):.1f} ms; "
          f"layer-parallel beats it from P = {crossover(machine, rows)}; best LP speedup "
          f"{serial_time(machine) / best.layer_parallel:.1f}x at P = {best.ranks}")
    # One rank: MGRIT's extra work, counted (every step application costs 1; serial backprop
    # applies N forward and N adjoint steps).
    steps_on_one_rank = simulate_gradient_schedule(
        machine.n_layers, machine.state_bytes, 1, machine.settings,
        iterations=machine.iterations).wall_time
    print(f"  one rank applies {steps_on_one_rank:.0f} steps where serial backprop applies "
          f"{2 * machine.n_layers}")
    assert steps_on_one_rank > 2 * machine.n_layers
show(plot_scaling(dense_rows, serial_time(dense), f"dense ResNet, N = {deep}, width 16, batch 64"),
     "09_where_layer_parallel_pays_off_scaling_dense")
show(plot_scaling(conv_rows, serial_time(conv),
                  f"conv ODE-net (digits), N = {conv_layers}, batch 50"),
     "09_where_layer_parallel_pays_off_scaling_conv")

# %% [markdown]
# Layer-parallel speed-up grows with P until each rank owns only a few coarsest intervals;
# then the coarse pipeline and the reductions (whose cost grows like log P) dominate, and
# adding ranks stops helping. With 3 levels and cfactor 4 a network of N layers can use at
# most N/16 layer ranks at all.
#
# ## 3. Data, depth, or both?
#
# Data parallelism splits the batch: each rank computes a smaller batch's gradient exactly,
# then one allreduce averages them. It is limited by the batch (D ≤ B) and by small batches
# running inefficiently. Layer parallelism splits the depth and pays MGRIT's extra work. The
# best split of P ranks into D groups of Q layer ranks:

# %%
print(f"{'P':>5}  {'winner':>14}  {'DP x':>6}  {'LP x':>6}  {'best x':>6}  split D×Q")
for r in dense_rows:
    t0 = serial_time(dense)

    def speed(t, t0=t0):
        return f"{t0 / t:6.2f}" if t else "     -"

    kind = ("-" if r.best_split is None else "data" if r.best_split[1] == 1 else "layer"
            if r.best_split[0] == 1 else "data × layer")
    split = "-" if r.best_split is None else f"{r.best_split[0]}×{r.best_split[1]}"
    print(f"{r.ranks:5d}  {kind:>14}  {speed(r.data_parallel)}  {speed(r.layer_parallel)}  "
          f"{speed(r.best)}  {split}")

# %% [markdown]
# On few ranks data parallelism usually wins: it does no extra work. Once the batch is split
# as far as it sensibly goes, only depth is left to split, and DP × LP takes over.
# Try your own network: `refbraid scale --layers 1024 --width 64 --batch-size 256`, or
# describe a GPU cluster with `--alpha`, `--beta` and `--step-cost`.


# %% [markdown]
# ## Exercise: what data parallelism pays per step
#
# Data parallelism adds up the gradients of all ranks once per step with a ring allreduce:
# a reduce-scatter then an all-gather, each `P − 1` messages of `n/P` bytes. In the α–β
# model (α seconds per message, β seconds per byte), write `allreduce_time(nbytes, ranks,
# alpha, beta)`. The check compares with the model `refbraid scale` predicts with
# (`refbraid.scaling.predict.ring_allreduce`), from one rank to 1,024.

# %%
from refbraid.lessons import exercises


def allreduce_time(nbytes, ranks, alpha, beta):
    """Seconds of a ring allreduce of `nbytes` over `ranks` ranks in the α–β model."""
    raise NotImplementedError  # your code here


exercises.check_allreduce_time(allreduce_time)


# %% [markdown]
# ## 4. One GPU: layer-parallel is batching
#
# Everything above splits a network over *ranks*. On one GPU there is nobody to split with,
# and yet layer-parallel training can pay there too, for a reason that has nothing to do
# with arithmetic. A GPU runs a small layer's GEMM in microseconds; what it cannot make fast
# is the *launch*: each kernel costs the host a few microseconds (more from Python) whatever
# it computes. Serial backprop of a deep, narrow network is a chain of N layers of a few
# small launches each: launch-bound.
#
# MGRIT's relaxation updates every interval of a level independently. Run one interval at a
# time and it issues *more* launches than backprop (it does more step applications). Run
# every interval of a sweep in one batched call (one launch set per sweep) and the count
# drops to a few launch sets per level plus the coarsest grid's sequential steps.
#
# `refbraid.backends.launch_count` counts, without a GPU, what the `cupy` backend would
# launch: every CuPy operation is one launch on a CuPy-like counting device (NumPy
# underneath). Two numbers per gradient: the **launches** the host issues one after another
# on one stream, and the **critical path**, the longest chain of launches each of which
# needs the previous one's result (what no number of streams could overlap).

# %%
from refbraid.backends.launch_count import MODES, gradient_counts, plot_launch_counts

launch_rows = [{"N": n, "mode": m, **gradient_counts("cupy", "dense", n, m).row()}
               for n in ((16, 64) if SMALL else (16, 64, 256)) for m in MODES]
print(f"{'N':>5}  {'gradient':<12} {'launches':>9} {'critical path':>14} {'syncs':>6}")
for r in launch_rows:
    print(f"{r['N']:5d}  {r['mode']:<12} {r['launches']:9d} {r['critical_path']:14d} "
          f"{r['syncs']:6d}")
show(plot_launch_counts(launch_rows, "dense ResNet, cupy, one gradient (counted)"),
     "09_where_layer_parallel_pays_off_launches")
deepest = {r["mode"]: r for r in launch_rows if r["N"] == max(x["N"] for x in launch_rows)}
assert deepest["lp-batched"]["launches"] < deepest["lp-per-step"]["launches"]
assert deepest["lp-batched"]["critical_path"] < deepest["serial"]["critical_path"]

# %% [markdown]
# Read the figure from the right. Serial backprop's launches and critical path both grow
# like N. Layer-parallel per step issues about twice serial's launches: on one stream it can
# only lose. Batched, the launches grow far slower than N and fall below serial backprop's
# from N = 64 on, while the critical path of either layer-parallel gradient is a fraction of
# serial's: the independence is there, and batching is how one stream uses it. That is why
# refbraid turns batched sweeps on for the GPU backends (`refbraid.backends.device_batching`),
# and why fused kernels (bias, activation and Euler update in one launch,
# `refbraid.backends.cupy_fused`; a convolution as one GEMM; a layer norm, a softmax, a GRU
# cell as one kernel each) matter as much as the solver. Timings need a GPU:
# `python -m benchmarks quick gpu`; the counts, `python -m benchmarks quick counts`, run anywhere
# (docs/gpu_layer_parallel.md).
#
# What a real GPU said (one H200, float32, `cupy`): the batched layer-parallel gradient of
# the dense ResNet took 0.24–0.55× refbraid's own serial backprop and 0.22–0.56× PyTorch's
# serial backprop at N = 256 and 1024 — but 1.08× PyTorch's at N = 64. A profile of one
# gradient shows the GPU busy for only 10–28 % of it: the host's path to the GPU (a Python
# call per launch), not the arithmetic, is what is left to make fast; the launch counts above
# say how many times it is paid.
#
# A CUDA graph pays it once: `refbraid train --backend cupy --cuda-graphs` records a whole
# gradient the first time and replays every launch of it with one host call per step. A
# recording may not wait for the device, so MGRIT then runs all its cycles and reads its
# residual norms after the replay. On the H200 the conv ODE-net's replayed layer-parallel
# gradient took 0.78× PyTorch's eager backprop at N = 64 and 0.52× at N = 256 (eager: 2.0×
# and 0.80× in the same run), its replayed serial backprop 0.62× and 0.41×.
#
# What a replayed graph leaves is the device's own work, and the same counter measures it:
# the **bytes** each kernel reads and writes (`Tally.bytes_moved`: every array a launch
# touches, once). Count the graphs a small conv ODE-net records, serial and layer-parallel:

# %%
from refbraid.backends.launch_count import GRAPH_MODES, graph_work

byte_rows = []
for n in (16, 64):
    conv = build_network("conv", (1, 8, 8), 3, n, 8, 1.0)
    data = np.random.default_rng(0)
    xs = data.standard_normal((16, 1, 8, 8)).astype(np.float32)
    for m in GRAPH_MODES:
        work = graph_work(conv, init_params(conv, 0, np.float32), xs,
                          data.integers(0, 3, 16), m)
        byte_rows.append({"N": n, "mode": m, "nodes": work.launches,
                          "MB": work.bytes_moved / 1e6})
print(f"{'N':>5}  {'graph of':<11} {'kernels':>8} {'MB moved':>9}")
for r in byte_rows:
    print(f"{r['N']:5d}  {r['mode']:<11} {r['nodes']:8d} {r['MB']:9.1f}")
at64 = {r["mode"]: r for r in byte_rows if r["N"] == 64}
assert at64["lp-batched"]["nodes"] < at64["serial"]["nodes"]
assert at64["lp-batched"]["MB"] > at64["serial"]["MB"]

# %% [markdown]
# Batching traded kernels for bytes: at N = 64 the layer-parallel graph holds about two
# fifths of serial backprop's kernels but moves nearly three times its bytes (MGRIT applies
# about twice the steps, and its residuals, corrections and norms still pass over whole
# states, though each step writes its result straight into MGRIT's rows; a conv step here is
# one kernel that reads its input once).
# So on one GPU layer-parallel training pays while serial backprop is bound by launches and
# latency — deep networks of small layers, small batches — and pays less as each layer grows
# big enough to keep the memory busy by itself. On the H200 the conv net's batched graphs
# moved their counted bytes at 1.1–1.3 TB/s, its serial graphs at 0.6–0.7 TB/s
# (`python -m benchmarks quick counts` counts the GPU suite's own sizes;
# docs/gpu_layer_parallel.md divides).
