"""The cupy backend's direct run of torch tensors (CPU: CPU tensors stand for the device's, the
driver's launch is recorded): once a run has checked the caches' strides, a run of torch tensors
with those strides, a contiguous aligned query, all on the plan's device, writes its pointers
into the plan's parameter blocks and launches, as the checking run does; anything else (other
strides, a strided or misaligned query, another device, caches of another kind in between) goes
through the checks again, and an array changed at the same address is refused before anything
launches. The launches on a GPU are ``gpu`` tests (``test_cupy_gpu.py``, ``test_cupy_graphs.py``)."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from pagedattn.backends.bitviews import numpy_to_torch
from pagedattn.backends.cupy import planning, runtime, specializations
from pagedattn.backends.cupy.backend import ATTENTION_STRIDE_SLOTS, MERGE_OUT_SLOT, CupyBackend, CupyPlanState
from pagedattn.backends.interface import Plan, array_signature
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.pools import random_paged_inputs

torch = pytest.importorskip("torch")

STREAM = 77
ATTENTION, MERGE = 0xA77, 0x3E6  # the kernels' handles


class _Launches:
    """Records each driver launch: the kernel's handle, grid, stream and its parameter slots."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.blocks: dict[int, runtime.KernelArguments] = {}

    def launch(self, handle: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: int,
               address: int, extra: int) -> None:
        block = self.blocks[handle]
        assert address == block.address
        self.calls.append((handle, (gx, gy, gz), stream, tuple(block.slots)))

    def synchronize(self, stream: int) -> None:
        raise AssertionError("a plan without sync never synchronises")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> _Launches:
    recorded = _Launches()
    monkeypatch.setattr(runtime, "_driver_calls", lambda: (recorded.launch, recorded.synchronize))
    monkeypatch.setattr(runtime, "_torch_raw_stream", lambda device: STREAM)
    # CPU tensors stand for device 0's; a tensor given ``_test_device`` is on that device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: getattr(self, "_test_device", 0), raising=False)
    return recorded


class _Table:
    """Stands for a plan's cupy array: what a parameter block reads of it."""

    def __init__(self, pointer: int) -> None:
        self.data = types.SimpleNamespace(ptr=pointer)


def _planned(launches: _Launches, seq_lens: list[int], slots: int, return_lse: bool = False,
             merge: str = "kernel") -> tuple[Any, ...]:
    """A cupy plan for decode of ``seq_lens`` on ``slots`` resident CTAs, built as ``_upload``
    builds it (tables as stand-ins) with the backend's ``merge`` option, and its torch arrays
    (float16)."""
    inputs = random_paged_inputs(seq_lens, None, block_size=16, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 dtype="float16", seed=6)
    q, k, v = (numpy_to_torch(np.asarray(x), "cpu") for x in inputs.args()[:3])
    index = [None if x is None else np.asarray(x) for x in inputs.args()[3:]]
    problem = check_paged_attention(q, k, v, *index, return_lse=return_lse)
    choice = planning.choose_kernel(problem)
    work = planning.build_work(problem, choice, slots=slots)
    tables = tuple(_Table(0x10000 * (i + 1)) for i in range(8))  # partials, merge counters, index arrays, items
    merged_after = merge == "kernel" and len(work.merges) > 0
    scalars = (np.int32(problem.max_blocks_per_seq), np.int32(8), np.int32(4), np.float32(0.125), np.float32(0),
               np.int32(0), np.int32(1), np.int32(0), np.float32(1))
    state = CupyPlanState(
        work=work, items=None, merges=None, block_tables=None, seq_lens=None, query_start_loc=None,
        alibi_slopes=None, attention=choice.spec,
        merge=specializations.merge_partials(problem.dtype, problem.head_dim, work.rows),
        threads=128, smem=0, scalars=scalars, attention_kernel=None,
        merge_kernel=object() if merged_after else None, partials=(None, None),
        device=0, attention_handle=ATTENTION, merge_handle=MERGE, table_args=tables,
        merge_args=(tables[:3], scalars[1:3]), lse_scratch_pointer=0xF000, lse_shape=(problem.num_tokens, 8),
    )
    CupyBackend._prepare_launches(state)
    CupyBackend._take_torch(state, torch)
    launches.blocks = {ATTENTION: state.attention_block}
    if state.merge_block is not None:
        launches.blocks[MERGE] = state.merge_block
    signatures = {"query": array_signature(q), "key_cache": array_signature(k), "value_cache": array_signature(v)}
    return Plan(problem, signatures, state), q, k, v


def _checking_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs that go through the checking path (``_run_arrays``)."""
    counted: list[int] = []
    checking = CupyBackend._run_arrays

    def counting(self: CupyBackend, *args: Any) -> Any:
        counted.append(1)
        return checking(self, *args)

    monkeypatch.setattr(CupyBackend, "_run_arrays", counting)
    return counted


@pytest.mark.parametrize("return_lse", [False, True])
def test_a_run_after_the_checked_one_launches_what_it_launched(launches: _Launches, return_lse: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    checking = _checking_runs(monkeypatch)
    plan, q, k, v = _planned(launches, [3000, 17, 5], slots=8, return_lse=return_lse)
    assert plan.state.merge_block is not None  # a long range on few CTAs splits
    backend = CupyBackend()
    first = backend.run(plan, q, k, v)
    second = backend.run(plan, q, k, v)
    assert len(checking) == 1 and plan.state.torch_strides == (k.stride(), v.stride())
    outputs = [result if isinstance(result, tuple) else (result, None) for result in (first, second)]
    assert outputs[0][0].data_ptr() != outputs[1][0].data_ptr()  # a fresh output while the first is held
    assert len(launches.calls) == 4
    for (out, lse), attention, merge in zip(outputs, launches.calls[0::2], launches.calls[1::2], strict=True):
        assert out.dtype == q.dtype and tuple(out.shape) == tuple(q.shape) and out.is_contiguous()
        lse_pointer = 0xF000 if lse is None else lse.data_ptr()
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse_pointer)
        assert attention[0] == ATTENTION and attention[2] == STREAM and attention[3][:5] == pointers
        assert merge[0] == MERGE and merge[3][MERGE_OUT_SLOT:MERGE_OUT_SLOT + 2] == pointers[3:]
    same = [(h, grid, s, slots[5:]) for h, grid, s, slots in launches.calls]
    assert same[0:2] == same[2:4]  # everything but the run's own pointers as the checked run had it


def test_a_split_plan_with_the_merge_fused_launches_the_attention_kernel_alone(launches: _Launches) -> None:
    plan, q, k, v = _planned(launches, [3000, 17, 5], slots=8, merge="fused")
    assert len(plan.state.work.merges) and plan.state.merge_block is None
    backend = CupyBackend()
    for _ in range(2):
        backend.run(plan, q, k, v)
    assert [call[0] for call in launches.calls] == [ATTENTION, ATTENTION]


def test_other_strides_are_checked_written_and_a_bad_view_refused(launches: _Launches,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    checking = _checking_runs(monkeypatch)
    plan, q, k, v = _planned(launches, [40, 17, 5], slots=264)
    backend = CupyBackend()
    backend.run(plan, q, k, v)
    padded = torch.zeros((*k.shape[:-1], 80), dtype=k.dtype)[..., :64]  # the same shape, other strides
    backend.run(plan, q, padded, v)
    backend.run(plan, q, padded, v)
    assert len(checking) == 2 and plan.state.torch_strides == (padded.stride(), v.stride())
    slots = launches.calls[-1][3][ATTENTION_STRIDE_SLOTS:ATTENTION_STRIDE_SLOTS + 3]
    assert slots == padded.stride()[:3]  # NHD: block, slot, head
    spaced = torch.zeros((*k.shape[:-1], 128), dtype=k.dtype)[..., ::2]  # head_dim stride 2
    launched = len(launches.calls)
    with pytest.raises(UnsupportedError) as error:
        backend.run(plan, q, spaced, v)
    assert error.value.argument == "key_cache" and len(launches.calls) == launched
    backend.run(plan, q, k, v)
    assert len(checking) == 4


def test_a_strided_or_misaligned_query_is_copied_by_the_checking_run(launches: _Launches,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    checking = _checking_runs(monkeypatch)
    plan, q, k, v = _planned(launches, [40, 17, 5], slots=264)
    backend = CupyBackend()
    backend.run(plan, q, k, v)
    strided = torch.zeros((*q.shape[:-1], 80), dtype=q.dtype)[..., :64]
    misaligned = torch.zeros(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    for query in (strided, misaligned):
        query.copy_(q)
        backend.run(plan, query, k, v)
        assert launches.calls[-1][3][0] != query.data_ptr()  # a contiguous aligned copy was launched
        assert launches.calls[-1][3][0] % 16 == 0
    assert len(checking) == 3


def test_arrays_on_another_device_are_refused_after_direct_runs(launches: _Launches) -> None:
    plan, q, k, v = _planned(launches, [40, 17, 5], slots=264)
    backend = CupyBackend()
    backend.run(plan, q, k, v)
    backend.run(plan, q, k, v)
    launched = len(launches.calls)
    for argument in ("query", "key_cache", "value_cache"):
        arrays = {"query": q, "key_cache": k, "value_cache": v}
        elsewhere = arrays[argument].view(arrays[argument].shape)
        elsewhere._test_device = 1
        with pytest.raises(PagedAttentionError, match="cuda:0") as error:
            backend.run(plan, **{**arrays, argument: elsewhere})
        assert error.value.argument == argument
    assert len(launches.calls) == launched


@pytest.mark.parametrize("argument, how", [("query", "shape"), ("key_cache", "dtype"), ("value_cache", "shape")])
def test_an_array_changed_at_the_same_address_is_refused_and_nothing_launches(launches: _Launches, argument: str,
                                                                              how: str) -> None:
    plan, q, k, v = _planned(launches, [40, 17, 5], slots=264)
    backend = CupyBackend()
    backend.run(plan, q, k, v)
    backend.run(plan, q, k, v)
    arrays = {"query": q, "key_cache": k, "value_cache": v}
    x = arrays[argument]
    changed = x.view(torch.int16) if how == "dtype" else x.view(-1, *x.shape[2:])
    assert changed.data_ptr() == x.data_ptr()
    launched = len(launches.calls)
    with pytest.raises(PagedAttentionError) as error:
        backend.run(plan, **{**arrays, argument: changed})
    assert error.value.argument == argument and len(launches.calls) == launched


class _DeviceArray:
    """Stands for a cupy array on device 0: what ``launch_view`` and ``Backend.run`` read."""

    def __init__(self, like: Any, pointer: int) -> None:
        self.shape, self.dtype = tuple(like.shape), np.dtype(np.float16)
        self.itemsize = 2
        self.strides = tuple(2 * s for s in like.stride())
        self.data = types.SimpleNamespace(ptr=pointer, device_id=0)


def test_caches_of_another_kind_in_between_send_the_next_torch_run_through_the_checks(
        launches: _Launches, monkeypatch: pytest.MonkeyPatch) -> None:
    checking = _checking_runs(monkeypatch)
    plan, q, k, v = _planned(launches, [40, 17, 5], slots=264)
    backend = CupyBackend()
    backend.run(plan, q, k, v)
    backend.run(plan, q, _DeviceArray(k, 0x40000), _DeviceArray(v, 0x80000))
    assert plan.state.torch_strides is None and launches.calls[-1][3][1:3] == (0x40000, 0x80000)
    backend.run(plan, q, k, v)
    assert len(checking) == 3 and launches.calls[-1][3][1:3] == (k.data_ptr(), v.data_ptr())
    backend.run(plan, q, k, v)
    assert len(checking) == 3

