"""The ``triton`` backend: paged attention and the cache operations as Triton kernels.

Runs on a CUDA GPU through torch tensors (anything DLPack gives is accepted; NumPy arrays
are copied to the device), on torch's current stream. With ``TRITON_INTERPRET=1`` the same
kernels run on the CPU in Triton's interpreter (slow; for tests). Neither triton nor torch
is imported until a method needs them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from pagedattn.backends.bitviews import as_tensor, numpy_to_torch, torch_to_numpy
from pagedattn.backends.capabilities import ON_CURRENT_DEVICE_FEATURES, Capabilities
from pagedattn.backends.interface import Backend, Plan
from pagedattn.backends.torch_streams import current_device_getter, current_stream_getter
from pagedattn.backends.triton.launch_config import (
    MAX_HEAD_DIM,
    DecodeTiles,
    Tiles,
    choose_num_splits,
    choose_tiles,
    next_power_of_2,
    reads_value_pairs,
)
from pagedattn.backends.triton.relaunch import ReadyLaunch, Relauncher, launch_hooked
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.arrays import AttentionProblem, WriteKVProblem
from pagedattn.spec.dtypes import FP8_DTYPES, numpy_dtype

LOG2E = 1.4426950408889634
#: Tokens of one write_kv program (a KV head of each): tokens on the grid's x axis, and few programs
#: for the interpreter, which runs one at a time.
WRITE_KV_TOKENS = 64
INTERPRETER_SMS = 4  # multiprocessors assumed by the split heuristic in interpreter mode
NO_WINDOW = 2**31 - 1  # the kernel's window when there is none: from any p_q (< 2**31) it reaches p = 0

#: fp8 cache dtype -> (mantissa bits, exponent bias, largest finite value, bits stored on overflow)
FP8_FORMATS: dict[str, tuple[int, int, float, int]] = {
    "float8_e4m3fn": (3, 7, 448.0, 0x7F),  # no inf: overflow is NaN
    "float8_e5m2": (2, 15, 57344.0, 0x7C),  # overflow is inf
}


def interpreter_mode() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class TritonPlanState:
    """What ``_plan`` builds once per batch: device index arrays, work list, launch choices.

    work: int32 ``[num_work, 5]``, each work item's record (its sequence, first query within
    it, the sequence's L, first token and q_len), longest key range first so that the
    heaviest programs start first: a program reads all it needs of its item in one round trip.
    """

    tiles: Tiles
    num_splits: int
    num_work: int
    block_tables: Any
    work: Any
    alibi_slopes: Any
    device: Any
    device_index: int  # the device's index, -1 on the CPU (what ``Tensor.get_device`` says)
    interpret: bool  # whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at plan)
    unused_output: Any  # float32 [1]: passed for an output the launch does not write (lse, partials)
    #: float32 split-KV partials [num_splits, T, Hq, D] and [num_splits, T, Hq] (unused_output
    #: when the plan does not split): made once by plan, written by every run
    part_out: Any = None
    part_lse: Any = None
    #: what the launches take that only the plan decides: grid, the attention kernel's
    #: arguments after the caches' strides, its constexprs and options, the merge's
    grid: tuple[int, int, int] = (1, 1, 1)
    tail_args: tuple[Any, ...] = ()
    constexprs: dict[str, Any] = field(default_factory=dict)
    launch_options: dict[str, Any] = field(default_factory=dict)
    merge_constexprs: dict[str, Any] = field(default_factory=dict)
    merge_options: dict[str, Any] = field(default_factory=dict)
    relauncher: Relauncher = field(default_factory=Relauncher)  # compiled kernels of this plan, reused by run
    #: data pointers of the plan's own arrays as the attention kernel takes them (partials,
    #: then index arrays and slopes), for launches that pass integers
    plan_pointers: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    #: what a direct run reads once: torch.Tensor, out's allocator (a contiguous tensor like
    #: the query, which has out's shape and dtype: ``torch.empty_like`` parses no shape), lse's
    #: shape and dtype, the pointer passed for an lse the plan does not return, torch's
    #: getters of the current device and of a device's current stream handle
    tensor_type: Any = None
    new_output: Callable[[Any], Any] = id
    lse_shape: tuple[int, int] = (0, 0)
    lse_dtype: Any = None
    unused_pointer: int = 0
    current_device: Callable[[], int] = int
    current_stream: Callable[[int], int] = int
    #: the plan's kernels ready to launch directly, by launch key (:class:`DirectRun`): made by
    #: the first run through the JIT under that key, taken by every later run under it
    direct: dict[tuple[Any, ...], DirectRun] = field(default_factory=dict)

    #: a CUDA graph that captured ``run`` of a triton plan holds these fixed
    fixed_in_graph: ClassVar[tuple[str, ...]] = (
        "the tiles, work list and split-KV count chosen by plan",
        "the device copies of block_tables and alibi_slopes made by plan, and its work records (from seq_lens "
        "and query_start_loc)",
        "the plan's split-KV partial buffers: one run of a plan at a time",
        "the addresses and strides of query, key_cache and value_cache",
    )
    capturable: ClassVar[bool] = True


@dataclass(frozen=True)
class DirectRun:
    """A plan's kernels compiled under one launch key, with every argument that the plan and
    the key fix bound in (:meth:`.ReadyLaunch.bind`): a run passes the stream, then the
    attention kernel's leading pointers ``(out, lse, *parts, query, key_cache, value_cache)``,
    and the merge kernel's ``(out, lse)`` (``merge`` None: the plan does not split)."""

    attention: ReadyLaunch
    parts: tuple[int, ...]
    merge: ReadyLaunch | None


@functools.cache
def _attention_kernels() -> tuple[Any, Any]:
    """The attention and merge kernels (imported once: every run launches them)."""
    from pagedattn.backends.triton.attention_kernels import merge_splits_kernel, paged_attention_kernel

    return paged_attention_kernel, merge_splits_kernel


def _work_list(problem: AttentionProblem, tiles: Tiles) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(work_seq, work_q, key_tiles)``: query tiles of every sequence, the key tiles each may read."""
    q_lens = problem.q_lens
    tiles_per_seq = -(-q_lens // tiles.block_q)
    work_seq = np.repeat(np.arange(problem.num_seqs), tiles_per_seq)
    first = np.repeat(np.cumsum(tiles_per_seq) - tiles_per_seq, tiles_per_seq)
    work_q = (np.arange(work_seq.shape[0]) - first) * tiles.block_q
    length = problem.seq_lens[work_seq]
    p_lo = length - q_lens[work_seq] + work_q
    p_hi = np.minimum(p_lo + tiles.block_q - 1, length - 1)
    kv_end = p_hi + 1 if problem.causal else length
    kv_start = np.zeros_like(kv_end)
    if problem.sliding_window is not None:
        kv_start = np.maximum(p_lo - problem.sliding_window + 1, 0)
    key_tiles = np.maximum(-(-kv_end // tiles.block_n) - kv_start // tiles.block_n, 0)
    order = np.argsort(-key_tiles, kind="stable")
    return work_seq[order], work_q[order], key_tiles[order]


class TritonBackend(Backend):
    """Paged attention in Triton: GQA-packed tiles, online softmax, split-KV for long contexts.

    ``num_splits`` and ``tiles`` (tests and tuning only) replace the choices of
    :func:`~pagedattn.backends.triton.launch_config.choose_num_splits` and
    :func:`~pagedattn.backends.triton.launch_config.choose_tiles`; ``decode_table`` replaces
    :data:`~pagedattn.backends.triton.launch_config.DECODE_TABLE` (decode tiles by block size);
    ``pdl`` forces the split-KV merge's programmatic dependent launch on or off (default: on
    from sm_90).
    """

    name = "triton"
    accepts_torch = True
    version = "0.1.0"
    description = "Triton kernels: varlen paged attention (GQA-packed, split-KV), write_kv, copy_blocks, merge"

    def __init__(self, *, num_splits: int | None = None, tiles: Tiles | None = None,
                 decode_table: dict[int | None, DecodeTiles] | None = None, pdl: bool | None = None) -> None:
        if num_splits is not None and num_splits < 1:
            raise PagedAttentionError("num_splits", f"expected None or an integer >= 1, received {num_splits!r}")
        if decode_table is not None and None not in decode_table:
            raise PagedAttentionError("decode_table", "needs an entry for None (every other block size)")
        self._forced_splits = num_splits
        self._forced_tiles = tiles
        self._decode_table = decode_table
        self._pdl = pdl

    # -- what the backend is -------------------------------------------------
    @classmethod
    def availability(cls) -> str | None:
        for module in ("triton", "torch"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install 'pagedattn[triton]')"
        if interpreter_mode():
            return None
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities(tf32=False, device="cpu (Triton interpreter)" if interpreter_mode() else "cuda",
                            max_head_dim=MAX_HEAD_DIM, features=ON_CURRENT_DEVICE_FEATURES)

    def current_device(self) -> str | None:
        """Triton launches on the current CUDA device: a call of arrays on another one is unsupported."""
        if interpreter_mode():
            return None
        import torch

        return f"cuda:{torch.cuda.current_device()}"

    def device_name(self) -> str:
        if interpreter_mode():
            return "cpu (Triton interpreter)"
        import torch

        return str(torch.cuda.get_device_name())

    def _device(self) -> Any:
        import torch

        if interpreter_mode():
            from pagedattn.backends.triton.interpreter import install

            install()  # every path to a launch asks for the device first
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def _uses_pdl(self) -> bool:
        """Whether the split-KV merge is launched as the attention kernel's programmatic
        dependent (PDL, sm_90 and later): it starts while the attention kernel's last programs
        run and waits in ``gdc_wait``, so no launch gap separates the two. ``pdl`` forces it on
        or off; never in the interpreter."""
        if interpreter_mode():
            return False
        if self._pdl is not None:
            return self._pdl
        import torch

        return bool(torch.cuda.get_device_capability(self._device())[0] >= 9)

    def _num_sms(self) -> int:
        if interpreter_mode():
            return INTERPRETER_SMS
        import torch

        return int(torch.cuda.get_device_properties(self._device()).multi_processor_count)

    # -- arrays --------------------------------------------------------------
    def to_device(self, array: np.ndarray) -> Any:
        return numpy_to_torch(np.asarray(array), self._device())

    def to_numpy(self, array: Any) -> np.ndarray:
        return torch_to_numpy(array)

    def synchronize(self) -> None:
        if not interpreter_mode():
            import torch

            torch.cuda.synchronize()

    # -- paged attention -----------------------------------------------------
    def _plan(self, problem: AttentionProblem, block_tables: Any, seq_lens: Any,
              query_start_loc: Any, alibi_slopes: Any) -> TritonPlanState:
        device = self._device()
        max_q_len = int(problem.q_lens.max(initial=0))
        tiles = self._forced_tiles or choose_tiles(max_q_len, problem.group_size, problem.head_dim, problem.dtype,
                                                   problem.block_size, self._decode_table,
                                                   numpy_dtype(problem.cache_dtype).itemsize)
        work_seq, work_q, key_tiles = _work_list(problem, tiles)
        num_programs = work_seq.shape[0] * problem.num_kv_heads * tiles.num_group_tiles
        if self._forced_splits is not None:
            num_splits = self._forced_splits
        else:
            num_splits = choose_num_splits(num_programs, int(key_tiles.max(initial=0)), self._num_sms(),
                                           tiles.resident, tiles.saturation)

        def upload(values: np.ndarray, dtype: Any = np.int32) -> Any:
            return numpy_to_torch(np.ascontiguousarray(values, dtype=dtype), device)

        slopes = problem.alibi_slopes
        T, Hq, D = problem.num_tokens, problem.num_q_heads, problem.head_dim
        unused = upload(np.zeros(1), np.float32)
        if num_splits > 1:
            import torch

            part_out = torch.empty((num_splits, T, Hq, D), dtype=torch.float32, device=device)
            part_lse = torch.empty((num_splits, T, Hq), dtype=torch.float32, device=device)
        else:  # float32 like real partials, so a batch that splits and one that does not share a binary
            part_out = part_lse = unused
        fp8 = problem.cache_dtype in FP8_DTYPES
        scale_k = problem.scale * (problem.k_scale if fp8 else 1.0)
        head_programs = problem.num_kv_heads * tiles.num_group_tiles
        num_work = int(work_seq.shape[0])
        grid = ((num_work * head_programs, num_splits, 1) if tiles.heads_fastest
                else (num_work, head_programs, num_splits))
        block_tables_dev = upload(problem.block_tables)
        q_begin = problem.query_start_loc[work_seq]
        records = np.stack([work_seq, work_q, problem.seq_lens[work_seq], q_begin,
                            problem.query_start_loc[work_seq + 1] - q_begin], axis=1)
        options: dict[str, Any] = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
        if tiles.max_registers is not None:
            options["maxnreg"] = tiles.max_registers
        state = TritonPlanState(
            tiles=tiles,
            num_splits=num_splits,
            num_work=num_work,
            block_tables=block_tables_dev,
            work=upload(records),  # attention_kernels.WORK_FIELDS columns
            alibi_slopes=None if slopes is None else upload(slopes, np.float32),
            device=device,
            device_index=-1 if device.index is None else int(device.index),
            interpret=interpreter_mode(),
            unused_output=unused,
            part_out=part_out,
            part_lse=part_lse,
            grid=grid,
            tail_args=(
                block_tables_dev.stride(0),
                T, Hq, num_splits, head_programs,
                scale_k * LOG2E, scale_k, problem.v_scale if fp8 else 1.0,
                problem.softcap if problem.softcap is not None else 1.0,
                int(problem.causal), min(problem.sliding_window or NO_WINDOW, NO_WINDOW),
                problem.group_size, tiles.num_group_tiles, int(problem.return_lse), int(num_splits > 1),
            ),
            constexprs=dict(
                GROUP_TILE=tiles.group_tile,
                HEAD_DIM=D, HEAD_DIM_PAD=tiles.head_dim_pad, BLOCK_SIZE=problem.block_size,
                BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, TABLE_MODE=tiles.table_mode(problem.block_size),
                HAS_SOFTCAP=problem.softcap is not None, HAS_ALIBI=problem.alibi_slopes is not None,
                Q_SCALED=fp8 and problem.dtype == "bfloat16",
                HEADS_FASTEST=tiles.heads_fastest, KEYS_MAJOR=tiles.keys_major,
                V_PAIRS=reads_value_pairs(tiles, D, 1 if fp8 else 2),
                IEEE=problem.dtype == "float32", INTERPRET=interpreter_mode(),
            ),
            launch_options=options,
            merge_constexprs=dict(
                HEAD_DIM=D, HEAD_DIM_PAD=next_power_of_2(D), SPLITS_PAD=next_power_of_2(num_splits),
                STORE_LSE=problem.return_lse, INTERPRET=interpreter_mode(),
            ),
            merge_options={"num_warps": 4, **({"launch_pdl": True} if self._uses_pdl() else {})},
        )
        tables = (state.block_tables, state.work, state.alibi_slopes if state.alibi_slopes is not None else state.work)
        pointers = (tuple(x.data_ptr() for x in (part_out, part_lse)), tuple(x.data_ptr() for x in tables))
        import torch

        return replace(state, plan_pointers=pointers, tensor_type=torch.Tensor,
                       new_output=functools.partial(torch.empty_like, memory_format=torch.contiguous_format),
                       lse_shape=(T, Hq), lse_dtype=torch.float32, unused_pointer=unused.data_ptr(),
                       current_device=current_device_getter(torch), current_stream=current_stream_getter(torch))

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """Allocate out (and lse) and launch on torch's current stream; everything else was
        made by plan, so a run copies nothing to the device and never synchronises.

        A run of torch tensors on the plan's device, 16-byte aligned, under a launch key
        (strides, current device) that an earlier run of this plan compiled, launches the
        kernels' C launchers directly with integer pointers (:class:`DirectRun`) and does
        nothing else: no launch hook installed, outputs aligned. Any other run goes through
        the JIT (:meth:`_run_through_jit`), which checks the arrays' device and keeps the
        compiled kernels for the next run under the same key."""
        state = plan.state
        tensor = state.tensor_type
        if state.direct and type(query) is tensor and type(key_cache) is tensor and type(value_cache) is tensor:
            index = state.device_index
            if query.get_device() == index and key_cache.get_device() == index and value_cache.get_device() == index:
                q_pointer, k_pointer, v_pointer = query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr()
                device_now = state.current_device()
                direct = state.direct.get((query.stride(), key_cache.stride(), value_cache.stride(), device_now))
                if direct is not None and not (q_pointer | k_pointer | v_pointer) & 15 and not launch_hooked():
                    out = state.new_output(query)
                    lse = query.new_empty(state.lse_shape, dtype=state.lse_dtype) if plan.problem.return_lse else None
                    out_pointer = out.data_ptr()
                    lse_pointer = state.unused_pointer if lse is None else lse.data_ptr()
                    if not (out_pointer | lse_pointer) & 15:
                        stream = state.current_stream(device_now)
                        attention, merge = direct.attention, direct.merge
                        attention.launch(*attention.grid, stream, *attention.middle, out_pointer, lse_pointer,
                                         *direct.parts, q_pointer, k_pointer, v_pointer, *attention.constexpr_values)
                        if merge is not None:
                            merge.launch(*merge.grid, stream, *merge.middle, out_pointer, lse_pointer,
                                         *direct.parts, *merge.constexpr_values)
                        return out, lse
        return self._run_through_jit(plan, query, key_cache, value_cache)

    def _run_through_jit(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """A run through triton's JIT (``kernel[grid](...)``): arrays of any kind converted to
        torch tensors, refused on another device than the plan's (naming them). Outside the
        interpreter, with every pointer 16-byte aligned, the compiled kernels are kept under
        the launch key for direct runs (:mod:`.relaunch`, :class:`DirectRun`)."""
        import torch

        problem, state = plan.problem, plan.state
        paged_attention_kernel, merge_splits_kernel = _attention_kernels()
        q, k_cache, v_cache = query, key_cache, value_cache
        if not (type(q) is torch.Tensor and type(k_cache) is torch.Tensor and type(v_cache) is torch.Tensor):
            device = state.device
            q, k_cache, v_cache = as_tensor(q, device), as_tensor(k_cache, device), as_tensor(v_cache, device)
        for tensor, argument in ((q, "query"), (k_cache, "key_cache"), (v_cache, "value_cache")):
            if tensor.get_device() != state.device_index:
                raise PagedAttentionError(argument, f"expected a tensor on {state.device}, received one on "
                                                    f"{tensor.device}")
        T, Hq, D = problem.num_tokens, problem.num_q_heads, problem.head_dim
        out = torch.empty((T, Hq, D), dtype=q.dtype, device=state.device)
        lse = torch.empty((T, Hq), dtype=torch.float32, device=state.device) if problem.return_lse else None
        if T == 0 or state.num_work == 0:
            return out, lse
        lse_arg = lse if lse is not None else state.unused_output
        q_strides, k_strides, v_strides = q.stride(), k_cache.stride(), v_cache.stride()
        key: tuple[Any, ...] | None = None  # None: the JIT's binary is not kept (interpreter, unaligned)
        if not state.interpret:
            pointers = (out.data_ptr(), lse_arg.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr())
            if not (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]) & 15:
                # what may differ between runs of this plan with 16-byte aligned arrays: the
                # arrays' strides, the current device
                key = (q_strides, k_strides, v_strides, state.current_device())
        kb, k1, k2, kd = k_strides
        vb, v1, v2, vd = v_strides
        # NHD [blocks, slot, head, d]; HND [blocks, head, slot, d]
        (ks, kh), (vs, vh) = ((k1, k2), (v1, v2)) if problem.kv_layout == "NHD" else ((k2, k1), (v2, v1))
        strides = (*q_strides, Hq * D, D, kb, ks, kh, kd, vb, vs, vh, vd)
        part_out, part_lse = state.part_out, state.part_lse
        args = [
            out, lse_arg, part_out, part_lse,
            q, k_cache, v_cache,
            state.block_tables, state.work, state.alibi_slopes if state.alibi_slopes is not None else state.work,
            *strides,
            *state.tail_args,
        ]
        constexprs = state.constexprs
        if constexprs["V_PAIRS"] and not (vd == 1 and not (vb | vs | vh | v_cache.data_ptr()) & 1):
            constexprs = {**constexprs, "V_PAIRS": False}  # fp8 value pairs are not 16-bit words here
        state.relauncher.launch(paged_attention_kernel, state.grid, key, args, constexprs,
                                state.launch_options, state.interpret)
        merge_args = (T, Hq, state.num_splits, Hq * D, D)
        if state.num_splits > 1:
            state.relauncher.launch(merge_splits_kernel, (T, Hq, 1), key,
                                    [out, lse_arg, part_out, part_lse, *merge_args],
                                    state.merge_constexprs, state.merge_options, state.interpret)
        if key is not None:
            attention = state.relauncher.ready(paged_attention_kernel, key)
            merge = state.relauncher.ready(merge_splits_kernel, key) if state.num_splits > 1 else None
            if attention is not None and (merge is not None or state.num_splits == 1):
                parts, tables = state.plan_pointers
                state.direct[key] = DirectRun(attention.bind((*tables, *strides, *state.tail_args)), parts,
                                              None if merge is None else merge.bind(merge_args))
        return out, lse

    # -- other operations ------------------------------------------------------
    def _write_kv(self, problem: WriteKVProblem, key: Any, value: Any, key_cache: Any,
                  value_cache: Any, slot_mapping: Any) -> None:
        import torch

        from pagedattn.backends.triton.cache_kernels import write_kv_kernel

        if problem.num_tokens == 0:
            return
        device = self._device()
        k, v = as_tensor(key, device), as_tensor(value, device)
        k_cache, v_cache = as_tensor(key_cache, device), as_tensor(value_cache, device)
        slots = numpy_to_torch(problem.slot_mapping.astype(np.int64), k.device)
        to_fp8 = problem.cache_dtype in FP8_DTYPES
        scales = numpy_to_torch(np.array([problem.k_scale, problem.v_scale], dtype=np.float64), k.device)
        if to_fp8:
            mant_bits, exp_bias, fp8_max, overflow_bits = FP8_FORMATS[problem.cache_dtype]
            k_dst, v_dst = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        else:
            mant_bits, exp_bias, fp8_max, overflow_bits = 0, 0, 0.0, 0
            k_dst, v_dst = k_cache, v_cache
        kb, k1, k2, kd = k_cache.stride()
        vb, v1, v2, vd = v_cache.stride()
        (ks, kh), (vs, vh) = ((k1, k2), (v1, v2)) if problem.kv_layout == "NHD" else ((k2, k1), (v2, v1))
        write_kv_kernel[(-(-problem.num_tokens // WRITE_KV_TOKENS), problem.num_kv_heads)](
            k, v, k_dst, v_dst, slots, scales,
            *k.stride(), *v.stride(),
            kb, ks, kh, kd,
            vb, vs, vh, vd,
            problem.num_tokens,
            BLOCK_SIZE=problem.block_size, HEAD_DIM=problem.head_dim,
            HEAD_DIM_PAD=next_power_of_2(problem.head_dim), TOKENS=WRITE_KV_TOKENS,
            TO_FP8=to_fp8, MANT_BITS=mant_bits, EXP_BIAS=exp_bias, FP8_MAX=fp8_max, OVERFLOW_BITS=overflow_bits,
            num_warps=4,
        )
        self._write_back(key_cache, k_cache)
        self._write_back(value_cache, v_cache)

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        import torch

        from pagedattn.backends.triton.cache_kernels import copy_blocks_kernel

        if pairs.shape[0] == 0:
            return
        device = self._device()
        n = int(pairs.shape[0])
        sources, destinations = pairs[:, 0], pairs[:, 1]
        overlap = np.intersect1d(sources, destinations).size > 0
        for cache_arg in (key_cache, value_cache):
            cache = as_tensor(cache_arg, device)
            src_ids = numpy_to_torch(sources.astype(np.int64), cache.device)
            dst_ids = numpy_to_torch(destinations.astype(np.int64), cache.device)
            if overlap:  # every source is read before any destination is written
                staging = torch.empty((n, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
                order = torch.arange(n, dtype=torch.int64, device=cache.device)
                self._launch_copy(copy_blocks_kernel, cache, staging, src_ids, order)
                self._launch_copy(copy_blocks_kernel, staging, cache, order, dst_ids)
            else:
                self._launch_copy(copy_blocks_kernel, cache, cache, src_ids, dst_ids)
            self._write_back(cache_arg, cache)

    @staticmethod
    def _write_back(original: Any, tensor: Any) -> None:
        """A NumPy cache was copied to the device: copy the written tensor back into it."""
        if isinstance(original, np.ndarray):
            original[...] = torch_to_numpy(tensor)

    @staticmethod
    def _launch_copy(kernel: Any, src: Any, dst: Any, src_ids: Any, dst_ids: Any) -> None:
        _, dim1, dim2, dim3 = src.shape
        kernel[(int(src_ids.shape[0]), dim1)](
            src, dst, src_ids, dst_ids, *src.stride(), *dst.stride(),
            DIM2=dim2, DIM2_PAD=next_power_of_2(dim2), DIM3=dim3, DIM3_PAD=next_power_of_2(dim3),
            num_warps=4,
        )

    def _merge_states(self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
        import torch

        from pagedattn.backends.triton.cache_kernels import merge_states_kernel

        device = self._device()
        tensors = [as_tensor(x, device).contiguous() for x in (out_a, lse_a, out_b, lse_b)]
        a, la, b, lb = tensors
        T, H, D = a.shape
        out = torch.empty_like(a)
        lse = torch.empty((T, H), dtype=torch.float32, device=a.device)
        if T * H == 0:
            return out, lse
        merge_states_kernel[(T * H,)](
            out, lse, a, la, b, lb,
            HEAD_DIM=D, HEAD_DIM_PAD=next_power_of_2(D), INTERPRET=interpreter_mode(),
            num_warps=1,
        )
        return out, lse
