"""The roofline's work counts: hand-computed cases, and visible pairs equal to the spec's."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.perf.roofline import work
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.exact import exact_attention


def problem(seq_lens, q_lens, *, block_size=16, hq=4, hkv=2, d=8, dtype=np.float32, **options):
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 1
    width = max(-(-n // block_size) for n in seq_lens)
    tables = np.arange(len(seq_lens) * width, dtype=np.int32).reshape(len(seq_lens), width) % num_blocks
    lens = np.array(seq_lens, dtype=np.int32)
    qsl = None if q_lens is None else np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    tokens = len(seq_lens) if q_lens is None else sum(q_lens)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((tokens, hq, d)).astype(dtype)
    kc = rng.standard_normal((num_blocks, block_size, hkv, d)).astype(dtype)
    return (q, kc, kc.copy(), tables, lens, qsl), options


def test_decode_bytes_and_flops_by_hand() -> None:
    args, _ = problem([40, 16], None)
    w = work(check_paged_attention(*args))
    kv_blocks = 3 + 1  # ceil(40/16) + ceil(16/16)
    assert w.kv_bytes == 2 * kv_blocks * 16 * 2 * 8 * 4
    index = 4 * (kv_blocks + 2)  # used table entries, seq_lens
    assert w.bytes == w.kv_bytes + 2 * (2 * 4 * 8 * 4) + index
    assert w.visible_pairs == 56
    assert w.flops == 4 * 8 * 4 * 56


def test_causal_prefill_counts_the_triangle() -> None:
    args, _ = problem([64], [64])
    w = work(check_paged_attention(*args))
    assert w.visible_pairs == 64 * 65 // 2


def test_sliding_window_reads_only_the_window_blocks() -> None:
    args, options = problem([100], None, sliding_window=10)
    w = work(check_paged_attention(*args, **options))
    assert w.visible_pairs == 10
    assert w.kv_bytes == 2 * 2 * 16 * 2 * 8 * 4  # keys 90..99 lie in blocks 5 and 6


def test_bfloat16_cache_and_lse_bytes() -> None:
    import ml_dtypes

    args, _ = problem([16], None, dtype=ml_dtypes.bfloat16)
    plain = work(check_paged_attention(*args))
    with_lse = work(check_paged_attention(*args, return_lse=True))
    assert plain.kv_bytes == 2 * 16 * 2 * 8 * 2
    assert with_lse.bytes - plain.bytes == 4 * 4  # float32 lse [1, Hq]


@pytest.mark.parametrize("options", [{}, {"causal": False}, {"sliding_window": 5}, {"sliding_window": 40}])
def test_visible_pairs_equal_the_spec(options: dict) -> None:
    args, _ = problem([30, 7, 0, 50], [9, 7, 0, 1])
    w = work(check_paged_attention(*args, **options))
    exact = exact_attention(*args, **options)
    assert w.visible_pairs * 4 == int(exact.num_visible.sum())  # num_visible is per (token, q head)


def test_floor_takes_the_larger_time() -> None:
    args, _ = problem([64], [64])
    w = work(check_paged_attention(*args))
    assert w.floor_seconds(1e12, 1e30) == pytest.approx(w.bytes / 1e12)
    assert w.floor_seconds(1e30, 1e6) == pytest.approx(w.flops / 1e6)
