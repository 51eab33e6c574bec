"""The course's helpers: figures where the student is, notebooks, self-checking exercises.

* :func:`show` / :func:`small` (``figures.py``): every lesson hands each figure it builds to
  ``show(fig, name)`` in the cell that builds it — inline in a Jupyter kernel, saved to
  ``lesson_figures/NN/`` (or ``$REFBRAID_LESSON_FIGURES``) in a plain script — and reads
  its size from ``small()`` (``REFBRAID_LESSON_SMALL=1``: quick run).
* ``notebooks.py``: lessons → executed ``.ipynb`` (jupytext + nbclient, the ``lessons``
  extra); ``cli.py``: ``refbraid lessons list | build``.
* :func:`need` (``notebooks.py``): a lesson's optional import (torch), or one line naming
  the ``lessons`` extra instead of a traceback.
* ``exercises`` (check functions that print PASS or what is wrong) and ``solutions`` (their
  reference solutions).

Converting a lesson written in the old style (mechanical; lessons 10–12 at merge):

1. drop ``import os`` / ``from pathlib import Path`` when only the two variables used them,
   and add ``from refbraid.lessons import show, small``;
2. ``SMALL = os.environ.get("REFBRAID_LESSON_SMALL") == "1"`` → ``SMALL = small()``, and
   delete ``FIGURES = os.environ.get("REFBRAID_LESSON_FIGURES")``;
3. every ``if FIGURES: [mkdir] fig.savefig(<folder> / "NAME.png", dpi=120)`` →
   ``show(fig, "NAME")`` (same NAME, so the saved files keep their names), placed in the
   cell that builds ``fig`` (a notebook shows a figure in the cell that calls ``show``);
   figures kept in a dict and saved in a loop at the end become one ``show`` per figure
   where each is made; a PNG that a command wrote and the lesson copied
   (``shutil.copy(run / "compare.png", ...)``) becomes ``show(run / "compare.png", "NAME")``;
4. in the "Run it" paragraph say: in Jupyter figures appear in their cells; as a script
   they go to ``lesson_figures/NN/`` (``REFBRAID_LESSON_FIGURES`` picks another folder).

The notebook test (tests/test_lessons_notebooks.py) then checks that every figure a lesson
saves is also displayed, as a PNG, in the cell that calls ``show`` for it.
"""

from .figures import FIGURES_ENV, SMALL_ENV, figure_folder, in_notebook, show, small
from .notebooks import need

__all__ = ["FIGURES_ENV", "SMALL_ENV", "figure_folder", "in_notebook", "need", "show", "small"]
