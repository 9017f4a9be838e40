"""The triton backend's direct run (CPU, kernels replaced by recorders): the first run of a plan
under a launch key goes through the JIT and keeps its compiled kernels; a later run under the
same key launches them directly with the arguments the JIT's launcher would get, pointers as
integers and fresh outputs; a run under another key (strides, alignment, device) or with a
launch hook goes through the JIT again; an array changed at the same address is still checked
and refused before anything launches. The launches on a GPU are ``gpu`` tests
(``test_triton_gpu.py``, ``test_triton_graphs.py``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("triton and torch are needed (pip install 'pagedattn[triton]')", allow_module_level=True)

from triton_mode import interpreter_setting

os.environ.setdefault("TRITON_INTERPRET", interpreter_setting())  # before any kernel module is imported

import torch

from pagedattn.backends.bitviews import numpy_to_torch
from pagedattn.backends.triton import backend as triton_backend
from pagedattn.backends.triton.backend import TritonBackend
from pagedattn.backends.triton.relaunch import ReadyLaunch
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.pools import random_paged_inputs

STREAM = 77
CPU = -1  # what Tensor.get_device says of a CPU tensor: the plan's device here


class _Launcher:
    """Stands for triton's CudaLauncher: records what reaches the C ``launch`` function."""

    launch_cooperative_grid = False
    launch_pdl = False
    global_scratch_size = 0
    profile_scratch_size = 0

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    def launch(self, *args: Any) -> None:
        self.calls.append(args)


class _Compiled:
    packed_metadata = (4, 1, 0)

    def __init__(self, function: int, calls: list[tuple[Any, ...]]) -> None:
        self.function = function
        self.run = _Launcher(calls)


class _Kernel:
    """Stands for a JITFunction with the real kernel's argument names: ``kernel[grid](...)``
    records the launch and returns a compiled kernel whose C launches are recorded."""

    def __init__(self, real: Any, function: int) -> None:
        self.arg_names = real.arg_names
        self.jit_launches: list[tuple[Any, ...]] = []
        self.direct_launches: list[tuple[Any, ...]] = []
        self.compiled = _Compiled(function, self.direct_launches)

    def __getitem__(self, grid: tuple[int, int, int]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> _Compiled:
            self.jit_launches.append((grid, args, kwargs))
            return self.compiled

        return launch


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> tuple[_Kernel, _Kernel]:
    attention, merge = triton_backend._attention_kernels()
    fakes = (_Kernel(attention, 0xA77), _Kernel(merge, 0x3E6))
    monkeypatch.setattr(triton_backend, "_attention_kernels", lambda: fakes)
    return fakes


def _planned(num_splits: int = 2, return_lse: bool = True) -> tuple[TritonBackend, Any, Any, Any, Any]:
    """A plan as on a GPU (not interpreted; CPU tensors stand for the device's), and its arrays."""
    inputs = random_paged_inputs([70, 33, 5], None, block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16,
                                 seed=5)
    q, k, v = (numpy_to_torch(x, "cpu") for x in inputs.args()[:3])
    backend = TritonBackend(num_splits=num_splits)
    plan = backend.plan(q, k, v, *inputs.args()[3:], return_lse=return_lse)
    state = dataclasses.replace(plan.state, interpret=False, current_device=lambda: CPU,
                                current_stream=lambda device: STREAM)
    return backend, dataclasses.replace(plan, state=state), q, k, v


def _pointers(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args)


def _expected(kernel: _Kernel, jit_launch: tuple[Any, ...], outputs: dict[int, Any]) -> tuple[Any, ...]:
    """What triton's launcher gives the C launch for a JIT launch, its first arguments (out,
    lse) replaced by ``outputs`` (index -> tensor)."""
    grid, args, kwargs = jit_launch
    args = tuple(outputs.get(i, x) for i, x in enumerate(args))
    constexprs = tuple(kwargs[name] for name in kernel.arg_names[len(args):])
    calls: list[tuple[Any, ...]] = []
    ready = ReadyLaunch.of(_Compiled(kernel.compiled.function, calls), grid, constexprs)
    assert ready is not None
    ready(STREAM, _pointers(args))
    return calls[0]


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("return_lse", [True, False])
def test_a_second_run_launches_directly_what_the_jit_would(kernels: tuple[_Kernel, _Kernel], num_splits: int,
                                                           return_lse: bool) -> None:
    attention, merge = kernels
    backend, plan, q, k, v = _planned(num_splits, return_lse)
    first = backend.run(plan, q, k, v)
    assert len(attention.jit_launches) == 1 and len(merge.jit_launches) == (num_splits > 1)
    assert attention.direct_launches == [] and len(plan.state.direct) == 1
    second = backend.run(plan, q, k, v)
    assert len(attention.jit_launches) == 1 and len(merge.jit_launches) == (num_splits > 1)  # no new JIT launch
    out, lse = second if return_lse else (second, None)
    first_out = first[0] if return_lse else first
    assert out.data_ptr() != first_out.data_ptr()  # a fresh output while the first is held
    assert out.dtype == q.dtype and tuple(out.shape) == tuple(q.shape) and out.is_contiguous()
    outputs = {0: out} if lse is None else {0: out, 1: lse}
    assert attention.direct_launches == [_expected(attention, attention.jit_launches[0], outputs)]
    if num_splits > 1:
        assert merge.direct_launches == [_expected(merge, merge.jit_launches[0], outputs)]
    else:
        assert merge.direct_launches == []


def test_another_key_goes_through_the_jit_and_is_kept_apart(kernels: tuple[_Kernel, _Kernel]) -> None:
    attention, _ = kernels
    backend, plan, q, k, v = _planned()
    backend.run(plan, q, k, v)
    padded = torch.zeros((*k.shape[:-1], k.shape[-1] + 16), dtype=k.dtype)[..., : k.shape[-1]]
    padded.copy_(k)  # the same shape and dtype, other strides
    backend.run(plan, q, padded, v)
    assert len(attention.jit_launches) == 2 and len(plan.state.direct) == 2
    backend.run(plan, q, padded, v)
    backend.run(plan, q, k, v)
    assert len(attention.jit_launches) == 2 and len(attention.direct_launches) == 2
    misaligned = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    assert misaligned.data_ptr() % 16 != 0
    backend.run(plan, misaligned, k, v)  # a misaligned array: the JIT every time, nothing kept
    backend.run(plan, misaligned, k, v)
    assert len(attention.jit_launches) == 4 and len(plan.state.direct) == 2
    heads_major = q.transpose(0, 1).contiguous().transpose(0, 1)  # dense, not contiguous
    for _ in range(2):  # through the JIT, then directly: out is contiguous all the same
        out = backend.run(plan, heads_major, k, v)[0]
        assert out.is_contiguous() and out.stride() == (q.shape[1] * q.shape[2], q.shape[2], 1)
    assert len(attention.jit_launches) == 5 and len(attention.direct_launches) == 3
    other_device = dataclasses.replace(plan.state, current_device=lambda: 3)  # the current device is in the key
    backend.run(dataclasses.replace(plan, state=other_device), q, k, v)
    assert len(attention.jit_launches) == 6 and len(attention.direct_launches) == 3


def test_a_launch_hook_sends_the_run_through_the_jit(kernels: tuple[_Kernel, _Kernel]) -> None:
    from triton import knobs

    attention, _ = kernels
    backend, plan, q, k, v = _planned()
    backend.run(plan, q, k, v)
    chain = knobs.runtime.launch_enter_hook
    hook_calls: list[Any] = []
    if hasattr(chain, "add"):
        chain.add(hook_calls.append)
    else:
        knobs.runtime.launch_enter_hook = hook_calls.append
    try:
        backend.run(plan, q, k, v)
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook_calls.append)
        else:
            knobs.runtime.launch_enter_hook = chain
    assert len(attention.jit_launches) == 2 and attention.direct_launches == []
    backend.run(plan, q, k, v)
    assert len(attention.jit_launches) == 2 and len(attention.direct_launches) == 1


@pytest.mark.parametrize("argument, how", [("query", "shape"), ("key_cache", "dtype"), ("value_cache", "shape")])
def test_an_array_changed_at_the_same_address_is_refused_and_nothing_launches(
        kernels: tuple[_Kernel, _Kernel], argument: str, how: str) -> None:
    attention, merge = kernels
    backend, plan, q, k, v = _planned()
    backend.run(plan, q, k, v)
    backend.run(plan, q, k, v)
    arrays = {"query": q, "key_cache": k, "value_cache": v}
    x = arrays[argument]
    changed = x.view(torch.int32) if how == "dtype" else x.view(-1, *x.shape[2:])
    assert changed.data_ptr() == x.data_ptr() and changed.stride()[-1] == x.stride()[-1]
    launched = (len(attention.jit_launches), len(attention.direct_launches), len(merge.direct_launches))
    with pytest.raises(PagedAttentionError) as error:
        backend.run(plan, **{**arrays, argument: changed})
    assert error.value.argument == argument
    assert (len(attention.jit_launches), len(attention.direct_launches), len(merge.direct_launches)) == launched


def test_arrays_on_another_device_than_the_plan_s_are_refused_after_direct_runs(
        kernels: tuple[_Kernel, _Kernel]) -> None:
    attention, _ = kernels
    backend, plan, q, k, v = _planned()
    backend.run(plan, q, k, v)
    backend.run(plan, q, k, v)
    elsewhere = dataclasses.replace(plan, state=dataclasses.replace(plan.state, device_index=0))
    assert elsewhere.state.direct  # the compiled kernels are there, the arrays are not on device 0
    with pytest.raises(PagedAttentionError, match="expected a tensor on") as error:
        backend.run(elsewhere, q, k, v)
    assert error.value.argument == "query"
    assert len(attention.jit_launches) == 1 and len(attention.direct_launches) == 1
