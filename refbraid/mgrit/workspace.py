"""Per-level arrays an MGRIT solve may reuse from the previous solve of the same shapes.

A solve allocates, per level, an iterate ``u`` (n_ℓ, *S_ℓ) and a right-hand side ``g``; the
coarsest level's forward substitution another block. A trainer solves the same shapes at
every step, so a :class:`Workspace` passed to :func:`refbraid.mgrit.solve` keeps them::

    ws = Workspace()
    a = solve(problem, settings, workspace=ws)    # a.solution is ws's level-0 array
    b = solve(problem2, settings, workspace=ws)   # overwrites it: a.solution now holds b's

Ownership (the one rule): **a solve's ``solution`` is the workspace's level-0 array**; the
next solve with the same workspace overwrites it. Copy what must outlive it, or give solves
whose results are read together (a forward trajectory the adjoint solve linearises at)
workspaces of their own. Without a workspace every solve allocates fresh arrays (the
default: nothing aliases).

Nothing here changes arithmetic: the solver writes the same values into a kept array that it
would write into a fresh one, and zero-fills only where it reads zeros (:meth:`zeros`: the
unforced right-hand side, zeroed once and never written again except its row 0).

Arrays are keyed by (role, level, shape, dtype, array type, device), so one workspace serves
NumPy, the strict array-API stand-in on its device and CUDA arrays alike (created with
:mod:`refbraid.backends.portable`'s helpers where ``like`` lives).
"""

from __future__ import annotations

from typing import Any

from ..backends.portable import empty_on, zeros_on


def _key(role: str, level: int, like, shape) -> tuple:
    device = getattr(like, "device", None)
    return (role, int(level), tuple(int(n) for n in shape), str(like.dtype),
            type(like).__module__, type(like).__name__, str(device))


class Workspace:
    """Arrays kept across solves, one per (role, level, shape, dtype, array type, device).

    ``empty(role, level, like, shape)``: an array of ``shape`` in ``like``'s dtype, where
    ``like`` lives, with whatever the previous user left in it (the caller overwrites every
    value it reads). ``zeros(...)``: the same, zero-filled once when it is made; the caller
    promises to write into it only what it rewrites at every use (module docstring).
    ``allocations`` counts the arrays made (a test of reuse: it stays put after the first
    solve).
    """

    def __init__(self) -> None:
        self._arrays: dict[tuple, Any] = {}
        self._undefined: set[tuple] = set()  # keys of the arrays made by `empty`
        self.allocations = 0

    def _get(self, role: str, level: int, like, shape, make):
        key = _key(role, level, like, shape)
        arr = self._arrays.get(key)
        if arr is None:
            arr = make(like, tuple(shape))
            self._arrays[key] = arr
            self.allocations += 1
            if make is empty_on:
                self._undefined.add(key)
        return arr

    def empty(self, role: str, level: int, like, shape):
        """A kept array of ``shape`` (``like``'s dtype and device), contents undefined."""
        return self._get(role, level, like, shape, empty_on)

    def zeros(self, role: str, level: int, like, shape):
        """A kept array of ``shape``, zero when made (see the class docstring)."""
        return self._get(role, level, like, shape, zeros_on)

    def copy_into(self, role: str, level: int, block):
        """``block``'s values in the kept array for (role, level): a copy that reuses memory."""
        out = self.empty(role, level, block, block.shape)
        out[...] = block
        return out

    def scribble(self, value: float = float("nan")) -> None:
        """Fill every kept array whose contents are undefined with ``value`` (NaN): a solve
        that read one before writing it would then give NaN or other numbers (the tests'
        proof that none does). The zeroed arrays keep their zeros."""
        for key in self._undefined:
            self._arrays[key][...] = value

    def clear(self) -> None:
        """Forget every kept array (the next solve allocates afresh)."""
        self._arrays.clear()
        self._undefined.clear()

    def __len__(self) -> int:
        return len(self._arrays)


class GradientWorkspace:
    """Kept arrays for a layer-parallel gradient: one :class:`Workspace` per solve, since the
    adjoint solve linearises at the forward solve's trajectory while it runs.

    Passed to :func:`refbraid.layer_parallel.layer_parallel_gradient` at every call, it makes
    the returned ``info.states`` and ``info.adjoints`` (and the MGRIT results' solutions) the
    workspace's arrays: the next call overwrites them. Gradients and the loss are new arrays.
    """

    def __init__(self) -> None:
        self.forward = Workspace()
        self.backward = Workspace()

    @property
    def allocations(self) -> int:
        return self.forward.allocations + self.backward.allocations

    def scribble(self, value: float = float("nan")) -> None:
        """:meth:`Workspace.scribble` on both workspaces."""
        self.forward.scribble(value)
        self.backward.scribble(value)
