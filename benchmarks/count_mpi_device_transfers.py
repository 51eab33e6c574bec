"""Print, per rank, the copies of one sharded layer-parallel training step over MPI on the
``cuda`` backend in Numba's CUDA simulator (device-resident): a markdown table.

    mpiexec -n 2 python -m mpi4py benchmarks/count_mpi_device_transfers.py

Columns: the layers a rank owns, its Numba kernel launches, its copies and allocations
through ``numba.cuda`` (``to_device``, ``device_array``, ``auto_device``, ``copy_to_host``:
zero when the kernels read and write the device arrays in place), its exits through the
host door ``refbraid.backends.host.to_host`` split into scalars (losses, residual norms,
label range, finiteness flags) and arrays (device arrays staged into host buffers for MPI:
no CUDA-aware MPI here), the largest exit (elements), and its neighbour messages (MGRIT
sends and their bytes). Model and step: tests/mpi/test_device_training.py's simulator test
(dense, N = 8, width 4, batch 4, 2 levels, cfactor 2, Adam), which asserts on these numbers.
"""

from __future__ import annotations

import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # counts the simulator's copies
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "mpi"))

import pytest  # noqa: E402
from test_device_training import SETTINGS, CudaCopies, _batches, _net  # noqa: E402

from refbraid.backends import get_backend  # noqa: E402
from refbraid.backends.host import COUNTS  # noqa: E402
from refbraid.distributed.network import distributed_gradient  # noqa: E402
from refbraid.distributed.sharded import ShardedTrainer  # noqa: E402
from refbraid.network import init_params, to_backend  # noqa: E402
from refbraid.parallel.device_messages import refuse_pickled_device_arrays  # noqa: E402
from refbraid.training.optim import make_optimizer  # noqa: E402


def rank_row() -> tuple[int, str]:
    """(world rank, this rank's table row) after one sharded step."""
    import array_api_strict

    from refbraid.backends.strict_device import forbid_host_conversions

    cuda = get_backend("cuda")
    net = _net("resnet", layers=8)
    (x, y), = _batches(net, n=1, B=4)
    trainer = ShardedTrainer(distributed_gradient(net, SETTINGS, cuda),
                             to_backend(init_params(net, 3), cuda), make_optimizer("adam", 1e-2))
    x, y = cuda.asarray(x), cuda.asarray(y)
    layer = trainer.gradient.topo.layer
    sizes: list[int] = []
    cpu = array_api_strict.Device("CPU_DEVICE")
    array_type = type(array_api_strict.asarray(0.0))
    to_device = array_type.to_device

    def recorded(array, device, /, **kwargs):
        if device == cpu and array.device != cpu:
            sizes.append(array.size)
        return to_device(array, device, **kwargs)

    patch = pytest.MonkeyPatch()
    try:
        counter = CudaCopies(patch)
        patch.setattr(array_type, "to_device", recorded)
        sends, sent, door = layer.counters["sends"], layer.counters["bytes_sent"], COUNTS["to_host"]
        with forbid_host_conversions(), refuse_pickled_device_arrays():
            trainer.step(x, y)
        sends, sent = layer.counters["sends"] - sends, layer.counters["bytes_sent"] - sent
        door = COUNTS["to_host"] - door
    finally:
        patch.undo()
    assert door == len(sizes)
    owned = trainer.gradient.owned
    scalars = sum(s == 1 for s in sizes)
    row = (f"| {layer.rank} | {int(owned[0])}..{int(owned[-1])} | {counter.launches} | "
           f"{sum(counter.copies.values())} | {scalars} | {door - scalars} | "
           f"{max(sizes, default=0)} | {sends} | {sent} |")
    return trainer.gradient.topo.world.rank, row


def main() -> None:
    from refbraid.parallel.mpi import MPIComm

    world = MPIComm.world()
    rank, row = rank_row()
    rows = world.gather(row, root=0)
    if rank == 0:
        print(f"one sharded step, --backend cuda (simulator), {world.size} ranks, dense N = 8, "
              f"width 4, batch 4")
        print("| rank | layers | launches | `numba.cuda` copies | scalar exits | staged arrays "
              "| largest exit | neighbour sends | bytes sent |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
