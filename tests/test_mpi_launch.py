"""Launch the MPI test suite under ``mpiexec`` for N = 1..4 ranks, and check fault handling.

``mpiexec -n N python -m mpi4py -m pytest tests/mpi -q`` must pass for every N (tests/mpi
compares every distributed result with the single-process one in the same run). Faults: an
exception on one rank ends the job within the timeout with that rank's message; a bad
data-parallel split stops the job with the explanation; a job past its timeout is killed.
Every launch has a timeout, so nothing here can hang.
"""

import time
from pathlib import Path

import pytest

from refbraid.parallel.launch import (
    HEAVY_YIELD,
    THREAD_VARS,
    mpi_env,
    mpiexec_command,
    oversubscription_env,
    run_mpi,
)

ROOT = Path(__file__).resolve().parents[1]
SUITE_TIMEOUT = 480  # seconds per N: the suite takes ~30-90 s on 2 idle cores (more under load)
FAULT_TIMEOUT = 60  # a hang would run into this; a clean abort takes about a second


def test_command_uses_the_mpi4py_runner_and_one_thread_per_rank():
    cmd = mpiexec_command(3, ["-m", "pytest"], python="py")
    assert cmd[1:3] == ["-n", "3"] and cmd[-5:] == ["py", "-m", "mpi4py", "-m", "pytest"]
    env = mpi_env({"EXTRA": "x"})
    assert all(env[v] == "1" for v in THREAD_VARS) and env["EXTRA"] == "x"


def test_more_ranks_than_cores_sleep_while_they_wait_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(HEAVY_YIELD, raising=False)
    assert oversubscription_env(2, 2) == {} and oversubscription_env(1, 4) == {}
    assert oversubscription_env(4, 2) == {HEAVY_YIELD: "1"}
    monkeypatch.setenv(HEAVY_YIELD, "0")
    assert oversubscription_env(4, 2) == {}


def test_launch_arguments_are_checked():
    with pytest.raises(ValueError, match="`n` \\(number of ranks\\) must be a positive integer"):
        mpiexec_command(0, ["-c", "pass"])
    with pytest.raises(TypeError, match="`argv` must be a list"):
        mpiexec_command(2, "-c pass")
    with pytest.raises(ValueError, match="`timeout` must be a positive number"):
        run_mpi(1, ["-c", "pass"], timeout=0)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_mpi_suite_passes(n):
    start = time.perf_counter()
    run = run_mpi(n, ["-m", "pytest", "tests/mpi", "-q", "-p", "no:cacheprovider"],
                  timeout=SUITE_TIMEOUT, cwd=ROOT)
    summary = next((line.strip(" =") for line in reversed(run.output.splitlines())
                    if " passed" in line or " failed" in line), "no pytest summary")
    print(f"\nmpiexec -n {n} tests/mpi: {summary} ({time.perf_counter() - start:.0f} s)",
          flush=True)  # progress: with -s one line per rank count as it finishes
    assert run.ok, f"mpiexec -n {n} tests/mpi failed:\n{run.output[-6000:]}"
    assert " passed" in run.output and " failed" not in run.output


FAILING_RANK = """
from mpi4py import MPI
import time
world = MPI.COMM_WORLD
if world.rank == 1:
    time.sleep(0.5)  # the others are already blocked in a receive that will never match
    raise ValueError("rank 1 fails on purpose")
world.recv(source=(world.rank + 1) % world.size)
"""


@pytest.mark.mpi
def test_an_exception_on_one_rank_ends_the_job_with_its_message():
    run = run_mpi(3, ["-c", FAILING_RANK], timeout=FAULT_TIMEOUT, cwd=ROOT)
    assert not run.timed_out, "the job hung instead of aborting"
    assert run.returncode != 0
    assert "ValueError: rank 1 fails on purpose" in run.output


@pytest.mark.mpi
@pytest.mark.parametrize("n, flags, message", [
    (3, ["--data-parallel", "2"],
     "refbraid train: error: `data_parallel` (--data-parallel) = 2 does not divide the 3 MPI "
     "ranks; use one of [1, 3]"),
    (2, ["--layers", "16"],
     "refbraid train: error: layer-parallel over 2 ranks with 16 layers: 2 ranks exceed the 1 "
     "interval of the coarsest MPI grid (every rank needs at least one coarsest interval); use "
     "at most 1 rank,"),
    (2, ["--model", "gru", "--serial"], "refbraid train: error: one MGRIT level (--serial or "
     "--levels 1) is a sequential sweep over the 16 positions: it cannot be split over 2 "
     "sequence ranks"),
    (2, ["--out", "/dev/null"], "refbraid train: error: `--out` '/dev/null' is not a folder"),
], ids=["split", "too-many-ranks", "sequence-model", "out-not-a-folder"])
def test_an_error_every_rank_shares_is_printed_once_without_a_traceback(n, flags, message,
                                                                       tmp_path):
    args = ["--out", str(tmp_path / "run"), "--epochs", "1", *flags]
    run = run_mpi(n, ["-m", "refbraid", "train", *args], timeout=FAULT_TIMEOUT, cwd=ROOT)
    assert not run.timed_out and run.returncode != 0, run.output
    assert run.output.count(message) == 1, run.output
    assert "Traceback" not in run.output and "[rank" not in run.output, run.output
    assert not (tmp_path / "run").exists()  # refused before any work: no folder left behind


@pytest.mark.mpi
def test_a_folder_holding_a_run_is_refused_on_every_rank(tmp_path):
    from refbraid.cli import main

    out = tmp_path / "run"
    flags = ["train", "--layers", "32", "--samples", "200", "--epochs", "1", "--quiet"]
    assert main([*flags, "--out", str(out)]) == 0
    before = (out / "log.json").read_bytes()
    run = run_mpi(2, ["-m", "refbraid", *flags, "--out", str(out)], timeout=FAULT_TIMEOUT,
                  cwd=ROOT)
    assert run.returncode != 0 and run.output.count("already holds a run") == 1, run.output
    assert (out / "log.json").read_bytes() == before


@pytest.mark.mpi
def test_a_job_past_its_timeout_is_killed():
    run = run_mpi(2, ["-c", "import time; time.sleep(120)"], timeout=3, cwd=ROOT)
    assert run.timed_out and not run.ok
    with pytest.raises(RuntimeError, match="timed out"):
        run.check()


@pytest.mark.lesson_script
@pytest.mark.mpi
def test_lesson_06_runs_in_small_mode_and_saves_its_figure(tmp_path, monkeypatch):
    """The lesson launches mpiexec itself; its own asserts check the gradients."""
    import runpy

    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(ROOT / "lessons" / "06_mpi_layer_parallel.py"), run_name="__main__")
    assert (tmp_path / "06_mpi_layer_parallel.png").is_file()


@pytest.mark.mpi
def test_refbraid_train_under_mpiexec_matches_one_process(tmp_path):
    """``mpiexec -n 2 refbraid train``: one summary line, files from rank 0, serial's numbers."""
    import json

    from refbraid.cli import main

    flags = ["train", "--layers", "32", "--samples", "300", "--epochs", "2", "--quiet"]
    assert main([*flags, "--out", str(tmp_path / "serial")]) == 0
    run = run_mpi(2, ["-m", "refbraid", *flags, "--out", str(tmp_path / "mpi")],
                  timeout=FAULT_TIMEOUT * 2, cwd=ROOT)
    assert run.ok, run.output
    assert run.output.count("finished peaks-resnet") == 1  # only rank 0 prints
    logs = [json.loads((tmp_path / r / "log.json").read_text()) for r in ("serial", "mpi")]
    assert logs[1]["gradient"] == "layer-parallel-mpi"
    a, b = (log["history"][-1] for log in logs)
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-12)
    assert b["val_acc"] == a["val_acc"]


@pytest.mark.mpi
def test_checkpoints_resume_across_mpi_and_one_process(tmp_path):
    """A checkpoint from ``mpiexec refbraid train`` (owned shards, gathered on rank 0) resumes
    in one process and vice versa: bit-identical to an uninterrupted single-process run for a
    pure layer-parallel split, ≤ 1e-12 with data parallelism."""
    import numpy as np

    from refbraid.cli import main
    from refbraid.layer_parallel import relative_gradient_error
    from refbraid.training.checkpoint import load_checkpoint

    flags = ["train", "--layers", "32", "--samples", "300", "--quiet", "--checkpoint-every", "1"]

    def mpi(n, *extra):
        run = run_mpi(n, ["-m", "refbraid", *flags, *extra], timeout=FAULT_TIMEOUT * 2, cwd=ROOT)
        assert run.ok, run.output

    def out(name):
        return ["--out", str(tmp_path / name)]

    assert main([*flags, "--epochs", "4", *out("whole")]) == 0  # the oracle, uninterrupted
    assert main([*flags, "--epochs", "2", *out("one")]) == 0
    mpi(2, "--epochs", "2", *out("mpi"))
    mpi(2, "--epochs", "4", "--resume", str(tmp_path / "one"), *out("one-then-mpi"))
    mpi(2, "--epochs", "4", "--data-parallel", "2", "--resume", str(tmp_path / "one"),
        *out("one-then-dp"))
    assert main([*flags, "--epochs", "4", "--resume", str(tmp_path / "mpi"),
                 *out("mpi-then-one")]) == 0
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.npz")
    for run in ("one-then-mpi", "mpi-then-one", "one-then-dp"):
        ckpt = load_checkpoint(tmp_path / run / "checkpoint.npz")
        assert ckpt.epoch == 4 and set(ckpt.params) == set(whole.params), run
        assert set(ckpt.optimizer_state) == set(whole.optimizer_state), run
        assert ckpt.rng_state == whole.rng_state, run
        losses = [[r["train_loss"] for r in c.history] for c in (ckpt, whole)]
        if run == "one-then-dp":  # the gradient sums over groups in another order
            assert relative_gradient_error(ckpt.params, whole.params) <= 1e-12, run
            assert losses[0] == pytest.approx(losses[1], rel=1e-12), run
            continue
        for k in whole.params:
            np.testing.assert_array_equal(ckpt.params[k], whole.params[k], err_msg=f"{run} {k}")
        for k in whole.optimizer_state:
            np.testing.assert_array_equal(ckpt.optimizer_state[k], whole.optimizer_state[k],
                                          err_msg=f"{run} {k}")
        assert losses[0] == losses[1], run


@pytest.mark.mpi
def test_trace_under_mpiexec_gathers_every_ranks_steps_to_rank_0(tmp_path):
    import json
    from collections import Counter

    out = tmp_path / "run"
    flags = ["train", "--layers", "32", "--samples", "300", "--epochs", "1", "--quiet",
             "--trace", "--out", str(out)]
    run = run_mpi(2, ["-m", "refbraid", *flags], timeout=FAULT_TIMEOUT, cwd=ROOT)
    assert run.ok, run.output
    trace = json.loads((out / "trace.json").read_text())
    log = json.loads((out / "log.json").read_text())
    steps = Counter(e["rank"] for e in trace["events"] if e["kind"] == "step")
    assert set(steps) == {0, 1}
    assert sum(steps.values()) == log["history"][-1]["stats"]["phi_calls"]
    kinds = Counter(e["kind"] for e in trace["events"])
    assert kinds["send"] == kinds["recv"] > 0 and kinds["allreduce"] > 0  # MPIComm's hooks
    assert (out / "timeline.png").is_file()
