"""How the cupy backend plans on the host: rows per work item, the kernel each problem takes
(the Hopper kernel's switch, sizing and fallbacks), and split-KV."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from cases import poisoned_case
from cupy_plans import kernel_of, rows_of, shape_problem, work_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.planning import build_work, choose_kernel, split_slots
from pagedattn.conformance.checks import problem_of


@pytest.mark.parametrize("cache", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp8_decode_takes_the_float16_route_of_the_decode_kernel(dtype: str, cache: str) -> None:
    """fp8 decode at every block size and head_dim 64/128, with either query dtype and on either
    device kind, takes paged_attention_decode with the fp8 cache type (the specialization whose
    products are float16: test_cupy_sass), with its fp8 stages' shared memory."""
    from pagedattn.backends.cupy import specializations as sp

    for block_size, head_dim, sm90 in itertools.product(sp.BLOCK_SIZES, sp.MMA_HEAD_DIMS, (False, True)):
        case = poisoned_case("fp8 route", [300, 45], block_size=block_size, head_dim=head_dim, dtype=dtype,
                             cache_dtype=cache)
        choice = kernel_of(problem_of(case), sm90=sm90)
        assert choice.spec.name_expression == (
            f"paged_attention_decode<{sp.CUDA_TYPES[dtype]}, {head_dim}, {block_size}, {sp.FP8_TYPES[cache]}>"
        )
        smem = sp.smem_bytes(dtype, head_dim, choice.rows, cache, choice.spec)
        stages = sp.DECODE_FP8_STAGES * 2 * sp.DECODE_SUB_N * head_dim  # one byte an element
        assert smem == sp.DECODE_ROWS * head_dim * 2 + sp.DECODE_WARPS * stages + (
            3 * sp.DECODE_ROWS * 4 + 2 * sp.DECODE_WARPS * sp.DECODE_ROWS * 4
        )


@pytest.mark.parametrize("num_q_heads", [2, 8, 16, 20, 32])
def test_fp8_decode_items_hold_at_most_eight_rows_and_cover_every_head_once(num_q_heads: int) -> None:
    """The decode kernel computes 8 query rows for fp8 caches (the n side of its products), so
    fp8 decode items hold at most DECODE_FP8_ROWS query heads; together they cover each (sequence,
    query head) once. 16-bit caches keep items of up to DECODE_ROWS rows."""
    from pagedattn.backends.cupy import specializations as sp

    group = num_q_heads // 2  # query heads a KV head
    for cache, most in (("float8_e4m3fn", sp.DECODE_FP8_ROWS), ("bfloat16", sp.DECODE_ROWS)):
        problem = shape_problem([300, 45, 1], num_q_heads=num_q_heads, num_kv_heads=2, cache_dtype=cache)
        work = work_of(problem)
        assert work.rows == sp.DECODE_ROWS
        assert work.items[:, 5].max() == min(most, group), cache
        whole = work.items[work.items[:, 8] < 0][:, [0, 1, 4, 5]]  # sequence, KV head, first head, heads
        split = work.merges[:, [0, 2, 3, 4]]  # the same of a split range (token = sequence in decode)
        seen = np.zeros((3, num_q_heads), dtype=int)
        for s, h, start, count in np.concatenate([whole, split]):
            seen[s, h * group + start : h * group + start + count] += 1
        assert (seen == 1).all(), cache


@pytest.mark.parametrize(
    "seq_lens, q_lens, num_q_heads, rows",
    [
        ([30, 5], None, 8, 16),  # decode, G = 4: the decode kernel
        ([30, 5], None, 48, 64),  # decode, G = 24: the tensor-core prefill kernel
        ([30, 5, 9], [1, 1, 2], 8, 64),  # mostly single queries: never the CUDA-core kernel
    ],
)
def test_fp8_caches_go_to_the_tensor_core_kernels(
    seq_lens: list[int], q_lens: list[int] | None, num_q_heads: int, rows: int
) -> None:
    case = poisoned_case("fp8 rows", seq_lens=seq_lens,
        q_lens=q_lens,
        num_q_heads=num_q_heads,
        num_kv_heads=2,
        head_dim=64,
        cache_dtype="float8_e5m2",
    )
    assert rows_of(problem_of(case)) == rows


@pytest.mark.parametrize(
    "seq_lens, q_lens, num_q_heads, rows",
    [
        ([300, 129, 7], [300, 50, 7], 4, 64),  # 357 tokens x G=2 over 3 sequences: 238 rows each
        ([600, 300], [600, 200], 8, 128),  # 800 tokens x G=4 over 2: 1,600 rows each
        ([4096], [4096], 32, 128),  # long prefill, G=16
        ([6000, 50], [64, 50], 8, 64),  # chunked prefill: 114 tokens x G=4 over 2 sequences
    ],
)
def test_prefill_tile_height_follows_the_rows_per_sequence(
    seq_lens: list[int], q_lens: list[int], num_q_heads: int, rows: int,
) -> None:
    """On an sm_90 device with prefill="auto" (the default): the Hopper kernel's 128 rows from
    512 rows per sequence on average, else the 64-row mma.sync kernel."""
    case = poisoned_case("rows", seq_lens=seq_lens, q_lens=q_lens,
        num_q_heads=num_q_heads, head_dim=64,
    )
    assert rows_of(problem_of(case), sm90=True) == rows
    assert work_of(problem_of(case), sm90=True).kernel == ("wgmma" if rows == 128 else "mma")


@pytest.mark.parametrize(
    "why, options, switch, sm90",
    [
        ("switch mma", {}, "mma", True),
        ("not an sm_90 device", {}, "auto", False),
        ("fp8 cache", {"cache_dtype": "float8_e4m3fn"}, "wgmma", True),
    ],
)
def test_mma_sync_prefill_always_takes_64_rows(
    why: str, options: dict, switch: str, sm90: bool
) -> None:
    """Long prefill the Hopper kernel does not take goes to the 64-row mma.sync kernel: no
    other height exists for it."""
    from pagedattn.backends.cupy import specializations as sp
    case = poisoned_case("rows", seq_lens=[4096], q_lens=[4096], num_q_heads=32,
        head_dim=64, **options,
    )
    problem = problem_of(case)
    assert rows_of(problem, sm90=sm90, prefill=switch) == sp.MMA_ROWS, why
    work = work_of(problem, sm90=sm90, prefill=switch)
    assert (work.kernel, work.rows, work.tile_n) == ("mma", 64, 64), why
    spec = kernel_of(problem, sm90=sm90, prefill=switch).spec
    assert spec.module == "paged_attention_mma", why
    assert sp.smem_bytes(problem.dtype, 64, work.rows, problem.cache_dtype, spec) == sp.mma_smem_bytes(
        64, problem.cache_dtype
    )
    with pytest.raises(ValueError, match="wgmma_attention"):
        sp.attention("bfloat16", 64, 16, sp.WGMMA_ROWS)  # 128 rows: the Hopper kernel's only


@pytest.mark.parametrize(
    "head_dim, cache",
    [(64, "bfloat16"), (128, "bfloat16"), (128, "float8_e4m3fn"), (256, "bfloat16"), (256, "float16")],
)
def test_two_decode_ctas_fit_on_an_sm(head_dim: int, cache: str) -> None:
    from pagedattn.backends.cupy import specializations

    per_sm = 228 * 1024  # H100/H200 shared memory per SM; 1 KB per CTA reserved
    smem = specializations.smem_bytes(cache, head_dim, specializations.DECODE_ROWS, cache)
    assert 2 * (smem + 1024) <= per_sm, f"decode kernel at {head_dim} with {cache} caches: {smem} bytes"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_head_dim_256_decode_takes_the_tensor_core_decode_kernel(dtype: str, block_size: int) -> None:
    """Decode at head_dim 256 with up to 16 query heads per KV head goes to the tensor-core
    decode kernel, whose streams there are warp pairs (half of O's columns each)."""
    from pagedattn.backends.cupy import specializations as sp

    case = poisoned_case("d256 decode", seq_lens=[300, 17], num_q_heads=16, num_kv_heads=8, head_dim=256,
                         dtype=dtype, block_size=block_size)
    choice = kernel_of(problem_of(case))
    assert choice.rows == sp.DECODE_ROWS
    assert choice.spec == sp.attention(dtype, 256, block_size, sp.DECODE_ROWS)
    assert choice.spec in sp.all_specializations(), "compiled by the compile check"
    assert sp.decode_split(256) == 2 and sp.decode_split(128) == 1
    assert sp.smem_bytes(dtype, 256, choice.rows, dtype, choice.spec) == sp.decode_smem_bytes(256)


@pytest.mark.parametrize(
    "why, options, num_q_heads, dtype, module",
    [
        ("the decode switch", {"decode": "simt"}, 16, "bfloat16", "paged_attention"),
        ("G = 24", {}, 48, "bfloat16", "paged_attention"),
        ("float32", {}, 16, "float32", "paged_attention"),
    ],
)
def test_head_dim_256_decode_elsewhere_stays_on_cuda_cores(
    why: str, options: dict, num_q_heads: int, dtype: str, module: str
) -> None:
    case = poisoned_case("d256 decode", seq_lens=[300, 17], num_q_heads=num_q_heads, num_kv_heads=2,
                         head_dim=256, dtype=dtype)
    assert kernel_of(problem_of(case), **options).spec.module == module, why


# -- the Hopper prefill kernel (wgmma): switch, sizing, predicates ----------------------------
def _long_prefill(**options):  # type: ignore[no-untyped-def]
    case = poisoned_case("wgmma", seq_lens=[1000, 600], q_lens=[1000, 600],
        num_q_heads=8, num_kv_heads=2, **options,
    )
    return problem_of(case)


@pytest.mark.parametrize("switch", ["wgmma", "auto", None])
def test_wgmma_kernel_takes_16_bit_prefill_on_sm90_when_switched_on(switch: str | None) -> None:
    from pagedattn.backends.cupy import planning
    from pagedattn.backends.cupy import specializations as sp

    given = {} if switch is None else {"prefill": switch}  # None: the default, "auto"
    problem = _long_prefill()
    assert planning.uses_wgmma(problem, CupyOptions(**given), sm90=True)
    assert rows_of(problem, sm90=True, **given) == sp.WGMMA_ROWS
    work = work_of(problem, sm90=True, **given)
    assert (work.kernel, work.rows, work.tile_n) == ("wgmma", 128, 64)
    spec = kernel_of(problem, sm90=True, **given).spec
    assert spec == sp.wgmma_attention("bfloat16", 128, 16)
    assert (spec.module, spec.arch) == ("paged_attention_wgmma", "sm_90a")
    assert spec.name_expression == "paged_attention_wgmma<bfloat16_t, 128, 16, false, 2>"
    # the schedules of 1 CTA per SM
    assert kernel_of(problem, sm90=True, wgmma_ctas=1, **given).spec.name_expression.endswith("true>")
    serial = kernel_of(problem, sm90=True, wgmma_ctas=1, wgmma_schedule="serial", **given)
    assert serial.spec.name_expression.endswith("false>")
    assert sp.wgmma_attention("bfloat16", 64, 16, ctas=1).name_expression.endswith("false>"), (
        "head_dim 64 has the serial schedule only"
    )


@pytest.mark.parametrize(
    "why, options, switch, sm90",
    [
        ("switch off", {}, "mma", True),
        ("not an sm_90 device", {}, "wgmma", False),
        ("fp8 cache", {"cache_dtype": "float8_e4m3fn"}, "wgmma", True),
        ("float32", {"dtype": "float32"}, "wgmma", True),
        ("head_dim 256", {"head_dim": 256}, "wgmma", True),
    ],
)
def test_wgmma_kernel_falls_back_where_it_does_not_apply(
    why: str, options: dict, switch: str, sm90: bool
) -> None:
    from pagedattn.backends.cupy import planning

    problem = _long_prefill(**options)
    assert not planning.uses_wgmma(problem, CupyOptions(prefill=switch), sm90=sm90), why
    assert work_of(problem, sm90=sm90, prefill=switch).kernel == "mma", why


def test_wgmma_auto_leaves_short_prefill_and_decode_to_the_mma_kernels() -> None:
    from pagedattn.backends.cupy import planning

    auto = CupyOptions(prefill="auto")
    short = poisoned_case("short", seq_lens=[6000, 50], q_lens=[64, 50], num_q_heads=8
    )
    decode = poisoned_case("decode", seq_lens=[600, 300])
    assert not planning.uses_wgmma(problem_of(short), auto, sm90=True)
    assert rows_of(problem_of(short), sm90=True, prefill="auto") == 64
    assert not planning.uses_wgmma(problem_of(decode), auto, sm90=True)


def test_wgmma_kernel_launch_shape_and_shared_memory() -> None:
    from pagedattn.backends.cupy import specializations as sp

    spec = sp.wgmma_attention("float16", 128, 32, ctas=1)
    assert sp.threads(sp.WGMMA_ROWS, spec) == 256, "two warpgroups"
    assert sp.tile_n("float16", sp.WGMMA_ROWS) == 64, "64-key tiles"
    # 1 CTA per SM: alignment slack + 4 stages x (K + V tiles of 64 keys x 128 x 2 bytes) + the Q tile
    # (128 rows x 128 x 2 bytes, its own region: read for every tile's S) + 3 words a row
    expected = 1024 + 4 * 2 * 64 * 128 * 2 + 128 * 128 * 2 + 3 * 128 * 4
    assert sp.smem_bytes("float16", 128, sp.WGMMA_ROWS, "float16", spec) == expected
    assert expected <= 227 * 1024, "one CTA must fit the per-block shared-memory limit (227 KB)"
    assert sp.smem_bytes(
        "float16", 64, sp.WGMMA_ROWS, None, sp.wgmma_attention("float16", 64, 16, ctas=1)
    ) == (
        1024 + 4 * 2 * 64 * 64 * 2 + 128 * 64 * 2 + 3 * 128 * 4
    )


def test_wgmma_two_ctas_per_sm_variant_fits_two_ctas_and_is_the_default() -> None:
    from pagedattn.backends.cupy import specializations as sp

    assert CupyOptions().wgmma_ctas == 2 and CupyOptions().wgmma_schedule == "overlap"
    spec = sp.wgmma_attention("bfloat16", 128, 16)
    # 2 stages at head_dim 128 leave no stage for the overlap schedule: serial
    assert spec.name_expression == "paged_attention_wgmma<bfloat16_t, 128, 16, false, 2>"
    assert sp.wgmma_stages(128, 2) == 2 and sp.wgmma_stages(64, 2) == 3
    sm_bytes = 228 * 1024  # an H100/H200 SM; each CTA also reserves 1 KB
    for head_dim in (64, 128):
        ctas2 = sp.smem_bytes(
            "bfloat16", head_dim, sp.WGMMA_ROWS, None, sp.wgmma_attention("bfloat16", head_dim, 32)
        )
        expected = (
            1024 + sp.wgmma_stages(head_dim, 2) * 2 * 64 * head_dim * 2 + 128 * head_dim * 2 + 3 * 128 * 4
        )
        assert ctas2 == expected
        assert 2 * (ctas2 + 1024) <= sm_bytes, f"two CTAs must fit one SM at head_dim {head_dim}"
    assert 2 * (sp.wgmma_smem_bytes(128, 1) + 1024) > sm_bytes, "the 1-CTA kernel does not"
    # 4 stages: the overlap schedule
    assert sp.wgmma_attention("bfloat16", 128, 16, ctas=1).name_expression == (
        "paged_attention_wgmma<bfloat16_t, 128, 16, true>"
    )
    with pytest.raises(ValueError, match="overlap"):
        sp.wgmma_attention("bfloat16", 128, 16, overlap=True, ctas=2)


def test_long_decode_is_split_and_merged() -> None:
    problem = shape_problem([65536, 65536], num_q_heads=32, num_kv_heads=8, head_dim=64, dtype="float16")
    work = work_of(problem, slots=396)
    assert len(work.merges) == 16 and len(work.items) >= 4 * 16


def test_long_prefill_that_fills_the_device_is_not_split_and_runs_sequence_by_sequence() -> None:
    case = poisoned_case("prefill", [1024, 768, 1024], [1024, 768, 1024], head_dim=64, dtype="float16")
    work = work_of(problem_of(case), slots=16, prefill="mma")
    # 3 sequences x 2 KV heads x (up to 1,024 / 16) chunks: many times the 16 slots, so no part
    # pays for a partial and a merge
    assert len(work.merges) == 0 and work.num_partials == 0
    assert (work.items[:, 8] == -1).all()
    seqs, lengths = work.items[:, 0], work.items[:, 7] - work.items[:, 6]
    assert (np.diff(seqs) >= 0).all(), "items run sequence by sequence (their K/V stays in L2)"
    for s in range(3):
        assert (np.diff(lengths[seqs == s]) <= 0).all(), "longest ranges first in each sequence"


def test_choose_split_splits_only_where_long_ranges_leave_slots_idle() -> None:
    from pagedattn.backends.cupy.planning import choose_split

    few_long = np.full(16, 1024)  # 2 x 65,536 decode at 64-key tiles: 16 ranges, 264 slots
    per_split = choose_split(few_long, 264)
    assert 16 * -(-1024 // per_split) <= 264, "one wave of parts"
    assert per_split <= 1024 // 8
    many = np.tile(np.arange(1, 65), 128)  # causal prefill: 8,192 ranges of 1..64 tiles
    assert choose_split(many, 264, partial_overhead=4.0) == 64, "no split"
    half_the_slots = np.full(64, 32)  # 8 x 2,048 decode on 132 slots: 2 parts save 16 tiles
    assert -(-32 // choose_split(half_the_slots, 132)) == 2, "2 parts a range"
    assert choose_split(half_the_slots, 132, min_gain=16.0) == 32, "a gain of 16 tiles is not enough"
    assert choose_split(few_long, 264, min_gain=16.0) == per_split


# split-KV parts of llama3-8b decode (8 KV heads, 64-key tiles, bf16) on an H200: 132
# multiprocessors, 264 decode CTAs resident; the split fills one CTA a multiprocessor
# (split_slots): (sequences, keys) -> parts per range
H200_MULTIPROCESSORS, H200_DECODE_CTAS = 132, 264
DECODE_PARTS = {(64, 4096): 1, (2, 65536): 8, (1, 2048): 8, (1, 32768): 16, (4, 8192): 4, (8, 2048): 1,
                (16, 2048): 1, (8, 4096): 2}


@pytest.mark.parametrize("shape, parts", DECODE_PARTS.items())
def test_decode_parts_on_the_h200_keep_four_tiles_and_one_cta_a_multiprocessor(shape: tuple[int, int],
                                                                                 parts: int) -> None:
    seqs, keys = shape
    problem = shape_problem([keys] * seqs, num_q_heads=32, num_kv_heads=8)
    slots = split_slots(problem, choose_kernel(problem), H200_DECODE_CTAS, H200_MULTIPROCESSORS)
    assert slots == H200_MULTIPROCESSORS
    work = work_of(problem, slots=slots)
    per_range = len(work.items) // (seqs * 8)
    assert per_range == parts
    if parts > 1:
        assert len(work.items) <= H200_MULTIPROCESSORS, "the parts fit one CTA a multiprocessor"
        assert keys // 64 // parts >= 4, "at least four tiles a part"


@pytest.mark.parametrize("cache_dtype, head_dim, q_lens", [("float8_e4m3fn", 128, None), (None, 256, None),
                                                           (None, 128, [512])],
                         ids=["fp8 decode", "head_dim 256 decode", "prefill"])
def test_other_kernels_split_for_every_resident_cta(cache_dtype: str | None, head_dim: int,
                                                    q_lens: list[int] | None) -> None:
    problem = shape_problem([4096], q_lens, num_q_heads=32, num_kv_heads=8, head_dim=head_dim,
                            cache_dtype=cache_dtype)
    assert split_slots(problem, choose_kernel(problem), H200_DECODE_CTAS, H200_MULTIPROCESSORS) == H200_DECODE_CTAS


def test_small_batch_decode_keeps_four_tiles_a_part_and_every_key_is_covered_once() -> None:
    case = poisoned_case("one short", [2048], num_q_heads=32, num_kv_heads=8)
    work = work_of(problem_of(case), slots=264)
    # 8 ranges of 32 tiles: 33 parts a range would fill the slots, four tiles a part allow 8
    assert len(work.merges) == 8 and len(work.items) == 8 * 8, "8 ranges of 32 tiles, four tiles a part"
    for head in range(8):
        mine = work.items[work.items[:, 1] == head]
        spans = sorted(zip(mine[:, 6].tolist(), mine[:, 7].tolist(), strict=True))
        assert spans[0][0] == 0 and spans[-1][1] == 2048
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "parts tile the range"


@pytest.mark.parametrize("num_splits", [1, 3, 8, 64])
def test_num_splits_cuts_the_longest_range_into_that_many_parts(num_splits: int) -> None:
    case = poisoned_case("forced", [2048, 1024], num_q_heads=32, num_kv_heads=8)
    work = work_of(problem_of(case), slots=264, num_splits=num_splits)
    longest = work.items[work.items[:, 0] == 0]
    per_head = len(longest) // 8
    assert per_head == min(num_splits, 2048 // 64)
    assert len(work.merges) == (0 if num_splits == 1 else 16)


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_far_pool_long_prefills_take_the_hopper_kernel(data: st.DataObject, dtype: str) -> None:
    """The far-pool long-prefill cell's cases reach the Hopper prefill kernel on sm_90 (the other
    far cells' decode and short batches never do), so its block offsets past element 2**31 are checked."""
    from pagedattn.backends.cupy.backend import CupyBackend
    from pagedattn.conformance.scale import far_pool_cases

    case = data.draw(far_pool_cases(CupyBackend().capabilities(), dtype=dtype, long_prefill=True))
    assert choose_kernel(problem_of(case), sm90=True).spec.module == "paged_attention_wgmma"


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_far_pool_verify_batches_take_the_mma_sync_kernel(data: st.DataObject, dtype: str) -> None:
    """The far-pool verify cell's cases (8 to 16 queries a sequence) reach the mma.sync prefill
    kernel on sm_90 at head_dim 64 and 128 (the CUDA-core kernel at 256), a kernel no other far
    cell of 16-bit caches reaches, so its block offsets past element 2**31 are checked."""
    from pagedattn.backends.cupy.backend import CupyBackend
    from pagedattn.conformance.scale import far_pool_cases

    problem = problem_of(data.draw(far_pool_cases(CupyBackend().capabilities(), dtype=dtype, verify=True)))
    assert problem.q_lens.min() >= 8
    want = "paged_attention_mma" if problem.head_dim in (64, 128) else "paged_attention"
    assert choose_kernel(problem, sm90=True).spec.module == want


@settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_far_row_prefills_take_the_hopper_kernel(data: st.DataObject) -> None:
    """The far-row prefill cell's batches (a query past element 2**31) reach the Hopper prefill
    kernel on sm_90, whose output rows no decode or short far-row batch reaches."""
    from pagedattn.backends.cupy.backend import CupyBackend
    from pagedattn.conformance.scale import far_row_cases

    case = data.draw(far_row_cases(CupyBackend().capabilities(), dtype="bfloat16", queries="prefills"))
    assert choose_kernel(problem_of(case), sm90=True).spec.module == "paged_attention_wgmma"


#: Scale strategies whose cells come one per batch kind, as their cells draw them (the costliest,
#: million-key and 2**31-byte cases, left out: they take the very long ones' kernels; and the wide
#: groups, which cupy runs on its CUDA-core kernel in decode too, past the decode kernel's 16 rows).
BATCH_KIND_STRATEGIES = ("far_pool_cases", "long_sequence_cases", "very_long_sequence_cases", "large_batch_cases")


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), fp8=st.booleans(), decode=st.booleans())
@pytest.mark.parametrize("strategy", BATCH_KIND_STRATEGIES)
def test_scale_cells_of_each_batch_kind_take_the_kernel_of_their_kind(strategy: str, data: st.DataObject, fp8: bool,
                                                                     decode: bool) -> None:
    """The scale cells of decode batches reach the decode kernel on sm_90, those of a few queries a
    sequence the CUDA-core kernel (the mma.sync one with fp8 caches), and the long ones' plans split
    them: each kernel's block offsets past element 2**31, split-KV parts and merge, positions and
    waves are checked in a cell of its own."""
    from pagedattn.backends.cupy.backend import CupyBackend
    from pagedattn.conformance import scale

    caps = CupyBackend().capabilities()
    case = data.draw(getattr(scale, strategy)(caps, dtype="float16", decode=decode, fp8=fp8))
    problem = problem_of(case)
    assert decode == problem.is_decode and (decode or problem.q_lens.max() >= 2)
    want = "paged_attention_decode" if decode else "paged_attention_mma" if fp8 else "paged_attention"
    choice = choose_kernel(problem, sm90=True)
    assert choice.spec.module == want
    if "long" in strategy:
        h200_sms = 132
        assert build_work(problem, choice, slots=split_slots(problem, choice, 2 * h200_sms, h200_sms)).num_partials
