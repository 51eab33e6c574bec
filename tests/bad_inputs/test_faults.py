"""Faults while a run is under way: nothing a user saved is lost, overwritten unasked or
half-written, and every ending is one line, a non-zero exit and a ``log.json`` that says how.

Disk full and file-size limits are simulated with a failing writer; Ctrl-C and ``kill -9``
are real signals sent to a real ``refbraid train`` process.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refbraid.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, main
from refbraid.training import run_folder, trainer
from refbraid.training.checkpoint import load_checkpoint
from refbraid.training.run_folder import LOCK_FILE, claim_run_folder

TINY = ["--samples", "200", "--layers", "16", "--width", "4", "--quiet", "--serial"]
ROOT = Path(__file__).resolve().parents[2]


def _log(folder: Path) -> dict:
    return json.loads((folder / "log.json").read_text())


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- the run folder
def test_a_folder_holding_a_run_is_never_overwritten_unasked(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "2", "--checkpoint-every", "1", "--out",
                 str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != LOCK_FILE}
    capsys.readouterr()
    assert main(["train", *TINY, "--epochs", "1", "--out", str(out)]) == EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert "already holds a run" in line and "--resume" in line and "--overwrite" in line
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != LOCK_FILE}
    assert after == before  # not one byte changed


def test_overwrite_replaces_the_run_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "2", "--checkpoint-every", "1", "--out",
                 str(out)]) == 0
    capsys.readouterr()
    assert main(["train", *TINY, "--epochs", "1", "--out", str(out), "--overwrite"]) == 0
    said = capsys.readouterr().out
    assert f"replacing the run in {out}/ (--overwrite)" in said and "checkpoint.npz" in said
    assert not (out / "checkpoint.npz").exists()  # the old run's checkpoint is gone
    assert _log(out)["epoch"] == 1 and _log(out)["status"] == "finished"


def test_resume_without_out_continues_in_the_resumed_runs_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "elsewhere"
    assert main(["train", *TINY, "--epochs", "1", "--checkpoint-every", "1", "--out",
                 str(out)]) == 0
    assert main(["train", *TINY, "--epochs", "2", "--checkpoint-every", "1", "--resume",
                 str(out)]) == 0
    assert load_checkpoint(out).epoch == 2 and _log(out)["epoch"] == 2
    assert not (tmp_path / "runs").exists()  # nothing went to the default folder


def test_a_second_run_on_a_folder_in_use_is_refused_with_the_owner(tmp_path, capsys):
    out = tmp_path / "run"
    holder = claim_run_folder(out)  # another run holds the folder
    try:
        assert main(["train", *TINY, "--epochs", "1", "--out", str(out)]) == EXIT_USAGE
        line = _one_line(capsys.readouterr().err)
        assert f"`--out` {str(out)!r} is in use by another refbraid run (pid {os.getpid()}" in line
    finally:
        holder.release()
    assert main(["train", *TINY, "--epochs", "1", "--out", str(out)]) == 0  # free again


def test_a_lock_file_left_by_a_killed_run_does_not_block(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text('{"pid": 999999, "host": "gone", "started": 0}')
    assert main(["train", *TINY, "--epochs", "1", "--out", str(out)]) == 0


def test_leftover_temporary_files_are_removed_at_start(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "1", "--checkpoint-every", "1", "--out",
                 str(out)]) == 0
    for name in (".checkpoint.npz.a1b2c3.tmp", ".log.json.zz9.tmp"):
        (out / name).write_bytes(b"\0" * 1000)  # what a kill during an atomic write leaves
    capsys.readouterr()
    assert main(["train", *TINY, "--epochs", "2", "--resume", str(out)]) == 0
    assert "removed 2 temporary file(s)" in capsys.readouterr().out
    assert not list(out.glob(".*.tmp"))


def test_an_unwritable_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(run_folder, "open", refuse, raising=False)
    started = []
    monkeypatch.setattr(trainer, "train_epoch", lambda *a, **k: started.append(1))
    assert main(["train", *TINY, "--epochs", "1", "--out", str(tmp_path / "ro")]) == EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert "`--out`" in line and "is not writable: Permission denied" in line
    assert not started


# ----------------------------------------------------------------------------- failing writes
@pytest.mark.parametrize("code, text", [(errno.ENOSPC, "no space left on the device"),
                                        (errno.EFBIG, "file too large")],
                         ids=["disk-full", "file-size-limit"])
def test_a_failing_checkpoint_write_stops_with_status_error(tmp_path, monkeypatch, capsys,
                                                           code, text):
    out = tmp_path / "run"
    real = trainer.save_checkpoint

    def fails_at_epoch_2(path, **kwargs):
        if kwargs["epoch"] >= 2:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, **kwargs)

    monkeypatch.setattr(trainer, "save_checkpoint", fails_at_epoch_2)
    assert main(["train", *TINY, "--epochs", "3", "--checkpoint-every", "1", "--out",
                 str(out)]) == EXIT_ERROR
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"refbraid train: error: {text} writing {out}/checkpoint.npz")
    assert "Kept checkpoint.npz (epoch 1)" in line and f"--resume {out}" in line
    assert _log(out)["status"] == "error" and _log(out)["epoch"] == 2
    assert load_checkpoint(out).epoch == 1  # the previous checkpoint is intact
    assert not list(out.glob(".*.tmp"))


def test_when_even_the_log_cannot_be_written_the_message_says_so(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    calls = []

    def disk_fills_up(path, obj):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trainer, "write_json", disk_fills_up)
    assert main(["train", *TINY, "--epochs", "2", "--out", str(out)]) == EXIT_ERROR
    line = _one_line(capsys.readouterr().err)
    assert "no space left on the device" in line and "log.json could not be updated" in line


def test_out_of_memory_is_one_line(tmp_path, monkeypatch, capsys):
    import refbraid.training.run as run

    def huge(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(run, "load_dataset", huge)
    assert main(["train", *TINY, "--out", str(tmp_path / "run")]) == EXIT_ERROR
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("refbraid train: out of memory (Unable to allocate") and \
        "`--samples`" in line


def test_a_bug_is_one_line_that_asks_for_debug_and_debug_raises(tmp_path, monkeypatch, capsys):
    def bug(*args, **kwargs):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(trainer, "train_epoch", bug)
    assert main(["train", *TINY, "--out", str(tmp_path / "a")]) == EXIT_ERROR
    line = _one_line(capsys.readouterr().err)
    assert "internal error: ZeroDivisionError: oops" in line and "--debug" in line
    assert _log(tmp_path / "a")["status"] == "error"
    with pytest.raises(ZeroDivisionError):
        main(["train", *TINY, "--out", str(tmp_path / "b"), "--debug"])
    monkeypatch.setenv("REFBRAID_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["train", *TINY, "--out", str(tmp_path / "c")])


# ----------------------------------------------------------------------------- signals
def test_ctrl_c_in_process_marks_the_run_interrupted(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real = trainer.train_epoch

    def interrupted_in_epoch_2(state, *args, **kwargs):
        if state.epoch == 1:
            raise KeyboardInterrupt
        return real(state, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_epoch", interrupted_in_epoch_2)
    assert main(["train", *TINY, "--epochs", "3", "--checkpoint-every", "1", "--out",
                 str(out)]) == EXIT_INTERRUPTED
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("refbraid train: interrupted (Ctrl-C). Kept checkpoint.npz (epoch 1)")
    assert _log(out)["status"] == "interrupted"


def _start(argv, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REFBRAID_DEBUG": ""}
    return subprocess.Popen([sys.executable, "-m", "refbraid", "train", *argv, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)


def _wait_for_epoch(proc: subprocess.Popen, epoch: int, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read()}")
        if line.startswith(f"epoch {epoch:>2}/"):
            return
    raise AssertionError("no progress line in time")


LONG = ["--samples", "600", "--layers", "32", "--width", "8", "--epochs", "60",
        "--checkpoint-every", "1", "--serial"]


@pytest.mark.slow
def test_sigint_to_a_real_run_leaves_status_interrupted_and_a_resumable_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = _start(LONG, out)
    try:
        _wait_for_epoch(proc, 2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    line = _one_line(err)
    assert line.startswith("refbraid train: interrupted (Ctrl-C). Kept checkpoint.npz (epoch")
    assert _log(out)["status"] == "interrupted"
    epoch = load_checkpoint(out).epoch
    assert epoch >= 1
    assert main(["train", *LONG[:-5], "--epochs", str(epoch + 1), "--checkpoint-every", "1",
                 "--serial", "--quiet", "--resume", str(out)]) == 0
    assert _log(out)["status"] == "finished"


@pytest.mark.slow
def test_kill_9_during_checkpoint_writes_leaves_a_loadable_run_and_no_stale_files(tmp_path):
    out = tmp_path / "run"
    for attempt in range(3):  # kill at different moments of the epoch / checkpoint cycle
        proc = _start(LONG if attempt == 0 else [*LONG, "--resume", str(out)], out)
        try:
            _wait_for_epoch(proc, 2 + attempt * 2)
            time.sleep(0.05 * attempt)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
        load_checkpoint(out)  # every kill leaves a loadable checkpoint and valid JSON
        _log(out)
        (out / ".checkpoint.npz.killed.tmp").write_bytes(b"\0" * 100)  # as a kill mid-write
    assert main(["train", *LONG[:-5], "--epochs", str(load_checkpoint(out).epoch + 1),
                 "--checkpoint-every", "1", "--serial", "--quiet", "--resume", str(out)]) == 0
    assert not list(out.glob(".*.tmp"))


@pytest.mark.slow
def test_two_real_runs_on_one_folder_the_second_is_refused(tmp_path):
    out = tmp_path / "run"
    first = _start(LONG, out)
    try:
        _wait_for_epoch(first, 1)
        second = subprocess.run([sys.executable, "-m", "refbraid", "train", *TINY, "--out",
                                 str(out)], capture_output=True, text=True, timeout=120,
                                cwd=ROOT)
    finally:
        first.kill()
        first.wait(timeout=30)
    assert second.returncode == EXIT_USAGE
    line = _one_line(second.stderr)
    assert f"is in use by another refbraid run (pid {first.pid}" in line


def test_a_run_refused_after_the_folder_check_leaves_no_empty_folders(tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "run"
    (tmp_path / "empty").mkdir()  # no MNIST files: refused when the data loads
    assert main(["train", *TINY, "--data", "mnist", "--data-dir", str(tmp_path / "empty"),
                 "--out", str(out)]) == EXIT_USAGE
    assert "MNIST files missing" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()
