"""The benchmark runner (``python -m benchmarks``): its timer, its one table and JSON file, and
the quick suites end to end at tiny sizes. Nothing here asserts on a time: only on the output's
shape and on what the suites check while they time (bit-identity, agreement with a reference)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the benchmarks package sits beside refbraid, not inside it
    sys.path.insert(0, str(ROOT))

from benchmarks.__main__ import QUICK, SUITES, load, parse_options
from benchmarks.harness import Result, measure, table, write_json
from benchmarks.step import BREAKDOWN, SHARES


def test_measure_counts_warmups_and_repeats():
    calls = []
    timing = measure(lambda: calls.append(1), repeat=3, warmup=2)
    assert len(calls) == 5
    assert len(timing.wall) == len(timing.cpu) == 3
    assert timing.min() <= timing.median()


def test_measure_fills_min_seconds_up_to_max_repeat():
    calls = []
    timing = measure(lambda: calls.append(1), repeat=1, warmup=1, min_seconds=10.0, max_repeat=7)
    assert len(timing.wall) == 7 and len(calls) == 8


@pytest.mark.parametrize("repeat, warmup", [(0, 1), (1, -1)])
def test_measure_refuses_bad_counts(repeat, warmup):
    with pytest.raises(ValueError, match="`repeat` must be >= 1"):
        measure(lambda: None, repeat=repeat, warmup=warmup)


def test_table_has_one_line_per_value_and_json_round_trips(tmp_path):
    results = [Result("solver", "case a", {"N": 4}).add("t", 1.5, "ms").add("same", True),
               Result("step", "case b").add("long", "x" * 80)]
    text = table(results).splitlines()
    assert text[0].split() == ["suite", "case", "quantity", "value", "unit"]
    assert set(text[1]) == {"-"}
    assert len(text) == 2 + 3
    assert "1.5" in text[2] and "ms" in text[2]
    assert "…" in text[4]  # long strings shortened in the table ...
    path = tmp_path / "b.json"
    write_json(path, {"size": "tiny"}, {"solver": ["a note"]}, results)
    doc = json.loads(path.read_text())
    assert doc["results"][1]["values"]["long"] == "x" * 80  # ... kept whole in the file
    assert doc["results"][0] == {"suite": "solver", "case": "case a", "params": {"N": 4},
                                 "values": {"t": 1.5, "same": True},
                                 "units": {"t": "ms", "same": ""}}


def test_options_are_typed_by_their_default_and_unknown_ones_refused():
    suites = {name: load(name) for name in ("step", "kernels")}
    opts = parse_options(["ranks=3", "torch=false", "dtype=float32"], suites)
    assert opts["step"]["ranks"] == 3 and opts["step"]["torch"] is False
    assert opts["kernels"]["torch"] is False and opts["kernels"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="`-o` must be name=value"):
        parse_options(["nonsense=1"], suites)
    with pytest.raises(ValueError, match="suite must be one of"):
        load("nonsense")


def test_every_suite_has_options_and_run():
    for name in SUITES:
        suite = load(name)
        assert isinstance(suite.OPTIONS, dict) and callable(suite.run)


def test_counts_suite_prints_what_launch_count_counts():
    """The ``counts`` suite's rows (counted in a fresh process) are
    refbraid.backends.launch_count's tallies, and its ratios are against serial's."""
    from benchmarks.counts import run
    from refbraid.backends import launch_count

    opts = {"gpu_backend": "cupy", "models": "dense", "sizes": "16", "fused": True,
            "layers": False, "transfers": False, "ranks": 0, "traffic": False}
    notes: list[str] = []
    rows = {r.params["mode"]: r.values for r in run("tiny", opts, notes)}
    graphs = [f"{m}, graph" for m in launch_count.GRAPH_MODES]
    assert list(rows) == [*launch_count.MODES, *graphs] and notes
    for mode, values in rows.items():
        t = launch_count.graph_counts("dense", 16, mode.split(",")[0]) if mode in graphs else \
            launch_count.gradient_counts("cupy", "dense", 16, mode)
        assert (values["launches"], values["critical path"], values["copies h→d"],
                values["copies d→h"], values["syncs"]) == (t.launches, t.critical_path, t.h2d,
                                                           t.d2h, t.syncs), mode
        assert values["launches ÷ serial"] == t.launches / rows["serial"]["launches"]
    with pytest.raises(ValueError, match="`models` must be among"):
        run("tiny", {**opts, "models": "mlp"}, [])


def test_counts_suite_prints_the_bytes_each_gpu_suite_gradient_moves():
    """Cases ``cupy traffic …``: the GPU suite's own whole-gradient cases (tiny here), eager
    and recorded, with launch_count's launches and bytes moved, and ratios to serial's."""
    import numpy as np

    from benchmarks.counts import run
    from benchmarks.gpu_cases import TINY_GRADIENT_CASES, gradient_case, gradient_settings
    from refbraid.backends import launch_count

    opts = {"gpu_backend": "cupy", "models": "dense", "sizes": "16", "fused": True,
            "layers": False, "transfers": False, "ranks": 0, "traffic": True}
    rows = {(r.params["case"], r.params["mode"]): r.values for r in run("tiny", opts, [])
            if "case" in r.params}
    net, params, x, y, size = gradient_case(*TINY_GRADIENT_CASES[1], np.float32)
    assert size.startswith("conv") and len(rows) == 4 * len(TINY_GRADIENT_CASES)
    settings = gradient_settings(True)
    eager = launch_count.network_counts("cupy", net, params, x, y, "lp-batched", settings)
    graph = launch_count.graph_work(net, params, x, y, "lp-batched", settings)
    for t, mode in ((eager, "lp-batched"), (graph, "lp-batched, graph")):
        values = rows[size, mode]
        assert values["launches"] == t.launches and values["MB moved"] == t.bytes_moved / 1e6
        serial = rows[size, mode.replace("lp-batched", "serial")]
        assert values["MB moved ÷ serial"] == pytest.approx(values["MB moved"] / serial["MB moved"])
        assert values["MB moved ÷ serial"] > 1
        assert sum(v for k, v in values.items() if k.startswith("share ")) <= 1


def test_counts_suite_counts_each_layer_with_and_without_the_hand_written_kernels():
    """Cases ``cupy layer …``: the launches of one forward and one adjoint per layer; the
    hand-written kernels take fewer than the reference operations (``fused=False``)."""
    from benchmarks.counts import run

    opts = {"gpu_backend": "cupy", "models": "dense", "sizes": "16", "layers": True,
            "transfers": False, "ranks": 0, "traffic": False}
    rows = {}
    for fused in (True, False):
        for r in run("tiny", {**opts, "fused": fused}, []):
            if "layer" in r.params:
                rows[r.params["layer"], fused] = r.values
    layers = {layer for layer, _ in rows}
    assert {"conv_step", "layernorm", "attention", "gru_cell"} <= layers
    assert rows["layernorm", True] == {"forward launches": 1, "adjoint launches": 3}
    for layer in layers:
        now, before = rows[layer, True], rows[layer, False]
        assert now["forward launches"] <= before["forward launches"], layer
        assert now["adjoint launches"] <= before["adjoint launches"], layer


@pytest.mark.mpi
@pytest.mark.slow  # numba compilation and 7 mpiexec launches: 2.5-5 min on 2 busy shared cores
def test_quick_suites_at_tiny_sizes_print_one_table_and_write_the_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tiny", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.split()[:5] == ["suite", "case",
                                                                       "quantity", "value", "unit"]]
    assert len(heads) == 1  # one table
    doc = json.loads(out.read_text())
    assert doc["meta"]["size"] == "tiny" and doc["meta"]["suites"] == list(QUICK)
    assert set(doc["notes"]) == set(QUICK)
    assert {r["suite"] for r in doc["results"]} == set(QUICK)
    table_rows = len(lines) - heads[0] - 2 - 2  # after the table: a blank line and "wrote"
    assert table_rows == sum(len(r["values"]) for r in doc["results"])
    for r in doc["results"]:
        assert r["values"] and set(r["values"]) == set(r["units"])
        for v in r["values"].values():
            assert isinstance(v, (int, float, str, bool))
            assert not (isinstance(v, float) and math.isnan(v)), r
    by_case = {(r["suite"], r["case"]): r["values"] for r in doc["results"]}
    # what the suites check while they time: against references, not against the clock
    kernels = [v for (s, _), v in by_case.items() if s == "kernels"]
    assert kernels and all(v["check"] < 1e-6 for v in kernels)
    pymgrit = [v for (s, c), v in by_case.items() if s == "solver" and c.startswith("pymgrit")]
    assert pymgrit and all(v["batched = per-step"] is True for v in pymgrit)
    assert by_case[("step", "gradient resnet N=16")]["Φ serial"] == 32
    assert {"α MPIComm", "β buffers"} <= set(by_case[("step", "messages 2 ranks")])
    assert "speedup" in by_case[("step", "resnet N=32 float64")]
    assert "torch f64" in by_case[("step", "conv N=32 float64")]
    scaled = by_case[("scaling", "resnet N=32 float64")]
    assert scaled["P=1"] in ("PASS", "miss") and scaled["pred P=1"] > 0
    assert ("scaling", "settings torchbraid conv N=32 float64") in by_case
    batched = by_case[("counts", "cupy dense N=16 lp-batched")]
    assert batched["launches"] < by_case[("counts", "cupy dense N=16 lp-per-step")]["launches"]
    assert by_case[("counts", "cuda step dense")]["numba.cuda copies + allocations"] == 0
    assert by_case[("counts", "cuda-host step dense")]["copies outside a kernel"] == 0
    assert by_case[("counts", "cuda sharded step rank 1 of 2")]["numba.cuda copies"] == 0


@pytest.mark.slow  # Numba's CUDA simulator, three short trainings: 1.5-2 min on 2 busy cores
def test_the_gpu_check_script_runs_every_step_on_the_simulator(tmp_path):
    """``bash benchmarks/gpu_check.sh OUT --simulator``, the one command for a GPU machine, end
    to end without one: every step ends ok (or skipped for a missing tool, never failed), the
    host-time profile of a gradient written per backend; its
    ``tiny gpu`` benchmark covers every backend (the simulator and the strict and CuPy-like
    stand-ins), each layer agreeing with NumPy and batched gradients with per-step, with the
    launch counts in the table; numba, cuda and cupy (eager and replayed from CUDA graphs)
    train to the same final line."""
    out = tmp_path / "gpu-check"
    env = {**os.environ, "PYTHON": sys.executable,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out),
                           "--simulator"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0 and "FAILED" not in summary, summary + proc.stderr
    steps = {line.split(":")[0]: line for line in summary.splitlines() if ":" in line}
    for step in ("env", "bench", "profile", "pytest", "train-numba", "train-cuda",
                 "train-cupy", "train-cupy-graphs"):
        assert ": ok (" in steps.get(step, ""), summary
    profile = (out / "profile-cuda-lp-batched.txt").read_text()
    assert "per gradient" in profile and "cumulative" in profile, profile[:2000]
    assert "the final lines agree" in steps["train-compare"], summary
    results = json.loads((out / "bench.json").read_text())["results"]
    backends = {r["params"]["backend"] for r in results}
    assert {"cuda", "cuda-host", "strict", "cupy"} <= backends
    checks = [r["values"]["check"] for r in results if "check" in r["values"]]
    assert checks and max(checks) < 1e-12
    assert any(r["case"] == "cupy dense N=16 lp-batched" for r in results)


@pytest.mark.mpi
@pytest.mark.slow  # two mpiexec launches and numba compilation: about a minute
def test_the_step_breakdown_splits_each_ranks_wall_time(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tiny", "step", "-o",
                           "breakdown=True", "-o", "layers=none", "-o", "torch=False",
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    conv = next(r["values"] for r in doc["results"] if r["case"] == "conv N=32 float64")
    for prefix in ("1 rank: rank 0", "2 ranks: rank 0", "2 ranks: rank 1"):
        parts = {kind: conv[f"{prefix} {kind}"] for kind in BREAKDOWN}
        assert parts["Φ fine fwd"] > 0 and parts["Φ fine adj"] > 0 and parts["other"] > 0
        assert all(v >= 0 for v in parts.values()), parts
        rest = sum(v for k, v in parts.items() if k != "wall")
        assert rest == pytest.approx(parts["wall"], rel=1e-9), parts
        shares = {share: conv[f"{prefix} {share} ÷ serial"] for share in SHARES}
        assert all(v > 0 for v in shares.values()) and shares["Φ"] < shares["wall"], shares


@pytest.mark.parametrize("model", ["dense", "conv"])
def test_the_torch_baseline_of_the_gpu_suite_is_refbraids_ode_body(model):
    """The ``gpu`` suite's PyTorch serial backprop (timed on a GPU only) runs here on the CPU:
    its N steps are refbraid's DenseStep / ConvStep with the same weights (tanh, h = T/N)."""
    torch = pytest.importorskip("torch")
    from benchmarks.gpu_timing import torch_ode_backprop
    from refbraid.backends import get_backend
    from refbraid.layers import ConvStep, DenseStep

    n, width, batch, side = 3, 2, 2, 4
    step = torch_ode_backprop(model, n, width, batch, side, np.float64, device="cpu")
    step()
    params = [*step.weights, *step.biases]
    assert all(p.grad is not None and p.grad.shape == p.shape for p in params)
    layer = DenseStep(width, "tanh") if model == "dense" else ConvStep(width, side, side, "tanh")
    y = step.x.numpy().copy()
    for W, b in zip(step.weights, step.biases, strict=True):
        y, _ = layer.forward({"W": W.detach().numpy(), "b": b.detach().numpy()}, y, 3.0 / n,
                             get_backend("numpy"))
    with torch.no_grad():
        np.testing.assert_allclose(y, step.forward().numpy(), rtol=1e-13, atol=1e-15)


def test_the_gpu_suite_times_the_batched_gradient_with_cupys_matmul_too(monkeypatch):
    """``LP batched, CuPy matmul``: the same batched gradient with its batched products
    through CuPy's ``matmul`` (the A/B of refbraid's strided-batched GEMM), checked against
    the per-step gradient; on the counting stand-in, CuPy's way makes its operand copies."""
    from benchmarks import gpu_timing
    from benchmarks.gpu_cases import TINY_GRADIENT_CASES, gradient_case, gradient_settings
    from refbraid.backends import launch_count
    from refbraid.backends.cupy_blas import GEMM_ENV
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.backends.launch_model import tracking
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient

    monkeypatch.delenv(GEMM_ENV, raising=False)
    monkeypatch.setattr(gpu_timing, "synchronise", lambda name: None)
    net, params, x, y, size = gradient_case(*TINY_GRADIENT_CASES[0], np.float64)
    with launch_count.counting("cupy") as bk:
        args = (to_backend(params, bk), bk.asarray(x), bk.asarray(y))
        lp = mgrit_gradient(net, gradient_settings(True), bk)
        per_step = lp(*args)[1]
        (row,) = gpu_timing.cupy_matmul_row(lp, bk, args, per_step, size, "float64", 1.0, 0, 1)
        assert GEMM_ENV not in os.environ  # restored
        with sweeps_batched(True):
            with tracking() as ours:
                lp(*args)
            with gpu_timing.cupy_matmul(), tracking() as cupys:
                lp(*args)
    assert row[0] == "LP batched, CuPy matmul" and row[3] == bk.name and float(row[6]) < 1e-12
    copies = [t.tally.by_name.get("ascontiguousarray", 0) for t in (ours, cupys)]
    assert copies[1] > copies[0]


def test_the_gpu_suite_times_the_conv_gradients_with_column_matrices_too(monkeypatch):
    """``…, im2col conv``: the conv network's batched layer-parallel and serial gradients,
    eager and replayed from CUDA graphs, with column-matrix convolutions (the A/B of the
    direct kernels), each checked against the direct one; on the counting stand-in the
    column matrices and their GEMMs are there, the direct kernels not."""
    from benchmarks import gpu_timing
    from benchmarks.gpu_cases import TINY_GRADIENT_CASES, gradient_case, gradient_settings
    from refbraid.backends import launch_count
    from refbraid.backends.cupy_conv import CONV_ENV
    from refbraid.backends.device_batching import sweeps_batched
    from refbraid.backends.launch_model import tracking
    from refbraid.network import to_backend
    from refbraid.training.gradients import mgrit_gradient, sequential_gradient

    monkeypatch.delenv(CONV_ENV, raising=False)
    monkeypatch.setattr(gpu_timing, "synchronise", lambda name: None)
    conv = next(c for c in TINY_GRADIENT_CASES if c[0] == "conv")
    net, params, x, y, size = gradient_case(*conv, np.float64)
    settings = gradient_settings(True)
    with launch_count.counting("cupy") as bk:
        args = (to_backend(params, bk), bk.asarray(x), bk.asarray(y))
        per_step = mgrit_gradient(net, settings, bk)(*args)[1]
        rows = list(gpu_timing.im2col_rows(net, settings, bk, args, per_step, size, "float64",
                                           1.0, 0, 1))
        assert CONV_ENV not in os.environ  # restored
        with sweeps_batched(True):
            with tracking() as direct:
                sequential_gradient(net, bk)(*args)
            with gpu_timing.im2col_convolutions(), tracking() as im2col:
                sequential_gradient(net, bk)(*args)
    assert [r[0] for r in rows] == [
        "LP batched, im2col conv", "refbraid serial, im2col conv",
        "LP batched, CUDA graph, im2col conv", "refbraid serial, CUDA graph, im2col conv"]
    assert all(r[3] == bk.name and float(r[6]) < 1e-12 for r in rows), rows
    assert direct.tally.by_name.get("conv_direct") and not direct.tally.by_name.get("im2col")
    assert im2col.tally.by_name.get("im2col") and not im2col.tally.by_name.get("conv_direct")


def test_a_gpu_case_that_raises_is_a_failed_row_and_the_others_go_on(monkeypatch, tmp_path):
    """A short GPU session must not lose its table to one failing case (an H200 run lost
    every per-layer row of a backend to one kernel): the failing backend's row says FAILED
    with the error, every other row is measured, the runner keeps them in its table and JSON
    and exits 1."""
    import benchmarks.__main__ as runner
    from benchmarks import gpu, gpu_timing

    rows = list(gpu_timing.layer_rows(["numpy", "no-such-backend"], np.float64, True, 0, 1))
    failed = [r for r in rows if str(r[6]).startswith("FAILED")]
    assert failed and {r[3] for r in failed} == {"no-such-backend"}
    assert "no-such-backend" in failed[0][6]  # the error's own words
    assert len([r for r in rows if r[3] == "numpy"]) == len(failed)  # every layer measured
    grads = list(gpu_timing.gradient_rows(["no-such-backend", "numpy"], np.float64, True, 0, 1))
    assert [r[0] for r in grads if r[3] == "numpy"] == ["LP per-step", "LP batched",
                                                        "refbraid serial"] * 2

    ok, bad = rows[0], failed[0]
    monkeypatch.setattr(gpu, "fresh", lambda *a, **k: [{"notes": []}, {"row": list(ok)},
                                                       {"row": list(bad)}])
    monkeypatch.setattr(runner, "load", lambda name: gpu)
    out = tmp_path / "b.json"
    assert runner.main(["tiny", "gpu", "--json", str(out)]) == 1
    saved = json.loads(out.read_text())
    assert len(saved["results"]) == 1
    assert any(n.startswith("FAILED") for n in saved["notes"]["gpu"])
    steps = gpu_timing.step_rows(["numpy", "no-such-backend"], np.float64, True, 0, 1)
    assert [str(r[6]).startswith("FAILED") for r in steps] == [False, True]


def test_a_gpu_worker_that_crashes_keeps_the_rows_it_finished(monkeypatch, tmp_path):
    """A crash the worker cannot catch (a CUDA error that kills the process) must not take
    the rows it already streamed with it: they are kept, a FAILED note quotes the crash's
    last line, and the runner exits 1."""
    import benchmarks.__main__ as runner
    from benchmarks import gpu, gpu_timing
    from benchmarks.harness import WorkerFailed

    ok = next(gpu_timing.layer_rows(["numpy"], np.float64, True, 0, 1))

    def crashed(*args, **kwargs):
        raise WorkerFailed("failed (exit 1):\nCUDAError: LAUNCH_OUT_OF_RESOURCES",
                           [{"notes": []}, {"row": list(ok)}])

    monkeypatch.setattr(gpu, "fresh", crashed)
    monkeypatch.setattr(runner, "load", lambda name: gpu)
    out = tmp_path / "b.json"
    assert runner.main(["tiny", "gpu", "--json", str(out)]) == 1
    saved = json.loads(out.read_text())
    assert len(saved["results"]) == 1
    assert any(n.startswith("FAILED") and "LAUNCH_OUT_OF_RESOURCES" in n
               for n in saved["notes"]["gpu"])
