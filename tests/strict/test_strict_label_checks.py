"""The label range checks copy two numbers to the host, not the batch of labels.

``input_checks.check_batch`` and ``sequence.losses.check_labels`` reduce min and max where the
labels live and bring those two scalars through the host door (``host.host_range``). Every
exit of the stand-in device (``to_device`` the CPU) is recorded here with its size.
"""

import array_api_strict
import numpy as np
import pytest

from refbraid.input_checks import check_batch
from refbraid.models import build_network
from refbraid.sequence.losses import IGNORE, cross_entropy


@pytest.fixture
def exits(monkeypatch):
    """Sizes of the arrays that leave the stand-in device during the test."""
    cpu = array_api_strict.Device("CPU_DEVICE")
    array_type = type(array_api_strict.asarray(0.0))
    original = array_type.to_device
    sizes: list[int] = []

    def recorded(array, device, /, **kwargs):
        if device == cpu and array.device != cpu:
            sizes.append(array.size)
        return original(array, device, **kwargs)

    monkeypatch.setattr(array_type, "to_device", recorded)
    return sizes


def test_check_batch_copies_the_label_range_not_the_labels(strict, exits):
    net = build_network("resnet", (2,), 3, 4, 4, 1.0)
    x = strict.asarray(np.random.default_rng(0).standard_normal((16, 2)))
    check_batch(net, x, strict.asarray(np.arange(16) % 3))
    assert exits and max(exits) == 1, exits
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 3\), got range \[0, 15\]"):
        check_batch(net, x, strict.asarray(np.arange(16)))


def test_sequence_loss_copies_the_label_range_not_the_labels(strict, exits):
    rng = np.random.default_rng(1)
    logits = strict.asarray(rng.standard_normal((4, 5, 3)))
    labels = rng.integers(0, 3, (4, 5))
    labels[:, :2] = IGNORE  # the prompt is not scored
    _, dlogits = cross_entropy(logits, strict.asarray(labels), strict)
    assert dlogits.shape == (4, 5, 3)
    assert exits and max(exits) == 1, exits  # the range, the loss: scalars only
    with pytest.raises(ValueError, match=r"got range \[-1, 7\]"):
        cross_entropy(logits, strict.asarray(np.where(labels == 2, 7, labels)), strict)
