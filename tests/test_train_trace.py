"""``refbraid train --trace``: one whole training step recorded on every rank."""

from __future__ import annotations

import json
from collections import Counter

from refbraid.cli import main

FLAGS = ["train", "--samples", "300", "--layers", "32", "--width", "4", "--epochs", "1",
         "--quiet", "--trace"]


def test_trace_records_every_step_application_of_the_second_training_step(tmp_path):
    out = tmp_path / "run"
    assert main([*FLAGS, "--out", str(out)]) == 0
    trace = json.loads((out / "trace.json").read_text())
    log = json.loads((out / "log.json").read_text())
    kinds = Counter(e["kind"] for e in trace["events"])
    assert trace["step"] == 2
    # every step application of both MGRIT solves (the log's mean equals it: every step of a
    # fixed-iteration run makes the same calls)
    assert kinds["step"] == log["history"][-1]["stats"]["phi_calls"]
    assert {e["rank"] for e in trace["events"]} == {0}
    levels = {e["level"] for e in trace["events"] if e["kind"] == "step"}
    assert levels == {0, 1, 2}
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_with_one_step_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*FLAGS, "--batch-size", "1000", "--out", str(out)]) == 2
    assert "`--trace` records training step 2" in capsys.readouterr().err
    assert not out.exists()
