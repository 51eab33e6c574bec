"""refbraid.lessons' figure helpers (show, small, figure_folder) and lesson 00 as a script."""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from refbraid.lessons import figure_folder, in_notebook, show, small
from refbraid.lessons.figures import METADATA_KEY

LESSON_00 = Path(__file__).resolve().parent.parent / "lessons" / "00_how_to_use_this_course.py"


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("yes", True), ("0", False),
                                                 ("", False), ("off", False)])
def test_small_reads_the_variable(value, expected, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", value)
    assert small() is expected


def test_small_names_the_variable_on_a_bad_value(monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "tiny")
    with pytest.raises(ValueError, match="REFBRAID_LESSON_SMALL must be 1 .* got 'tiny'"):
        small()


def test_figure_folder_default_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("REFBRAID_LESSON_FIGURES", raising=False)
    assert figure_folder("04_heatmap") == Path("lesson_figures/04")
    assert figure_folder("extra") == Path("lesson_figures")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    assert figure_folder("04_heatmap") == tmp_path


def test_show_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`name` must be a file name"):
        show(Figure(), "../escape")
    with pytest.raises(TypeError, match="`fig` must be a matplotlib Figure"):
        show(42, "01_x")
    with pytest.raises(ValueError, match="`fig` must be a matplotlib Figure or an existing PNG"):
        show("no/such/file.png", "01_x")


def test_show_copies_a_png_file_a_command_wrote(tmp_path, monkeypatch):
    made = tmp_path / "compare.png"
    Figure(figsize=(1, 1)).savefig(made)
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path / "figs"))
    saved = show(made, "13_copied")
    assert saved == tmp_path / "figs" / "13_copied.png"
    assert saved.read_bytes() == made.read_bytes()


def test_show_in_a_kernel_displays_a_named_png_and_saves_only_when_asked(tmp_path, monkeypatch):
    """A stand-in IPython with a kernel: show() publishes the PNG, names it, writes no file."""
    published = []
    display = types.ModuleType("IPython.display")
    display.Image = lambda data, format: ("png", data)
    display.display = lambda obj, metadata: published.append((obj, metadata))
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: types.SimpleNamespace(kernel=object())
    ipython.display = display
    ipython.version_info = (9, 0)  # matplotlib asks, on first drawing with IPython loaded
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REFBRAID_LESSON_FIGURES", raising=False)
    assert in_notebook()
    assert show(Figure(figsize=(1, 1)), "01_inline") is None
    (kind, png), metadata = published[0]
    assert png.startswith(b"\x89PNG") and metadata == {METADATA_KEY: "01_inline"}
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path / "figs"))
    assert show(Figure(figsize=(1, 1)), "01_both") == tmp_path / "figs" / "01_both.png"
    assert len(published) == 2


def test_lesson_00_runs_as_a_script(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.delenv("REFBRAID_LESSON_FIGURES", raising=False)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(LESSON_00), run_name="__main__")  # its own asserts are the checks
    out = capsys.readouterr().out
    for name in ("00_euler_error", "00_mgrit_iterations"):  # its two figures
        assert (tmp_path / "lesson_figures" / "00" / f"{name}.png").is_file()
    # its own exercise: a worked wrong answer, then the student's (untouched: TODO), no PASS
    assert "FAIL  [00 forward Euler]" in out and "TODO  [00 forward Euler]" in out
    assert "PASS" not in out
