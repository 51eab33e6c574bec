"""Where the device stand-ins' arrays live: one question for both stand-ins."""

from refbraid.backends import cupy_standin, strict_device


def on_device(a) -> bool:
    """True for an array of a device stand-in: the CuPy-like stand-in's, or array-api-strict's
    on the strict stand-in's device (never a host NumPy array)."""
    if isinstance(a, cupy_standin.ndarray):
        return True
    return type(a).__module__.startswith("array_api_strict") and \
        a.device == strict_device.DEVICE
