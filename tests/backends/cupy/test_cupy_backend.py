"""Tests of the cupy backend, grouped by what they need.

- CPU (CI): importing the backend imports no GPU library; the declared capabilities; every
  declared kernel specialization compiles for sm_90 with NVRTC (no GPU needed); the host-side
  work items, replayed by a NumPy model of the kernel, cover every row once and give the exact
  answer; unsupported cases raise before anything runs.
- GPU: the kernels against the exact spec on poisoned pools. Without a CUDA device they are
  reported as skipped with the backend's availability reason, never passed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagedattn.backends.cupy.backend import CupyBackend
from pagedattn.backends.cupy.cases import make_case
from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.planning import build_work, choose_kernel
from pagedattn.errors import UnsupportedError
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.exact import exact_attention
from pagedattn.spec.kv_ops import slot_view

HAVE_NVRTC = importlib.util.find_spec("cupy") is not None
GPU_REASON = CupyBackend.availability()


# -- arrays and registry -----------------------------------------------------------------
def test_importing_the_backend_imports_neither_cupy_nor_torch() -> None:
    code = (
        "import sys, pagedattn.backends.cupy.backend, pagedattn.backends.cupy.compile_check;"
        "print(sorted(m for m in ('cupy', 'torch', 'triton') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_capabilities_declare_what_is_compiled() -> None:
    from pagedattn.backends.cupy import specializations

    caps = CupyBackend().capabilities()
    assert caps.block_sizes == (16, 32, 64)
    assert caps.head_dims == specializations.HEAD_DIMS
    assert set(caps.dtypes) == set(specializations.CUDA_TYPES)
    assert caps.supports("fp8") and caps.supports("strided_caches")
    assert {"float8_e4m3fn", "float8_e5m2"} <= set(caps.cache_dtypes)
    assert {"write_kv", "copy_blocks", "merge_states", "lse", "alibi"} <= caps.features


@pytest.mark.parametrize(
    "dtype, head_dim", [("float32", 64), ("bfloat16", 256)], ids=["float32 query", "d256"]
)
def test_fp8_caches_outside_the_tensor_core_kernels_raise_unsupported(
    dtype: str, head_dim: int
) -> None:
    case = make_case(
        "fp8",
        np.random.default_rng(0),
        seq_lens=[20],
        head_dim=head_dim,
        dtype=dtype,
        cache_dtype="float8_e4m3fn",
    )
    with pytest.raises(UnsupportedError, match="fp8 caches need float16/bfloat16") as error:
        CupyBackend().plan(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
        )
    assert error.value.capability == "fp8"


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
    case = make_case(
        "fp8 rows",
        np.random.default_rng(0),
        seq_lens=seq_lens,
        q_lens=q_lens,
        num_q_heads=num_q_heads,
        num_kv_heads=2,
        head_dim=64,
        cache_dtype="float8_e5m2",
    )
    assert _rows(_problem(case)) == rows


def _problem(case):  # type: ignore[no-untyped-def]
    return check_paged_attention(*case.args(), **case.options)


def _rows(problem, *, sm90: bool = False, **options) -> int:  # type: ignore[no-untyped-def]
    """Rows per CTA of the kernel a backend built with ``options`` picks (``sm90``: on an H100/H200)."""
    return choose_kernel(problem, CupyOptions(**options), sm90=sm90).rows


def _work(problem, *, sm90: bool = False, slots: int = 132, min_tiles_per_split: int = 4,  # type: ignore[no-untyped-def]
          **options):
    """The work plan of a backend built with ``options`` for ``slots`` resident CTAs."""
    choice = choose_kernel(problem, CupyOptions(**options), sm90=sm90)
    return build_work(problem, choice, slots=slots, min_tiles_per_split=min_tiles_per_split)


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
    case = make_case(
        "rows", np.random.default_rng(0), seq_lens=seq_lens, q_lens=q_lens,
        num_q_heads=num_q_heads, head_dim=64,
    )
    assert _rows(_problem(case), sm90=True) == rows
    assert _work(_problem(case), sm90=True).kernel == ("wgmma" if rows == 128 else "mma")


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
    case = make_case(
        "rows", np.random.default_rng(0), seq_lens=[4096], q_lens=[4096], num_q_heads=32,
        head_dim=64, **options,
    )
    problem = _problem(case)
    assert _rows(problem, sm90=sm90, prefill=switch) == sp.MMA_ROWS, why
    work = _work(problem, sm90=sm90, prefill=switch)
    assert (work.kernel, work.rows, work.tile_n) == ("mma", 64, 64), why
    spec = choose_kernel(problem, CupyOptions(prefill=switch), sm90=sm90).spec
    assert spec.module == "paged_attention_mma", why
    assert sp.smem_bytes(problem.dtype, 64, work.rows, problem.cache_dtype, spec) == sp.mma_smem_bytes(
        64, problem.cache_dtype
    )
    with pytest.raises(ValueError, match="wgmma_attention"):
        sp.attention("bfloat16", 64, 16, sp.WGMMA_ROWS)  # 128 rows: the Hopper kernel's only


def test_two_decode_ctas_fit_on_an_sm() -> None:
    from pagedattn.backends.cupy import specializations

    per_sm = 228 * 1024  # H100/H200 shared memory per SM; 1 KB per CTA reserved
    for cache in ("bfloat16", "float8_e4m3fn"):
        smem = specializations.smem_bytes("bfloat16", 128, specializations.DECODE_ROWS, cache)
        assert 2 * (smem + 1024) <= per_sm, f"decode kernel with {cache} caches: {smem} bytes"


def test_unsupported_block_size_names_the_capability() -> None:
    case = make_case("bs8", np.random.default_rng(0), seq_lens=[20], head_dim=64, block_size=8)
    with pytest.raises(UnsupportedError, match="block_size 8"):
        CupyBackend().plan(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
        )


# -- compile check (CPU, CI) ----------------------------------------------------------------
@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_every_declared_specialization_compiles_for_sm90() -> None:
    from pagedattn.backends.cupy.compile_check import compile_all
    from pagedattn.backends.cupy.specializations import all_specializations

    results = compile_all("sm_90")
    compiled = {r.name_expression for r in results}
    assert compiled == {s.name_expression for s in all_specializations()}
    assert all(0 < r.registers <= 255 for r in results)
    decode = next(
        r for r in results if r.name_expression == "paged_attention<bfloat16_t, 128, 16, 4>"
    )
    assert decode.spill_store_bytes <= 64, f"decode kernel spills {decode.spill_store_bytes} bytes"
    wgmma = [r for r in results if r.name_expression.startswith("paged_attention_wgmma")]
    # 2 dtypes x block sizes 16, 32, 64 x (1 CTA/SM: head_dim 64 serial, 128 serial and
    # overlap; 2 CTAs/SM: serial at both head dims)
    assert len(wgmma) == 30, [r.name_expression for r in wgmma]
    one_cta = [r for r in wgmma if not r.name_expression.endswith(", 2>")]
    assert all(r.spill_store_bytes == 0 and r.stack_bytes == 0 for r in one_cta), one_cta
    # 2 CTAs/SM: at most 128 registers (two 256-thread CTAs in 64 K registers), a few spills
    two_cta = [r for r in wgmma if r.name_expression.endswith(", 2>")]
    assert len(two_cta) == 12 and all(r.registers <= 128 for r in two_cta), two_cta
    assert all(r.spill_store_bytes <= 64 for r in two_cta), two_cta


# -- the Hopper prefill kernel (wgmma): switch, sizing, predicates ----------------------------
def _long_prefill(**options):  # type: ignore[no-untyped-def]
    case = make_case(
        "wgmma", np.random.default_rng(0), seq_lens=[1000, 600], q_lens=[1000, 600],
        num_q_heads=8, num_kv_heads=2, **options,
    )
    return _problem(case)


@pytest.mark.parametrize("switch", ["wgmma", "auto", None])
def test_wgmma_kernel_takes_16_bit_prefill_on_sm90_when_switched_on(switch: str | None) -> None:
    from pagedattn.backends.cupy import planning
    from pagedattn.backends.cupy import specializations as sp

    given = {} if switch is None else {"prefill": switch}  # None: the default, "auto"
    options = CupyOptions(**given)
    problem = _long_prefill()
    assert planning.uses_wgmma(problem, options, sm90=True)
    assert _rows(problem, sm90=True, **given) == sp.WGMMA_ROWS
    work = _work(problem, sm90=True, **given)
    assert (work.kernel, work.rows, work.tile_n) == ("wgmma", 128, 64)
    spec = choose_kernel(problem, options, sm90=True).spec
    assert spec == sp.wgmma_attention("bfloat16", 128, 16)
    assert (spec.module, spec.arch) == ("paged_attention_wgmma", "sm_90a")
    assert spec.name_expression == "paged_attention_wgmma<bfloat16_t, 128, 16, false, 2>"
    one_cta = CupyOptions(**given, wgmma_ctas=1)  # the schedules of 1 CTA per SM
    assert choose_kernel(problem, one_cta, sm90=True).spec.name_expression.endswith("true>")
    serial = CupyOptions(**given, wgmma_ctas=1, wgmma_schedule="serial")
    assert choose_kernel(problem, serial, sm90=True).spec.name_expression.endswith("false>")
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
    assert _work(problem, sm90=sm90, prefill=switch).kernel == "mma", why


def test_wgmma_auto_leaves_short_prefill_and_decode_to_the_mma_kernels() -> None:
    from pagedattn.backends.cupy import planning

    auto = CupyOptions(prefill="auto")
    short = make_case(
        "short", np.random.default_rng(0), seq_lens=[6000, 50], q_lens=[64, 50], num_q_heads=8
    )
    decode = make_case("decode", np.random.default_rng(0), seq_lens=[600, 300])
    assert not planning.uses_wgmma(_problem(short), auto, sm90=True)
    assert _rows(_problem(short), sm90=True, prefill="auto") == 64
    assert not planning.uses_wgmma(_problem(decode), auto, sm90=True)


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


@pytest.mark.parametrize(
    "options",
    [{}, {"causal": False}, {"sliding_window": 37}, {"sliding_window": 200, "causal": False}],
    ids=["causal", "non-causal", "window", "window non-causal"],
)
@pytest.mark.parametrize("num_q_heads", [8, 14, 24], ids=["G=4", "G=7", "G=12"])
def test_wgmma_warpgroup_unmasks_only_tiles_all_its_rows_see_whole(
    options: dict, num_q_heads: int
) -> None:
    """The wgmma kernel's per-warpgroup "whole" predicate (64 rows, 64-key tiles), checked
    against the contract's visibility rule on every tile of every work item."""
    case = make_case(
        "predicates", np.random.default_rng(5), seq_lens=[700, 300, 64], q_lens=[650, 130, 64],
        num_q_heads=num_q_heads, head_dim=64, **options,
    )
    problem = _problem(case)
    work = _work(problem, sm90=True, slots=64, prefill="wgmma")
    assert work.kernel == "wgmma"
    W = problem.sliding_window or 0
    unmasked = 0
    for item in work.items:
        seq, token_start, num_tokens, num_groups = (int(item[i]) for i in (0, 2, 3, 5))
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        num_rows = num_tokens * num_groups
        pq_min = L - q_len + (token_start - int(problem.query_start_loc[seq]))
        for wg in (0, 1):
            first, last = 64 * wg, min(64 * wg + 63, num_rows - 1)
            if first >= num_rows:
                continue
            pq_lo, pq_hi = pq_min + first // num_groups, pq_min + max(last, 0) // num_groups
            p_q = pq_min + np.arange(first, last + 1) // num_groups
            for p0 in range(int(item[6]), int(item[7]), 64):
                whole = (
                    p0 + 64 <= L
                    and (not problem.causal or p0 + 63 <= pq_lo)
                    and (W <= 0 or p0 > pq_hi - W)
                )
                if whole:
                    unmasked += 1
                    p = np.arange(p0, p0 + 64)[None, :]
                    visible = (p < L) & np.ones((p_q.size, 1), bool)
                    if problem.causal:
                        visible &= p <= p_q[:, None]
                    if W:
                        visible &= p > p_q[:, None] - W
                    assert visible.all(), (tuple(item), wg, p0)
    assert unmasked > 0 or W < 128


@pytest.mark.parametrize("window", [1, 5, 50, 129], ids=lambda w: f"W={w}")
@pytest.mark.parametrize("block_size", [16, 64], ids=lambda b: f"bs{b}")
def test_wgmma_items_cover_exactly_the_tiles_a_window_leaves_visible(
    window: int, block_size: int
) -> None:
    """With a sliding window not aligned to the 64-key tiles (and smaller than one), each wgmma
    work item's [kv_begin, kv_end) holds every key its rows see (contract: p <= p_q and
    p > p_q - W) and no tile none of its rows sees."""
    case = make_case(
        "window items", np.random.default_rng(9), seq_lens=[900, 260, 77], q_lens=[700, 260, 70],
        head_dim=64, block_size=block_size, sliding_window=window,
    )
    problem = _problem(case)
    work = _work(problem, sm90=True, prefill="wgmma")
    assert work.kernel == "wgmma" and work.tile_n == 64
    seen = np.zeros((problem.num_tokens, problem.num_q_heads), dtype=np.int64)
    for item in work.items:
        seq, kv_head, token_start, num_tokens, g0, ng, kv_begin, kv_end, _ = (int(x) for x in item)
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        first = L - q_len + token_start - int(problem.query_start_loc[seq])
        p_q = first + np.arange(num_tokens)
        lo, hi = np.maximum(0, p_q - window + 1), np.minimum(p_q, L - 1)  # visible: lo..hi
        assert kv_begin % 64 == 0 and kv_end % 64 == 0, tuple(item)
        assert kv_begin <= lo.min() and hi.max() < kv_end, (tuple(item), lo.min(), hi.max())
        for p0 in range(kv_begin, kv_end, 64):
            assert ((lo <= p0 + 63) & (hi >= p0)).any(), f"tile {p0} of {tuple(item)} is seen by no row"
        heads = kv_head * problem.group_size + g0 + np.arange(ng)
        seen[np.ix_(token_start + np.arange(num_tokens), heads)] += 1
    assert (seen == 1).all(), "every (token, head) row belongs to exactly one item"


@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_compile_check_fails_on_a_compile_error() -> None:
    from pagedattn.backends.cupy import compile_check

    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module("kv_ops", ["write_kv<float>"], text="this is not C++;")


# -- work items, replayed by a NumPy model of the kernel --------------------------------------
def _model(problem, work, query, key_cache, value_cache):  # type: ignore[no-untyped-def]
    """What the kernel computes for the work items (float64): rows, masks, split-KV merge."""
    k_slots, v_slots = (
        slot_view(key_cache, problem.kv_layout),
        slot_view(value_cache, problem.kv_layout),
    )
    out = np.full((problem.num_tokens, problem.num_q_heads, problem.head_dim), np.nan)
    lse = np.full((problem.num_tokens, problem.num_q_heads), np.nan)
    partial_out = np.zeros((max(1, work.num_partials), work.rows, problem.head_dim))
    partial_lse = np.zeros((max(1, work.num_partials), work.rows))
    bs = problem.block_size
    for seq, kv_head, t0, nt, g0, ng, kv_begin, kv_end, partial in work.items:
        L = problem.seq_lens[seq]
        q_len = problem.q_lens[seq]
        assert kv_begin % work.tile_n == 0 and kv_end % work.tile_n == 0
        assert nt * ng <= work.rows
        p = np.arange(kv_begin, min(kv_end, L))  # the kernel reads nothing at p >= L
        table = problem.block_tables[seq, p // bs] if p.size else np.zeros(0, np.int64)
        assert (p // bs < -(-L // bs)).all()
        for r in range(nt * ng):
            t, h = t0 + r // ng, kv_head * problem.group_size + g0 + r % ng
            p_q = L - q_len + (t - problem.query_start_loc[seq])
            k = k_slots[table, p % bs, kv_head].astype(np.float64)
            v = v_slots[table, p % bs, kv_head].astype(np.float64)
            s = problem.scale * k @ query[t, h].astype(np.float64)
            if problem.softcap:
                s = problem.softcap * np.tanh(s / problem.softcap)
            if problem.alibi_slopes is not None:
                s = s + problem.alibi_slopes[h] * (p - p_q)
            visible = np.ones(p.size, bool)
            if problem.causal:
                visible &= p <= p_q
            if problem.sliding_window:
                visible &= p > p_q - problem.sliding_window
            s = np.where(visible, s, -np.inf)
            m = s.max(initial=-np.inf)
            w = np.exp(s - (m if np.isfinite(m) else 0.0))
            o = w @ np.where(visible[:, None], v, 0.0) / w.sum() if w.sum() > 0 else 0.0
            row_lse = m + np.log(w.sum()) if w.sum() > 0 else -np.inf
            if partial >= 0:
                partial_out[partial, r], partial_lse[partial, r] = o, row_lse
            else:
                assert np.isnan(lse[t, h]), f"row (token {t}, head {h}) written twice"
                out[t, h], lse[t, h] = o, row_lse
    for t0, nt, kv_head, g0, ng, first, n in work.merges:
        for r in range(nt * ng):
            t, h = t0 + r // ng, kv_head * problem.group_size + g0 + r % ng
            parts = partial_lse[first : first + n, r]
            m = parts.max()
            w = np.where(np.isfinite(parts), np.exp(parts - (m if np.isfinite(m) else 0.0)), 0.0)
            assert np.isnan(lse[t, h]), f"row (token {t}, head {h}) written twice"
            out[t, h] = w @ partial_out[first : first + n, r] / w.sum() if w.sum() > 0 else 0.0
            lse[t, h] = m + np.log(w.sum()) if w.sum() > 0 else -np.inf
    return out, lse


WORK_CASES = {
    "decode with padding and split-KV": dict(
        seq_lens=[0, 1, 17, 900], num_q_heads=8, num_kv_heads=2
    ),
    "varlen mixed": dict(seq_lens=[1, 40, 129, 77], q_lens=[1, 40, 7, 0], block_size=32),
    "G=7 decode": dict(seq_lens=[33, 300], num_q_heads=14, num_kv_heads=2),
    "G=12 prefill": dict(seq_lens=[50], q_lens=[50], num_q_heads=24, num_kv_heads=2),
    "window": dict(seq_lens=[400, 100], q_lens=[30, 1], sliding_window=37, block_size=64),
    "non-causal HND": dict(seq_lens=[120, 64], q_lens=[20, 64], causal=False, kv_layout="HND"),
    "tensor-core decode": dict(
        seq_lens=[0, 1, 17, 900, 3000], num_q_heads=8, num_kv_heads=2, dtype="float16"
    ),
    "tensor-core rows": dict(seq_lens=[300, 129, 7], q_lens=[300, 50, 7], dtype="float16"),
    "wgmma rows": dict(
        seq_lens=[600, 300, 9], q_lens=[600, 200, 9], dtype="float16", num_q_heads=8,
        sliding_window=150,
    ),
    "fp8 mixed": dict(
        seq_lens=[1, 40, 129, 77], q_lens=[1, 40, 7, 0], dtype="bfloat16",
        cache_dtype="float8_e4m3fn",
    ),
    "fp8 decode": dict(
        seq_lens=[0, 17, 900], num_q_heads=8, num_kv_heads=2, dtype="float16",
        cache_dtype="float8_e5m2",
    ),
    "softcap alibi": dict(
        seq_lens=[300],
        q_lens=[4],
        softcap=5.0,
        alibi_slopes=np.linspace(0.01, 0.2, 8).astype(np.float32),
    ),
}


@pytest.mark.parametrize("name", list(WORK_CASES))
def test_work_items_cover_every_row_once_and_give_the_exact_answer(name: str) -> None:
    sm90 = name == "wgmma rows"  # the Hopper kernel's 128-row items, planned as on an sm_90 device
    case = make_case(
        name, np.random.default_rng(1), head_dim=64, **{"dtype": "float32", **WORK_CASES[name]}
    )
    if name == "tensor-core rows":
        assert _rows(_problem(case), sm90=sm90) == 64
    if name == "wgmma rows":
        assert _rows(_problem(case), sm90=sm90) == 128
    problem = _problem(case)
    work = _work(problem, sm90=sm90, slots=64, min_tiles_per_split=1)  # force split-KV
    assert (work.kernel == "wgmma") == (name == "wgmma rows")
    out, lse = _model(problem, work, case.query, case.key_cache, case.value_cache)
    exact = exact_attention(*case.args(), **case.options)
    assert not np.isnan(lse).any(), "some output row is written by no work item"
    np.testing.assert_allclose(out, exact.out, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(lse, exact.lse, rtol=1e-9, atol=1e-9)


def test_long_decode_is_split_and_merged() -> None:
    case = make_case(
        "long",
        np.random.default_rng(2),
        seq_lens=[65536, 65536],
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=64,
        dtype="float16",
    )
    problem = _problem(case)
    work = build_work(problem, slots=396)
    assert len(work.merges) == 16 and len(work.items) >= 4 * 16


def test_long_prefill_that_fills_the_device_is_not_split_and_runs_sequence_by_sequence() -> None:
    case = make_case(
        "prefill",
        np.random.default_rng(3),
        seq_lens=[1024, 768, 1024],
        q_lens=[1024, 768, 1024],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype="float16",
    )
    problem = _problem(case)
    work = _work(problem, slots=16, prefill="mma")
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


# -- GPU -------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"cupy backend unavailable: {GPU_REASON}")


@gpu
@pytest.mark.parametrize("small", [True])
def test_gpu_kernels_match_the_exact_spec_on_poisoned_pools(small: bool) -> None:
    from pagedattn.backends.cupy.gpu_check import check_case, correctness_cases

    backend = CupyBackend()
    failures = []
    for case in correctness_cases(np.random.default_rng(3), small=small):
        ok, summary = check_case(backend, case)
        if not ok:
            failures.append(f"{case.name}: {summary}")
    assert not failures, "\n".join(failures)


@gpu
def test_gpu_cache_operations_match_the_spec() -> None:
    from pagedattn.backends.cupy.gpu_check import check_ops

    results = check_ops(CupyBackend(), np.random.default_rng(4))
    assert all(ok for _, ok, _ in results), [r for r in results if not r[1]]


# -- the 64-row tensor-core prefill kernel's tile predicate (kernels/paged_attention_mma.cu)
def _cta_tile_whole(problem, item, p0, tile_n):  # type: ignore[no-untyped-def]
    """``whole`` as attend_tile computes it for one CTA and one tile: from the p_q of the item's
    first and last token (plain scores then skip the mask)."""
    seq, _, token_start, num_tokens = (int(x) for x in item[:4])
    L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
    pq_min = L - q_len + (token_start - int(problem.query_start_loc[seq]))
    pq_max = pq_min + num_tokens - 1
    W = problem.sliding_window or 0
    return (
        p0 + tile_n <= L
        and (not problem.causal or p0 + tile_n - 1 <= pq_min)
        and (W <= 0 or p0 > pq_max - W)
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"causal": False}, {"sliding_window": 37}, {"sliding_window": 200, "causal": False}],
    ids=["causal", "non-causal", "window", "window non-causal"],
)
@pytest.mark.parametrize("num_q_heads", [8, 14, 24], ids=["G=4", "G=7", "G=12"])
def test_mma_kernel_unmasks_only_tiles_all_its_rows_see_whole(
    options: dict, num_q_heads: int
) -> None:
    """Each tile of a 64-row work item is seen by some row of the item, and one the kernel
    leaves unmasked holds only keys all its rows see (checked against the contract's rule)."""
    from pagedattn.backends.cupy import specializations as sp

    case = make_case(
        "predicates", np.random.default_rng(5), seq_lens=[700, 300, 64], q_lens=[650, 130, 64],
        num_q_heads=num_q_heads, head_dim=64, **options,
    )
    problem = _problem(case)
    work = _work(problem, slots=64, prefill="mma")
    assert (work.kernel, work.rows, work.tile_n) == ("mma", sp.MMA_ROWS, sp.MMA_TILE_N)
    tile_n = work.tile_n
    unmasked = 0
    for item in work.items:
        seq, token_start, num_groups = int(item[0]), int(item[2]), int(item[5])
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        rows = np.arange(int(item[3]) * num_groups)
        p_q = L - q_len + (token_start - int(problem.query_start_loc[seq])) + rows // num_groups
        for p0 in range(int(item[6]), int(item[7]), tile_n):
            p = np.arange(p0, p0 + tile_n)[None, :]
            visible = (p < L) & np.ones((rows.size, 1), bool)
            if problem.causal:
                visible &= p <= p_q[:, None]
            if problem.sliding_window:
                visible &= p > p_q[:, None] - problem.sliding_window
            assert visible.any(), f"tile {p0} of {tuple(item)} is seen by no row"
            if _cta_tile_whole(problem, item, p0, tile_n):
                unmasked += 1
                assert visible.all(), (tuple(item), p0)
    # (a window narrower than two tiles leaves no tile whole)
    assert unmasked > 0 or (problem.sliding_window or 10**9) < 2 * tile_n


def test_kernel_source_changes_with_its_headers(tmp_path: Path) -> None:
    """cupy caches compiled modules by their source text: an edited header must change it."""
    from pagedattn.backends.cupy import specializations as sp

    (tmp_path / "kernel.cu").write_text('#include "common.cuh"\n__global__ void k() {}\n')
    (tmp_path / "common.cuh").write_text("#pragma once\n")
    before = sp.source("kernel", tmp_path)
    assert before.startswith('#include "common.cuh"')
    assert sp.source("kernel", tmp_path) == before, "the same files give the same text"
    (tmp_path / "common.cuh").write_text("#pragma once\n#define CHANGED 1\n")
    assert sp.source("kernel", tmp_path) != before


def test_gpu_check_run_check_records_a_raising_check_as_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pagedattn.backends.cupy.gpu_check import run_check

    def raising() -> tuple[bool, str]:
        raise ValueError("boom")

    assert run_check("fine", lambda: (True, "ok")) == ("fine", True, "ok")
    assert run_check("broken", raising) == ("broken", False, "ValueError: boom")
    assert capsys.readouterr().out.splitlines() == ["ok   fine: ok", "FAIL broken: ValueError: boom"]
