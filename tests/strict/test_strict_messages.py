"""The message codec with device arrays, without MPI: a strict-device array is staged
through a host buffer (never pickled) and comes back on the device; a direct message is a
header only. The MPI side runs under mpiexec in tests/mpi/test_device_messages.py."""

import numpy as np
import pytest

from refbraid.backends.host import to_host
from refbraid.backends.strict_device import DEVICE
from refbraid.parallel.codec import DIRECT, STAGED, DirectHeader, decode_message, encode_message
from refbraid.parallel.device_messages import Staged, is_device_array, stage_tree, unstage_tree


def _kind(buf) -> int:
    return int(buf[:8].view(np.int64)[0])


@pytest.mark.parametrize("shape", [(3, 4), (), (0, 2), (2, 1, 3)])
def test_a_device_array_is_staged_and_decoded_onto_the_device(strict, shape):
    host = np.random.default_rng(0).standard_normal(shape)
    buf = encode_message(strict.asarray(host))
    assert _kind(buf) == STAGED
    got = decode_message(buf, strict.asarray)
    assert got.device == DEVICE and tuple(got.shape) == shape
    np.testing.assert_array_equal(to_host(got), host)
    with pytest.raises(TypeError, match="to_device"):
        decode_message(buf)  # no way back onto the device: an error, not a host array


def test_a_direct_message_is_only_a_header(strict):
    buf = encode_message(strict.asarray(np.ones((2, 5), np.float32)), direct=True)
    assert _kind(buf) == DIRECT and buf.nbytes <= 64
    head = decode_message(buf)
    assert head == DirectHeader((2, 5), np.dtype(np.float32))


def test_collective_payloads_stage_device_arrays_and_only_those(strict):
    rows = {"W": strict.asarray(np.arange(6.0).reshape(2, 3)), "ids": np.arange(3), "n": 4}
    staged = stage_tree([rows, (strict.asarray(np.ones(2)),)], strict.asarray)
    assert isinstance(staged[0]["W"], Staged) and isinstance(staged[0]["ids"], np.ndarray)
    assert not any(is_device_array(v) for v in (staged[0]["W"], staged[1][0]))
    back = unstage_tree(staged, strict.asarray)
    assert back[0]["W"].device == DEVICE and back[0]["n"] == 4
    np.testing.assert_array_equal(to_host(back[0]["W"]), np.arange(6.0).reshape(2, 3))
    with pytest.raises(TypeError, match="to_device"):
        stage_tree(rows, None)
