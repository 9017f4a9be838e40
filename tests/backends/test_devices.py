"""The contract's "Devices": one call's arrays share one device (else the error names the one that
does not, and nothing is written), and a backend without ``other_device`` refuses a call on another
device than its current one as unsupported. Then the conformance cells that hold backends to it:
the bad-input items of an array on another device, and the wrapper of the cells on another GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pagedattn.backends.devices import array_device, require_one_device
from pagedattn.backends.torch.backend import TorchBackend
from pagedattn.conformance.another_gpu import OnAnotherGPU
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.bad_inputs import check_bad_input, other_device, valid_call
from pagedattn.errors import PagedAttentionError, UnsupportedError

torch = pytest.importorskip("torch")


def test_array_device_names_torch_devices_and_leaves_host_data_on_none():
    assert array_device(torch.zeros(2)) == "cpu:0"
    assert array_device(torch.zeros(2, device="meta")) == "meta"
    assert array_device(np.zeros(2)) is None
    assert array_device([1, 2]) is None
    assert array_device(None) is None


def test_require_one_device_names_the_first_array_elsewhere_and_returns_the_device():
    host, meta = torch.zeros(2), torch.zeros(2, device="meta")
    assert require_one_device((("a", np.zeros(2)), ("b", host), ("c", host))) == "cpu:0"
    assert require_one_device((("a", np.zeros(2)), ("b", [1]))) is None
    with pytest.raises(PagedAttentionError) as raised:
        require_one_device((("key_cache", host), ("value_cache", host), ("query", meta), ("x", meta)))
    assert raised.value.argument == "query"
    assert "meta" in str(raised.value) and "key_cache is on cpu:0" in str(raised.value)


def _torch_call() -> dict[str, Any]:
    call = valid_call("float32", 16, "NHD")
    return {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value for name, value in call.items()}


@pytest.mark.parametrize(("operation", "argument"), [
    ("paged_attention", "query"), ("paged_attention", "value_cache"), ("write_kv", "key"),
    ("write_kv", "value_cache"), ("copy_blocks", "value_cache"), ("merge_states", "lse_b"),
])
def test_every_entry_point_refuses_an_array_on_another_device_and_writes_nothing(operation, argument):
    c = _torch_call()
    c[argument] = c[argument].to("meta")
    caches = {name: c[name].clone() for name in ("key_cache", "value_cache") if name != argument}
    backend = TorchBackend("cpu")
    calls = {
        "paged_attention": lambda: backend.paged_attention(c["query"], c["key_cache"], c["value_cache"],
                                                           c["block_tables"], c["seq_lens"], c["query_start_loc"]),
        "write_kv": lambda: backend.write_kv(c["key"], c["value"], c["key_cache"], c["value_cache"],
                                             c["slot_mapping"]),
        "copy_blocks": lambda: backend.copy_blocks(c["key_cache"], c["value_cache"], c["pairs"]),
        "merge_states": lambda: backend.merge_states(c["out_a"], c["lse_a"], c["out_b"], c["lse_b"]),
    }
    with pytest.raises(PagedAttentionError) as raised:
        calls[operation]()
    assert raised.value.argument == argument and not isinstance(raised.value, UnsupportedError)
    for name, before in caches.items():
        assert torch.equal(c[name], before), name


class _CurrentIsTheHost(TorchBackend):
    """torch on the CPU, saying the host is its current device (as a GPU backend names its GPU)."""

    def current_device(self) -> str | None:
        return "cpu:0"


def test_a_call_on_another_device_than_the_current_one_is_unsupported_without_other_device():
    c = {name: value.to("meta") if isinstance(value, torch.Tensor) and value.is_floating_point() else value
         for name, value in _torch_call().items()}
    backend = _CurrentIsTheHost("cpu")
    with pytest.raises(UnsupportedError) as raised:
        backend.write_kv(c["key"], c["value"], c["key_cache"], c["value_cache"], c["slot_mapping"])
    assert raised.value.capability == "other_device" and "meta while cpu:0" in str(raised.value)
    with pytest.raises(UnsupportedError):
        backend.plan(c["query"], c["key_cache"], c["value_cache"], c["block_tables"], c["seq_lens"],
                     c["query_start_loc"])
    host = _torch_call()  # on the current device: planned
    backend.plan(host["query"], host["key_cache"], host["value_cache"], host["block_tables"], host["seq_lens"],
                 host["query_start_loc"])


def test_the_bad_input_items_of_another_device_fail_a_backend_that_does_not_check(monkeypatch):
    import pagedattn.backends.interface as interface

    backend = TorchBackend("cpu")
    assert other_device(backend) == "meta"
    check_bad_input(backend, "query_on_another_device", dtype="float32", block_size=16, kv_layout="NHD")
    monkeypatch.setattr(interface, "require_one_device", lambda arrays: None)
    for name in ("query_on_another_device", "write_kv_key_on_another_device"):
        with pytest.raises(ConformanceFailure):
            check_bad_input(backend, name, dtype="float32", block_size=16, kv_layout="NHD")


class _Returns:
    """A stand-in backend whose ``merge_states`` returns what it is given, and may switch device."""

    name = "stand-in"

    def __init__(self, fake_torch: Any, switch_to: int | None) -> None:
        self._torch, self._switch_to = fake_torch, switch_to

    def merge_states(self, *outputs: Any) -> Any:
        if self._switch_to is not None:
            self._torch.cuda.device_now = self._switch_to
        return outputs


class _OnGPU:
    def __init__(self, index: int) -> None:
        self.index = index

    def __dlpack_device__(self) -> tuple[int, int]:
        return 2, self.index


def _fake_torch() -> Any:
    cuda = SimpleNamespace(device_now=0)
    cuda.current_device = lambda: cuda.device_now
    return SimpleNamespace(cuda=cuda, device=lambda kind, index: f"{kind}:{index}")


def test_the_another_gpu_wrapper_fails_a_call_that_moves_the_current_device_or_returns_elsewhere():
    fake = _fake_torch()
    OnAnotherGPU(_Returns(fake, None), fake, 0, 1).merge_states(_OnGPU(1), _OnGPU(1))  # type: ignore[arg-type]
    with pytest.raises(ConformanceFailure, match="left cuda:1 the current device"):
        OnAnotherGPU(_Returns(fake, 1), fake, 0, 1).merge_states(_OnGPU(1))  # type: ignore[arg-type]
    fake.cuda.device_now = 0
    with pytest.raises(ConformanceFailure, match="returned an array on cuda:0"):
        OnAnotherGPU(_Returns(fake, None), fake, 0, 1).merge_states(_OnGPU(1), _OnGPU(0))  # type: ignore[arg-type]
