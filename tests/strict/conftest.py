"""The strict device stand-in (refbraid.backends.strict_device) for the tests in this folder.

Every test here runs inside ``forbid_host_conversions()``: an implicit conversion of a device
array (``float``, ``bool``, ``numpy.asarray``, f-strings, DLPack, pickling) fails the test;
only ``refbraid.backends.host.to_host`` brings values to the host.
"""

import pytest

pytest.importorskip("array_api_strict")

from refbraid.backends import get_backend
from refbraid.backends.strict_device import forbid_host_conversions


@pytest.fixture(autouse=True)
def _no_implicit_host_conversions():
    with forbid_host_conversions():
        yield


@pytest.fixture
def strict():
    """The ``strict`` backend: reference kernels on array-api-strict arrays on ``device1``."""
    return get_backend("strict")
