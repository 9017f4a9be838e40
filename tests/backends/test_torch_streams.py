"""torch's device and stream getters the GPU backends share: torch's internal ones where present,
else the public API, giving the same integers."""

from __future__ import annotations

from types import SimpleNamespace

from pagedattn.backends.torch_streams import current_device_getter, current_stream_getter


def _torch(internal: bool) -> SimpleNamespace:
    stream = SimpleNamespace(cuda_stream=0xBEEF)
    cuda = SimpleNamespace(current_device=lambda: 3, current_stream=lambda device: stream if device == 3 else None)
    internals = {"_cuda_getDevice": lambda: 3, "_cuda_getCurrentRawStream": lambda device: 0xBEEF * (device == 3)}
    return SimpleNamespace(_C=SimpleNamespace(**(internals if internal else {})), cuda=cuda)


def test_internal_getters_are_taken_where_present() -> None:
    torch = _torch(internal=True)
    assert current_device_getter(torch) is torch._C._cuda_getDevice
    assert current_stream_getter(torch) is torch._C._cuda_getCurrentRawStream


def test_the_public_api_gives_the_same_integers_without_them() -> None:
    for internal in (True, False):
        torch = _torch(internal)
        device = current_device_getter(torch)()
        assert device == 3 and current_stream_getter(torch)(device) == 0xBEEF
