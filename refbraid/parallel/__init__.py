"""Distribution of time points over ranks, kept out of MGRIT's math.

=============  ===================================================================
module         job
=============  ===================================================================
layout.py      blocks of the time grid per rank, aligned with the coarsest grid
comm.py        the communicator interface MGRIT talks through; serial and
               thread-simulated implementations
mpi.py         MPIComm (the same interface over mpi4py), world splits for data
               parallelism, abort-on-error (imported on demand: mpi4py is optional)
ops.py         exchanges as linear operators with their adjoints (DistDL), each
               checked by the distributed dot-product test
launch.py      ``mpiexec -n N python -m mpi4py ...`` with timeouts and one thread
=============  ===================================================================
"""

from .comm import Comm, SerialComm, ThreadComm, exchange_ghost, pipeline, run_ranks
from .layout import Layout, check_layout, partition

__all__ = [
    "Comm",
    "Layout",
    "SerialComm",
    "ThreadComm",
    "check_layout",
    "exchange_ghost",
    "partition",
    "pipeline",
    "run_ranks",
]
