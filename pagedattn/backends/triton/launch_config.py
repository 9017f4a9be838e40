"""Launch choices of the Triton backend, from a fixed table (never autotuned inside a call).

Pure Python, no triton import: the plan calls these once per batch.

- :func:`choose_tiles`: tile shape and warps from the batch's longest ``q_len``, the GQA
  group size, head_dim, dtype and (decode only) the block size.
- :func:`choose_num_splits`: the split-KV count, from a wave model of the grid. A program
  streams its key range; the programs on one multiprocessor share its bandwidth, which they
  reach in full from ``saturation`` programs on (past it, contention costs
  ``OVERSUBSCRIBED``), and at most ``resident`` fit there at once. So a wave of ``c``
  programs a multiprocessor, each over ``1/s`` of its range (in whole tiles), takes
  ``max(c, saturation) / s``, and the grid the sum over its waves (:func:`estimated_waves`).
  The count is the fastest so estimated (the smallest of equals), among counts that leave
  every split ``MIN_TILES_PER_SPLIT`` key tiles and the grid ``MAX_SPLIT_WAVES`` waves, up to
  ``MAX_SPLITS``. Splits only partition the key range: which keys count never depends on the
  choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

PROGRAMS_PER_SM = 2  # resident programs per multiprocessor assumed when the tiles do not say
MIN_TILES_PER_SPLIT = 4  # key tiles a split must have for the extra merge to pay
MAX_SPLITS = 64  # bound on the partial buffers: [num_splits, T, Hq, D] float32
MAX_SPLIT_WAVES = 4  # split grids of more waves than this: each program's start costs more than the tail saves
OVERSUBSCRIBED = 0.05  # a wave past saturation runs this much slower than its bytes say (contention)
MAX_GROUP_TILE = 64  # query heads of one KV head served by one program at most
MAX_HEAD_DIM = 512  # larger head_dims exceed registers/shared memory: reported unsupported


class DecodeTiles(NamedTuple):
    """One entry of the decode tile table."""

    block_n: int  # keys per tile
    num_warps: int
    num_stages: int  # Triton gives the block-table load its own stage: K/V get fewer buffers
    resident: int  # programs per multiprocessor (registers, shared memory of the sm_90a build)
    keys_major: bool  # scores as [keys, rows]: K and V feed warpgroup MMA from shared memory
    table_by_block: bool = True  # one block-table read per tile or per block, not per key (Tiles.table_mode)
    pick_in_registers: bool = False  # a tile of one whole block still reads its entry per block (Tiles.table_mode)
    saturation: int | None = None  # programs per multiprocessor that reach its full bandwidth (None: resident)


# Decode tiles (16-bit, head_dim <= 128, 16 rows: up to 16 query heads per KV head), by block
# size (None: any other). Picked on an H200 by `tools/triton-tile-sweep --decode`: per block
# size the least t(64 x 4096) + 2 t(2 x 65536) with the perf suite's timer. 16-key tiles of 2
# warps read the block table once per tile and keep 3 K/V buffers in flight (7 stages); 152
# registers, 29 KB of shared memory: 6 programs a multiprocessor. 4 of them already reach its
# bandwidth: llama3-8b 64 x 4,096 (512 programs, 3.9 a multiprocessor) runs at 98% of the read
# ceiling unsplit and no faster split, while 40 x 4,096 (320 programs) takes 167 us in 2 splits
# against 205 us unsplit (H200, graph replay).
DECODE_TILES = DecodeTiles(16, 2, 7, 6, False, saturation=4)
# A decode tile streams the same bytes whatever head_dim and cache dtype: a tile's keys x
# row bytes is the table's keys x 256 (head_dim 128, 16 bits). Each tile costs about the same
# issue time (scores, softmax, table lookup), so half the bytes per tile would halve the
# bandwidth: at head_dim 64 (32 / 8 heads, 64 x 4,096, bf16) 16-key tiles ran at 3.0 TB/s and
# 32-key tiles of the same warps and stages at 4.1 TB/s.
DECODE_TILE_ROW_BYTES = 256
# fp8 caches at head_dim 128: 64-key tiles of 2 warps, twice a 16-bit tile's bytes, 5 stages
# (4 K/V buffers, 39 KB), and one block-table read per block picked in registers even where the
# tile is one block. Picked on an H200 by the perf suite's timer (llama3-8b heads, e4m3, bf16
# queries, 64 x 4,096, block sizes 16 / 32 / 64): 149 / 150 / 152 us, against 169 / 180 / 188 us
# for 32-key tiles of 7 stages; 4 stages took 192 us, a register cap of 168 or 128 spilled
# (266-370 us). The split model counts 4 programs a multiprocessor: values read as pairs take
# 188 registers (223 with a window and softcap), which would hold 5, but 2 x 65,536 split for 5
# (41 parts) took 103.7 us graph replay against 73.8 us in the 32 parts counted for 4. The same
# tiles serve head_dim 64 (half the bytes a tile): `tools/triton-tile-sweep --fp8-d64` (llama3.2-1b
# heads 32 / 8, e4m3, 64 x 4,096 at block sizes 16 / 32 / 64) took 84.4 / 82.0 / 82.0 us, against
# 104.0 / 98.5 / 95.8 us for the 16-bit table's tiles at four times the keys (64 keys, 7 stages)
# and 93.0 / 87.2 / 87.3 us at best for 128-key tiles. There ptxas holds them at 128 registers
# with a 4-byte spill (168 and none for the slower tiles).
FP8_DECODE_TILES = DecodeTiles(64, 2, 5, 4, False, True, True)
FP8_DECODE_HEAD_DIMS = (64, 128)  # head_dim_pad of the fp8 caches that take FP8_DECODE_TILES
# 16-bit decode at head_dim 256 (32-key tiles of 4 warps, 2 stages, 16 rows): 168 registers and
# 41 KB of shared memory on the sm_90a build: 3 programs a multiprocessor, and no fewer reach
# its bandwidth (saturation = resident). gemma3-12b heads 32 x 4,096 (256 programs) took 272 us
# unsplit, 327 us in 2 splits (a wave and a third) and 253 us in 3 (two full waves); 64 x 4,096
# 609 us unsplit, 493 us in 3 (H200, graph replay; docs/backends/triton.md).
WIDE_DECODE_RESIDENT = 3
DECODE_TABLE: dict[int | None, DecodeTiles] = {None: DECODE_TILES, 16: DECODE_TILES, 32: DECODE_TILES,
                                               64: DECODE_TILES}

# Prefill tiles (16-bit, head_dim <= 128) at their full height: rows (queries x group heads),
# keys per tile, warps, stages, and a register cap per thread (None: the compiler's choice),
# which decides how many programs share a multiprocessor.
PREFILL_ROWS = 128
PREFILL_BLOCK_N = 64
PREFILL_WARPS = 8
PREFILL_STAGES = 3
PREFILL_MAX_REGISTERS: int | None = 128  # two programs per multiprocessor: 0.71x against 0.54x cuDNN
PREFILL_TABLE_BY_BLOCK = True  # one block-table read per block (Tiles.table_mode)

# Head dims past 256 (head_dim_pad 512: Gemma 4's global layers). Picked on an H200 with the perf
# suite's timer (gemma4-26b heads 8/4, bf16, block sizes 16 / 32 / 64; read ceiling 4,385 GB/s):
# decode 32 x 4,096 in 16-key tiles of 2 warps and 6 stages, 4 programs an SM, 265.5 / 269.8 /
# 267.3 us (92 %), against 298.8-307.1 us for 4 warps and 3 stages and 402.8-421.4 us for 8
# warps and 2; causal prefill 4 x 4,096 in 64 x 32 tiles of 8 warps and 3 stages, 3.20 / 3.19 /
# 3.22 ms (172 TFLOP/s), against 10.4-10.6 ms for 32 x 16 tiles. float32 keeps 32 x 16 tiles of 8
# warps and 2 stages: its K and V tiles are twice as large, and 64 x 32 ones pass 227 KB of
# shared memory.
HUGE_DECODE_TILES = DecodeTiles(16, 2, 6, 4, False)
HUGE_PREFILL = (64, 32, 8, 3)  # rows, keys per tile, warps, stages
HUGE_FLOAT32 = (32, 16, 8, 2)


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class Tiles:
    """Tile shape of the attention kernel: rows = queries x heads, keys per tile, warps."""

    block_m: int  # rows of a program: (block_m // group_tile) queries x group_tile heads
    block_n: int  # keys per tile
    group_tile: int  # query heads of one KV head per program (power of two)
    num_group_tiles: int  # programs per KV head along the head axis
    head_dim_pad: int  # head_dim rounded up to a power of two >= 16 (tl.dot minimum)
    num_warps: int
    num_stages: int
    heads_fastest: bool = False  # launch order: the KV heads of a work item next to each other
    resident: int = PROGRAMS_PER_SM  # programs of these tiles resident on one multiprocessor
    keys_major: bool = False  # scores as [block_n, block_m] (keys first); the table uses it for decode
    max_registers: int | None = None  # register cap per thread passed to the compiler (maxnreg)
    table_by_block: bool = True  # one block-table read per tile or per block, not per key (see table_mode)
    pick_in_registers: bool = False  # mode 2 where a tile is exactly one block (see table_mode)
    saturation: int | None = None  # programs per multiprocessor that reach its bandwidth (None: resident)

    def table_mode(self, block_size: int) -> int:
        """The kernel's ``TABLE_MODE`` at ``block_size``: with ``table_by_block``, 1 (one block-table
        read per tile) where ``block_n`` divides ``block_size``, 2 (one per block, picked per key in
        registers) where ``block_size`` divides ``block_n``, and 2 where they are equal with
        ``pick_in_registers``; else 0 (one read per key)."""
        if not self.table_by_block:
            return 0
        if self.pick_in_registers and block_size == self.block_n:
            return 2
        if block_size % self.block_n == 0:
            return 1
        return 2 if self.block_n % block_size == 0 else 0

    @property
    def block_q(self) -> int:
        """Queries of one sequence per program."""
        return self.block_m // self.group_tile


def choose_tiles(max_q_len: int, group_size: int, head_dim: int, dtype: str, block_size: int | None = None,
                 decode_table: dict[int | None, DecodeTiles] | None = None, cache_bytes: int = 2) -> Tiles:
    """Pick tiles from the fixed tables (``decode_table``: this one in place of ``DECODE_TABLE``).

    Decode-like batches (``max_q_len <= 1``): one query, its group's heads padded to 16 rows (the
    tl.dot minimum, whatever the group size) or to the group's power of two above 16; for
    16-bit queries with head_dim <= 128 and 16 rows, keys per tile, warps, stages and the
    scores' orientation come from ``DECODE_TABLE`` by ``block_size``, its keys per tile
    scaled so that a tile holds the bytes of a head_dim-128 16-bit tile
    (:data:`DECODE_TILE_ROW_BYTES`: twice the keys at head_dim 64; head dims below 64 keep the
    table's), and twice that for fp8 caches (``cache_bytes`` 1) but at head_dim 64 and 128
    (:data:`FP8_DECODE_HEAD_DIMS`), where fp8 caches take :data:`FP8_DECODE_TILES` unless a
    ``decode_table`` is given; otherwise 128 keys,
    4 warps. Prefill: up to ``PREFILL_ROWS`` rows of 16-bit queries (64 for float32 or head_dim >
    128), 64 keys per tile, 8 warps at 128 rows, and the ``PREFILL_*`` entries (register cap)
    at the full height. float32 or head_dim > 128: 32 keys per tile. head_dim > 256: the
    ``HUGE_*`` entries (16-bit decode of 16 rows: :data:`HUGE_DECODE_TILES`).
    """
    decode = max_q_len <= 1
    # decode: one query per sequence, so the rows are heads; a group tile of at least 16 (the
    # tl.dot minimum) makes the tiles, and so the compiled kernel, the same for every group size
    group_tile = min(next_power_of_2(max(group_size, 16) if decode else group_size), MAX_GROUP_TILE)
    num_group_tiles = -(-group_size // group_tile)
    head_dim_pad = max(16, next_power_of_2(head_dim))
    wide = dtype == "float32" or head_dim_pad > 128
    huge = head_dim_pad > 256
    huge_rows, huge_block_n, huge_warps, huge_stages = HUGE_FLOAT32 if dtype == "float32" else HUGE_PREFILL
    max_rows = huge_rows if huge else 64 if wide else max(PREFILL_ROWS, group_tile)
    block_q = max(1, min(next_power_of_2(max_q_len), max_rows // group_tile))
    block_m = max(16, block_q * group_tile)
    block_n = huge_block_n if huge else 32 if wide else (128 if decode else 64)
    num_warps = huge_warps if huge else 8 if block_m >= 128 else 4
    num_stages = huge_stages if huge else 3 if head_dim_pad <= 128 else 2
    resident, keys_major, max_registers, table_by_block, pick_in_registers = PROGRAMS_PER_SM, False, None, True, False
    saturation: int | None = None
    if decode and not wide and block_m == 16:
        fp8_tiles = decode_table is None and cache_bytes == 1 and head_dim_pad in FP8_DECODE_HEAD_DIMS
        table = DECODE_TABLE if decode_table is None else decode_table
        entry = FP8_DECODE_TILES if fp8_tiles else table.get(block_size, table[None])
        block_n, num_warps, num_stages, resident, keys_major, table_by_block, pick_in_registers, saturation = entry
        if head_dim_pad >= 64 and not fp8_tiles:  # fp8 tiles are sized as they are; below 64 unmeasured
            block_n *= max(1, DECODE_TILE_ROW_BYTES // (head_dim_pad * cache_bytes))
    elif decode and dtype != "float32" and head_dim_pad == 256 and cache_bytes == 2 and block_m == 16:
        resident = WIDE_DECODE_RESIDENT
    elif decode and dtype != "float32" and huge and block_m == 16:
        block_n, num_warps, num_stages, resident = HUGE_DECODE_TILES[:4]
    elif not decode and not wide and block_m == PREFILL_ROWS:
        block_n, num_warps, num_stages, max_registers = (PREFILL_BLOCK_N, PREFILL_WARPS, PREFILL_STAGES,
                                                         PREFILL_MAX_REGISTERS)
        table_by_block = PREFILL_TABLE_BY_BLOCK
    # decode: the heads of a sequence read the same blocks (NHD: interleaved in memory), so
    # they run side by side; prefill: a head's K/V is reused by the next query tiles, so
    # consecutive programs take consecutive work items of one head (L2 reuse)
    return Tiles(block_m, block_n, group_tile, num_group_tiles, head_dim_pad, num_warps, num_stages,
                 heads_fastest=decode, resident=resident, keys_major=keys_major, max_registers=max_registers,
                 table_by_block=table_by_block, pick_in_registers=pick_in_registers, saturation=saturation)


def reads_value_pairs(tiles: Tiles, head_dim: int, cache_bytes: int) -> bool:
    """Whether the kernel reads value tiles as 16-bit words of two fp8 values (``V_PAIRS``): fp8
    caches on decode tiles (16 rows, scores not keys-major) at a power-of-two head_dim >= 32.
    Otherwise a value tile of fp8 bytes is gathered from shared memory a byte at a time: a
    product's operand holds two keys of one dimension in each register."""
    return (cache_bytes == 1 and tiles.block_m == 16 and not tiles.keys_major and head_dim == tiles.head_dim_pad
            and head_dim >= 32)


def estimated_waves(num_programs: int, splits: int, key_tiles: int, num_sms: int, resident: int,
                    saturation: int) -> float:
    """Time of a grid of ``num_programs`` programs, each over ``key_tiles`` tiles cut into ``splits``
    parts of ``ceil(key_tiles / splits)``, in tile times at full bandwidth: per wave of ``c``
    programs a multiprocessor, ``saturation`` programs' parts, or ``c`` and ``OVERSUBSCRIBED`` more
    past saturation."""
    left, slots, time = num_programs * splits, resident * num_sms, 0.0
    per_split = -(-max(key_tiles, 1) // splits)
    while left > 0:
        wave = min(left, slots)
        per_sm = wave / num_sms
        time += (per_sm * (1 + OVERSUBSCRIBED) if per_sm > saturation else saturation) * per_split
        left -= wave
    return time


def choose_num_splits(num_programs: int, max_key_tiles: int, num_sms: int, resident: int = PROGRAMS_PER_SM,
                      saturation: int | None = None) -> int:
    """Split-KV count for a grid of ``num_programs`` whose longest key range has ``max_key_tiles`` tiles,
    at most ``resident`` programs fitting on each of ``num_sms`` multiprocessors and ``saturation``
    (default ``resident``) reaching its bandwidth: the count :func:`estimated_waves` holds fastest,
    the smallest of equals, in at most ``MAX_SPLIT_WAVES`` waves."""
    if num_programs <= 0:
        return 1
    saturation = resident if saturation is None else min(saturation, resident)
    waves = MAX_SPLIT_WAVES * resident * num_sms // num_programs
    counts = range(1, max(1, min(max_key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS, waves)) + 1)
    times = [estimated_waves(num_programs, splits, max_key_tiles, num_sms, resident, saturation) for splits in counts]
    return min(zip(times, counts, strict=True))[1]
