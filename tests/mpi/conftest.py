"""Tests that run under ``mpiexec``: every rank runs every test, with the same parameters.

Launched by tests/test_mpi_launch.py as ``mpiexec -n N python -m mpi4py -m pytest tests/mpi``
for N = 1..4 (or by hand, the same command). A plain ``pytest`` run does not collect these
files (they would only repeat the N = 1 case); set ``REFBRAID_MPI_TESTS=1`` to force them.

Only world rank 0 writes pytest's report. A failure on one rank must not leave the others
blocked in a collective of the same test: :func:`pytest_runtest_logreport` prints the failure
with the rank and aborts the whole job (``MPI_Abort``), so the launcher sees a non-zero exit
code and the failing rank's message within seconds.
"""

import os
import sys

from refbraid.parallel.mpi import launched_by_mpiexec

if not (launched_by_mpiexec() or os.environ.get("REFBRAID_MPI_TESTS") == "1"):
    collect_ignore_glob = ["test_*.py"]

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Only world rank 0 reports to the terminal (failures on any rank still print, below)."""
    if not launched_by_mpiexec():
        return
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report):
    if not report.failed:
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return
    sys.stderr.write(f"\n[rank {world.Get_rank()}] FAILED {report.nodeid} ({report.when}):\n"
                     f"{report.longreprtext}\n")
    sys.stderr.flush()
    world.Abort(1)


@pytest.fixture(scope="session")
def world():
    """An MPIComm over a duplicate of COMM_WORLD."""
    from refbraid.parallel.mpi import MPIComm

    return MPIComm.world()


@pytest.fixture
def shared_tmp(world):
    """A fresh folder every rank sees (made by rank 0, removed after the test).

    Not pytest's ``tmp_path``: concurrent ranks would each make and prune numbered folders.
    """
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(world.bcast(tempfile.mkdtemp(prefix="refbraid-mpi-") if world.rank == 0
                            else None, root=0))
    yield path
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
