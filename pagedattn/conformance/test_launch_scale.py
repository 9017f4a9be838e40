"""How kernels divide their work, at the sizes where it shows: groups wider than a tile of rows,
batches larger than one wave of CTAs (run once, with fp8 caches too, and planned once and run as
an engine runs a plan), batches that fill the GPU with sequences past 65,536 keys (ranges walked
whole past 16-bit offsets), batches of many sequences sharing a long prefix (a cascade path's), more
than 65,535 tokens, sequences or block pairs in one call (attention, write_kv, copy_blocks,
merge_states: a CUDA grid's y and z axes take no more), prefills of several query tiles per sequence (with and
without the causal mask), chunks of thousands of queries after thousands of keys (split plans of
many query tiles), a sequence of more than 65,536 keys (more split parts than a fixed-size merge
holds; positions past 16 bits; with fp8 caches, under a sliding window), and one of more than a
million keys (past what a plan or merge sized for a 131,072-key context holds), and one whose keys
and values pass 2**31 bytes (where a size in signed 32 bits wraps). The cells about
a GPU's launch limits (waves, grid axes) are unsupported for a backend run in an interpreter,
which has none.

Each cell draws one size past the limit it is about (the GPU's, not the profile's; see
:mod:`pagedattn.conformance.scale`), few examples, and stops at the first failure. The mutant
runner takes this module last: it costs the Triton interpreter minutes, and only the mutants it
exists for get this far. The many-pair and many-sequence cells come last: their cases cost the
mutants' NumPy kernel most.
"""

from __future__ import annotations

import functools

import pytest

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_scale_cell
from pagedattn.conformance.scale import (
    BATCH_KINDS,
    LONG_TAIL_KINDS,
    SPLIT_BATCH_PAIRS,
    kv_bytes_past_int32_cases,
    large_batch_cases,
    long_batch_cases,
    long_chunk_cases,
    long_prefill_cases,
    long_tail_batch_cases,
    many_pair_copy_blocks_cases,
    many_sequence_cases,
    many_token_cases,
    many_token_merge_cases,
    many_token_write_kv_cases,
    million_key_sequence_cases,
    scale_limits,
    shared_prefix_batch_cases,
    very_long_batch_cases,
    very_long_sequence_cases,
    very_long_window_sequence_cases,
    wide_group_cases,
)
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

#: 16-bit dtypes of the long-prefill cells (the prefill kernels' tensor-core paths).
PREFILL_DTYPES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_long_prefills_match_spec(request, backend, dtype):
    """1 or 2 sequences of hundreds of queries (512 rows and more each, after up to 1,000 keys of
    context): several query tiles per sequence and their causal diagonals, within the error
    model; inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, long_prefill_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="long_prefill", max_examples=limits.long_examples,
                   requires={"features": ("varlen",)})


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_long_prefills_under_negative_scales_match_spec(request, backend, dtype):
    """The long prefills under a negative explicit scale, their queries large (scores in the
    thousands) or, in bfloat16, a last query of scores near 1e10: a prefill kernel that only large
    batches reach meets the scales and magnitudes the small cells draw (a row max taken on q.k
    before scaling keeps the least score there, and exp overflows); within the error model."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_prefill_cases, negative_scale=True), checks.matches_spec,
                   limits, dtype=dtype, feature="long_prefill_negative_scale", max_examples=limits.long_examples,
                   requires={"features": ("varlen",)})


@pytest.mark.parametrize("dtype", PREFILL_DTYPES)
def test_long_non_causal_prefills_match_spec(request, backend, dtype):
    """The long prefills without the causal mask (an encoder's prompt, a bidirectional block):
    every query tile sees every key of its sequence, past its own diagonal, within the error
    model; inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_prefill_cases, causal=False), checks.matches_spec,
                   limits, dtype=dtype, feature="long_prefill_non_causal", max_examples=limits.long_examples,
                   requires={"features": ("varlen", "non_causal")})


def test_long_chunks_match_spec(request, backend):
    """1 or 2 chunks of 1,100 to 2,048 queries after 2,048 to 8,192 keys of context (a long prompt's
    chunked prefill: split plans of many query tiles, parts past the first tiles' causal bounds),
    one KV head, lse: a sample of rows, one of every 16-query tile, within the error model;
    inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, long_chunk_cases, checks.long_chunks_match_spec, limits, dtype="float16",
                   feature="long_chunks", max_examples=limits.batch_examples, requires={"features": ("varlen",)})


def test_long_chunks_under_a_window_match_spec(request, backend):
    """The long chunks under a sliding window no wider than the context (a local-attention layer's
    chunked prefill): each row's window starts at its own position, so the KV tiles a query tile
    may see whole move with its last query; a sample of rows within the error model; inputs
    untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_chunk_cases, window=True), checks.long_chunks_match_spec,
                   limits, dtype="float16", feature="long_chunks_window", max_examples=limits.batch_examples,
                   requires={"features": ("varlen", "sliding_window")})


def test_long_chunks_with_fp8_caches_match_spec(request, backend):
    """The long chunks with fp8 caches and scales (v_scale never 1) and bfloat16 queries: the fp8
    prefill paths' split plans over many query tiles, a sample of rows within the error model;
    inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_chunk_cases, fp8=True), checks.long_chunks_match_spec,
                   limits, dtype="bfloat16", feature="long_chunks_fp8", max_examples=limits.batch_examples,
                   requires={"features": ("varlen", "fp8")})


def test_long_chunks_with_tails_match_spec(request, backend):
    """The long chunks with fp8 caches, float16 queries and an attention sink over a flat tail
    (:data:`~pagedattn.conformance.scale.LONG_TAIL_KINDS`): a prefill kernel walks a row's keys
    in few parts, so one that takes P in fp8 for P V flushes a tail holding much of the row's
    mass; a sample of rows within the error model; inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_chunk_cases, fp8=True, kinds=LONG_TAIL_KINDS),
                   checks.long_chunks_match_spec, limits, dtype="float16", feature="long_chunks_tails",
                   max_examples=limits.batch_examples, requires={"features": ("varlen", "fp8")})


def test_long_tails_in_a_full_batch_match_spec(request, backend):
    """64 sequences of 2,048 keys and more on 8 KV heads, fp8 caches, float16 queries, each with an
    attention sink over a flat tail holding 40% of its mass: a batch that fills a GPU without split-KV,
    so a kernel that drops the tail's small weights (P in fp8 for P V) loses them from every row;
    within the error model. A backend run in an interpreter (thousands of key tiles, one program
    at a time) is unsupported here unless ``PAGEDATTN_SIZE=large``."""
    limits = scale_limits()
    run_scale_cell(request, backend, long_tail_batch_cases, checks.matches_spec, limits, dtype="float16",
                   feature="long_tail_batch", max_examples=limits.batch_examples,
                   requires={"features": ("fp8",), "many_programs": True})


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_wide_groups_match_spec(request, backend, dtype, batch):
    """12 to 128 query heads per KV head (wider than one tile of rows; 96, 71 and others no power of
    two), one cell of decode and one of a few queries a sequence, within the error model; inputs
    untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, wide_group_cases,
                   checks.matches_spec, limits, dtype=dtype, feature="wide_groups",
                   max_examples=limits.wide_examples, batch=batch)


#: The dtype of the large-batch and many-token cells: how work is spread over CTAs does not depend
#: on it, and a batch this large costs the Triton interpreter a minute.
LARGE_BATCH_DTYPES = ("bfloat16",)


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_long_batches_match_spec(request, backend, dtype):
    """Decode of 528 (sequence, KV head) pairs and more, each sequence 6,000 to 8,192 keys: a batch
    that fills the GPU, so no plan splits it and each CTA walks a whole sequence's range (an
    engine's 64 x 8,192 decode), within the error model; inputs untouched. A backend run in an
    interpreter (one program at a time) is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, long_batch_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="long_batch", max_examples=limits.batch_examples, requires={"launch_limits": True},
                   shrink=False)  # every case fills the GPU: a shrink step rebuilds one as large


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_long_batches_with_fp8_caches_match_spec(request, backend, dtype):
    """The long batches with fp8 caches and scales: whole ranges of thousands of keys through the fp8
    decode paths, within the error model; inputs untouched. A backend run in an interpreter is
    unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_batch_cases, fp8=True), checks.matches_spec, limits,
                   dtype=dtype, feature="long_batch_fp8", max_examples=limits.batch_examples,
                   requires={"features": ("fp8",), "launch_limits": True}, shrink=False)


@pytest.mark.parametrize("fp8", [False, True], ids=["same", "fp8"])
def test_split_batches_match_spec(request, backend, fp8):
    """Decode of 64 (sequence, KV head) pairs, each sequence 6,000 to 8,192 keys (llama3-70b's
    tensor-parallel slice first: 64 sequences, 8 query heads on one KV head): fewer pairs than
    the GPU's multiprocessors, so plans split every sequence, and the parts of all of them
    share one partials workspace; bfloat16 queries, 16-bit or fp8 caches; within the error
    model, inputs untouched. A backend run in an interpreter is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(long_batch_cases, fp8=fp8, pairs=SPLIT_BATCH_PAIRS),
                   checks.matches_spec, limits, dtype="bfloat16", feature="split_batch",
                   max_examples=limits.batch_examples, cell={"cache": "fp8" if fp8 else "same"},
                   requires={"features": ("fp8",) if fp8 else (), "launch_limits": True}, shrink=False)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("fp8", [False, True], ids=["same", "fp8"])
def test_very_long_batches_match_spec(request, backend, fp8, batch):
    """528 (sequence, KV head) pairs, each sequence past 65,536 keys, one cell of decode and one of 2
    or 3 queries a sequence: a batch that fills the GPU, so no plan splits it and each CTA walks a
    whole range past where an offset within it wraps in 16 bits (the very long cells' single
    sequences are split into short parts); bfloat16 queries, 16-bit or fp8 caches; each table
    names a few hundred blocks many times; out and lse within the error model; inputs untouched.
    A backend run in an interpreter is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(very_long_batch_cases, fp8=fp8),
                   checks.matches_spec_by_distinct_blocks, limits, dtype="bfloat16", feature="very_long_batch",
                   max_examples=limits.batch_examples, cell={"cache": "fp8" if fp8 else "same"},
                   requires={"features": ("fp8",) if fp8 else (), "launch_limits": True}, shrink=False,
                   batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_large_batches_match_spec(request, backend, dtype, batch):
    """More than 4,224 short sequences (more than one wave of CTAs of any size on the GPU), one cell
    of decode and one of mixed batches (a quarter of the sequences with up to 4 queries), within
    the error model; inputs untouched. A backend run in an interpreter (no waves: one program at a
    time) is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, large_batch_cases,
                   checks.matches_spec, limits, dtype=dtype, feature="large_batch",
                   max_examples=limits.batch_examples,
                   requires={"launch_limits": True}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_large_batches_with_fp8_caches_match_spec(request, backend, dtype, batch):
    """The large batches with fp8 caches and scales: the waves (or persistent work list) of the
    fp8 paths, decode and mixed, within the error model; inputs untouched. A backend run in an
    interpreter is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(large_batch_cases, fp8=True),
                   checks.matches_spec, limits, dtype=dtype, feature="large_batch_fp8",
                   max_examples=limits.batch_examples,
                   requires={"features": ("fp8",), "launch_limits": True}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_shared_prefix_batches_match_spec(request, backend, batch):
    """16 to 128 sequences sharing the blocks of a prefix of 256 to 2,048 keys, every query in its
    sequence's own blocks: the batches for which engines take a cascade path (the prefix once for
    every sequence, merged with each suffix), within the error model; inputs untouched."""
    _run_shared_prefix_cell(request, backend, 1, batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_two_shared_prefix_batches_match_spec(request, backend, batch):
    """The shared-prefix batches in two groups, each sharing a prefix of its own (the first two
    sequences in the first): a batch with no prefix common to all, which a cascade path must not
    take as one."""
    _run_shared_prefix_cell(request, backend, 2, batch)


def _run_shared_prefix_cell(request, backend, prefixes: int, batch: str) -> None:
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(shared_prefix_batch_cases, prefixes=prefixes),
                   checks.matches_spec, limits, dtype="bfloat16", feature=f"shared_prefix_x{prefixes}",
                   max_examples=limits.batch_examples, batch=batch)


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_large_batch_plans_serve_many_runs(request, backend, dtype):
    """A plan of the large batches used as an engine uses it: beside a second plan, run on the next
    layer's query and caches, then on the first arrays again. Every run within the error model; an
    earlier run's out and lse kept; the same arrays give the same bits (a persistent kernel's work
    counter zeroed at plan, not at each run, gives a later run no work). Unsupported in an interpreter."""
    limits = scale_limits()
    run_scale_cell(request, backend, large_batch_cases, checks.plan_serves_many_runs, limits, dtype=dtype,
                   feature="large_batch_plans", max_examples=limits.batch_examples,
                   requires={"launch_limits": True})


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_large_batch_captured_runs_replay_new_contents(request, backend, dtype):
    """A plan of the large batches captured in a CUDA graph, replayed after the next layer's query and
    caches are written into its arrays: the bits of an eager run (a counter or work list a launch
    needs reset is reset in the graph too). Unsupported off CUDA and for plans that are not capturable."""
    limits = scale_limits()
    run_scale_cell(request, backend, large_batch_cases, checks.replay_matches_eager, limits, dtype=dtype,
                   feature="large_batch_replays", max_examples=limits.batch_examples,
                   requires={"launch_limits": True, "device": "cuda"})


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_many_tokens_match_spec(request, backend, dtype):
    """More than 65,535 query tokens in one call (256 prompts of 256 queries under a short window;
    past a CUDA grid's y and z limit), within the error model; inputs untouched. A backend run in
    an interpreter (no grid limits) is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, many_token_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="many_tokens", max_examples=limits.batch_examples, requires={"launch_limits": True})


@pytest.mark.parametrize("cache", ["same", "fp8"])
def test_write_kv_of_many_tokens(request, backend, cache):
    """write_kv of more than 65,535 tokens in one call (a long prefill's keys and values), into
    caches of the keys' dtype or fp8 with scales: the spec's bits at every slot written, every
    other slot unchanged. A backend run in an interpreter (no grid limits) is unsupported here."""
    limits = scale_limits()
    fp8 = cache == "fp8"
    run_scale_cell(request, backend, functools.partial(many_token_write_kv_cases, fp8=fp8),
                   checks.write_kv_matches_spec, limits, dtype="bfloat16", feature="many_tokens_write_kv",
                   max_examples=limits.batch_examples, cell={"cache": cache},
                   requires={"features": ("write_kv", "fp8") if fp8 else ("write_kv",), "launch_limits": True})


def test_merge_states_of_many_tokens(request, backend):
    """merge_states of more than 65,535 tokens in one call (the parts of a long prefill's chunks):
    within rounding of the exact merge, an empty side ignored. A backend run in an interpreter (no
    grid limits) is unsupported here. Not shrunk: every case is as large as the first."""
    limits = scale_limits()
    run_scale_cell(request, backend, many_token_merge_cases, checks.merge_states_matches_spec, limits,
                   dtype="bfloat16", feature="many_tokens_merge", max_examples=limits.batch_examples,
                   requires={"features": ("merge_states",), "launch_limits": True}, shrink=False)


#: The dtype of the very-long cell: float16, whose 10-bit mantissa shows a smaller error than
#: bfloat16's (a sequence this long costs the Triton interpreter about a minute per dtype).
VERY_LONG_DTYPES = ("float16",)
#: dtypes of the cell past 2**31 bytes of keys and values: float32 first, the fewest keys (a CPU runs it).
KV_BYTES_DTYPES = ("float32", "bfloat16", "float16")


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", VERY_LONG_DTYPES)
def test_very_long_sequences_match_spec(request, backend, dtype, batch):
    """One sequence of 65,537 to 131,072 keys on one KV head (positions past 16 bits; split plans
    of more parts than 64), one cell of decode and one of a few queries, within the error model;
    inputs untouched. This and the very long, million-key and 2**31-byte cells below come one per
    batch kind (:data:`~pagedattn.conformance.scale.BATCH_KINDS`)."""
    limits = scale_limits()
    run_scale_cell(request, backend, very_long_sequence_cases,
                   checks.matches_spec, limits, dtype=dtype, feature="very_long_sequences",
                   max_examples=limits.batch_examples, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", VERY_LONG_DTYPES)
def test_very_long_sequences_with_fp8_caches_match_spec(request, backend, dtype, batch):
    """The very long sequence with fp8 caches and scales (v_scale never 1): the fp8 paths' split
    plans and merges of more than 65,536 keys (a backend may split them finer than its 16-bit
    caches), within the error model; inputs untouched. In an interpreter (a tile at a time, every
    key) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(very_long_sequence_cases, fp8=True),
                   checks.matches_spec, limits, dtype=dtype, feature="very_long_sequences_fp8",
                   max_examples=limits.batch_examples,
                   requires={"features": ("fp8",), "many_programs": True}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", VERY_LONG_DTYPES)
def test_very_long_sequences_with_a_window_match_spec(request, backend, dtype, batch):
    """The very long sequence under a sliding window of 100 to 4,096 keys (query positions past
    32,767, where a window's test on 16-bit positions passes keys far outside it), softcap and
    ALiBi each sometimes, within the error model; inputs untouched."""
    limits = scale_limits()
    run_scale_cell(request, backend, very_long_window_sequence_cases,
                   checks.matches_spec, limits, dtype=dtype, feature="very_long_sequences_window",
                   max_examples=limits.batch_examples,
                   requires={"features": ("sliding_window",)}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", VERY_LONG_DTYPES)
def test_million_key_sequences_match_spec(request, backend, dtype, batch):
    """One sequence of 1,048,577 to 1,310,720 keys on one KV head (a million-token model's context:
    more keys than a plan or merge sized for 131,072 holds, block-table columns past 65,536 at
    block size 16), decode or a few queries, within the error model; inputs untouched. In an
    interpreter (minutes of tiles) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, million_key_sequence_cases,
                   checks.matches_spec, limits, dtype=dtype, feature="million_key_sequences",
                   max_examples=limits.batch_examples,
                   requires={"many_programs": True},
                   shrink=False, batch=batch)  # a shrink step costs the spec seconds


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", KV_BYTES_DTYPES)
def test_sequences_past_2_31_bytes_of_keys_and_values_match_spec(request, backend, dtype, batch):
    """One sequence whose keys and values of one KV head pass 2**31 bytes, where a size held in
    signed 32 bits wraps (4,194,304 keys at head_dim 128 in 16 bits; 1,048,576 at head_dim 256 in
    float32), its block table repeating a few dozen blocks; decode or a few queries, out and lse
    within the error model; inputs untouched. On a CPU the 16-bit dtypes (2 to 4 million keys) run
    only under PAGEDATTN_SIZE=large, and in an interpreter every dtype does."""
    limits = scale_limits()
    run_scale_cell(request, backend, kv_bytes_past_int32_cases,
                   checks.matches_spec_by_distinct_blocks, limits, dtype=dtype, feature="kv_bytes_past_int32",
                   max_examples=limits.batch_examples,
                   requires={"many_programs": True, "large_arrays": dtype != "float32"},
                   shrink=False, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_sequences_past_2_31_bytes_of_fp8_keys_and_values_match_spec(request, backend, batch):
    """The sequence past 2**31 bytes with fp8 caches and scales (v_scale never 1) under bfloat16
    queries: one byte an element, 8,388,608 keys and more at head_dim 128 (the fp8 path's own sizes
    and plans); out and lse within the error model; inputs untouched. On a CPU and in an
    interpreter only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, functools.partial(kv_bytes_past_int32_cases, fp8=True),
                   checks.matches_spec_by_distinct_blocks, limits, dtype="bfloat16",
                   feature="kv_bytes_past_int32_fp8", max_examples=limits.batch_examples,
                   requires={"features": ("fp8",), "many_programs": True, "large_arrays": True}, shrink=False,
                   batch=batch)


def test_copy_blocks_of_many_pairs(request, backend):
    """copy_blocks of more than 65,535 pairs in one call (past a CUDA grid's y and z limit), chains
    among them: the spec's bits in every block. A backend run in an interpreter is unsupported
    here (no grid limits; a program per pair and row costs it hours)."""
    limits = scale_limits()
    run_scale_cell(request, backend, many_pair_copy_blocks_cases, checks.copy_blocks_matches_spec, limits,
                   dtype="bfloat16", feature="many_pairs_copy_blocks", max_examples=limits.batch_examples,
                   requires={"features": ("copy_blocks",), "launch_limits": True}, shrink=False)


@pytest.mark.parametrize("queries", ["decode", "prompts"])
def test_many_sequences_match_spec(request, backend, queries):
    """More than 65,536 sequences in one call, one query each (a decode call) or two (a varlen
    call; past a CUDA grid's y and z limit), within the error model; inputs untouched. A backend
    run in an interpreter, which has no grid limits and runs one program at a time, is
    unsupported here."""
    limits = scale_limits()
    features = ("varlen",) if queries == "prompts" else ()
    run_scale_cell(request, backend, functools.partial(many_sequence_cases, queries=queries), checks.matches_spec,
                   limits, dtype=LARGE_BATCH_DTYPES[0], feature="many_sequences", max_examples=limits.batch_examples,
                   cell={"queries": queries}, requires={"features": features, "launch_limits": True}, shrink=False)
