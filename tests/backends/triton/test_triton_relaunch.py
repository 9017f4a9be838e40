"""The triton backend's direct relaunch (CPU): a ready launch gives the C launcher the arguments,
in the order, that triton's own launcher gives it; a plan keeps a compiled kernel only under a
key, outside the interpreter and without launch hooks; ``run`` refuses arrays on another
device than the plan's, naming them. The launches on a GPU are ``gpu`` tests
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

from pagedattn.backends.bitviews import numpy_to_torch
from pagedattn.backends.triton.backend import TritonBackend
from pagedattn.backends.triton.relaunch import ReadyLaunch, Relauncher
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.pools import random_paged_inputs


class _Launcher:
    """Stands for triton's CudaLauncher: records what reaches the C ``launch`` function."""

    launch_cooperative_grid = False
    launch_pdl = True
    num_ctas = 1
    profile_scratch_size = 0
    profile_scratch_align = 1

    def __init__(self, global_scratch_size: int = 0) -> None:
        self.global_scratch_size = global_scratch_size
        self.global_scratch_align = 1
        self.calls: list[tuple[Any, ...]] = []

    def launch(self, *args: Any) -> None:
        self.calls.append(args)

    def __call__(self, *args: Any) -> None:  # triton's own Python launcher, on this object
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher.__call__(self, *args)  # type: ignore[arg-type]


class _Compiled:
    function = 0xF00
    packed_metadata = (4, 1, 0)

    def __init__(self, launcher: _Launcher) -> None:
        self.run = launcher


def _triton_launch(compiled: _Compiled, grid: tuple[int, int, int], stream: int, bound: tuple[Any, ...]) -> None:
    """What JITFunction.run does with a compiled kernel and no launch hook."""
    compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *bound)


@pytest.mark.parametrize("scratch", [0, 64], ids=["C launcher", "python launcher (scratch)"])
def test_a_ready_launch_passes_what_triton_s_launcher_passes(scratch: int) -> None:
    if scratch:
        pytest.importorskip("triton.backends.nvidia.driver")
    args, constexprs = (0x1000, 0x2000, 7, 16), (64, True)
    expected, ready_one = _Launcher(scratch), _Launcher(scratch)
    if scratch:  # triton asks its allocator for the scratch: the NullAllocator raises without one
        from triton import set_allocator

        set_allocator(lambda size, align, stream: 0x9000)
    try:
        _triton_launch(_Compiled(expected), (3, 2, 1), 77, (*args, *constexprs))
        ready = ReadyLaunch.of(_Compiled(ready_one), (3, 2, 1), constexprs)
        assert ready is not None
        ready(77, args)
    finally:
        if scratch:
            from triton.runtime import _allocation

            _allocation._allocator.set(_allocation.NullAllocator())
    assert ready_one.calls == expected.calls and len(expected.calls) == 1
    assert (ready.launch == ready_one.launch) is (not scratch)  # the C function itself when no scratch


def test_a_compiled_kernel_without_launch_parts_is_not_kept() -> None:
    assert ReadyLaunch.of(object(), (1, 1, 1), ()) is None


class _Kernel:
    """Stands for a JITFunction: ``kernel[grid](*args, **kwargs)`` records and returns a compiled kernel."""

    arg_names = ("x", "n", "BLOCK")

    def __init__(self) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.compiled = _Compiled(_Launcher())

    def __getitem__(self, grid: tuple[int, int, int]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> _Compiled:
            self.launches.append((grid, args, kwargs))
            return self.compiled

        return launch


def test_a_plan_keeps_the_jit_s_kernel_only_under_a_key_outside_the_interpreter() -> None:
    kernel, relauncher = _Kernel(), Relauncher()
    relauncher.launch(kernel, (2, 1, 1), ("strides", 0), [0x1000, 5], {"BLOCK": 16}, {"num_warps": 4}, True)
    relauncher.launch(kernel, (2, 1, 1), None, [0x1000, 5], {"BLOCK": 16}, {"num_warps": 4}, False)
    assert len(kernel.launches) == 2 and kernel.launches[0][2] == {"BLOCK": 16, "num_warps": 4}
    assert relauncher.ready(kernel, ("strides", 0)) is None
    relauncher.launch(kernel, (2, 1, 1), ("strides", 0), [0x1000, 5], {"BLOCK": 16}, {"num_warps": 4}, False)
    ready = relauncher.ready(kernel, ("strides", 0))
    assert ready is not None and ready.constexpr_values == (16,) and ready.grid == (2, 1, 1)
    assert relauncher.ready(kernel, ("other strides", 0)) is None
    assert relauncher.ready(_Kernel(), ("strides", 0)) is None  # another kernel, the same key


def test_a_launch_hook_sends_every_launch_through_the_jit() -> None:
    from triton import knobs

    kernel, relauncher = _Kernel(), Relauncher()
    relauncher.launch(kernel, (1, 1, 1), ("k",), [0x1000, 5], {"BLOCK": 16}, {}, False)
    assert relauncher.ready(kernel, ("k",)) is not None

    def hook(metadata: Any) -> None:
        return None

    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):
        chain.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        assert relauncher.ready(kernel, ("k",)) is None
        relauncher.launch(kernel, (1, 1, 1), ("k2",), [0x1000, 5], {"BLOCK": 16}, {}, False)
        assert relauncher.ready(kernel, ("k2",)) is None
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            knobs.runtime.launch_enter_hook = chain
    assert relauncher.ready(kernel, ("k",)) is not None and relauncher.ready(kernel, ("k2",)) is None


def test_run_refuses_arrays_on_another_device_than_the_plan_s() -> None:
    inputs = random_paged_inputs([20, 5], None, block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16, seed=1)
    backend = TritonBackend()
    q, k, v = (numpy_to_torch(x, "cpu") for x in inputs.args()[:3])
    plan = backend.plan(q, k, v, *inputs.args()[3:])
    assert plan.state.device_index == -1  # the interpreter's device: the CPU
    elsewhere = dataclasses.replace(plan, state=dataclasses.replace(plan.state, device_index=0))
    with pytest.raises(PagedAttentionError, match="expected a tensor on") as error:
        backend.run(elsewhere, q, k, v)
    assert error.value.argument == "query"
    backend.run(plan, q, k, v)  # the plan's own device passes
