"""Whether work is being recorded into a CUDA graph, and what that forbids.

A CUDA graph capture records launches without running them, so the recorded code may not
wait for the device (no device→host read: :func:`host_reads_deferred`) nor copy host memory
over (the copy would be recorded reading memory freed after the capture:
:func:`recording_graph`). These flags are how the rest of refbraid knows:
:func:`~refbraid.backends.host.to_host` refuses, the input checks and MGRIT's decisions wait
for the caller, :func:`~refbraid.backends.portable.stack_rows` avoids CuPy's address table,
and the CuPy stand-in of the tests refuses what a real capture would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_deferred_depth = 0  # > 0 inside host_reads_deferred()


class HostReadDeferred(RuntimeError):
    """A device value was brought to the host inside :func:`host_reads_deferred`."""


@contextmanager
def host_reads_deferred() -> Iterator[None]:
    """Inside, no device value may reach the host: :func:`to_host` raises
    :class:`HostReadDeferred`, and the code that would read one defers instead — the value
    checks of inputs are the caller's (made before), the loss stays a 0-d device array, MGRIT
    runs every cycle and decides its status afterwards (``MGRITResult.settle``). This is the
    contract of work recorded into a CUDA graph (:mod:`refbraid.backends.graphs`): a capture
    cannot wait for the device it is recording."""
    global _deferred_depth
    _deferred_depth += 1
    try:
        yield
    finally:
        _deferred_depth -= 1


def host_reads_allowed() -> bool:
    """False inside :func:`host_reads_deferred`."""
    return _deferred_depth == 0


_recording_depth = 0  # > 0 inside recording_graph()


@contextmanager
def recording_graph() -> Iterator[None]:
    """:func:`host_reads_deferred`, and what a CUDA graph capture adds: no host→device copy
    either (a recorded copy would read host memory freed after the capture), and no
    concatenation of many arrays through a host-made address table
    (:func:`~refbraid.backends.portable.stack_rows`).
    The warm-up call before a capture runs under :func:`host_reads_deferred` alone: its
    copies fill the caches the recorded call then reads."""
    global _recording_depth
    with host_reads_deferred():
        _recording_depth += 1
        try:
            yield
        finally:
            _recording_depth -= 1


def is_recording_graph() -> bool:
    """True inside :func:`recording_graph`."""
    return _recording_depth > 0
