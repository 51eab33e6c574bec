"""Print the host↔device copies of one layer-parallel training step on the ``cuda`` backend
in Numba's CUDA simulator, per model (dense, conv, transformer, GRU): a markdown table.

    python benchmarks/count_cuda_transfers.py                          # device-resident
    REFBRAID_CUDA_ARRAYS=host python benchmarks/count_cuda_transfers.py  # host-array mode

Device-resident columns: the backend's kernel calls, Numba kernel launches, copies and
allocations through ``numba.cuda`` (``to_device``, ``device_array``, ``auto_device``,
``copy_to_host``), exits through ``refbraid.backends.host.to_host`` and the largest of them
(elements). Host-array mode: host→device and device→host copies and those made outside a
kernel wrapper. The counting is tests/test_cudasim_training_step.py's (same models, sizes
and step), which asserts on these numbers.
"""

from __future__ import annotations

import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # counts the simulator's copies
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_cudasim_training_step import (  # noqa: E402
    TransferCounter,
    _host_mode_step_copies,
    _model,
    _step,
)

from refbraid.backends import get_backend  # noqa: E402
from refbraid.backends.host import COUNTS  # noqa: E402

MODELS = ("dense", "conv", "transformer", "gru")


def device_row(name: str) -> str:
    patch = pytest.MonkeyPatch()
    net, params, x, labels = _model(name, np.random.default_rng(0))
    counter = TransferCounter(patch)
    door = COUNTS["to_host"]
    try:
        _step(net, params, x, labels, counter.wrap(get_backend("cuda")))
    finally:
        patch.undo()
    door = COUNTS["to_host"] - door
    return (f"| {name} | {counter.kernel_calls} | {counter.launches} | "
            f"{sum(counter.copies.values())} | {door} | {max(counter.door_sizes)} |")


def main() -> None:
    if os.environ.get("REFBRAID_CUDA_ARRAYS", "").lower() == "host":
        print("| model | host→device | device→host | copies outside a kernel |")
        print("|---|---:|---:|---:|")
        for name in MODELS:
            c = _host_mode_step_copies(name)
            print(f"| {name} | {c['h2d']} | {c['d2h']} | {c['outside']} |")
        return
    print("| model | kernel calls | launches | numba.cuda copies + allocations | exits through "
          "to_host | largest exit |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in MODELS:
        print(device_row(name))


if __name__ == "__main__":
    main()
