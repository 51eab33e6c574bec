"""Distribution of time points over ranks, kept out of MGRIT's math.

=============  ===================================================================
module         job
=============  ===================================================================
layout.py      blocks of the time grid per rank, aligned with the coarsest grid
comm.py        the communicator interface MGRIT talks through; serial and
               thread-simulated implementations (an MPI one plugs in later)
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
