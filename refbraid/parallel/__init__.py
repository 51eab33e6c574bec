"""Distribution of time points over ranks, kept out of MGRIT's math.

=============  ===================================================================
module         job
=============  ===================================================================
layout.py      blocks of the time grid per rank, aligned with the coarsest grid
comm.py        the communicator interface MGRIT talks through; serial and
               thread-simulated implementations
mpi.py         MPIComm (the same interface over mpi4py), world splits for data
               parallelism (imported on demand: mpi4py is optional)
codec.py       neighbour messages as raw bytes behind a shape/dtype header
faults.py      an error on one rank ends the job (one line, never a hang); rank 0
               decides for every rank (root_decides)
ops.py         exchanges as linear operators with their adjoints (DistDL), each
               checked by the distributed dot-product test
launch.py      ``mpiexec -n N python -m mpi4py ...`` with timeouts and one thread
trace.py       opt-in execution trace (steps, messages, collectives) and the
               critical path; the hooks cost one lookup when off
virtual.py     the virtual cluster: P ranks on virtual clocks (step costs, α + β·bytes
               per message), predicted wall time, timeline and critical path; its
               communicators and their D × Q split (virtual_topology)
virtual_world  what the virtual ranks share: clocks, mailboxes, communicator groups
.py            and their collectives
costs.py       its cost model: step costs per level and direction, collectives
scheduler.py   runs the virtual ranks' threads one at a time
plots.py       the timeline figure (imported on demand: matplotlib)
=============  ===================================================================
"""

from .comm import Comm, SerialComm, ThreadComm, exchange_ghost, pipeline, run_ranks, run_traced
from .layout import Layout, check_layout, partition
from .trace import Recorder, Trace, critical_path, recording
from .virtual import StepCosts, VirtualComm, VirtualRun, simulate

__all__ = [
    "Comm",
    "Layout",
    "Recorder",
    "SerialComm",
    "StepCosts",
    "ThreadComm",
    "Trace",
    "VirtualComm",
    "VirtualRun",
    "check_layout",
    "critical_path",
    "exchange_ghost",
    "partition",
    "pipeline",
    "recording",
    "run_ranks",
    "run_traced",
    "simulate",
]
