"""Error conventions shared across refbraid (a leaf module: it imports nothing of refbraid).

Errors that a user's input causes are ``ValueError``/``TypeError`` whose message names the
argument (or CLI flag), the value and what was expected. Beyond that:

* :class:`CollectiveError` — a user error that every MPI rank raises identically, because
  every rank checks the same input (a ``--data-parallel`` that does not divide the world, more
  ranks than coarsest intervals) or because world rank 0 checked it and shared its verdict
  (the output folder). Every rank stops on it without ``MPI_Abort``, and only world rank 0
  prints it, so the user reads it once.
* Context notes (:func:`add_note`, PEP 678's ``__notes__``): code that an exception passes
  through may add one sentence of context without changing the exception's type — e.g. the
  training loop adds what it kept on disk ("Kept checkpoint.npz (epoch 2) ... in runs/x/"),
  and the command line prints the message with its notes in one line.
"""

from __future__ import annotations


class CollectiveError(ValueError):
    """A user error raised with the same message on every MPI rank (printed once, by rank 0)."""


def add_note(err: BaseException, note: str) -> None:
    """Attach ``note`` to ``err`` (``BaseException.add_note`` of Python ≥ 3.11, by hand before)."""
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # pragma: no cover - Python 3.10
        err.__notes__ = [*getattr(err, "__notes__", []), note]


def notes(err: BaseException) -> list[str]:
    """The notes attached to ``err`` (oldest first; empty when none)."""
    return [str(n) for n in getattr(err, "__notes__", ()) or ()]
