"""Mutants whose bug shows only at scale: 32-bit offsets past 2**31 elements, split-KV merges of
long sequences, index arithmetic that holds only for power-of-two sizes, groups wider than a
tile of rows, batches larger than one wave of CTAs, more query tokens, sequences or copied
blocks than a grid's y or z axis takes, prefills of several query tiles, sequences of more than
65,536 keys, blocks and head dims larger than a fixed tile, blocks smaller than a run of slots,
long rows whose mass lies in weights far below their maximum, split plans run more than once,
split parts of groups past 8 query heads, split and unsplit sequences and ragged query counts in
one plan, and a cascade path for batches sharing a long prefix (:class:`CascadeKernelBackend`).

:class:`AddressedKernelBackend` is the stepped kernel the way a GPU kernel addresses memory:
it finds each key's block-table column and slot from its position (:meth:`locate`), reads a
block through an element offset (:meth:`block_offsets`), and splits a long sequence of a
small batch into parts of :data:`PART_KEYS` keys whose states it merges (:meth:`parts`,
:meth:`merge`). Unmodified it passes the suite; each mutant below changes one of those steps.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pagedattn.backends.capabilities import Capabilities
from pagedattn.conformance.mutants.attention import FusedScoreShift, RowMaxOfUnscaledProducts
from pagedattn.conformance.mutants.kernel import F32, State, SteppedKernelBackend
from pagedattn.conformance.mutants.plans import LaunchBindsFirstRunArrays
from pagedattn.conformance.scale import LONG_BATCH_PAIRS, LONG_PREFILL_ROWS
from pagedattn.spec import kv_ops
from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.dtypes import FP8_DTYPES, QUERY_DTYPES, numpy_dtype
from pagedattn.spec.online_softmax import merge_states
from pagedattn.spec.pools import INT32_OFFSET_LIMIT, UINT32_OFFSET_LIMIT

#: Sequences from this many keys are split when the batch is small (at most SPLIT_MAX_SEQS).
SPLIT_MIN_KEYS = 2048
SPLIT_MAX_SEQS = 4
#: Keys per split part (rounded down to whole blocks).
PART_KEYS = 1024


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    """``values`` (int64) as a 32-bit register holds them: two's complement wrap-around."""
    return ((values + 2**31) % 2**32 - 2**31).astype(np.int64)


def _write_kv_landing(problem: Any, key: Any, value: Any, key_cache: Any, value_cache: Any,
                      land: Callable[[np.ndarray], np.ndarray]) -> None:
    """The spec's write_kv with each written slot s (int64) landing at ``land(s)``; skipped tokens stay -1."""
    slots = problem.slot_mapping.astype(np.int64)
    kv_ops.write_kv(key, value, key_cache, value_cache, np.where(slots >= 0, land(slots), -1),
                    kv_layout=problem.kv_layout, k_scale=problem.k_scale, v_scale=problem.v_scale)


class AddressedKernelBackend(SteppedKernelBackend):
    """The stepped kernel with offset addressing and split-KV (not registered; base of the scale mutants)."""

    name = "addressed-kernel"
    description = "the stepped kernel addressing K/V by element offsets, splitting long sequences"

    # -- steps ------------------------------------------------------------------------------
    def locate(self, p: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(block-table column, slot) of positions ``p``."""
        return p // block_size, p % block_size

    def block_offsets(self, blocks: np.ndarray, slots: np.ndarray, problem: AttentionProblem) -> np.ndarray:
        """Element offsets of (block, slot) in a contiguous NHD cache, in 64-bit arithmetic."""
        slot_elements = problem.num_kv_heads * problem.head_dim
        return blocks.astype(np.int64) * (problem.block_size * slot_elements) + slots.astype(np.int64) * slot_elements

    def parts(self, blocks: list[int], length: int, problem: AttentionProblem) -> list[list[int]]:
        """Split-KV: the logical blocks of a long sequence of a small batch cut into parts."""
        if length < SPLIT_MIN_KEYS or problem.num_seqs > SPLIT_MAX_SEQS:
            return [blocks]
        per_part = max(1, PART_KEYS // problem.block_size)
        return [blocks[i:i + per_part] for i in range(0, len(blocks), per_part)]

    def merge(self, states: list[State]) -> State:
        """Merge the parts' (m, l, O): rescale each by exp(m_i - m) to the largest m."""
        m = np.max([s[0] for s in states], axis=0)
        shift = self.merge_shift(m)
        l, O = np.zeros_like(states[0][1]), np.zeros_like(states[0][2])
        with np.errstate(invalid="ignore"):
            for m_i, l_i, O_i in states:
                alpha = np.exp(m_i - shift)
                l = l + alpha * l_i
                O = O + alpha[..., None] * O_i
        return m.astype(F32), l.astype(F32), O.astype(F32)

    def merge_shift(self, m: np.ndarray) -> np.ndarray:
        """What the merge subtracts from each part's m: the largest m, guarded as a step's shift is
        (0 where it is -inf: no part saw a key)."""
        return self.row_shift(m)

    # -- the kernel -----------------------------------------------------------------------------
    def read_block(self, slots: np.ndarray, row: np.ndarray, j: int, problem: AttentionProblem) -> np.ndarray:
        """Logical block ``j`` of a sequence as ``[block_size, Hkv, D]``, read through element offsets."""
        bs = problem.block_size
        p = j * bs + np.arange(bs)
        columns, slot_ids = self.locate(p, bs)
        blocks = np.asarray(row)[np.minimum(columns, len(row) - 1)].astype(np.int64)
        slot_elements = problem.num_kv_heads * problem.head_dim
        offsets = self.block_offsets(blocks, slot_ids, problem) % (problem.num_blocks * bs * slot_elements)
        flat_slots = offsets // slot_elements
        return slots[flat_slots // bs, flat_slots % bs]


# -- 32-bit offsets past 2**31 elements --------------------------------------------------------

class Int32CacheOffsets(AddressedKernelBackend):
    bug = "attention computes a block's element offset block * block_stride in int32: wraps past 2**31 elements"
    models = "int32 offset overflow in paged-attention kernels on KV caches past 2**31 elements"
    killed_by = "test_far_pool_attention_matches_spec"

    def block_offsets(self, blocks, slots, problem):
        return _wrap_int32(super().block_offsets(blocks, slots, problem))


def _on_fp8_caches(offsets, problem, wrap):
    """``wrap(offsets)`` where the problem's caches are fp8 (the faulty path), else ``offsets``."""
    return wrap(offsets) if problem.cache_dtype in FP8_DTYPES else offsets


class Fp8Int32CacheOffsets(AddressedKernelBackend):
    bug = ("the fp8-cache attention path computes a block's element offset in int32 (the 16-bit path in 64-bit): "
           "wraps past 2**31 elements")
    models = "int32 offsets in a separate fp8 KV-cache kernel on caches past 2**31 elements"
    killed_by = "test_far_pool_attention_with_fp8_caches_matches_spec"

    def block_offsets(self, blocks, slots, problem):
        return _on_fp8_caches(super().block_offsets(blocks, slots, problem), problem, _wrap_int32)


class Fp8ByteOffsetsIn32Bits(AddressedKernelBackend):
    bug = ("the fp8-cache attention path addresses K/V by byte offsets in an unsigned 32-bit register (a "
           "buffer load's offset): blocks past byte 2**32, element 2**32 of a one-byte cache, read from byte "
           "offset mod 2**32")
    models = ("ROCm/aiter PR 2893 (batch prefill overflowed 32-bit byte offsets once the KV cache passed 4 GB) "
              "and PR 4575 (buffer descriptors' 32-bit offsets on a KV cache past 4 GB, fp8 prefill kernels "
              "among those fixed)")
    killed_by = "test_far_pool_attention_with_fp8_caches_matches_spec"

    def block_offsets(self, blocks, slots, problem):
        return _on_fp8_caches(super().block_offsets(blocks, slots, problem), problem,
                              lambda offsets: offsets % 2**32)  # one byte an element


def _is_long_prefill(problem: AttentionProblem) -> bool:
    """Whether ``problem`` takes a long prefill's path: LONG_PREFILL_ROWS rows a sequence or more on average."""
    return problem.num_tokens * problem.group_size >= LONG_PREFILL_ROWS * problem.num_seqs


class Int32OffsetsOnOnePath(AddressedKernelBackend):
    """Block offsets in int32 on the batches :meth:`on_its_path` picks (a kernel path of their own),
    in 64 bits on every other: past element 2**31 of the pool they wrap. Not a mutant itself."""

    def on_its_path(self, problem: AttentionProblem) -> bool:
        raise NotImplementedError

    def block_offsets(self, blocks, slots, problem):
        offsets = super().block_offsets(blocks, slots, problem)
        return _wrap_int32(offsets) if self.on_its_path(problem) else offsets


class Int32OffsetsOfOneSlotBlocks(Int32OffsetsOnOnePath):
    bug = ("attention on blocks of one slot (a token-level page table) takes its own path, whose offset "
           "slot * slot_stride is int32: past element 2**31 of the pool it wraps; other block sizes in 64 bits")
    models = ("ROCm/aiter issue 2517 (batch prefill at page_block_size 1 returned all zeros past 8,388,608 pages: "
              "an int32 product in the kernel's buffer size), issue 2608 and sgl-project/sglang PR 22257 (the "
              "page size < 128 path kept 32-bit offsets once a layer's cache passed 4 GB, the path for pages of "
              "128 and more mended)")
    killed_by = "test_far_pools_of_small_and_large_blocks_match_spec"

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return problem.block_size == 1


class Int32OffsetsOfLongPrefills(Int32OffsetsOnOnePath):
    bug = ("attention on a long prefill (at least LONG_PREFILL_ROWS rows a sequence on average) takes a "
           "prefill path of its own, whose block offset block * block_stride is int32: past element 2**31 "
           "it wraps; decode and short batches in 64 bits")
    models = ("ROCm/aiter PR 2893 (the batch prefill kernel's 32-bit offsets overflowed once the KV cache "
              "passed 4 GB, decode unaffected) and sgl-project/sglang PR 22257 (one path of a kernel kept "
              "32-bit offsets on large caches where another was mended)")
    killed_by = "test_far_pool_long_prefills_match_spec"

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return _is_long_prefill(problem)


class Int32OffsetsOfGroupedHeads(Int32OffsetsOnOnePath):
    bug = ("attention with several query heads a KV head (GQA) takes a grouped kernel of its own, whose block "
           "offset block * block_stride is int32: past element 2**31 of the pool it wraps; one query head a KV "
           "head in 64 bits")
    models = ("vllm-project/vllm PR 47671 (its Triton decode attention has a kernel for one query head a KV head "
              "and a grouped one for GQA, and both multiplied the page number by the page stride in int32: a fix "
              "made in one of them leaves the other wrapping)")
    killed_by = "test_far_pool_attention_matches_spec"

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return problem.group_size > 1


def _hnd_read_as_nhd(slots: np.ndarray) -> np.ndarray:
    """The slot view ``[blocks, block_size, Hkv, D]`` of an HND cache as a kernel that takes it for
    NHD reads it: each block's memory (head-major) taken slot-major."""
    nb, bs, hkv, d = slots.shape
    return np.ascontiguousarray(slots.transpose(0, 2, 1, 3)).reshape(nb, bs, hkv, d)


class LongPrefillsReadHNDAsNHD(SteppedKernelBackend):
    bug = ("attention on a long prefill (at least LONG_PREFILL_ROWS rows a sequence on average) takes a prefill "
           "path of its own that addresses an HND cache as NHD: its keys and values come from other slots and "
           "heads; decode, short batches and NHD caches right. Declares block sizes 16, 32 and 64, as most GPU "
           "kernels do")
    models = ("a prefill kernel of its own beside the decode one, where only the latter takes the cache's layout: "
              "vllm-project/vllm-xpu-kernels PR 449 (HND added to paged attention by each kernel's sequence "
              "stride), vllm-project/vllm issue 49012 (a cache kernel that assumed NHD silently corrupted HND "
              "caches)")
    killed_by = "test_far_pool_long_prefills_match_spec"

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), block_sizes=(16, 32, 64))

    def slots(self, cache, problem):
        view = super().slots(cache, problem)
        return _hnd_read_as_nhd(view) if _is_long_prefill(problem) and problem.kv_layout == "HND" else view


#: Keys of the tile of :class:`Int32OffsetsOfBlocksOfATile`: blocks of this many slots or more hold
#: a whole tile each.
TILE_KEYS = 64


class Int32OffsetsOfBlocksOfATile(Int32OffsetsOnOnePath):
    bug = ("attention in blocks of TILE_KEYS slots or more, where a key tile lies inside one block (one "
           "block-table read a tile), addresses the tile's block in int32: past element 2**31 of the pool it "
           "wraps; smaller blocks, several to a tile, in 64 bits. Declares block sizes 16, 32 and 64, as most "
           "GPU kernels do")
    models = ("kernels that address a tile inside one block apart from a tile over several blocks (this "
              "project's Triton kernels, `_key_slots`' table modes 1 and 2), where a fix reaches one path "
              "only: sgl-project/sglang PR 22257 (one page-size path kept 32-bit offsets on caches past 4 GB "
              "after the other was mended)")
    killed_by = "test_far_pool_attention_matches_spec"

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), block_sizes=(16, 32, 64))

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return problem.block_size >= TILE_KEYS


#: Queries a sequence, at most, of the batches :class:`Int32OffsetsOfShortQueryBatches` takes on its
#: own path: a speculative decode's verification of a few draft tokens, or a short chunk.
SHORT_QUERY_BATCH_ROWS = 4


class Int32OffsetsOfShortQueryBatches(Int32OffsetsOnOnePath):
    bug = ("attention on a varlen batch of at most SHORT_QUERY_BATCH_ROWS queries a sequence takes a path of "
           "its own (speculative decoding's verification), whose block offset block * block_stride is int32: "
           "past element 2**31 it wraps; decode batches and longer queries in 64 bits")
    models = ("syv-ai/qwen38-27b-rtx3090 issue 86 (a speculative-decoding attention kernel multiplied the block "
              "id by the block stride in int32: an illegal memory access on long cached-prefix requests, where "
              "the decode kernels were sound)")
    killed_by = "test_far_pool_attention_matches_spec"

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return is_short_query_batch(problem)


def is_short_query_batch(problem: AttentionProblem) -> bool:
    """Whether ``problem`` is a varlen batch of at most :data:`SHORT_QUERY_BATCH_ROWS` queries a sequence."""
    return not problem.is_decode and int(problem.q_lens.max(initial=0)) <= SHORT_QUERY_BATCH_ROWS


#: Queries a sequence, at most, of the batches :class:`SplitPartialsOf4RowsASequence` takes on its
#: split path (a speculative verify); longer prefills take another.
VERIFY_BATCH_ROWS = 16
#: Query rows a sequence the split partials of :class:`SplitPartialsOf4RowsASequence` hold.
SCRATCH_ROWS = 4


def is_verify_batch(problem: AttentionProblem) -> bool:
    """Whether ``problem`` is a varlen batch of 5 to :data:`VERIFY_BATCH_ROWS` queries a sequence, at most."""
    most = int(problem.q_lens.max(initial=0))
    return not problem.is_decode and SHORT_QUERY_BATCH_ROWS < most <= VERIFY_BATCH_ROWS


class Int32OffsetsOfVerifyBatches(Int32OffsetsOnOnePath):
    bug = ("attention on a varlen batch of 5 to VERIFY_BATCH_ROWS queries a sequence takes a verify path of its "
           "own, whose block offset block * block_stride is int32: past element 2**31 it wraps; decode, up to 4 "
           "queries a sequence and longer prefills in 64 bits")
    models = ("syv-ai/qwen38-27b-rtx3090 issue 86 (a speculative-decoding attention kernel multiplied the block "
              "id by the block stride in int32: an illegal memory access on long cached-prefix requests, where "
              "the decode kernels were sound), on a verify path of 5 to 16 queries a sequence (a draft of 7 "
              "tokens, as MTP and EAGLE give, among them)")
    killed_by = "test_far_pool_verify_batches_match_spec"

    def on_its_path(self, problem: AttentionProblem) -> bool:
        return is_verify_batch(problem)


class SplitPartialsOf4RowsASequence(AddressedKernelBackend):
    bug = ("the split path of varlen batches of at most VERIFY_BATCH_ROWS queries a sequence (a speculative "
           "verify) holds a part's partial m, l and O for SCRATCH_ROWS query rows a sequence: row j's are stored "
           "at row j mod 4, so a sequence's rows past the 4th overwrite earlier rows' and the merge gives rows "
           "j and j mod 4 the last writer's; decode, up to 4 queries a sequence and longer prefills right")
    models = ("vllm-project/vllm PR 52879 (the split-KV path's softmax segments allocated per sequence and "
              "indexed per query row: from 2 queries a sequence rows wrote past them; the fix sizes them per "
              "query row, up to the width the path is gated on)")
    killed_by = "test_long_verify_batches_match_spec"

    def parts(self, blocks, length, problem):
        self.verify = is_verify_batch(problem)  # at most 4 rows a sequence: each row has its own slot
        return super().parts(blocks, length, problem)

    def merge(self, states):
        if len(states) > 1 and self.verify:
            states = [tuple(_rows_mod(x, SCRATCH_ROWS) for x in state) for state in states]
        return super().merge(states)


def _rows_mod(x: np.ndarray, rows: int) -> np.ndarray:
    """``x``'s rows as a scratch of ``rows`` rows holds them, written in order at row ``j mod rows``
    and read back from there: each row gets the last row written to its slot."""
    out = x.copy()
    for slot in range(min(rows, x.shape[0])):
        sharing = np.arange(slot, x.shape[0], rows)
        out[sharing] = x[sharing[-1]]
    return out


class Int32OffsetsOfSmallViews(AddressedKernelBackend):
    bug = ("attention takes 32-bit block offsets when the cache view holds fewer than 2**31 elements: in a "
           "layer view of a larger pool, block * block_stride passes 2**31 and wraps")
    models = ("vllm-project/vllm issue 50427 (paged K/V offsets overflow int32 once num_gpu_blocks >= 2**31 / "
              "(block_size * 2 * num_kv_heads * head_size): the block stride holds K and V)")
    killed_by = "test_far_layer_views_match_spec"

    def read_block(self, slots, row, j, problem):
        self.block_stride = slots.strides[0] // slots.itemsize  # elements between blocks of the view
        self.view_elements = slots.size
        return super().read_block(slots, row, j, problem)

    def block_offsets(self, blocks, slots, problem):
        offsets = super().block_offsets(blocks, slots, problem)
        if self.view_elements >= INT32_OFFSET_LIMIT:  # a large view: 64-bit offsets
            return offsets
        block_elements = problem.block_size * problem.num_kv_heads * problem.head_dim
        read = _wrap_int32(blocks.astype(np.int64) * self.block_stride) // self.block_stride
        return offsets + (read - blocks) * block_elements


class TableRowOffsetsIn32Bits(SteppedKernelBackend):
    bug = ("reads the caller's block table in place, row s at entry s * row_stride computed in int32: in a view "
           "of an engine's table of more than 2**31 entries, a row past entry 2**31 is read from memory 2**32 "
           "entries before it (read here as 0s)")
    models = ("vLLM's paged_attention kernels and the many derived from them (ROCm, Metal): `block_tables + "
              "seq_idx * max_num_blocks_per_seq`, both int")
    killed_by = "test_far_table_rows_match_spec"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return np.asarray(block_tables)

    def table_row(self, plan, s):
        table = plan.state
        offset = s * (table.strides[0] // table.itemsize)
        if _wrap_int32(np.array([offset], np.int64))[0] != offset:
            return np.zeros(table.shape[1], np.int64)
        return table[s].astype(np.int64)


class TableRowOffsetsInUnsigned32Bits(TableRowOffsetsIn32Bits):
    bug = ("reads the caller's block table in place, row s at entry s * row_stride computed in unsigned 32 bits "
           "(an int32 overflow mended with an unsigned type): right up to entry 2**32 of an engine's table, a row "
           "past it read at entry (s * row_stride) mod 2**32")
    models = ("`block_tables + seq_idx * max_num_blocks_per_seq` of vLLM's paged_attention kernels with its int "
              "operands made unsigned, as the 32-bit block offsets of ROCm/aiter PR 4427 and "
              "vllm-project/vllm-xpu-kernels PR 445 were")
    killed_by = "test_far_table_rows_match_spec"

    def table_row(self, plan, s):
        table = plan.state  # the caller's table, as its parent plans it
        row_stride = table.strides[0] // table.itemsize
        offset = s * row_stride
        # the row holding entry offset mod 2**32 (a row's first entry where the stride divides
        # 2**32, as in the far tables)
        return table[offset % UINT32_OFFSET_LIMIT // row_stride].astype(np.int64)


class Uint32OffsetsWithoutFp8(Int32OffsetsOfSmallViews):
    bug = ("attention computes block * block_stride in unsigned 32 bits (an int32 overflow mended with an "
           "unsigned type): right up to element 2**32 of the pool, wrapped past it; a backend of 16-bit "
           "caches only, whose far pools end before element 2**32")
    models = ("32-bit offsets of a layer view over one allocation for all layers: ROCm/aiter PR 4427 (a per-layer "
              "view's block * stride in a 32-bit unsigned buffer offset, past it at 6.5 GB), "
              "vllm-project/vllm-xpu-kernels PR 445 (vLLM's one allocation for all layers, block * stride in 32 "
              "bits); unsigned, such an offset reaches element 2**32 of a 16-bit pool, 8 GiB")
    killed_by = "test_far_layer_views_match_spec"

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        return replace(caps, cache_dtypes=QUERY_DTYPES, features=caps.features - {"fp8"})

    def block_offsets(self, blocks, slots, problem):
        offsets = AddressedKernelBackend.block_offsets(self, blocks, slots, problem)
        block_elements = problem.block_size * problem.num_kv_heads * problem.head_dim
        read = (blocks.astype(np.int64) * self.block_stride % UINT32_OFFSET_LIMIT) // self.block_stride
        return offsets + (read - blocks) * block_elements


class PageTileOf128Slots(AddressedKernelBackend):
    bug = ("attention loads a block in a tile of at most 128 slots: in a larger block, slot s is read "
           "from slot s % 128")
    models = ("flashinfer-ai/flashinfer issue 4347 (a paged-attention kernel wrong with page sizes over 128; "
              "its kernels assumed at most 128 tokens per page: flashinfer-ai/flashinfer issue 1796)")
    killed_by = "test_large_blocks_match_spec"

    def locate(self, p, block_size):
        columns, slots = super().locate(p, block_size)
        return columns, slots % 128


#: Consecutive slots the mutant below reads as one run from the block of the run's first position.
SLOT_RUN = 8


class SlotRunsOf8WithinOneBlock(AddressedKernelBackend):
    bug = ("attention reads keys in runs of 8 consecutive positions, all from the block of the run's first "
           "position: right when a block holds a multiple of 8 slots, and with blocks of 1, 4 or 12 slots "
           "the run reads past its block into whatever block follows in memory")
    models = ("Dao-AILab/flash-attention PR 824 (a tile's copy from the paged cache assumed to lie in one "
              "page, which held for pages of 256 and not for the 16 engines use); "
              "sgl-project/sglang issue 38196 (a backend silently wrong at page size 16 and right at 128)")
    killed_by = "test_small_blocks_match_spec"

    def locate(self, p, block_size):
        start = p // SLOT_RUN * SLOT_RUN
        return start // block_size, start % block_size + (p - start)


class LargePagesSeeFirst4096Keys(SteppedKernelBackend):
    bug = ("with blocks of more than 128 slots, attention sees only the keys of the first 4,096 positions and "
           "the last block: the blocks between are skipped")
    models = ("flashinfer-ai/flashinfer issue 4347 (trtllm-gen context attention with pages of 256: right to "
              "4,096 keys, wrong from 6,144, as if it saw only the first 4,096 keys and the last page)")
    killed_by = "test_large_blocks_match_spec"

    def logical_blocks(self, length, block_size, p_q, problem):
        blocks = super().logical_blocks(length, block_size, p_q, problem)
        if block_size <= 128 or not blocks:
            return blocks
        return [j for j in blocks if (j + 1) * block_size <= 4096 or j == blocks[-1]]


class WriteKVSlotsOfA128Tile(SteppedKernelBackend):
    bug = ("write_kv finds a token's slot within its block modulo 128: in a block of more than 128 slots, "
           "slot s lands at s % 128")
    models = ("a cache write whose in-block offset holds pages of at most 128 tokens (the page limit of "
              "flashinfer-ai/flashinfer issue 1796)")
    killed_by = "test_large_block_operations_match_spec"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        bs = problem.block_size
        _write_kv_landing(problem, key, value, key_cache, value_cache, lambda s: s // bs * bs + s % bs % 128)


class HeadTileOf256(SteppedKernelBackend):
    bug = ("attention holds q, k and O in a head tile of 256 dims: scores from the first 256 dims only, "
           "the output's dims past 256 never written")
    models = ("Dao-AILab/flash-attention issue 805 (head_dim 1024 ran without an error and gave wrong results); "
              "ROCm/aiter PR 2273 (a paged kernel for one head size called for others: wrong results)")
    killed_by = "test_large_head_dims_match_spec"

    def scores(self, q, k, problem):
        return super().scores(q[..., :256], k[..., :256], problem)

    def weighted_values(self, p_ij, visible, v):
        out = super().weighted_values(p_ij, visible, v)
        out[..., 256:] = 0
        return out


class WriteKVInt32Offsets(AddressedKernelBackend):
    bug = "write_kv computes slot * (num_kv_heads * head_dim) in int32: slots past element 2**31 land elsewhere"
    models = "int32 slot offsets in reshape_and_cache-style cache writes on large caches"
    killed_by = "test_far_pool_operation"

    def offset_register(self, offsets: np.ndarray) -> np.ndarray:
        """An element offset (int64) as the kernel's 32-bit register holds it."""
        return _wrap_int32(offsets)

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        slot_elements = problem.num_kv_heads * problem.head_dim
        total = problem.num_blocks * problem.block_size
        _write_kv_landing(problem, key, value, key_cache, value_cache,
                          lambda s: (self.offset_register(s * slot_elements) // slot_elements) % total)


class WriteKVInt32TokenOffsets(AddressedKernelBackend):
    bug = ("write_kv reads a token's key and value at token * (num_kv_heads * head_dim) in int32: tokens past "
           "element 2**31 of the inputs are read from another row")
    models = ("32-bit offsets into the key/value inputs of a cache write (vllm-project/vllm-ascend PR 8505 review: "
              "headId * seqLen * headDim in uint32; SHI-Labs/NATTEN PR 337: token strides widened to 64 bits)")
    killed_by = "test_far_rows_of_write_kv"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        row_elements = problem.num_kv_heads * problem.head_dim
        tokens = np.flatnonzero(problem.slot_mapping >= 0)
        rows = (_wrap_int32(tokens.astype(np.int64) * row_elements) // row_elements) % problem.num_tokens
        kv_ops.write_kv(np.asarray(key)[rows], np.asarray(value)[rows], key_cache, value_cache,
                        problem.slot_mapping[tokens], kv_layout=problem.kv_layout, k_scale=problem.k_scale,
                        v_scale=problem.v_scale)


class CopyBlocksInt32Offsets(AddressedKernelBackend):
    bug = "copy_blocks computes block * block_stride in int32: blocks past element 2**31 are copied from/to others"
    models = "int32 block offsets in copy_blocks / swap_blocks on large caches"
    killed_by = "test_far_pool_operation"

    def offset_register(self, offsets: np.ndarray) -> np.ndarray:
        """An element offset (int64) as the kernel's 32-bit register holds it."""
        return _wrap_int32(offsets)

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        num_blocks = key_cache.shape[0]
        block_elements = int(np.prod(key_cache.shape[1:]))
        wrapped = (self.offset_register(pairs.astype(np.int64) * block_elements) // block_elements) % num_blocks
        super()._copy_blocks(key_cache, value_cache, wrapped)


class WriteKVOffsetsInUnsigned32Bits(WriteKVInt32Offsets):
    bug = ("write_kv computes slot * (num_kv_heads * head_dim) in unsigned 32 bits (an int32 overflow mended "
           "with an unsigned type): right up to element 2**32 of the caches (byte 2**32 of an fp8 one), slots "
           "past it land at the offset mod 2**32")
    models = ("the unsigned mend of a 32-bit offset: vllm-project/vllm issue 1486 (reshape_and_cache's int32 slot "
              "offsets past 2**31 elements), iree-org/wave PR 1061 (buffer offsets moved from signed to unsigned "
              "32-bit limits, to reach about 4 GB)")
    killed_by = "test_far_pool_operation"

    def offset_register(self, offsets):
        return offsets % UINT32_OFFSET_LIMIT


class CopyBlocksOffsetsInUnsigned32Bits(CopyBlocksInt32Offsets):
    bug = ("copy_blocks computes block * block_stride in unsigned 32 bits: blocks past element 2**32 of the "
           "caches (byte 2**32 of fp8 ones) are copied from and to the block at the offset mod 2**32")
    models = ("the unsigned mend of a 32-bit offset (iree-org/wave PR 1061: up to about 4 GB) in a copy-on-write "
              "kernel, whose int32 form CopyBlocksInt32Offsets models")
    killed_by = "test_far_pool_operation"

    def offset_register(self, offsets):
        return offsets % UINT32_OFFSET_LIMIT


# -- split-KV ---------------------------------------------------------------------------------

def _unwritten(state: State, rows: Any) -> State:
    """``state`` (m ``[n, Hq]``, l, O ``[n, Hq, D]``) with the rows where ``rows`` (broadcast to
    ``[n, Hq]``) holds left unwritten: NaN, what a partial buffer holds before a part writes it."""
    m, l, O = state
    rows = np.asarray(rows)
    return (np.where(rows, F32(np.nan), m), np.where(rows, F32(np.nan), l),
            np.where(rows[..., None], F32(np.nan), O))


#: The head_dim of :class:`SplitPartialsOfHalfAWideHead`'s own split path, and the dims that path's
#: epilogue writes (the stride its other instantiations use).
WIDE_SPLIT_HEAD_DIM = 256
WIDE_SPLIT_WRITTEN_DIMS = 128
#: The fewest query heads a KV head of that path (a grouped kernel's instantiations, GQA 4 and 8).
WIDE_SPLIT_MIN_GROUP = 4


class SplitPartialsOfHalfAWideHead(AddressedKernelBackend):
    bug = ("split-KV at head_dim WIDE_SPLIT_HEAD_DIM with WIDE_SPLIT_MIN_GROUP query heads a KV head and more "
           "(a grouped kernel's instantiation of its own) writes each part's O for the first "
           "WIDE_SPLIT_WRITTEN_DIMS dims only, the rest 0; unsplit sequences, smaller groups and other head dims "
           "right. Declares head dims 64, 80, 96, 128 and 256 and block sizes 16, 32 and 64, as most GPU kernels do")
    models = ("gittensor-ai-lab/sparkinfer issues 330 and 425 (the int8 flash-decode split kernel, right at "
              "head_dim 128, computed only the first 128 of 256 output dims at head_dim 256: its hard-coded stride "
              "of 128; it engaged only at long context, so shorter cases and other head dims passed)")
    killed_by = "test_long_sequences_match_spec"

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), head_dims=(64, 80, 96, 128, 256), block_sizes=(16, 32, 64))

    def _run(self, plan, query, key_cache, value_cache):
        self.group_size = plan.problem.group_size
        return super()._run(plan, query, key_cache, value_cache)

    def merge(self, states):
        if (len(states) > 1 and states[0][2].shape[-1] == WIDE_SPLIT_HEAD_DIM
                and self.group_size >= WIDE_SPLIT_MIN_GROUP):
            states = [(m, l, np.concatenate([O[..., :WIDE_SPLIT_WRITTEN_DIMS],
                                             np.zeros_like(O[..., WIDE_SPLIT_WRITTEN_DIMS:])], axis=-1))
                      for m, l, O in states]
        return super().merge(states)


class SplitPartsReadHNDAsNHD(AddressedKernelBackend):
    bug = ("split-KV parts address an HND cache as NHD (slot * Hkv * D + head * D within a block): a split "
           "sequence's keys and values come from other slots and heads; unsplit sequences and NHD caches right. "
           "Declares block sizes 16, 32 and 64, as most GPU kernels do")
    models = ("a split-KV kernel of its own beside the unsplit one, where only the latter takes the cache's "
              "layout: vllm-project/vllm-xpu-kernels PR 449 (HND added to paged attention by each kernel's "
              "sequence stride), vllm-project/vllm issue 49012 (a cache kernel that assumed NHD silently "
              "corrupted HND caches)")
    killed_by = "test_long_sequences_of_wide_groups_match_spec"

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), block_sizes=(16, 32, 64))

    def _run(self, plan, query, key_cache, value_cache):
        self.misread: dict[int, np.ndarray] = {}  # each cache's slot view as the split parts read it
        return super()._run(plan, query, key_cache, value_cache)

    def parts(self, blocks, length, problem):
        cut = super().parts(blocks, length, problem)
        self.split = len(cut) > 1
        return cut

    def read_block(self, slots, row, j, problem):
        if self.split and problem.kv_layout == "HND":
            if id(slots) not in self.misread:
                self.misread[id(slots)] = _hnd_read_as_nhd(slots)
            slots = self.misread[id(slots)]
        return super().read_block(slots, row, j, problem)


class SplitMergeIgnoresMax(AddressedKernelBackend):
    bug = "split-KV merge adds the parts' l and O without rescaling each by exp(m_i - m_max)"
    models = "split-KV / flash-decoding reduction combining partials without the max correction"
    killed_by = "test_long_sequences_match_spec"

    def merge(self, states):
        if len(states) == 1:
            return states[0]
        m = np.max([s[0] for s in states], axis=0)
        l = np.sum([s[1] for s in states], axis=0)
        O = np.sum([s[2] for s in states], axis=0)
        return m.astype(F32), l.astype(F32), O.astype(F32)


class SplitVScaleTwice(AddressedKernelBackend):
    bug = "fp8 v_scale is applied to each split part's O and again after the merge: split rows are off by v_scale"
    models = "fp8 cache scales applied in both the split-KV partials and the merge"
    killed_by = "test_long_sequences_with_fp8_caches_match_spec"

    def _run(self, plan, query, key_cache, value_cache):
        self.v_scale = F32(plan.problem.v_scale)
        return super()._run(plan, query, key_cache, value_cache)

    def merge(self, states):
        m, l, O = super().merge(states)
        if len(states) == 1:
            return m, l, O
        return m, l, (O * self.v_scale).astype(F32)


class SplitEmptyPartNaN(AddressedKernelBackend):
    bug = ("split-KV: a part that sees no key (all outside the window) leaves its partial O / l = 0 / 0, "
           "and the merge weighs it by 0: 0 * NaN = NaN")
    models = "split-KV partials of empty splits (sliding window, causal) poisoning the merge"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def merge(self, states):
        if len(states) == 1:
            return states[0]
        m = np.max([s[0] for s in states], axis=0)
        shift = self.merge_shift(m)
        l, O = np.zeros_like(states[0][1]), np.zeros_like(states[0][2])
        for m_i, l_i, O_i in states:
            weight = np.exp(m_i - shift) * l_i
            with np.errstate(invalid="ignore", divide="ignore"):
                partial = O_i / l_i[..., None]  # the part's normalised output, as a kernel writes it
            l = l + weight
            O = O + weight[..., None] * partial
        return m.astype(F32), l.astype(F32), O.astype(F32)


class SplitMergeOfRowsWithoutKeysNaN(AddressedKernelBackend):
    bug = ("split-KV merge weighs each part by exp(m_i - m) with no guard for m = -inf: a split row whose every "
           "part is empty (every score -inf) gets exp(-inf + inf) = NaN instead of out 0, lse -inf")
    models = ("flashinfer-ai/flashinfer PR 4401 (an empty split-KV chunk merged in state_t::merge/normalize); "
              "cupy's merge_partials without its lse_k == -inf test")
    killed_by = "test_long_rows_of_minus_inf_scores_are_empty"

    def merge(self, states):
        return states[0] if len(states) == 1 else super().merge(states)

    def merge_shift(self, m):
        return m


class AlibiDistanceInQueryDtype(AddressedKernelBackend):
    bug = ("ALiBi's distance p - p_q is computed in the query's dtype: bfloat16 holds integers exactly "
           "only to 256, float16 to 2,048, so far keys get the wrong bias")
    models = "ALiBi bias from positions held in half precision at long context"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def transform(self, s_ij, p, p_q, visible, problem):
        if problem.alibi_slopes is None or problem.dtype == "float32":
            return super().transform(s_ij, p, p_q, visible, problem)
        from pagedattn.spec.dtypes import numpy_dtype

        capped = super().transform(s_ij, p, p_q, visible, replace(problem, alibi_slopes=None))  # softcap alone
        half = numpy_dtype(problem.dtype)
        distance = (p[None, :].astype(half) - p_q[:, None].astype(half)).astype(F32)
        return (capped + problem.alibi_slopes[None, :, None] * distance[:, None, :]).astype(F32)


class SplitLseOfLargestPart(AddressedKernelBackend):
    bug = ("split-KV merge returns out right but lse as the largest part's own (m_max + log l_max), "
           "not the log-sum-exp over the parts")
    models = "split-KV / cascade merges that combine out but pass one part's lse through"
    killed_by = "test_long_sequences_match_spec"

    lse_l: np.ndarray | None = None  # the largest part's l, for the lse of a split row

    def merge(self, states):
        self.lse_l = None
        merged = super().merge(states)
        if len(states) > 1:
            largest = int(np.argmax([float(np.max(s[0])) for s in states]))
            self.lse_l = states[largest][1]
        return merged

    def finalize(self, m, l, O):
        out, lse = super().finalize(m, l, O)
        part_l = self.lse_l
        if part_l is None:
            return out, lse
        with np.errstate(divide="ignore"):
            return out, (m + np.log(part_l)).astype(F32)


class SplitDropsLastPart(AddressedKernelBackend):
    bug = "split-KV cuts L // part_len parts: the keys after the last whole part are not read"
    models = "split-KV partition rounding down (partial last split dropped)"
    killed_by = "test_long_sequences_match_spec"

    def parts(self, blocks, length, problem):
        cut = super().parts(blocks, length, problem)
        if len(cut) == 1:
            return cut
        whole = length // PART_KEYS
        return cut[:max(1, whole)]


class SplitMergeLseOverflows(AddressedKernelBackend):
    bug = ("split-KV merge folds each part into a running (lse, out) as lse + log(1 + exp(lse_i - lse)): a part "
           "whose lse lies more than 88.7 above the running one overflows exp (lse inf, out 0)")
    models = ("zhuzilin/ring-flash-attention PR 30 (that lse update overflowed exp; fixed with a log-sigmoid); "
              "flashinfer-ai/flashinfer PR 5119 review (large finite sinks gave NaN in a split merge)")
    killed_by = "test_long_needles_match_spec"

    def merge(self, states):
        if len(states) == 1:
            return states[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lse_out = [(m + np.log(l), O / np.where(l == 0, F32(1), l)[..., None]) for m, l, O in states]
            lse, out = lse_out[0]
            for lse_i, out_i in lse_out[1:]:  # a part with no key (lse -inf) adds nothing; after only such
                folded = lse + np.log(F32(1) + np.exp(lse_i - lse))  # parts the next is taken whole; inf past e**88.7
                new = np.where(np.isneginf(lse_i), lse, np.where(np.isneginf(lse), lse_i, folded))
                weight, weight_i = np.exp(lse - new), np.exp(lse_i - new)
                out = (np.where(np.isneginf(lse), F32(0), weight)[..., None] * out
                       + np.where(np.isneginf(lse_i), F32(0), weight_i)[..., None] * out_i)
                lse = new
        l = np.where(np.isneginf(lse), F32(0), F32(1))
        return lse.astype(F32), l.astype(F32), np.where(l[..., None] == 0, F32(0), out).astype(F32)


class SplitMergeDropsNonFiniteParts(AddressedKernelBackend):
    bug = ("split-KV merge weighs a part whose lse is not finite as an empty one (a guard for an empty part's 0 / 0 "
           "that also takes NaN and inf): NaN or inf that a row sees in one part never reaches it")
    models = ("vllm-project/vllm csrc/attention/merge_attn_states.cu (a part's lse of +inf replaced by -inf, an "
              "empty part's, before the merge); flashinfer-ai/flashinfer PR 4054 (empty parts' NaN in merges)")
    killed_by = "test_long_sequences_with_non_finite_scores_propagate"

    def merge(self, states):
        if len(states) == 1:
            return states[0]
        kept = []
        for m, l, O in states:
            with np.errstate(divide="ignore", invalid="ignore"):
                empty = ~np.isfinite(m + np.log(l))
            kept.append((np.where(empty, F32(-np.inf), m), np.where(empty, F32(0), l),
                         np.where(empty[..., None], F32(0), O)))
        return super().merge(kept)


# -- groups past 8 query heads a KV head in a split plan -----------------------------------------

#: Rows of an MMA tile (a KV head's query heads), and rows of its first row slot.
MMA_ROWS, ROW_SLOT_ROWS = 16, 8


class SplitPartialsOfTheFirstRowSlot(AddressedKernelBackend):
    bug = ("a split part stores the partials of the first 8 rows of each 16-row tile of a KV head's query heads "
           "alone (an MMA tile's first row slot): past 8 query heads a KV head, the other rows' partials keep what "
           "the buffer held (NaN) and the merge reads them; a plan that does not split stores every row")
    models = ("local-inference-lab/b12x PR 24 (split-KV decode epilogues stored MMA row_slot 0 only, the packed "
              "query rows 0-7 of the m16 tile: garbage output whenever the GQA group size passed 8)")
    killed_by = "test_long_sequences_of_wide_groups_match_spec"

    def parts(self, blocks, length, problem):
        self._group = problem.group_size
        return super().parts(blocks, length, problem)

    def drops_rows(self) -> bool:
        """Whether this call's split parts store row slot 0 alone: every call's."""
        return True

    def merge(self, states):
        if len(states) == 1 or not self.drops_rows():
            return super().merge(states)
        heads = states[0][1].shape[-1]
        lost = (np.arange(heads) % self._group) % MMA_ROWS >= ROW_SLOT_ROWS  # [Hq]
        return super().merge([_unwritten(state, lost) for state in states])


class Fp8SplitPartialsOfTheFirstRowSlot(SplitPartialsOfTheFirstRowSlot):
    bug = ("the fp8-cache path's split parts store the partials of the first 8 rows of each 16-row tile of a KV "
           "head's query heads alone (the 16-bit path's store every row): on fp8 caches, past 8 query heads a KV "
           "head, the merge reads what the buffer held (NaN) for the others")
    models = ("local-inference-lab/b12x PR 24 (split-KV decode epilogues stored MMA row_slot 0 only, garbage past "
              "a GQA group of 8), in an fp8 decode kernel of its own")
    killed_by = "test_long_sequences_of_wide_groups_with_fp8_caches_match_spec"

    def drops_rows(self) -> bool:
        return self.cache_dtype in FP8_DTYPES


# -- power-of-two index arithmetic ---------------------------------------------------------------

class PowerOfTwoBlockMath(AddressedKernelBackend):
    bug = ("column and slot of position p as p >> log2(block_size) and p & (block_size - 1):"
           " right for powers of two only")
    models = "bit-shift block/slot arithmetic that assumes a power-of-two block size"
    killed_by = "test_odd_sizes_match_spec"

    def locate(self, p, block_size):
        shift = int(block_size).bit_length() - 1
        return p >> shift, p & (block_size - 1)


# -- groups wider than a tile, batches larger than a wave ---------------------------------------

#: Rows of a decode MMA tile (query heads of one KV head it holds).
DECODE_TILE_ROWS = 16
#: Rows of a prefill tile.
PREFILL_TILE_ROWS = 64
#: CTAs of a persistent kernel: 132 SMs (an H100/H200) x 4 resident.
PERSISTENT_CTAS = 132 * 4


class DecodeGroupWrapsTile(SteppedKernelBackend):
    bug = ("decode holds a KV head's query heads in one 16-row MMA tile: past 16 heads, head g reads the query "
           "row of head g % 16")
    models = "GQA decode kernels that assume a group fits one MMA tile (group sizes past 16 computed wrong)"
    killed_by = "test_wide_groups_match_spec"

    def _run(self, plan, query, key_cache, value_cache):
        problem = plan.problem
        if problem.is_decode and problem.group_size > DECODE_TILE_ROWS:
            g = np.arange(problem.num_q_heads) % problem.group_size
            query = np.asarray(query)[:, np.arange(problem.num_q_heads) - g + g % DECODE_TILE_ROWS]
        return super()._run(plan, query, key_cache, value_cache)


#: Queries of a prefill kernel's query tile, and keys of its KV tile.
QUERY_TILE_TOKENS = 64
KV_TILE_KEYS = 64


class CausalBoundOfFirstQueryTile(SteppedKernelBackend):
    bug = ("causal prefill in 64-query tiles with the KV range's end hoisted out of the tile loop: every tile stops "
           "at the end of the 64-key tile holding the 64th query's position, so later queries miss the keys after it")
    models = "loop-invariant causal bounds (the last KV tile computed once per sequence) in multi-tile prefill kernels"
    killed_by = "test_long_prefills_match_spec"

    def visible(self, p, p_q, length, problem):
        vis = super().visible(p, p_q, length, problem)
        if problem.causal and len(p_q) > QUERY_TILE_TOKENS:
            last_key = (int(p_q[QUERY_TILE_TOKENS - 1]) // KV_TILE_KEYS + 1) * KV_TILE_KEYS - 1
            vis &= p[None, :] <= last_key
        return vis


class WindowTilesOfTheFirstQuery(SteppedKernelBackend):
    bug = ("causal prefill under a sliding window in 64-query tiles: the 64-key tiles every row of a query tile "
           "sees whole (no mask) are found from the window of the tile's first query, not its last: later rows "
           "also see the keys of those tiles below their own window")
    models = ("the unmasked middle of a tile's key range (FlashAttention-2's n_block_min and n_masking_steps) "
              "computed for the wrong end of the query tile under a local window; the same project's triton "
              "kernel takes the bound from the tile's last query (full_lo)")
    killed_by = "test_long_chunks_under_a_window_match_spec"

    def visible(self, p, p_q, length, problem):
        vis = super().visible(p, p_q, length, problem)
        window = problem.sliding_window
        if problem.causal and window is not None and len(p_q) > 1:
            first = p_q[(np.arange(len(p_q)) // QUERY_TILE_TOKENS) * QUERY_TILE_TOKENS]  # each row's tile's first
            whole_from = -(-np.maximum(first - window + 1, 0) // KV_TILE_KEYS) * KV_TILE_KEYS
            whole_to = (first + 1) // KV_TILE_KEYS * KV_TILE_KEYS  # the tiles past it hold the diagonal: masked
            vis |= (p[None, :] >= whole_from[:, None]) & (p[None, :] < whole_to[:, None]) & (p < length)[None, :]
        return vis


class LargePrefillMaxOfUnscaledProducts(RowMaxOfUnscaledProducts):
    bug = ("the row max taken on the raw products q.k and then scaled, in the kernel of large prefills only ("
           "512 rows a sequence and up): under a negative scale it is the row's least score, and exp(s - m) "
           "overflows once the scores spread past 88")
    models = ("a fast path that assumes scale > 0 in a kernel only large batches reach (this project's cupy "
              "Hopper prefill guards it with scale > 0); the draws of small cells never meet it")
    killed_by = "test_long_prefills_under_negative_scales_match_spec"

    def scale(self, problem):
        value = super().scale(problem)
        self.negative_plain = self.negative_plain and _large_prefill(problem)
        return value


#: Keys of block-table entries a CTA holds in one batch (32 sub-tiles of 16 keys for each of 4 warps).
TABLE_BATCH_KEYS = 2048


class TableBatchRefreshedLate(SteppedKernelBackend):
    bug = ("a CTA holds its range's block-table entries in batches of 2,048 keys and loads each next batch one "
           "batch late: in a range walked whole (a batch that fills the GPU, so unsplit), keys from 4,096 on are "
           "read from the blocks of the keys 2,048 before")
    models = ("an off-by-one in a software-pipelined block-table prefetch (this project's cupy decode kernel "
              "holds one entry a lane, a batch ahead: the kernel edit DecodeTableBatchOffByOne); split plans of "
              "small batches never walk that far in one CTA")
    killed_by = "test_long_batches_match_spec"

    def read_block(self, slots, row, j, problem):
        bs = problem.block_size
        late = TABLE_BATCH_KEYS // bs
        if (self.refreshes_late(problem) and problem.num_seqs * problem.num_kv_heads >= LONG_BATCH_PAIRS
                and j * bs >= 2 * TABLE_BATCH_KEYS and late):
            return super().read_block(slots, row, j - late, problem)
        return super().read_block(slots, row, j, problem)

    def refreshes_late(self, problem: AttentionProblem) -> bool:
        """Whether this problem's path has the bug (every path here)."""
        return True


class Fp8TableBatchRefreshedLate(TableBatchRefreshedLate):
    bug = ("the fp8-cache decode path (its own stages and steps of two sub-tiles) loads each next batch of 2,048 "
           "keys of block-table entries one batch late: on fp8 caches, in a range walked whole, keys from 4,096 "
           "on read the blocks of the keys 2,048 before")
    models = ("an off-by-one in the block-table prefetch of a separate fp8 decode path; the 16-bit path's long "
              "batches pass")
    killed_by = "test_long_batches_with_fp8_caches_match_spec"

    def refreshes_late(self, problem):
        return problem.cache_dtype in FP8_DTYPES


#: Query rows of a decode kernel's tile (one warp's: rows g and g + 8 of each lane group).
DECODE_TILE_ROWS = 16


class RescaleDecidedByTheFirstRows(SteppedKernelBackend):
    bug = ("decode skips O *= alpha in a tile of 16 query heads unless one of its first 8 raised its running max: "
           "when only the other 8 raise theirs, their O keeps the old scale")
    models = ("a rescale skipped where alpha == 1, decided over a warp's rows with only one of each lane's two "
              "rows tested (this project's cupy fp8 decode kernel tests both; the kernel edit "
              "DecodeRescaleOfTheFirstRowsOnly drops the second)")
    killed_by = "test_long_sequences_of_wide_groups_match_spec"

    def scale(self, problem):
        self.group = problem.group_size if problem.is_decode else 0
        return super().scale(problem)

    def output_rescale(self, alpha, m, m_new):
        if self.group <= DECODE_TILE_ROWS // 2:
            return alpha
        heads = np.arange(m.shape[-1])
        within = heads % self.group
        tile = (heads // self.group) * self.group + within // DECODE_TILE_ROWS
        first = within % DECODE_TILE_ROWS < DECODE_TILE_ROWS // 2
        raised = (m_new > m) & first[None, :]
        first_raised = np.zeros_like(raised)
        for t in np.unique(tile):
            first_raised[:, tile == t] = raised[:, tile == t].any(axis=1, keepdims=True)
        return np.where(~first[None, :] & ~first_raised, F32(1), alpha)


class Fp8SplitRescaleDecidedByTheFirstRows(AddressedKernelBackend, RescaleDecidedByTheFirstRows):
    bug = ("fp8 decode of split sequences skips O *= alpha in a tile of 16 query heads unless one of its first 8 "
           "raised its running max: within each part, where only the other 8 raise theirs, their O keeps the old "
           "scale")
    models = ("this project's cupy fp8 decode kernel with the kernel edit DecodeRescaleOfTheFirstRowsOnly: its "
              "parts of about 1,024 keys, and the fp8 tolerance of keys far from 0")
    killed_by = "test_long_sequences_of_wide_groups_with_fp8_caches_match_spec"

    def output_rescale(self, alpha, m, m_new):
        if self.cache_dtype not in FP8_DTYPES:
            return alpha
        return super().output_rescale(alpha, m, m_new)


def _large_prefill(problem: AttentionProblem) -> bool:
    """Whether a kernel of large prefills takes ``problem``: LONG_PREFILL_ROWS rows (queries x query
    heads, at most 128 heads) a sequence on average and up (cupy's Hopper kernel: 4 of its 128-row
    tiles; the long prefills are sized by the same bound)."""
    rows = problem.num_tokens * min(problem.group_size, 128)
    return not problem.is_decode and rows >= LONG_PREFILL_ROWS * max(1, problem.num_seqs)


class LargePrefillFusedScoreShift(FusedScoreShift):
    bug = ("scale and running-max shift in one fused multiply-add, in the kernel of large prefills only (512 rows "
           "a sequence and up): the max key's weight is e to its score's rounding error, inf or 0 once scores "
           "pass about 1e9")
    models = ("a one-FFMA exponent in a kernel only large batches reach, used past its range (this project's "
              "cupy Hopper prefill bounds its fast path at |m| < 2**19 in log2 units; the kernel edit "
              "WgmmaFastPathPastItsRange drops the bound); like that fast path, under a positive scale and "
              "without softcap or ALiBi only")
    killed_by = "test_long_prefills_match_spec"

    def scale(self, problem):
        self.large = (_large_prefill(problem) and problem.scale > 0 and problem.softcap is None
                      and problem.alibi_slopes is None)
        return super().scale(problem)

    def scores(self, q, k, problem):
        if self.large:
            return super().scores(q, k, problem)
        return SteppedKernelBackend.scores(self, q, k, problem)


class LargePrefillValueOnePastL(SteppedKernelBackend):
    bug = ("large prefills (512 rows a sequence and up) load the value at p = L with the last tile: masked, its "
           "weight is 0, but 0 * NaN = NaN in P V where that slot holds NaN")
    models = ("a tile's row count compared with <= for <: this project's cupy Hopper prefill kernel (16-bit "
              "caches) with the kernel edit WgmmaReadsOneRowPastL")
    killed_by = "test_long_prefills_match_spec"

    def scale(self, problem):
        self.large = _large_prefill(problem) and problem.cache_dtype not in FP8_DTYPES
        return super().scale(problem)

    def visible(self, p, p_q, length, problem):
        self.one_past = (p == length) & self.large
        return super().visible(p, p_q, length, problem)

    def weighted_values(self, p_ij, visible, v):
        return super().weighted_values(p_ij, visible | self.one_past[None, :], v)


class NonCausalKeysEndAtItsQueryTile(SteppedKernelBackend):
    bug = ("prefill in 64-query tiles whose key loop ends at the KV tile holding the tile's last query, "
           "causal or not: without the causal mask, the queries of every tile but the last miss the later keys")
    models = ("sgl-project/sglang PR 39593 (Triton extend attention's key loop stopped at the causal query tile's "
              "end while a mask exposed later keys: bidirectional blocks silently missed them)")
    killed_by = "test_long_non_causal_prefills_match_spec"

    def visible(self, p, p_q, length, problem):
        vis = super().visible(p, p_q, length, problem)
        if not problem.causal and len(p_q) > QUERY_TILE_TOKENS:
            tiles_last = np.minimum((np.arange(len(p_q)) // QUERY_TILE_TOKENS + 1) * QUERY_TILE_TOKENS, len(p_q)) - 1
            last_key = (p_q[tiles_last] // KV_TILE_KEYS + 1) * KV_TILE_KEYS - 1
            vis &= p[None, :] <= last_key[:, None]
        return vis


class UnwrittenOutputKernel(SteppedKernelBackend):
    """The stepped kernel leaving some (token, query head) rows of out and lse as allocated (zero, and
    -inf): the base of the mutants whose launch never reaches part of the output (not registered)."""

    def unwritten(self, problem: AttentionProblem) -> np.ndarray:
        """bool ``[num_tokens, num_q_heads]``: the rows no CTA writes (none here)."""
        return np.zeros((problem.num_tokens, problem.num_q_heads), dtype=bool)

    def _run(self, plan, query, key_cache, value_cache):
        problem = plan.problem
        rows = self.unwritten(problem)
        if rows.all():  # the launch failed: nothing ran (and a batch this large costs the stepped kernel a minute)
            out = np.zeros((problem.num_tokens, problem.num_q_heads, problem.head_dim), dtype=np.asarray(query).dtype)
            return out, np.full((problem.num_tokens, problem.num_q_heads), -np.inf, dtype=F32)
        out, lse = super()._run(plan, query, key_cache, value_cache)
        out[rows] = 0
        if lse is not None:
            lse[rows] = -np.inf
        return out, lse


class GroupTailTilesUnwritten(UnwrittenOutputKernel):
    bug = ("a KV head's query heads are cut into 64-row tiles but the grid has one program per KV head: "
           "heads past the 64th of each group are never written")
    models = "grids sized for one head tile per KV head: query heads past the first tile left unwritten (MQA)"
    killed_by = "test_wide_groups_match_spec"

    def unwritten(self, problem):
        tail = np.arange(problem.num_q_heads) % problem.group_size >= PREFILL_TILE_ROWS
        return np.broadcast_to(tail, (problem.num_tokens, problem.num_q_heads))


class GroupTilesPlacedEvery16Heads(UnwrittenOutputKernel):
    bug = ("a KV head's query heads are cut into 64-row tiles, but tile i starts at head 16 i (a decode tile's "
           "height) instead of 64 i: the tiles overlap, and heads past 16 (tiles - 1) + 64 are never written")
    models = ("a head tile's first head from the wrong tile height (triton's g0 with 16 for GROUP_TILE): right "
              "while a group fits in 80 heads, as Falcon-7B's 71 does; MLA decode's 128 heads on one KV head")
    killed_by = "test_wide_groups_match_spec"

    def unwritten(self, problem):
        tiles = -(-problem.group_size // PREFILL_TILE_ROWS)
        reach = 16 * (tiles - 1) + PREFILL_TILE_ROWS
        tail = np.arange(problem.num_q_heads) % problem.group_size >= reach
        return np.broadcast_to(tail, (problem.num_tokens, problem.num_q_heads))


class WorkListOneWave(UnwrittenOutputKernel):
    bug = ("a persistent kernel launches 132 x 4 CTAs over its (sequence, KV head) work list and walks it once: "
           "pairs past the 528th are never computed")
    models = "persistent-kernel work loops that stop after the first wave (large decode batches lose sequences)"
    killed_by = "test_large_batches_match_spec"

    def unwritten(self, problem):
        G, Hkv = problem.group_size, problem.num_kv_heads
        rows = super().unwritten(problem)
        for item in range(PERSISTENT_CTAS, problem.num_seqs * Hkv):
            s, h = divmod(item, Hkv)
            rows[int(problem.query_start_loc[s]):int(problem.query_start_loc[s + 1]), h * G:(h + 1) * G] = True
        return rows


class Fp8WorkListOneWave(WorkListOneWave):
    bug = ("the fp8-cache decode path is a persistent kernel of 132 x 4 CTAs that walks its (sequence, KV head) "
           "work list once (the 16-bit path covers every pair): on fp8 caches, pairs past the 528th are never computed")
    models = ("persistent-kernel work loops that stop after the first wave, in a separate fp8 KV-cache kernel; "
              "vllm-project/vllm issue 6429 (FP8 KV-cache models failed where the 16-bit cache served)")
    killed_by = "test_large_batches_with_fp8_caches_match_spec"

    def unwritten(self, problem):
        if problem.cache_dtype in FP8_DTYPES:
            return super().unwritten(problem)
        return UnwrittenOutputKernel.unwritten(self, problem)


class WorkCounterZeroedAtPlan(UnwrittenOutputKernel):
    bug = ("past one wave, a persistent kernel's CTAs take (sequence, KV head) pairs from a counter that plan "
           "zeroes once: the first run leaves it at the end of the list, so a later run of the plan takes no pair "
           "and writes nothing")
    models = ("ROCm/aiter PR 4916 (a split-K counter zeroed once where it is allocated: a replay finds it "
              "non-zero); flashinfer-ai/flashinfer issue 4002 (a planner's scheduler entries left stale for "
              "a graph's padded CTAs)")
    killed_by = "test_large_batch_plans_serve_many_runs"

    #: whether the run under way found the counter at the end of its list
    exhausted = False

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return {"taken": 0}

    def unwritten(self, problem):
        return np.full((problem.num_tokens, problem.num_q_heads), self.exhausted)

    def _run(self, plan, query, key_cache, value_cache):
        items = plan.problem.num_seqs * plan.problem.num_kv_heads
        persistent = items > PERSISTENT_CTAS  # a smaller list launches one CTA per pair
        self.exhausted = persistent and plan.state["taken"] >= items
        if persistent:
            plan.state["taken"] = items
        return super()._run(plan, query, key_cache, value_cache)


#: The most blocks a CUDA grid's y or z axis takes.
GRID_YZ_LIMIT = 65_535


class QueryTokensOnGridZ(UnwrittenOutputKernel):
    bug = ("one CTA per query token on the grid's z axis: past 65,535 tokens the launch fails without an "
           "exception and no row is written")
    models = ("flashinfer-ai/flashinfer issue 3125 (tokens on gridDim.z: wrong results past 65,535, no error); "
              "SandAI-org/MagiAttention PR 40; deepspeedai/DeepSpeed PR 1239")
    killed_by = "test_many_tokens_match_spec"

    def unwritten(self, problem):
        return np.full((problem.num_tokens, problem.num_q_heads), problem.num_tokens > GRID_YZ_LIMIT)


class SequencesOnGridY(UnwrittenOutputKernel):
    bug = ("one CTA per (query head, sequence) with sequences on the grid's y axis: past 65,535 sequences the "
           "launch fails without an exception and no row is written")
    models = ("vLLM's paged_attention_v1 launcher (dim3 grid(num_heads, num_seqs, 1)); "
              "Dao-AILab/flash-attention issue 1786 (FA2's batch on grid.y: 80,000 sequences of 16 tokens fail)")
    killed_by = "test_many_sequences_match_spec"

    def unwritten(self, problem):
        return np.full((problem.num_tokens, problem.num_q_heads), problem.num_seqs > GRID_YZ_LIMIT)


class UnlaunchedOperationKernel(SteppedKernelBackend):
    """The stepped kernel whose ``write_kv``, ``copy_blocks`` or ``merge_states`` launch fails without
    an exception where its hook says so: nothing written or copied, or the merge's output as
    allocated (out 0, lse -inf). The base of the operations' launch-limit mutants (not registered)."""

    kv_layout = "NHD"  # the layout of the copy_blocks call under way (_copy_blocks is not given it)

    def write_kv_launch_fails(self, problem: Any, key: Any) -> bool:
        """Whether the launch of this ``write_kv`` fails (never here)."""
        return False

    def copy_launch_fails(self, num_pairs: int, heads: int, head_dim: int, itemsize: int) -> bool:
        """Whether the launch of a ``copy_blocks`` of ``num_pairs`` pairs on caches of ``heads`` KV heads
        of ``head_dim`` values of ``itemsize`` bytes fails (never here)."""
        return False

    def merge_launch_fails(self, out_a: Any) -> bool:
        """Whether the launch of a ``merge_states`` of states shaped as ``out_a`` fails (never here)."""
        return False

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        if not self.write_kv_launch_fails(problem, key):
            super()._write_kv(problem, key, value, key_cache, value_cache, slot_mapping)

    def copy_blocks(self, key_cache, value_cache, pairs, *, kv_layout="NHD"):
        self.kv_layout = kv_layout
        super().copy_blocks(key_cache, value_cache, pairs, kv_layout=kv_layout)

    def _copy_blocks(self, key_cache, value_cache, pairs):
        shape = np.shape(key_cache)
        heads = shape[2] if self.kv_layout == "NHD" else shape[1]
        if not self.copy_launch_fails(len(pairs), heads, shape[-1], np.asarray(key_cache).itemsize):
            super()._copy_blocks(key_cache, value_cache, pairs)

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        if self.merge_launch_fails(out_a):  # out and lse as allocated
            out_a = np.asarray(out_a)
            return np.zeros_like(out_a), np.full(out_a.shape[:2], -np.inf, dtype=F32)
        return super()._merge_states(out_a, lse_a, out_b, lse_b)


class CopyBlocksPairsOnGridY(UnlaunchedOperationKernel):
    bug = ("copy_blocks launches one CTA per (layer, pair) with pairs on the grid's y axis: past 65,535 pairs the "
           "launch fails without an exception and nothing is copied")
    models = ("vLLM's copy_blocks launcher (dim3 grid(num_layers, num_pairs)) and the kernels derived from it "
              "(ROCm/aiter, the fp8 copy_pages variants)")
    killed_by = "test_copy_blocks_of_many_pairs"

    def copy_launch_fails(self, num_pairs, heads, head_dim, itemsize):
        return num_pairs > GRID_YZ_LIMIT


class WriteKVTokensOnGridY(UnlaunchedOperationKernel):
    bug = ("write_kv launches one CTA per token on the grid's y axis: past 65,535 tokens the launch fails without "
           "an exception and nothing is written")
    models = ("kernels launched with tokens on gridDim.y or z (as QueryTokensOnGridZ); lablup/mlxcel issue 648 "
              "(long-prompt prefill: a grid's y dimension past 65,535)")
    killed_by = "test_write_kv_of_many_tokens"

    def write_kv_launch_fails(self, problem, key):
        return problem.num_tokens > GRID_YZ_LIMIT


class Fp8WriteKVTokensOnGridY(WriteKVTokensOnGridY):
    bug = ("write_kv into fp8 caches launches one CTA per token on the grid's y axis (the 16-bit path's on x): "
           "past 65,535 tokens the launch fails without an exception and nothing is written")
    models = ("a cache write with a kernel of its own for fp8 caches (quantising with the scales), launched "
              "as WriteKVTokensOnGridY; vllm-project/vllm issue 6429 (FP8 KV-cache models failed where the "
              "16-bit cache served)")
    killed_by = "test_write_kv_of_many_tokens"

    def write_kv_launch_fails(self, problem, key):
        return super().write_kv_launch_fails(problem, key) and problem.cache_dtype in FP8_DTYPES


# -- merges and cache operations: tokens on a grid axis, heads in one block, rows in one tile -------

class MergeTokensOnGridY(UnlaunchedOperationKernel):
    bug = ("merge_states launches one CTA per (head, token) with tokens on the grid's y axis: past 65,535 tokens "
           "the launch fails without an exception and nothing is written")
    models = ("vllm-project/vllm PR 52381 (fused kernels with the token count on grid-y: 65,536 tokens fail to "
              "launch); fla-org/flash-linear-attention PR 1239 (documents x heads on a grid axis past 65,535)")
    killed_by = "test_merge_states_of_many_tokens"

    def merge_launch_fails(self, out_a):
        return np.shape(out_a)[0] > GRID_YZ_LIMIT


#: Threads a CUDA block takes, at most; bytes a thread loads at once (one 16-byte vector).
BLOCK_THREADS, VECTOR_BYTES = 1024, 16


def threads_of_heads_in_one_block(heads: int, head_dim: int, itemsize: int) -> int:
    """Threads of a block holding ``heads`` heads of ``head_dim`` values of ``itemsize`` bytes, a
    16-byte vector a thread."""
    return heads * -(-head_dim * itemsize // VECTOR_BYTES)


class MergeHeadsInOneBlock(UnlaunchedOperationKernel):
    bug = ("merge_states launches one CTA per token holding every head, a row of head_dim / (16 bytes of values) "
           "lanes per head: past 1,024 threads (more than 64 heads of 128 in 16 bits, 32 of 256) the launch "
           "fails without an exception and nothing is written")
    models = ("lightseekorg/tokenspeed PR 330 and PR 1185 (merge_state's head axis packed into blockDim.y: 96 "
              "MLA heads of 128 ask 1,536 threads, and the launch fails)")
    killed_by = "test_merges_of_many_wide_heads_match_exact_merge"

    def merge_launch_fails(self, out_a):
        _, heads, head_dim = np.shape(out_a)
        return threads_of_heads_in_one_block(heads, head_dim, np.asarray(out_a).itemsize) > BLOCK_THREADS


class WriteKVHeadsInOneBlock(UnlaunchedOperationKernel):
    bug = ("write_kv launches one CTA per token holding every KV head, head_dim / (16 bytes of values) lanes a "
           "head: past 1,024 threads (more than 64 KV heads of 128 in 16 bits) the launch fails without an "
           "exception and nothing is written")
    models = ("vllm-project/vllm PR 26021 (reshape_and_cache as grid(num_tokens), block(num_heads * head_size / "
              "x)); LMCache/LMCache issue 4154 (a KV block transfer of 16 lanes x num_heads threads: "
              "MiniMax-M3's 128 KV heads fail to launch); gittensor-ai-lab/sparkinfer issue 201 (a KV append "
              "with blockDim = head_dim)")
    killed_by = "test_wide_head_operations_match_spec"

    def write_kv_launch_fails(self, problem, key):
        _, heads, head_dim = np.shape(key)
        return threads_of_heads_in_one_block(heads, head_dim, np.asarray(key).itemsize) > BLOCK_THREADS


class CopyBlocksHeadsInOneBlock(UnlaunchedOperationKernel):
    bug = ("copy_blocks launches one CTA per (pair, slot) holding every KV head, head_dim / (16 bytes of values) "
           "lanes a head: past 1,024 threads (more than 64 KV heads of 128 in 16 bits) the launch fails "
           "without an exception and nothing is copied")
    models = ("LMCache/LMCache issue 4154 (multi_layer_block_kv_transfer launched with blocks of "
              "min(elements_per_head, 32) x num_heads threads: 128 KV heads of 128 fail to launch)")
    killed_by = "test_wide_head_operations_match_spec"

    def copy_launch_fails(self, num_pairs, heads, head_dim, itemsize):
        return threads_of_heads_in_one_block(heads, head_dim, itemsize) > BLOCK_THREADS


#: Dims of the row tile of a merge kernel: a warp of 32 lanes, 8 values each.
MERGE_ROW_TILE = 256


class MergeRowTileOf256(SteppedKernelBackend):
    bug = ("merge_states holds a row in a tile of 256 dims (a warp of 32 lanes, 8 values each): out's dims past "
           "the 256th never written")
    models = ("merge kernels dispatched for head dims up to 256 while MLA's value dim is 512 "
              "(flashinfer-ai/flashinfer PR 761: merges asked for head_dim 192 and 512)")
    killed_by = "test_merges_of_many_wide_heads_match_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        out, lse = super()._merge_states(out_a, lse_a, out_b, lse_b)
        out = np.array(out)
        out[..., MERGE_ROW_TILE:] = 0
        return out, lse


# -- a sequence of more than 65,536 keys -------------------------------------------------------

#: Split parts a fixed-size merge holds (a shared-memory array of one entry per part).
MERGE_MAX_PARTS = 64
#: Positions an unsigned 16-bit integer holds.
UINT16_POSITIONS = 2**16


class SplitMergeHoldsAtMost64Parts(AddressedKernelBackend):
    bug = "split-KV merge holds at most 64 parts (a fixed shared-memory array): parts past the 64th are dropped"
    models = ("flashinfer-ai/flashinfer PR 4573 (reduce kernels covering 32 splits, one per lane, unchecked); "
              "ROCm/aiter PR 3669 (split LSE scales in an LDS array of max_splits entries)")
    killed_by = "test_very_long_sequences_match_spec"

    def merge(self, states):
        return super().merge(states[:MERGE_MAX_PARTS])


#: Multiprocessors of an H100 or H200, and the split-KV parts a per-core workspace holds for each.
GPU_SMS = 132
WORKSPACE_PARTS_PER_SM = 2
#: Keys from which SplitPartialsSizedPerCore splits a sequence of a batch of fewer pairs than
#: GPU_SMS, into parts of PART_KEYS and more, at most MERGE_MAX_PARTS a sequence.
WORKSPACE_SPLIT_MIN_KEYS = 4096


class SplitPartialsSizedPerCore(AddressedKernelBackend):
    bug = ("splits every sequence of 4,096 keys and more of a batch of fewer (sequence, KV head) pairs than the "
           "GPU's 132 multiprocessors (at most 64 parts each), but sizes the parts' workspace from a per-core "
           "heuristic, two parts a multiprocessor: a batch of many long sequences has more, and the parts past "
           "the 264th are never stored, so the merge reads what the workspace held (NaN)")
    models = ("hw-native-sys/simpler PR 683 (split-KV workspace sized by a per-core heuristic, block_dim x "
              "SPLITKV_RATIO: 3.7 MB for 256 sequences of 8,192 keys on one KV head, which need 46 MB, written "
              "out of bounds); vllm-project/vllm PR 45844 (a split-KV scratchpad sized for fewer query heads than "
              "a split writes: its outputs overlapped the reduction's flags)")
    killed_by = "test_split_batches_match_spec"

    def _run(self, plan, query, key_cache, value_cache):
        self.parts_stored = 0
        return super()._run(plan, query, key_cache, value_cache)

    def parts(self, blocks, length, problem):
        self.first_part = None
        if length < WORKSPACE_SPLIT_MIN_KEYS or problem.num_seqs * problem.num_kv_heads >= GPU_SMS:
            return [blocks]
        per_part = max(-(-PART_KEYS // problem.block_size), -(-len(blocks) // MERGE_MAX_PARTS))
        cut = [blocks[i:i + per_part] for i in range(0, len(blocks), per_part)]
        self.first_part, self.parts_stored = self.parts_stored, self.parts_stored + len(cut)
        return cut

    def merge(self, states):
        if self.first_part is None:
            return super().merge(states)
        capacity = WORKSPACE_PARTS_PER_SM * GPU_SMS
        return super().merge([state if self.first_part + i < capacity else _unwritten(state, True)
                              for i, state in enumerate(states)])


class Fp8SplitMergeHoldsAtMost64Parts(AddressedKernelBackend):
    bug = ("the fp8-cache path's split-KV merge holds at most 64 parts (the 16-bit path's holds them all): on fp8 "
           "caches, parts past the 64th are dropped")
    models = ("flashinfer-ai/flashinfer PR 4573 and ROCm/aiter PR 3669 (merges of a fixed number of splits), in a "
              "separate fp8 path whose plan splits finer than the 16-bit one; "
              "vllm-project/vllm issue 6429 (FP8 KV-cache models failed at contexts the 16-bit cache served)")
    killed_by = "test_very_long_sequences_with_fp8_caches_match_spec"

    def merge(self, states):
        return super().merge(states[:MERGE_MAX_PARTS] if self.cache_dtype in FP8_DTYPES else states)


class KeyPositionsIn16Bits(AddressedKernelBackend):
    bug = ("a key's position is held in 16 bits where its block-table column and slot are found: the key at "
           "p >= 65,536 is read from position p - 65,536")
    models = ("ml-explore/mlx issue 3360 (key positions in a 16-bit short in the SDPA kernel's mask: "
              "wrong past 32K keys)")
    killed_by = "test_very_long_sequences_match_spec"

    def locate(self, p, block_size):
        return super().locate(p % UINT16_POSITIONS, block_size)


class KeyPositionsIn16BitsOfShortQueryBatches(KeyPositionsIn16Bits):
    bug = ("on varlen batches of at most SHORT_QUERY_BATCH_ROWS queries a sequence, which take a path of their "
           "own (speculative decoding's verify), a key's position is held in 16 bits where its block-table column "
           "and slot are found: the key at p >= 65,536 is read from position p - 65,536; decode batches and "
           "longer queries right")
    models = ("ml-explore/mlx issue 3360 (key positions in a 16-bit short: wrong past 32K keys) on the verify "
              "path that vllm-project/flash-attention PRs 176 and 190 give split-KV to, a path of its own beside "
              "decode's")
    killed_by = "test_very_long_sequences_match_spec"

    def read_block(self, slots, row, j, problem):
        self.short_queries = is_short_query_batch(problem)
        return super().read_block(slots, row, j, problem)

    def locate(self, p, block_size):
        if self.short_queries:
            return super().locate(p, block_size)
        return AddressedKernelBackend.locate(self, p, block_size)


class RangeKeyOffsetsIn16Bits(AddressedKernelBackend):
    bug = ("a key's offset within its CTA's range is held in 16 bits: in a range walked whole past 65,536 keys (a "
           "batch of more than SPLIT_MAX_SEQS sequences, which no plan splits: a batch that fills the GPU), "
           "the key at offset o >= 65,536 is read from offset o - 65,536; split parts, a thousand keys or so, never "
           "reach it")
    models = ("ml-explore/mlx issue 3360 (key positions in a 16-bit short: wrong past 32K keys) on the path that "
              "walks each sequence whole, which engines take for large batches (pegainfer-project/pegainfer PR 623: "
              "split-KV decode up to a batch of 32, a non-partitioned kernel above)")
    killed_by = "test_very_long_batches_match_spec"

    def read_block(self, slots, row, j, problem):
        self.whole_ranges = problem.num_seqs > SPLIT_MAX_SEQS and self.wraps_on(problem)
        return super().read_block(slots, row, j, problem)

    def wraps_on(self, problem: AttentionProblem) -> bool:
        """Whether this problem's path holds the offset in 16 bits (every path here)."""
        return True

    def locate(self, p, block_size):  # a range walked whole starts at key 0
        return super().locate(p % UINT16_POSITIONS if self.whole_ranges else p, block_size)


class RangeKeyOffsetsIn16BitsOfShortQueryBatches(RangeKeyOffsetsIn16Bits):
    bug = ("on varlen batches of at most SHORT_QUERY_BATCH_ROWS queries a sequence, which take a path of their "
           "own (speculative decoding's verify), a key's offset within its CTA's range is held in 16 bits: in a "
           "range walked whole past 65,536 keys, the key at offset o >= 65,536 is read from offset o - 65,536; "
           "decode batches right")
    models = ("the bug of RangeKeyOffsetsIn16Bits on the verify path, which engines run beside decode's "
              "(vllm-project/flash-attention PRs 176 and 190 give it split-KV of its own, unsplit at large batch)")
    killed_by = "test_very_long_batches_match_spec"

    def wraps_on(self, problem):
        return is_short_query_batch(problem)


class Fp8RangeKeyOffsetsIn16Bits(RangeKeyOffsetsIn16Bits):
    bug = ("the fp8-cache decode path (its own stages and steps) holds a key's offset within its CTA's range in 16 "
           "bits: on fp8 caches, in a range walked whole past 65,536 keys, the key at offset o >= 65,536 is read "
           "from offset o - 65,536; the 16-bit path's ranges are right")
    models = ("the bug of RangeKeyOffsetsIn16Bits in a separate fp8 decode path; vllm-project/vllm issue 6429 "
              "(FP8 KV-cache models failed at contexts the 16-bit cache served)")
    killed_by = "test_very_long_batches_match_spec"

    def wraps_on(self, problem):
        return problem.cache_dtype in FP8_DTYPES


def _int16(values: np.ndarray) -> np.ndarray:
    """``values`` as a signed 16-bit integer (a ``short``) holds them: two's complement wrap-around."""
    return (np.asarray(values, dtype=np.int64) + 2**15) % 2**16 - 2**15


class WindowMaskIn16BitPositions(AddressedKernelBackend):
    bug = ("the sliding window's test compares key and query positions held in 16 bits (a signed short): past "
           "32,767 they wrap, and keys far outside the window pass it")
    models = ("ml-explore/mlx issue 3360 (mask positions in a 16-bit short in the SDPA kernel: 2 to 10 times the "
              "output past 32K keys when the mask hides most positions)")
    killed_by = "test_very_long_sequences_with_a_window_match_spec"

    def visible(self, p, p_q, length, problem):
        if problem.sliding_window is None:
            return super().visible(p, p_q, length, problem)
        vis = super().visible(p, p_q, length, replace(problem, sliding_window=None))
        return vis & (_int16(p)[None, :] > _int16(p_q)[:, None] - problem.sliding_window)


class SplitWindowEdgeOfTheFirstQuery(AddressedKernelBackend):
    bug = ("the few-query kernel (varlen batches of at most SHORT_QUERY_BATCH_ROWS queries a sequence: "
           "speculative decoding's verify) takes, on a split sequence (SPLIT_MIN_KEYS keys or more in a small "
           "batch) of 16-bit caches, the sliding window's left edge of the sequence's first query for every query "
           "row: row i sees the i keys left of its window too; unsplit sequences, decode, fp8 caches and longer "
           "queries right")
    models = ("flashinfer-ai/flashinfer issue 3864 (a speculative verify that mis-computed a few rows once a "
              "sequence passed the sliding window, and was right on one query a sequence), on 16-bit caches")
    killed_by = "test_very_long_sequences_with_a_window_match_spec"
    #: The path's caches (fp8 or not) and the batches it takes.
    fp8 = False
    batches = staticmethod(is_short_query_batch)

    def on_its_path(self, problem: AttentionProblem) -> bool:
        """Whether the faulty kernel runs ``problem``'s sequences: its caches and batches."""
        return (problem.cache_dtype in FP8_DTYPES) == self.fp8 and self.batches(problem)

    def visible(self, p, p_q, length, problem):
        split = length >= SPLIT_MIN_KEYS and problem.num_seqs <= SPLIT_MAX_SEQS
        if not split or problem.sliding_window is None or not self.on_its_path(problem):
            return super().visible(p, p_q, length, problem)
        vis = super().visible(p, p_q, length, replace(problem, sliding_window=None))
        return vis & (p[None, :] > p_q[0] - problem.sliding_window)


class SplitWindowEdgeOfTheFirstQueryOnFp8(SplitWindowEdgeOfTheFirstQuery):
    bug = ("the few-query kernel of fp8 caches (varlen batches of at most SHORT_QUERY_BATCH_ROWS queries a "
           "sequence) takes, on a split sequence (SPLIT_MIN_KEYS keys or more in a small batch), the sliding "
           "window's left edge of the sequence's first query for every query row: row i sees the i keys left of "
           "its window too; unsplit sequences, decode, 16-bit caches and longer queries right")
    models = ("flashinfer-ai/flashinfer issue 3864 (a speculative verify of bfloat16 queries on fp8 caches "
              "mis-computed a few rows once a sequence passed the sliding window; right without the window, on "
              "fp8 queries, and on one query a sequence), on a path of at most 4 queries a sequence")
    killed_by = "test_long_sequences_with_fp8_caches_under_a_window_match_spec"
    fp8 = True


class SplitWindowEdgeOfTheFirstQueryOfFp8Verify(SplitWindowEdgeOfTheFirstQuery):
    bug = ("the verify kernel of fp8 caches (varlen batches of 5 to VERIFY_BATCH_ROWS queries a sequence) "
           "takes, on a split sequence (SPLIT_MIN_KEYS keys or more in a small batch), the sliding window's left "
           "edge of the sequence's first query for every query row: row i sees the i keys left of its window too; "
           "unsplit sequences, up to 4 queries a sequence, 16-bit caches and longer queries right")
    models = ("flashinfer-ai/flashinfer issue 3864 (trtllm-gen's speculative verify of 8 queries a sequence, "
              "bfloat16 queries on fp8 caches, mis-computed a few rows once a sequence passed the sliding window; "
              "right on 1, 2 or 4 queries a sequence, without the window, and on fp8 queries)")
    killed_by = "test_long_verify_batches_match_spec"
    fp8 = True
    batches = staticmethod(is_verify_batch)


# -- many sequences sharing a long prefix: a cascade path ----------------------------------------

#: Sequences, and keys of a prefix they all share, from which the cascade kernel takes its
#: cascade path (vLLM's FlashAttention backend asks for a common prefix of 256 tokens and more).
CASCADE_MIN_SEQS, CASCADE_MIN_KEYS = 8, 256


class CascadeKernelBackend(SteppedKernelBackend):
    """The stepped kernel with a cascade path (not registered; base of the cascade mutants): where
    at least :data:`CASCADE_MIN_SEQS` sequences share their first blocks (:data:`CASCADE_MIN_KEYS`
    keys and more) and every query lies past them, one pass runs every query over the shared
    prefix and another over each sequence's own keys, and their states merge by lse."""

    name = "cascade-kernel"
    description = "the stepped kernel computing a prefix every sequence shares once, merged with each suffix"

    #: the logical blocks [first, stop) and the block-table rows of the pass under way (None: all, the plan's)
    _visit: tuple[int, int] | None = None
    _rows: np.ndarray | None = None

    # -- steps ------------------------------------------------------------------------------
    def compared_rows(self, problem: AttentionProblem) -> np.ndarray:
        """The block-table rows whose common leading blocks are taken as the batch's shared prefix: all."""
        return problem.block_tables

    def shared_blocks(self, problem: AttentionProblem) -> int:
        """Leading block-table columns alike in :meth:`compared_rows`, within every sequence's blocks."""
        lens = problem.seq_lens.astype(np.int64)
        needed = int((-(-lens // problem.block_size)).min()) if len(lens) else 0
        tables = self.compared_rows(problem)[:, :needed]
        alike = (tables == tables[:1]).all(axis=0)
        return int(alike.argmin()) if not alike.all() else needed

    def prefix_rows(self, problem: AttentionProblem, blocks: int) -> np.ndarray:
        """The block-table rows the prefix pass reads: the plan's."""
        return problem.block_tables

    def prefix_lse(self, lse: np.ndarray) -> np.ndarray:
        """The prefix pass's lse ``[T, Hq]`` as the merge reads it."""
        return lse

    def cascade_blocks(self, problem: AttentionProblem) -> int:
        """Blocks of the cascade path's prefix (0: no cascade path)."""
        blocks = self.shared_blocks(problem)
        if problem.num_seqs < CASCADE_MIN_SEQS or blocks * problem.block_size < CASCADE_MIN_KEYS:
            return 0
        if int(problem.token_positions()[1].min()) < blocks * problem.block_size:
            return 0
        return blocks

    def table_row(self, plan, s):
        return super().table_row(plan, s) if self._rows is None else self._rows[s]

    def logical_blocks(self, length, block_size, p_q, problem):
        blocks = super().logical_blocks(length, block_size, p_q, problem)
        if self._visit is None:
            return blocks
        first, stop = self._visit
        return [j for j in blocks if first <= j < stop]

    # -- the kernel -----------------------------------------------------------------------------
    def _run(self, plan, query, key_cache, value_cache):
        problem = plan.problem
        blocks = self.cascade_blocks(problem)
        if blocks == 0:
            return super()._run(plan, query, key_cache, value_cache)
        both = replace(plan, problem=replace(problem, return_lse=True))  # each pass's lse, for the merge
        wide = np.asarray(query).astype(F32)  # each pass's out in float32, rounded once after the merge
        try:
            self._visit, self._rows = (0, blocks), self.prefix_rows(problem, blocks)
            out_p, lse_p = super()._run(both, wide, key_cache, value_cache)
            self._visit, self._rows = (blocks, 2**62), None
            out_s, lse_s = super()._run(both, wide, key_cache, value_cache)
        finally:
            self._visit = self._rows = None
        out, lse = merge_states(out_p, self.prefix_lse(lse_p), out_s, lse_s)
        return out.astype(np.asarray(query).dtype), (lse.astype(F32) if problem.return_lse else None)


class CascadePrefixLseTransposed(CascadeKernelBackend):
    bug = ("the cascade path's prefix pass writes its lse as [query heads, tokens] and the merge reads it as "
           "[tokens, query heads]: each row's prefix is weighed by another row's lse")
    models = ("vllm-project/vllm PR 22003 (cascade attention's prefix lse, a non-contiguous view, read as "
              "contiguous: garbled output when 128 requests share a system prompt); "
              "vllm-project/vllm issue 22103 (cascade attention's accuracy loss on a batch of repeated prompts)")
    killed_by = "test_shared_prefix_batches_match_spec"

    def prefix_lse(self, lse):
        return np.ascontiguousarray(lse.T).reshape(lse.shape)


class CascadePrefixOfTheFirstSequence(CascadeKernelBackend):
    bug = ("the cascade path finds the shared prefix from the first two sequences' block tables and reads it "
           "from the first sequence's row for every sequence: a batch of two prefix groups reads the second "
           "group's prefix from the first's blocks")
    models = ("vllm-project/vllm PR 55227 (a common prefix found for requests that do not share one: the "
              "cascade path used the first request's prefix block table for the others); "
              "vllm-project/vllm issue 22103 (a batch of 32 repeats of one prompt and 18 of another)")
    killed_by = "test_two_shared_prefix_batches_match_spec"

    def compared_rows(self, problem):
        return problem.block_tables[:2]

    def prefix_rows(self, problem, blocks):
        rows = problem.block_tables.copy()
        rows[:, :blocks] = rows[0, :blocks]
        return rows


# -- a sequence of more than a million keys ----------------------------------------------------

#: Keys a merge sized for a 131,072-key context holds the parts of (128 parts of PART_KEYS).
MERGE_MAX_KEYS = 2**17


class SplitMergeSizedFor128KKeys(AddressedKernelBackend):
    bug = ("split-KV merge sized for a 131,072-key context (128 parts of 1,024 keys): the parts past the 128th "
           "are dropped")
    models = ("ROCm/vllm PR 22 (custom paged attention's reduction wrong past a 16K context) and PR 238 (its "
              "reduction's cases widened to 128K keys of 256-key partitions); vllm-project/vllm PR 39001 (the "
              "ROCm custom op capped at 131,072 keys until a multi-pass reduction)")
    killed_by = "test_million_key_sequences_match_spec"

    def merge(self, states):
        return super().merge(states[:MERGE_MAX_KEYS // PART_KEYS])


# -- a sequence past 2**31 bytes of keys and values --------------------------------------------

class SplitPlanOfInt32KVBytes(AddressedKernelBackend):
    bug = ("the split plan sizes a sequence's work from its K and V bytes, L * 2 * head_dim * itemsize, in int32: "
           "from 2**31 bytes on the size is negative and the plan covers no key")
    models = ("Dao-AILab/flash-attention PR 2662 (a tile scheduler sized its L2 swizzle from seqlen_k * (headdim + "
              "headdim_v) * element_size in int32: negative past about 4M keys at head_dim 128 in bfloat16, and the "
              "kernel decoded work out of range)")
    killed_by = "test_sequences_past_2_31_bytes_of_keys_and_values_match_spec"

    def parts(self, blocks, length, problem):
        per_key = 2 * problem.head_dim * numpy_dtype(problem.cache_dtype).itemsize
        covered = max(0, int(_wrap_int32(np.array([length * per_key]))[0])) // per_key
        if covered >= length:
            return super().parts(blocks, length, problem)
        return super().parts(blocks[:-(-covered // problem.block_size)], covered, problem)


# -- chunks of many queries after long contexts --------------------------------------------------

#: Queries of a prefill tile of the mutant below.
QUERY_TILE = 64


class SplitSkipsPartsPastItsQueryTile(AddressedKernelBackend):
    bug = ("split-KV prefill in 64-query tiles: a tile skips the parts that begin past its last query's "
           "position without writing their partials, and the merge reads what the buffer held (NaN)")
    models = ("NVIDIA/cudnn-frontend PR 768 (a split that holds no key of a tile must still write O = 0, "
              "lse = -inf, the merge's identity); ROCm/aiter PR 3606 (chunked prefill's split reduction: "
              "final lse wrong)")
    killed_by = "test_long_chunks_match_spec"

    def parts(self, blocks, length, problem):
        parts = super().parts(blocks, length, problem)
        self._part_starts = [part[0] * problem.block_size if part else length for part in parts]
        return parts

    def visible(self, p, p_q, length, problem):
        self._p_q = p_q  # the rows of the sequence being computed
        return super().visible(p, p_q, length, problem)

    def merge(self, states):
        if len(states) == 1:
            return super().merge(states)
        p_q = np.asarray(self._p_q)
        tile_last = p_q[np.minimum((np.arange(p_q.size) // QUERY_TILE + 1) * QUERY_TILE, p_q.size) - 1]
        # [n, 1]: rows of tiles that skip a part
        return super().merge([_unwritten(state, (tile_last < start)[:, None])
                              for start, state in zip(self._part_starts, states, strict=True)])


# -- long rows: sums of many keys, and weights far below the maximum -----------------------------

#: Weights under this fraction of the running maximum vanish in the two mutants below: half of
#: float8 e4m3's smallest step, 2**-9, where a cast rounds them to 0.
NEGLIGIBLE_WEIGHT = 2.0**-10


def _sixteen_bit(kernel: SteppedKernelBackend) -> bool:
    """Whether the call ``kernel`` is running has 16-bit queries (the path of the mutants below)."""
    return bool(kernel.query_dtype != np.float32)


class TailWeightsFlushed(SteppedKernelBackend):
    bug = ("with fp8 caches and 16-bit queries P V takes P in float8 e4m3, whose smallest step is 2**-9: weights "
           "under 2**-10 of the running max flush to 0 while l counts them, so a long row whose mass lies in many "
           "small weights loses it")
    models = ("ROCm/FlyDSL PR 1020 (fp8 attention casts P to e4m3 before P V: with thousands of keys most "
              "weights fall below 2**-9, l still counts them, rows keep 64% of their weight)")
    killed_by = "test_long_tails_with_fp8_caches_match_spec"

    def weighted_values(self, p_ij, visible, v):
        if self.cache_dtype in FP8_DTYPES and _sixteen_bit(self):
            p_ij = np.where(p_ij < F32(NEGLIGIBLE_WEIGHT), F32(0), p_ij)
        return super().weighted_values(p_ij, visible, v)


class SkipsNegligibleBlocks(SteppedKernelBackend):
    bug = ("with 16-bit queries a block whose weights are all under 2**-10 of the running max is skipped, neither "
           "l nor O updated: skip-softmax with a fixed threshold, right on short rows, wrong where such blocks hold "
           "the mass")
    models = ("skip-softmax block skipping (BLASST) left on for exact attention: lightseekorg/tokenspeed PR 1359 "
              "(a nonzero threshold must be calibrated per sequence length); quic/efficient-transformers PR 1009 "
              "(its threshold divided by the context length)")
    killed_by = "test_long_tails_match_spec"

    def update(self, m, l, O, s_ij, visible, v):
        m_new, l_new, O_new = super().update(m, l, O, s_ij, visible, v)
        if not _sixteen_bit(self):
            return m_new, l_new, O_new
        with np.errstate(invalid="ignore"):
            skip = s_ij.max(axis=-1) < m + F32(np.log(NEGLIGIBLE_WEIGHT))  # [n, Hq]; NaN never skips
        return (np.where(skip, m, m_new), np.where(skip, l, l_new), np.where(skip[..., None], O, O_new))


# -- a split plan used as an engine uses it: run once per layer, on other arrays ------------------

def _split_sequences(backend: AddressedKernelBackend, problem: AttentionProblem) -> list[int]:
    """The sequences of ``problem`` that ``backend`` cuts into more than one part, in batch order."""
    bs = problem.block_size
    return [s for s, length in enumerate(problem.seq_lens)
            if len(backend.parts(list(range(-(-int(length) // bs))), int(length), problem)) > 1]


def _leave_split_rows_unwritten(backend: AddressedKernelBackend, problem: AttentionProblem, out: np.ndarray,
                                lse: np.ndarray | None) -> None:
    """Set the rows of the sequences ``backend`` splits back to what out and lse held before any
    merge wrote them (0 and -inf), in place."""
    starts = problem.query_start_loc
    for s in _split_sequences(backend, problem):
        out[starts[s]:starts[s + 1]] = 0
        if lse is not None:
            lse[starts[s]:starts[s + 1]] = -np.inf


def _plan_splits(backend: AddressedKernelBackend, problem: AttentionProblem) -> bool:
    """Whether ``backend`` cuts a sequence of ``problem`` into more than one part (a split plan)."""
    return bool(_split_sequences(backend, problem))


class SplitMergeInArrivalOrder(AddressedKernelBackend):
    bug = ("split-KV merge adds the parts' rescaled l and O in the order the parts finish, which changes from "
           "run to run: the same call gives other bits")
    models = ("ROCm/aiter issue 4364 (a long-context decode's split-K reduce: run-to-run different outputs at "
              "temperature 0); merges by atomicAdd into float32 partial sums")
    killed_by = "test_long_plans_serve_many_runs"

    runs = 0

    def _run(self, plan, query, key_cache, value_cache):
        self.runs += 1
        return super()._run(plan, query, key_cache, value_cache)

    def merge(self, states):
        # on every other run the parts finish last to first
        return super().merge(states[::-1] if self.runs % 2 == 0 else states)


class SplitPlanBindsFirstRunArrays(LaunchBindsFirstRunArrays, AddressedKernelBackend):
    bug = ("a split plan caches its launches (the parts, then the merge) with its first run's query and caches: "
           "later runs of it read those arrays; a plan that does not split launches afresh")
    models = ("flashinfer-ai/flashinfer PR 5080 (an identity-memoised plan replayed without re-pointing it at the "
              "new call's buffers), in a split-KV path's own launch cache")
    killed_by = "test_long_plans_serve_many_runs"

    def caches_launch(self, plan):
        return _plan_splits(self, plan.problem)


class SplitPartialsNeverFreed(AddressedKernelBackend):
    bug = ("a split plan's run allocates its parts' partial m, l and O anew and never frees them: every run of a "
           "long sequence leaves them behind; a plan that does not split allocates none")
    models = ("apache/tvm PR 14723 (a workspace cudaMalloc'ed on every attention call and never freed); "
              "split-KV partial buffers allocated per call outside the framework's allocator")
    killed_by = "test_long_runs_hold_no_memory"

    def merge(self, states):
        if len(states) > 1:
            self.__dict__.setdefault("partials", []).append([np.array(x) for state in states for x in state])
        return super().merge(states)


class SplitMergeCounterNeverReset(AddressedKernelBackend):
    bug = ("split-KV merged by the part of a range that counts itself last, in a counter that plan zeroes once "
           "and the merging part never sets back: a plan's first run merges, and in its later runs no part "
           "counts to the range's number, so the split sequences' rows are never written")
    models = ("ROCm/aiter PR 4916 (a split-K counter zeroed once where it is allocated: a replay finds it "
              "non-zero); a fused split-KV merge whose arrival counters live in the plan (the cupy backend's)")
    killed_by = "test_long_plans_serve_many_runs"

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        runs = self.__dict__.setdefault("runs_of_plan", {})  # by live plan: an id is dropped with its plan
        if id(plan) not in runs:
            weakref.finalize(plan, runs.pop, id(plan), None)
        runs[id(plan)] = runs.get(id(plan), 0) + 1
        if runs[id(plan)] > 1:  # no merge: the split rows keep what they held
            _leave_split_rows_unwritten(self, plan.problem, out, lse)
        return out, lse


# -- split batches of long and short sequences, and of ragged query counts ----------------------

class MisplacedMergeRows(AddressedKernelBackend):
    """The addressed kernel whose split-KV merge writes each split sequence's rows from a row of
    :meth:`merged_row_start` on (not registered; base of the two mutants below). Only the merge
    writes a split sequence's rows, so rows it misses keep what out and lse held (0 and -inf)."""

    def merged_row_start(self, problem: AttentionProblem, rank: int, s: int) -> int:
        """The first row the merge writes split sequence ``s`` (the ``rank``-th split one) to: its own."""
        return int(problem.query_start_loc[s])

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        problem = plan.problem
        split = _split_sequences(self, problem)
        starts = problem.query_start_loc
        wrong_out, wrong_lse = out.copy(), None if lse is None else lse.copy()
        _leave_split_rows_unwritten(self, problem, wrong_out, wrong_lse)
        for rank, s in enumerate(split):
            first = self.merged_row_start(problem, rank, s)
            rows = max(0, min(int(starts[s + 1] - starts[s]), problem.num_tokens - first))
            wrong_out[first:first + rows] = out[starts[s]:starts[s] + rows]
            if wrong_lse is not None and lse is not None:
                wrong_lse[first:first + rows] = lse[starts[s]:starts[s] + rows]
        return wrong_out, wrong_lse


class SplitMergeWritesTheKthSequencesRows(MisplacedMergeRows):
    bug = ("split-KV merge runs over the split sequences alone and writes the k-th one's rows from the first row "
           "of the batch's k-th sequence: right while the split sequences come first; after a short sequence that "
           "is not split, the short one's rows get a long one's output and the long one's rows are never written")
    models = ("pytorch/pytorch PR 194168 (the split-KV combine kernel addressed a varlen batch's output by a "
              "batch index its path never set: every sequence's rows written over the first one's, the rest never "
              "written); vllm-project/flash-attention PR 190 (its combine kernel made to address out and lse "
              "through cu_seqlens_q)")
    killed_by = "test_mixed_length_batches_match_spec"

    def merged_row_start(self, problem, rank, s):
        return int(problem.query_start_loc[rank])


class SplitMergeRowsOfAPaddedBatch(MisplacedMergeRows):
    bug = ("split-KV merge writes split sequence s's rows from row s x (the batch's most queries a sequence) on, "
           "the padded layout: right while every sequence has as many queries; in a varlen batch of other counts "
           "rows land on other sequences' and some are never written")
    models = ("vllm-project/flash-attention PR 190 (the split-KV combine's lse write assumed uniform query "
              "lengths and its out was addressed by an unset batch stride: made to address rows through "
              "cu_seqlens_q); Dao-AILab/flash-attention PR 2542 (varlen split-KV's combine addresses rows of a "
              "padded layout)")
    killed_by = "test_long_speculative_batches_match_spec"

    def merged_row_start(self, problem, rank, s):
        return s * int(problem.q_lens.max(initial=0))


class UniformSplitKernelBackend(AddressedKernelBackend):
    """The addressed kernel splitting every sequence of a split batch into the parts of its longest
    (parts of one length, as many as the longest needs: a short sequence's later parts hold no
    key, and a padding entry's, ``L = 0``, none), as a grid of (sequence, part) programs does
    (not registered; base of the two mutants below). Unmodified it passes the suite."""

    name = "uniform-split-kernel"
    description = "the addressed kernel giving every sequence of a split batch as many parts as its longest"

    def parts(self, blocks, length, problem):
        longest = int(problem.seq_lens.max())
        longest_parts = super().parts(list(range(-(-longest // problem.block_size))), longest, problem)
        per_part = max(1, len(longest_parts[0]))
        self._past_end = [i * per_part >= len(blocks) for i in range(len(longest_parts))]
        return [blocks[i * per_part:(i + 1) * per_part] for i in range(len(longest_parts))]


class SplitPartsPastItsEndUnwritten(UniformSplitKernelBackend):
    bug = ("split-KV gives every sequence of a split batch the parts of its longest (parts of one length, as many "
           "as the longest needs); a part that begins at or past its sequence's end exits without writing its "
           "partials, and the merge reads what the buffer held (NaN)")
    models = ("vllm-project/flash-attention PR 190 (split partials pre-initialised to O = 0, lse = -inf so that "
              "early-exit splits cannot leak garbage into the combine); flash-attention's split-KV kernel writes "
              "O = 0 and lse = -inf for a split past a sequence's keys for the same reason")
    killed_by = "test_mixed_length_batches_match_spec"

    def merge(self, states):
        if len(states) == 1:
            return super().merge(states)
        return super().merge([_unwritten(state, past) for state, past in zip(states, self._past_end, strict=True)])


class SplitMergeOfEmptyPartsNaN(UniformSplitKernelBackend):
    bug = ("split-KV merge weighs each part by exp(lse_i - max lse) with no guard for a max of -inf: a row whose "
           "parts are all empty (a padding entry, L = 0, in a split batch) gets exp(-inf + inf) = NaN")
    models = ("flashinfer-ai/flashinfer issue 4051 (merging states that are all empty gives NaN, in merge_states "
              "and the persistent kernels' reductions); vllm-project/vllm PR 28181 and PR 39148 (merge_attn_states "
              "NaN where both lse are -inf)")
    killed_by = "test_mixed_length_batches_match_spec"

    def merge(self, states):
        m, l, O = super().merge(states)
        if len(states) == 1:
            return m, l, O
        empty = np.all([np.isneginf(m_i) for m_i, _, _ in states], axis=0)  # [n, Hq]
        return _unwritten((m, l, O), empty)
