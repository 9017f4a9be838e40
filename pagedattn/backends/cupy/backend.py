"""The ``cupy`` backend: CUDA C++ kernels (``kernels/*.cu``) compiled by NVRTC (``cupy.RawModule``).

``plan`` picks the kernel once (:func:`.planning.choose_kernel`, from the backend's options),
builds the work items (:mod:`.planning`), uploads them with the block tables and makes the
split-KV partial buffers and merge counters; ``run`` allocates the outputs and launches the
attention kernel (whose last part of a split range merges it; with ``merge="kernel"``,
``merge_partials`` after it) on the current stream (torch's when torch uses
CUDA), so it can be captured in a CUDA graph. Arrays: torch CUDA tensors, cupy arrays or
:class:`~.arrays.RawArray` for bfloat16/fp8 bits, passed by pointer; outputs come back in the
query's kind.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np

from pagedattn.backends.capabilities import ON_CURRENT_DEVICE_FEATURES, Capabilities
from pagedattn.backends.cupy import arrays, planning, specializations
from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.options import resolve as resolve_options
from pagedattn.backends.cupy.runtime import (
    KernelArguments,
    current_stream,
    kernel,
    kernel_handle,
    launch,
    launch_config,
    launch_direct,
    prepared,
    stream_handle,
)
from pagedattn.backends.interface import Backend, Plan
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec.arrays import AttentionProblem, WriteKVProblem
from pagedattn.spec.dtypes import QUERY_DTYPES

NUM_THREADS = specializations.NUM_THREADS
#: the attention kernel's parameters: query, key_cache, value_cache, out, lse, eight plan arrays,
#: then the six cache strides at this slot
ATTENTION_STRIDE_SLOTS = 13
#: the merge kernel's parameters: partial_out, partial_lse, merges, then out and lse at this slot
MERGE_OUT_SLOT = 3


#: what a CUDA graph that captured ``run`` of a cupy plan holds fixed (see docs/backends/cupy.md)
FIXED_IN_GRAPH: tuple[str, ...] = (
    "the work items, split-KV parts and kernel chosen by plan",
    "the device copies of block_tables, seq_lens, query_start_loc and alibi_slopes made by plan",
    "the plan's split-KV partial buffers, merge counters and parameter blocks: one run of a plan at a time",
    "the addresses and strides of query, key_cache and value_cache",
)


P = ParamSpec("P")
R = TypeVar("R")


def _on_current_stream(method: Callable[P, R]) -> Callable[P, R]:
    """Run ``method`` with torch's current stream as cupy's (uploads, copies and launches in order)."""

    @functools.wraps(method)
    def on_stream(*args: P.args, **kwargs: P.kwargs) -> R:
        with current_stream():
            return method(*args, **kwargs)

    return on_stream


@dataclass
class CupyPlanState:
    """Device copies of what the kernels read besides query and caches, and the launch setup.

    Everything a run needs that does not depend on the arrays' addresses is prepared here
    once, including the split-KV partial buffers, so that ``run`` allocates only its outputs
    and launches: no host-to-device copy, no synchronisation (a run can be graph-captured).
    """

    work: planning.WorkPlan
    items: Any  # cupy int32 [n, 11]
    merges: Any  # cupy int32 [m, 7]
    block_tables: Any  # cupy int32 [num_seqs, max_blocks_per_seq]
    seq_lens: Any  # cupy int32 [num_seqs]
    query_start_loc: Any  # cupy int32 [num_seqs + 1]
    alibi_slopes: Any  # cupy float32 [num_q_heads] (zeros when unused)
    attention: specializations.Specialization
    merge: specializations.Specialization
    threads: int
    smem: int
    scalars: tuple[Any, ...]  # the attention kernel's trailing scalar arguments
    attention_kernel: Any  # the compiled kernels (runtime.prepared)
    merge_kernel: Any
    #: float32 partial_out [max(1, parts), rows, head_dim] and partial_lse [max(1, parts), rows]
    partials: tuple[Any, Any]
    #: int32 [max(1, parts)], zero between runs: the parts of a split range counted at its first
    #: partial, by the kernel's fused merge (None with ``merge="kernel"``)
    merge_counters: Any = None
    #: the attention kernel's arguments between the outputs and the strides (plan's arrays)
    table_args: tuple[Any, ...] = ()
    #: the merge kernel's arguments before out and lse, and after them
    merge_args: tuple[tuple[Any, ...], tuple[Any, ...]] = ((), ())
    sync: bool = False
    #: the device the plan's arrays and kernels are on
    device: int = 0
    #: float32 [T, Hq] written by the kernels as lse when the plan does not return it
    lse_scratch: Any = None
    #: the kernels' CUfunction handles and parameter blocks (runtime.KernelArguments): a run
    #: writes its pointers (and changed strides) into the slots and launches in one driver call
    attention_handle: int = 0
    merge_handle: int = 0
    attention_block: Any = None
    merge_block: Any = None
    #: their launch configurations (runtime.launch_config; None: nothing to launch)
    attention_launch: tuple[int, ...] | None = None
    merge_launch: tuple[int, ...] | None = None
    #: (strides and 16-byte alignment of the two caches) last checked, whose strides are in
    #: ``attention_block``
    strides_seen: tuple[Any, ...] | None = None
    #: what a direct run of torch tensors reads once: torch.Tensor (None until torch is seen),
    #: out's allocator (a contiguous tensor like the query, which has out's shape and dtype:
    #: ``torch.empty_like`` parses no shape), lse's shape and dtype, the pointer passed for an
    #: lse the plan does not return
    tensor_type: Any = None
    new_output: Callable[[Any], Any] = id
    lse_shape: tuple[int, int] = (0, 0)
    lse_dtype: Any = None
    lse_scratch_pointer: int = 0
    #: the strides of the torch caches (key_cache, value_cache) whose checked strides
    #: ``attention_block`` holds; None when its strides are of other arrays
    torch_strides: tuple[Any, ...] | None = None

    @property
    def capturable(self) -> bool:
        """Whether ``run`` of this plan can be captured in a CUDA graph (not with ``sync``)."""
        return not self.sync

    @property
    def fixed_in_graph(self) -> tuple[str, ...]:
        return FIXED_IN_GRAPH


class CupyBackend(Backend):
    """Paged attention on CUDA cores and tensor cores with split-KV; write_kv, copy_blocks,
    merge_states kernels.

    Options (see :class:`~.options.CupyOptions`; each left out takes its ``PAGEDATTN_CUPY_*``
    environment variable, else its default): ``prefill="auto"``, ``decode="mma"``,
    ``split_kv=True``, ``num_splits=0`` (automatic), ``wgmma_ctas=2``, ``wgmma_schedule="overlap"``,
    ``merge="fused"``, ``sync=False``.
    """

    name = "cupy"
    accepts_torch = True
    version = "0.1.0"
    description = (
        "CuPy RawModule: hand-written CUDA C++ compiled by NVRTC (online softmax, split-KV)"
    )

    def __init__(
        self,
        *,
        prefill: str | None = None,
        decode: str | None = None,
        split_kv: bool | None = None,
        num_splits: int | None = None,
        wgmma_ctas: int | None = None,
        wgmma_schedule: str | None = None,
        merge: str | None = None,
        sync: bool | None = None,
    ) -> None:
        self.options: CupyOptions = resolve_options(
            prefill=prefill,
            decode=decode,
            split_kv=split_kv,
            num_splits=num_splits,
            wgmma_ctas=wgmma_ctas,
            wgmma_schedule=wgmma_schedule,
            merge=merge,
            sync=sync,
        )

    @classmethod
    def availability(cls) -> str | None:
        if importlib.util.find_spec("cupy") is None:
            return "cupy is not installed (pip install 'pagedattn[cupy]')"
        try:
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as error:
            return f"no CUDA device ({type(error).__name__}: {error})"
        return None if count > 0 else "no CUDA device"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            dtypes=QUERY_DTYPES,
            # fp8 caches: float16/bfloat16 queries at head_dim 64/128 only (else _plan refuses)
            cache_dtypes=(*QUERY_DTYPES, *specializations.FP8_TYPES),
            block_sizes=specializations.BLOCK_SIZES,
            head_dims=specializations.HEAD_DIMS,
            kv_layouts=("NHD", "HND"),
            features=ON_CURRENT_DEVICE_FEATURES,
            tf32=False,
            device="cuda",
        )

    def current_device(self) -> str | None:
        """The kernels load and launch on the current CUDA device: a call of arrays on another one
        is unsupported."""
        import cupy

        return f"cuda:{cupy.cuda.Device().id}"

    def device_name(self) -> str:
        import cupy

        device = cupy.cuda.Device()
        return str(cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode())

    def to_device(self, array: np.ndarray) -> Any:
        return arrays.to_device(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return arrays.to_numpy(array)

    def synchronize(self) -> None:
        current_stream().synchronize()

    # -- paged attention -----------------------------------------------------
    def _plan(
        self,
        problem: AttentionProblem,
        block_tables: Any,
        seq_lens: Any,
        query_start_loc: Any,
        alibi_slopes: Any,
    ) -> CupyPlanState:
        fp8_capable = (
            problem.dtype in specializations.MMA_DTYPES
            and problem.head_dim in specializations.MMA_HEAD_DIMS
        )
        if problem.cache_dtype in specializations.FP8_TYPES and not fp8_capable:
            raise UnsupportedError(
                "key_cache",
                f"{problem.cache_dtype} caches with {problem.dtype} queries at head_dim"
                f" {problem.head_dim} (fp8 caches need float16/bfloat16 queries and head_dim"
                " 64 or 128)",
                backend=self.name,
                capability="fp8",
            )
        choice = planning.choose_kernel(problem, self.options, sm90=planning.device_has_wgmma())
        work = planning.build_work(
            problem,
            choice,
            slots=planning.split_slots(
                problem, choice, self._resident_ctas(problem, choice), self._multiprocessors()
            ),
            split_kv=self.options.split_kv,
            num_splits=self.options.num_splits or None,
        )
        slopes = (
            problem.alibi_slopes if problem.alibi_slopes is not None else np.zeros(1, np.float32)
        )
        with current_stream():  # uploads ordered before the launches on the same stream
            return self._upload(work, choice, problem, slopes)

    def _upload(
        self,
        work: planning.WorkPlan,
        choice: planning.KernelChoice,
        problem: AttentionProblem,
        slopes: np.ndarray,
    ) -> CupyPlanState:
        import cupy

        rows, name, cache = work.rows, problem.dtype, problem.cache_dtype
        fp8 = cache in specializations.FP8_TYPES
        attention = choice.spec
        merge = specializations.merge_partials(name, problem.head_dim, rows)
        smem = specializations.smem_bytes(name, problem.head_dim, rows, cache, attention)
        parts = max(1, work.num_partials)
        partials = (
            cupy.empty((parts, rows, problem.head_dim), dtype=cupy.float32),
            cupy.empty((parts, rows), dtype=cupy.float32),
        )
        fused = self.options.merge == "fused"
        counters = cupy.zeros(parts, dtype=cupy.int32) if fused and len(work.merges) else None
        state = CupyPlanState(
            work=work,
            items=cupy.asarray(work.items),
            merges=cupy.asarray(work.merges),
            block_tables=cupy.asarray(problem.block_tables.astype(np.int32)),
            seq_lens=cupy.asarray(problem.seq_lens.astype(np.int32)),
            query_start_loc=cupy.asarray(problem.query_start_loc.astype(np.int32)),
            alibi_slopes=cupy.asarray(slopes.astype(np.float32)),
            attention=attention,
            merge=merge,
            threads=specializations.threads(rows, attention),
            smem=smem,
            scalars=(
                np.int32(problem.max_blocks_per_seq),
                np.int32(problem.num_q_heads),
                np.int32(problem.group_size),
                # fp8: the score scale holds k_scale (the contract's k_scale is 1.0 otherwise)
                np.float32(problem.scale * problem.k_scale),
                np.float32(problem.softcap or 0.0),
                np.int32(problem.sliding_window or 0),
                np.int32(problem.causal),
                np.int32(problem.alibi_slopes is not None),
                np.float32(problem.v_scale if fp8 else 1.0),
            ),
            attention_kernel=prepared(attention, smem),
            merge_kernel=prepared(merge) if len(work.merges) and not fused else None,
            partials=partials,
            merge_counters=counters,
            sync=self.options.sync,
        )
        state.table_args = (
            *partials,
            0 if counters is None else counters,  # a null pointer: no merge in the kernel
            state.block_tables,
            state.seq_lens,
            state.query_start_loc,
            state.alibi_slopes,
            state.items,
        )
        state.merge_args = ((*partials, state.merges), state.scalars[1:3])
        state.device = cupy.cuda.Device().id
        if not problem.return_lse:
            state.lse_scratch = cupy.empty((problem.num_tokens, problem.num_q_heads), dtype=cupy.float32)
            state.lse_scratch_pointer = int(state.lse_scratch.data.ptr)
        state.lse_shape = (problem.num_tokens, problem.num_q_heads)
        torch = sys.modules.get("torch")
        if torch is not None:
            self._take_torch(state, torch)
        state.attention_handle = kernel_handle(state.attention_kernel)
        if state.merge_kernel is not None:
            state.merge_handle = kernel_handle(state.merge_kernel)
        self._prepare_launches(state)
        return state

    @staticmethod
    def _prepare_launches(state: CupyPlanState) -> None:
        """The kernels' parameter blocks, from the plan's arrays and scalars (pointers and
        strides are set by every run: slots 0-4 and ATTENTION_STRIDE_SLOTS), and their launch
        configurations, from the handles, the work and the threads."""
        work = state.work
        state.attention_block = KernelArguments(
            (0, 0, 0, 0, 0, *state.table_args, *(np.int64(0),) * 6, *state.scalars)
        )
        state.attention_launch = launch_config(
            state.attention_handle, (len(work.items),), (state.threads,), state.smem
        )
        if state.merge_kernel is not None:
            before, after = state.merge_args
            state.merge_block = KernelArguments((*before, 0, 0, *after))
            # one CTA per (merge, row)
            state.merge_launch = launch_config(
                state.merge_handle, (len(work.merges), work.rows), (NUM_THREADS,), 0
            )

    @staticmethod
    def _multiprocessors() -> int:
        import cupy

        return int(cupy.cuda.Device().attributes["MultiProcessorCount"])

    def _resident_ctas(self, problem: AttentionProblem, choice: planning.KernelChoice) -> int:
        """CTAs of the attention kernel ``choice`` resident on the whole device (registers,
        shared memory)."""
        import cupy

        attributes = cupy.cuda.Device().attributes
        rows, spec = choice.rows, choice.spec
        registers = int(getattr(kernel(spec), "num_regs", 0) or 255)
        per_warp = -(-registers * 32 // 256) * 256  # registers are allocated per warp in 256s
        threads = specializations.threads(rows, spec)
        by_registers = attributes["MaxRegistersPerMultiprocessor"] // (per_warp * threads // 32)
        smem = (
            specializations.smem_bytes(
                problem.dtype, problem.head_dim, rows, problem.cache_dtype, spec
            )
            + 1024
        )
        by_smem = attributes["MaxSharedMemoryPerMultiprocessor"] // smem
        per_sm = max(1, min(by_registers, by_smem, 2048 // threads))
        return per_sm * attributes["MultiProcessorCount"]

    def _cache_strides(
        self, view: tuple[Any, ...], argument: str, kv_layout: str
    ) -> tuple[Any, Any, Any]:
        """``(stride_block, stride_slot, stride_head)`` in elements, as np.int64, of a cache's
        :func:`~.arrays.launch_view`; raises the unsupported error unless head_dim has unit
        stride and rows are 16-byte aligned."""
        pointer, _, strides, itemsize = view
        s_block, s1, s2, s_dim = strides
        s_slot, s_head = (s1, s2) if kv_layout == "NHD" else (s2, s1)
        aligned = int(pointer) % 16 == 0 and all(
            (s * itemsize) % 16 == 0 for s in (s_block, s_slot, s_head)
        )
        if s_dim != 1 or not aligned:
            raise UnsupportedError(
                argument,
                f"cache view with element strides {tuple(strides)}: the kernel needs"
                " a unit head_dim stride and 16-byte aligned rows",
                backend=self.name,
                capability="strided_caches",
            )
        return np.int64(s_block), np.int64(s_slot), np.int64(s_head)

    def _set_strides(
        self, state: CupyPlanState, k_view: tuple[Any, ...], v_view: tuple[Any, ...], kv_layout: str
    ) -> None:
        """Write the six cache strides into the attention kernel's parameter block, checked
        (:meth:`_cache_strides`) once per strides and 16-byte alignment of the two caches."""
        seen = (k_view[2], v_view[2], k_view[0] & 15, v_view[0] & 15, k_view[3], v_view[3])
        if seen != state.strides_seen:
            strides = (
                *self._cache_strides(k_view, "key_cache", kv_layout),
                *self._cache_strides(v_view, "value_cache", kv_layout),
            )
            block = state.attention_block
            for slot, stride in enumerate(strides, start=ATTENTION_STRIDE_SLOTS):
                block[slot] = int(stride)
            state.strides_seen = seen

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """Allocate out (and lse when planned) in the query's kind and launch on the current
        stream (torch's when torch uses CUDA). Arrays are passed by pointer through the plan's
        parameter blocks: no conversion, copy or synchronisation, so the launches can be
        graph-captured.

        Torch tensors on the plan's device, a C-contiguous query, all three 16-byte aligned,
        caches with the strides an earlier run checked (``torch_strides``): the pointers go
        into the parameter blocks and the kernels launch, nothing else. Any other run takes
        :meth:`_run_arrays`, which checks and converts."""
        state: CupyPlanState = plan.state
        tensor = state.tensor_type
        if type(query) is tensor and type(key_cache) is tensor and type(value_cache) is tensor:
            device = state.device
            if (
                query.get_device() == device
                and key_cache.get_device() == device
                and value_cache.get_device() == device
                and (key_cache.stride(), value_cache.stride()) == state.torch_strides
                and query.is_contiguous()
            ):
                q_pointer, k_pointer, v_pointer = (
                    query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr()
                )
                if not (q_pointer | k_pointer | v_pointer) & 15:
                    out = state.new_output(query)
                    lse = (
                        query.new_empty(state.lse_shape, dtype=state.lse_dtype)
                        if plan.problem.return_lse
                        else None
                    )
                    out_pointer = out.data_ptr()
                    lse_pointer = state.lse_scratch_pointer if lse is None else lse.data_ptr()
                    self._launch(state, q_pointer, k_pointer, v_pointer, out_pointer, lse_pointer)
                    return out, lse
        return self._run_arrays(plan, query, key_cache, value_cache)

    def _run_arrays(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """A run of any device arrays (torch, cupy, RawArray): launch views read and checked
        (device, cache strides), a strided or misaligned query copied, outputs in the query's
        kind. Torch caches whose strides pass are remembered for direct runs."""
        p: AttentionProblem = plan.problem
        state: CupyPlanState = plan.state
        device = state.device
        k_view = arrays.launch_view(key_cache, "key_cache", device)
        v_view = arrays.launch_view(value_cache, "value_cache", device)
        self._set_strides(state, k_view, v_view, p.kv_layout)
        torch_caches = arrays.is_torch(key_cache) and arrays.is_torch(value_cache)
        state.torch_strides = (k_view[2], v_view[2]) if torch_caches else None
        if torch_caches and state.tensor_type is None:
            import torch

            self._take_torch(state, torch)
        query = arrays.contiguous_query(query)
        q_pointer = arrays.launch_view(query, "query", device)[0]
        out, out_pointer, lse, lse_pointer = arrays.empty_outputs(
            query, (p.num_tokens, p.num_q_heads, p.head_dim), p.return_lse
        )
        if lse is None:
            lse_pointer = state.lse_scratch_pointer
        self._launch(state, q_pointer, k_view[0], v_view[0], out_pointer, lse_pointer)
        return out, lse

    @staticmethod
    def _take_torch(state: CupyPlanState, torch: Any) -> None:
        """Let direct runs of torch tensors happen: what they take of torch, looked up once."""
        state.new_output = functools.partial(torch.empty_like, memory_format=torch.contiguous_format)
        state.tensor_type, state.lse_dtype = torch.Tensor, torch.float32

    @staticmethod
    def _launch(
        state: CupyPlanState, q_pointer: int, k_pointer: int, v_pointer: int, out_pointer: int,
        lse_pointer: int,
    ) -> None:
        """Write the run's pointers into the plan's parameter blocks and launch the attention
        kernel, then ``merge_partials`` when the plan splits with ``merge="kernel"``, on the
        current stream."""
        stream = stream_handle(state.device)
        state.attention_block.slots[0:5] = (q_pointer, k_pointer, v_pointer, out_pointer, lse_pointer)
        if state.attention_launch is not None:
            launch_direct(
                state.attention_launch,
                state.attention_block,
                stream,
                state.sync,
                state.attention.name_expression,
            )
        if state.merge_launch is not None:
            state.merge_block.slots[MERGE_OUT_SLOT:MERGE_OUT_SLOT + 2] = (out_pointer, lse_pointer)
            launch_direct(
                state.merge_launch, state.merge_block, stream, state.sync, state.merge.name_expression
            )

    # -- other operations (uploads, copies and launches all on the current stream) --
    @_on_current_stream
    def _write_kv(
        self,
        problem: WriteKVProblem,
        key: Any,
        value: Any,
        key_cache: Any,
        value_cache: Any,
        slot_mapping: Any,
    ) -> None:
        import cupy

        fp8 = problem.cache_dtype in specializations.FP8_TYPES
        raw_key, name = arrays.raw_view(key, "key")
        raw_value, _ = arrays.raw_view(value, "value")
        raw_key, raw_value = cupy.ascontiguousarray(raw_key), cupy.ascontiguousarray(raw_value)
        strides = []
        for cache, argument in ((key_cache, "key_cache"), (value_cache, "value_cache")):
            raw, _ = arrays.raw_view(cache, argument)
            s0, s1, s2, s3 = arrays.element_strides(raw)
            strides.append(
                (raw, (s0, s1, s2, s3) if problem.kv_layout == "NHD" else (s0, s2, s1, s3))
            )
        slots = cupy.asarray(problem.slot_mapping.astype(np.int64))
        (raw_kc, k_strides), (raw_vc, v_strides) = strides
        launch(
            specializations.write_kv_fp8(name, problem.cache_dtype)
            if fp8
            else specializations.kv_op("write_kv", name),
            (problem.num_tokens,),
            (NUM_THREADS,),
            (
                raw_key,
                raw_value,
                raw_kc,
                raw_vc,
                slots,
                np.int32(problem.num_kv_heads),
                np.int32(problem.head_dim),
                np.int32(problem.block_size),
                *(np.int64(s) for s in k_strides),
                *(np.int64(s) for s in v_strides),
                # x / scale is taken in float64, as the spec does
                *((np.float64(problem.k_scale), np.float64(problem.v_scale)) if fp8 else ()),
            ),
            sync=self.options.sync,
        )

    @_on_current_stream
    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        import cupy

        if len(pairs) == 0:
            return
        src = cupy.asarray(np.ascontiguousarray(pairs[:, 0], dtype=np.int64))
        dst = cupy.asarray(np.ascontiguousarray(pairs[:, 1], dtype=np.int64))
        raws = [
            arrays.raw_view(c, a)
            for c, a in ((key_cache, "key_cache"), (value_cache, "value_cache"))
        ]
        name = raws[0][1]
        if name not in specializations.CACHE_TYPES:
            raise UnsupportedError(
                "key_cache", f"cache dtype {name}", backend=self.name, capability="fp8"
            )
        buffers = []
        for raw, _ in raws:  # every source is read before any destination is written
            _, d1, d2, d3 = raw.shape
            buffer = cupy.empty((len(pairs), d1 * d2 * d3), dtype=raw.dtype)
            launch(
                specializations.kv_op("copy_blocks_gather", name),
                (len(pairs),),
                (NUM_THREADS,),
                (
                    raw,
                    buffer,
                    src,
                    np.int32(d1),
                    np.int32(d2),
                    np.int32(d3),
                    *(np.int64(s) for s in arrays.element_strides(raw)),
                ),
                sync=self.options.sync,
            )
            buffers.append(buffer)
        for (raw, _), buffer in zip(raws, buffers, strict=True):
            _, d1, d2, d3 = raw.shape
            launch(
                specializations.kv_op("copy_blocks_scatter", name),
                (len(pairs),),
                (NUM_THREADS,),
                (
                    raw,
                    buffer,
                    dst,
                    np.int32(d1),
                    np.int32(d2),
                    np.int32(d3),
                    *(np.int64(s) for s in arrays.element_strides(raw)),
                ),
                sync=self.options.sync,
            )

    @_on_current_stream
    def _merge_states(
        self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any
    ) -> tuple[Any, Any]:
        import cupy

        raws = []
        for array, argument in (
            (out_a, "out_a"),
            (lse_a, "lse_a"),
            (out_b, "out_b"),
            (lse_b, "lse_b"),
        ):
            raw, _ = arrays.raw_view(array, argument)
            raws.append(cupy.ascontiguousarray(raw))
        _, name = arrays.raw_view(out_a, "out_a")
        if name not in specializations.CUDA_TYPES:
            raise PagedAttentionError(
                "out_a", f"dtype {name} is not one of {', '.join(QUERY_DTYPES)}"
            )
        T, H, D = raws[0].shape
        out, raw_out = arrays.empty_like_output(out_a, raws[0], name)
        lse, raw_lse = arrays.empty_lse(out_a, (T, H))
        total = T * H * D
        launch(
            specializations.kv_op("merge_states", name),
            (-(-total // 256),),
            (256,),
            (raws[0], raws[1], raws[2], raws[3], raw_out, raw_lse, np.int64(T * H), np.int32(D)),
            sync=self.options.sync,
        )
        return out, lse
