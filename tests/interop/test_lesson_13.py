"""Lesson 13 runs end to end in small mode (its own assertions are the checks)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

LESSON = (Path(__file__).resolve().parents[2] / "lessons"
          / "13_check_your_layer_parallel_code.py")


def test_lesson_10_runs_and_saves_its_figure(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="lesson 13 checks a PyTorch network (torch optional)")
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(LESSON), run_name="__main__")
    assert (tmp_path / f"{LESSON.stem}.png").is_file()
