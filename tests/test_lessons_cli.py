"""`refbraid lessons list | build`: the listing, one built notebook, and clear errors."""

from __future__ import annotations

import sys

import pytest

from refbraid.cli import main


def test_lessons_list_prints_every_lesson(capsys):
    assert main(["lessons", "list"]) == 0
    out = capsys.readouterr().out
    assert "00  Lesson 00 — The idea in one page, and how to use this course" in out
    assert "09  Lesson 09 — Where layer-parallel training pays off" in out


def test_lessons_build_writes_an_executed_notebook(tmp_path, monkeypatch, capsys):
    nbformat = pytest.importorskip("nbformat", reason='the extra `lessons`')
    pytest.importorskip("nbclient", reason='the extra `lessons`')
    monkeypatch.chdir(tmp_path)  # nothing may land in the working folder but --out
    assert main(["lessons", "build", "0", "--small", "--out", "nb"]) == 0
    assert "built 1 notebooks" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "00_how_to_use_this_course.ipynb"]
    nb = nbformat.read(tmp_path / "nb" / "00_how_to_use_this_course.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.output_type == "error" for o in outputs)
    assert nb.metadata.kernelspec.name == "python3"


@pytest.mark.parametrize(("argv", "message"), [
    (["lessons", "build", "42"], "`LESSON` '42' is not a lesson number; expected one of 00, 01"),
    (["lessons", "list", "--lessons", "/no/such/folder"], "no lessons folder at /no/such/folder"),
])
def test_lessons_bad_input_is_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbraid lessons: error: ") and message in err
    assert "Traceback" not in err


def test_lessons_build_names_the_missing_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nbclient", None)  # `import nbclient` now fails
    assert main(["lessons", "build", "01", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "needs the optional extra `lessons`" in err and "missing: nbclient" in err
    assert 'pip install -e ".[lessons]"' in err


def test_a_failing_lesson_is_reported_and_its_notebook_still_written(tmp_path, capsys):
    pytest.importorskip("nbclient", reason='the extra `lessons`')
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    (lessons / "01_broken.py").write_text(
        '# %% [markdown]\n# # Lesson 01 — broken\n\n# %%\nprint("before")\n\n'
        '# %%\nraise ValueError("boom")\n')
    out = tmp_path / "nb"
    argv = ["lessons", "build", "--small", "--lessons", str(lessons), "--out", str(out)]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "FAILED: ValueError: boom" in printed and "1 of 1 lessons failed (01)" in printed
    assert (out / "01_broken.ipynb").is_file()


def test_a_lesson_whose_module_is_missing_is_named_before_any_build(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    assert main(["lessons", "build", "13", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert "lesson(s) 13 need the optional extra `lessons`; missing: torch" in err
    assert 'pip install -e ".[lessons]"' in err


def test_a_lesson_run_without_its_module_stops_with_one_line(monkeypatch):
    from refbraid.lessons import need

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemExit) as stop:
        need("torch")
    assert str(stop.value) == ('this lesson needs `torch`, part of the optional extra '
                               '`lessons`: pip install -e ".[lessons]" (from the refbraid '
                               'checkout).')
