"""Which MPI runs keep their arrays on the device (refbraid.distributed.choose.mpi_backend).

Under ``mpiexec`` the plain layer-parallel networks train on the backend's device arrays
(tests/mpi/test_device_training.py proves it); the other MPI gradients handle host arrays
only: ``--backend cuda`` falls back to host-array mode there and says so, a device backend
given to them directly is refused with a message naming what is device-resident.
"""

import warnings

import pytest

pytest.importorskip("array_api_strict")

from refbraid.backends import get_backend
from refbraid.distributed.choose import MPIRun, device_resident, mpi_backend
from refbraid.distributed.engine import host_backend
from refbraid.errors import CollectiveError
from refbraid.models import build_network
from refbraid.sequence import GRUModel


def _resnet():
    return build_network("resnet", (2,), 3, 8, 4, 1.0)


def test_the_plain_networks_keep_the_device_backend():
    strict = get_backend("strict")
    assert device_resident(MPIRun(model="resnet"), _resnet())
    assert mpi_backend(MPIRun(model="resnet"), _resnet(), strict) is strict
    tokens = {"vocab_size": 7, "per_token": True, "language_model": True}
    untied = build_network("gpt-untied", (5,), 7, 8, 4, 1.0, "tanh", tokens)
    tied = build_network("gpt", (5,), 7, 8, 4, 1.0, "tanh", tokens)
    assert device_resident(MPIRun(model="gpt-untied"), untied)  # its mpi_network
    assert not device_resident(MPIRun(model="gpt"), tied)  # distributed.chained: host


@pytest.mark.parametrize("config, net", [
    (MPIRun(model="gru"), GRUModel(4, 2, 4, 3, "classic")),
    (MPIRun(model="resnet", bias_control=True), _resnet()),
    (MPIRun(model="resnet", dp_groups=2), _resnet()),
    (MPIRun(model="resnet", mgopt=True), _resnet()),
], ids=["gru", "bias-control", "daso", "mgopt"])
def test_other_mpi_runs_fall_back_to_host_arrays_and_say_what_is_device_resident(config, net):
    assert not device_resident(config, net)
    cuda = get_backend("cuda")  # the simulator's device arrays (tests/conftest.py)
    said = []
    host = mpi_backend(config, net, cuda, say=said.append)
    assert host.name == "cuda" and host.xp.__name__ == "numpy"
    if cuda.xp is not host.xp:  # device-resident cuda: the fallback is announced
        assert len(said) == 1 and "trains on host arrays" in said[0]
        assert "Device-resident MPI training covers the models whose one Network" in said[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mpi_backend(config, net, get_backend("numpy")).name == "numpy"  # silent


def test_a_host_only_mpi_gradient_refuses_device_arrays_naming_what_is_device_resident():
    with pytest.raises(CollectiveError, match=r"DASO handles host \(NumPy\) arrays only; "
                       r"backend 'strict' keeps them on a device\. Device-resident MPI "
                       r"training covers the models whose one Network DistributedGradient "
                       r"distributes: resnet, conv, transformer, gpt-untied"):
        host_backend("strict", "DASO")
    assert host_backend("numpy").name == "numpy"


def test_training_flags_become_the_mpi_run_that_chooses():
    from refbraid.training.config import TrainConfig
    from refbraid.training.gradients import mpi_run

    run = mpi_run(TrainConfig(model="resnet", bias_control="measure", data_parallel=2))
    assert run == MPIRun(model="resnet", data_parallel=2, epochs=run.epochs, bias_control=True)
    assert not device_resident(run, _resnet())
    assert device_resident(mpi_run(TrainConfig(model="resnet")), _resnet())
