"""What the MPI gradients share (distributed, staged, chained/tied sequence, GRU).

* :func:`host_backend` — the backend of an MPI gradient: its messages are host (NumPy) arrays,
  so a backend whose namespace keeps arrays on a device is refused, naming ``bk``;
* :func:`gather_shards` — the full arrays on one rank from data-parallel group 0's owned
  shards, row-stacked parameters (``steps.*``) concatenated in layer order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..errors import CollectiveError


def host_backend(bk: Backend | str) -> Backend:
    """``get_backend(bk)``, refused (on every rank alike) unless it computes on NumPy arrays."""
    backend = get_backend(bk)
    if backend.xp is not np:
        raise CollectiveError(f"`bk`: the MPI gradient sends host (NumPy) arrays; backend "
                              f"{backend.name!r} keeps them on a device. Use numpy or numba.")
    return backend


def steps_key(key: str) -> bool:
    """Whether ``key`` (``[buffer/]name``) names a row-stacked parameter ``steps.*``."""
    return key.rpartition("/")[2].startswith("steps.")


def gather_shards(topology, shard: dict[str, Any], root: int = 0,
                  is_rows: Callable[[str], bool] = steps_key) -> dict[str, Any] | None:
    """Full arrays on world rank ``root`` (None elsewhere) from group 0's shards, in layer-rank
    order: keys with ``is_rows(key)`` (and at least one axis) are concatenated along their rows,
    the others are taken from the first shard that has them. Collective over the world."""
    parts = topology.world.gather(shard if topology.group == 0 else None, root=root)
    if parts is None:
        return None
    parts = [s for s in parts if s is not None]  # group 0, in layer-rank order
    full: dict[str, Any] = {}
    for k in sorted({k for s in parts for k in s}):
        have = [s[k] for s in parts if k in s]
        rows = is_rows(k) and np.ndim(have[0]) > 0
        full[k] = np.concatenate(have, axis=0) if rows else have[0]
    return full
