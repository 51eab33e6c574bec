"""What the MPI gradients share (distributed, staged, chained/tied sequence, GRU).

* :func:`host_backend` — the backend of an MPI gradient that handles host (NumPy) arrays
  only (the staged, GRU, chained/tied sequence and DASO gradients): a backend whose namespace
  keeps arrays on a device is refused, naming ``bk`` and what is device-resident. The plain
  layer-parallel networks (:class:`~refbraid.distributed.network.DistributedGradient`)
  train on device arrays;
* :func:`gather_shards` — the full arrays on one rank from data-parallel group 0's owned
  shards, row-stacked parameters (``steps.*``) concatenated in layer order;
* :func:`replicated_rows`, :func:`place_rows` — replicated mode's way in (the step rows a
  rank reads from the full parameters) and out (its gradient rows into the full gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import Backend, get_backend
from ..backends.portable import namespace
from ..errors import CollectiveError
from ..network import Params, group, row, set_row
from .ownership import Rows

#: what trains on device arrays under mpiexec (error messages and docs/gpu.md say the same)
DEVICE_RESIDENT_MPI = ("the models whose one Network DistributedGradient distributes: resnet, "
                       "conv, transformer, gpt-untied (sharded or replicated; not with "
                       "--space-parallel, DASO, --bias-control or --mgopt-levels)")


def host_backend(bk: Backend | str, what: str = "this MPI gradient") -> Backend:
    """``get_backend(bk)``, refused (on every rank alike) unless it computes on NumPy arrays."""
    backend = get_backend(bk)
    if backend.xp is not np:
        raise CollectiveError(
            f"`bk`: {what} handles host (NumPy) arrays only; backend {backend.name!r} keeps "
            f"them on a device. Device-resident MPI training covers {DEVICE_RESIDENT_MPI}. "
            f"Use numpy or numba (`refbraid train --backend cuda` runs this model's kernels "
            f"in host-array mode under mpiexec).")
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
        rows = is_rows(k) and len(getattr(have[0], "shape", ())) > 0
        full[k] = namespace(have[0]).concat(have, axis=0) if rows else have[0]
    return full


def replicated_rows(plan, q: int, params: Params) -> dict[str, Rows]:
    """Replicated mode: the rows of ``steps.*`` that layer rank ``q`` reads
    (``plan.weight_rows(q)``), taken from the full ``params``."""
    need = plan.weight_rows(q)
    return {k: Rows(f"steps.{k}", q, {int(n): row(v, int(n)) for n in need})
            for k, v in group(params, "steps").items()}


def place_rows(grads: Params, part: dict[str, Any]) -> Params:
    """``grads`` (zeros) with a rank's gradient ``part`` written in: a dict of rows (the rows
    this rank computed, wherever they are owned) row by row, a whole array as it is."""
    for k, v in part.items():
        if isinstance(v, dict):
            for a, r in v.items():
                set_row(grads[k], a, r)
        else:
            grads[k][...] = v
    return grads
