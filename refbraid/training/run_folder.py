"""The output folder of a run: checked before any work, claimed by one run at a time.

A run folder holds one run's files (:data:`RUN_FILES`). Before training, :func:`claim_run_folder`

1. checks that ``--out`` is, or can become, a writable folder (not a file, not inside a file,
   not a device, a name the file system accepts) by creating it and writing a probe file;
2. takes the folder's lock file :data:`LOCK_FILE` (an exclusive ``flock``, which the kernel
   releases when the process ends however it ends, so a killed run never leaves a stale lock;
   the file records the owner's pid, host and start time for the message another run shows);
3. refuses a folder that already holds a run (a ``log.json`` or ``checkpoint.npz``) unless
   ``--resume`` points at that very run or ``--overwrite`` was given (then the old run's files
   are removed, and the caller says so);
4. removes temporary files that an interrupted atomic write left behind (``.<name>.*.tmp``,
   see :mod:`refbraid.atomic`): nobody else can be writing them, since we hold the lock.

Every refusal is a ``ValueError`` naming ``--out`` (or ``--resume``) and what to do instead.
Under MPI only world rank 0 touches the folder; the other ranks learn its verdict
(:func:`refbraid.parallel.faults.root_decides`), so all stop with the same message.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX; elsewhere the lock falls back to O_EXCL creation plus a liveness check
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

#: Every file a run writes into its folder (what ``--overwrite`` removes).
RUN_FILES = ("log.json", "checkpoint.npz", "curves.png", "mgrit.png", "gradient_error.png",
             "gradient_error.json", "trace.json", "timeline.png")
#: Files whose presence means the folder holds a run.
RUN_MARKERS = ("log.json", "checkpoint.npz")
LOCK_FILE = ".refbraid.lock"
PROBE_FILE = ".refbraid.probe"


@dataclass
class RunFolder:
    """A claimed run folder: ``path``, and what claiming it did (for the caller to report)."""

    path: Path
    replaced: list[str]  # old run files removed because of --overwrite
    stale_removed: list[str]  # leftover temporary files removed
    created: Path | None = None  # the outermost folder the claim created (None: none)
    _lock_fd: int | None = None

    def release(self, discard_if_unused: bool = False) -> None:
        """Give the folder back (the lock file stays; a lock is the flock, not the file).

        ``discard_if_unused``: a folder this claim created and nothing was written to is
        removed again (a run that failed before its first epoch leaves no empty folder).
        """
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        if discard_if_unused and self.created is not None:
            with contextlib.suppress(OSError):
                if {p.name for p in self.path.iterdir()} <= {LOCK_FILE}:
                    (self.path / LOCK_FILE).unlink(missing_ok=True)
                    folder = self.path
                    while True:  # up to the outermost folder we made, while they are empty
                        folder.rmdir()
                        if folder == self.created:
                            break
                        folder = folder.parent


# ----------------------------------------------------------------------------- checks
def check_writable_folder(path: Path, flag: str = "--out") -> Path:
    """Create ``path`` (and parents) if needed and prove a file can be written in it."""
    shown = str(path)
    if not shown.strip():
        raise ValueError(f"`{flag}` must name a folder, got {shown!r}.")
    if _exists(path) and not path.is_dir():
        what = "a file" if path.is_file() else "not a folder (a device or other special file)"
        raise ValueError(f"`{flag}` {shown!r} is {what}; give a folder for the run's files.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"`{flag}` {shown!r} cannot be created: a part of it is a file, not a "
                         f"folder.") from None
    except OSError as err:
        raise ValueError(f"`{flag}` {shown!r} cannot be created: {err.strerror}.") from None
    probe = path / PROBE_FILE
    try:
        with open(probe, "wb") as fh:
            fh.write(b"refbraid")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise ValueError(f"`{flag}` {shown!r} is not writable: {err.strerror}.") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return path


def _exists(path: Path) -> bool:
    """``path.exists()``, False for names the file system rejects (e.g. too long)."""
    try:
        return path.exists()
    except OSError:
        return False


def _outermost_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None: it exists)."""
    missing = None
    for p in [path, *path.parents]:
        if _exists(p):
            break
        missing = p
    return missing


def resume_folder(resume: str | os.PathLike | None) -> Path | None:
    """The run folder a ``--resume`` path belongs to (the folder itself, or a file's parent)."""
    if not resume:
        return None
    p = Path(resume)
    return p if p.is_dir() else p.parent


def describe_run(path: Path) -> str:
    """A short description of the run in ``path`` for messages: its status and epoch."""
    try:
        log = json.loads((path / "log.json").read_text())
        return f"status {log.get('status')!r} at epoch {log.get('epoch')}"
    except (OSError, ValueError, AttributeError):
        held = [name for name in RUN_MARKERS if (path / name).exists()]
        return "holding " + ", ".join(held)


def _same_folder(a: Path, b: Path | None) -> bool:
    if b is None:
        return False
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


# ----------------------------------------------------------------------------- lock
def _lock_owner(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return (f"pid {info['pid']} on {info['host']}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['started']))}")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _owner_record() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "started": time.time()}).encode()


def acquire_lock(folder: Path) -> int:
    """Hold ``folder/.refbraid.lock`` exclusively; ValueError naming the owner if it is held.

    With ``flock`` the lock dies with its process. A lock file that was replaced between our
    open and our flock (another run removed and re-created it) is retried, so two runs can
    never both believe they hold it.
    """
    path = folder / LOCK_FILE
    busy = (f"`--out` {str(folder)!r} is in use by another refbraid run ({{owner}}); wait for "
            f"it to finish or choose another `--out`.")
    if fcntl is None:  # pragma: no cover - Windows: O_EXCL, no stale-lock recovery
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise ValueError(busy.format(owner=_lock_owner(path))) from None
        os.write(fd, _owner_record())
        return fd
    for _ in range(10):
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(busy.format(owner=_lock_owner(path))) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, _owner_record())
            os.fsync(fd)
            return fd
        os.close(fd)  # the file we locked is no longer the lock file: try again
    raise ValueError(busy.format(owner=_lock_owner(path)))  # pragma: no cover


# ----------------------------------------------------------------------------- claim
@contextlib.contextmanager
def output_folder(out: str | os.PathLike, flag: str = "--out") -> Iterator[Path]:
    """The checked output folder of a command that writes files but is not a run (``compare``,
    ``lessons build``): checked as a run folder is (step 1 above) before any work, and removed
    again when the command fails before writing anything into a folder it created."""
    path = Path(out)
    created = _outermost_missing(path)
    folder = RunFolder(check_writable_folder(path, flag), [], [], created)
    failed = True
    try:
        yield folder.path
        failed = False
    finally:
        folder.release(discard_if_unused=failed)


def remove_stale_temporaries(folder: Path) -> list[str]:
    """Delete ``.<name>.*.tmp`` files left by interrupted atomic writes; returns their names."""
    removed = []
    for p in folder.glob(".*.tmp"):
        if p.is_file():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p.name)
    return sorted(removed)


def claim_run_folder(out: str | os.PathLike, *, resume: str | os.PathLike | None = None,
                     overwrite: bool = False) -> RunFolder:
    """Check, lock and (if asked) clear the run folder ``out``; see the module docstring.

    The caller must :meth:`RunFolder.release` it.
    """
    created = _outermost_missing(Path(out))
    folder = check_writable_folder(Path(out))
    fd = acquire_lock(folder)
    try:
        replaced: list[str] = []
        holds_run = any((folder / name).exists() for name in RUN_MARKERS)
        if holds_run and not _same_folder(folder, resume_folder(resume)):
            if not overwrite:
                raise ValueError(
                    f"`--out` {str(folder)!r} already holds a run ({describe_run(folder)}); "
                    f"continue it with `--resume {folder}`, choose another `--out`, or pass "
                    f"`--overwrite` to replace it.")
            for name in RUN_FILES:
                if (folder / name).exists():
                    (folder / name).unlink()
                    replaced.append(name)
        stale = remove_stale_temporaries(folder)
    except BaseException:
        os.close(fd)
        raise
    return RunFolder(folder, replaced, stale, created, fd)
