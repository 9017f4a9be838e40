"""The kernel-gaps cases: fp8 caches in pools, plans and bytes; the chunked kind; bars against
the faster of two peers; one fp8 and one chunked case through the bench on the CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pagedattn.errors import PagedAttentionError
from pagedattn.perf import cli, device, inputs, peers, report, shapes
from pagedattn.perf.measure import Result, case_work
from pagedattn.perf.roofline import visible_ranges
from pagedattn.perf.targets import (
    FASTER_OF_CUDNN_AND_FLASH,
    KERNEL_GAP_TARGETS,
    LARGE_KV_BYTES,
    QUICK_DECODE_TARGETS,
    Target,
    judge,
)
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.dtypes import FP8_DTYPES, numpy_dtype

GQA = shapes.MODELS["llama3-8b"]


def small(kind: str = "decode", **fields: object) -> shapes.Case:
    return replace(shapes.Case(GQA, kind, batch=3, context=100, block_size=16, dtype="float32", chunk=8), **fields)


def test_every_case_name_is_one_case_across_the_sets() -> None:
    named: dict[str, shapes.Case] = {}
    for name, group in shapes.SETS.items():
        assert len({c.name for c in group}) == len(group), f"{name}: names are unique"
        for case in group:  # names leave the dtype out: the cpu set runs float32
            first = named.setdefault(case.name, case)
            assert replace(first, dtype=case.dtype) == case, f"{case.name} names two cases"
    gaps = shapes.SETS["kernel-gaps"]
    assert shapes.resolve([c.name for c in gaps]) == gaps, "each name resolves to the set's case, dtype included"
    assert {c.dtype for c in gaps} == {"bfloat16", "float16"}


def test_fp8_names_options_and_pool_keys() -> None:
    plain = small()
    e4m3 = small(kv_dtype="float8_e4m3fn")
    scaled = small(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0)
    e5m2 = small(kv_dtype="float8_e5m2", k_scale=0.5, v_scale=2.0)
    assert e4m3.name == plain.name + "/kv-e4m3" and scaled.name == plain.name + "/kv-e4m3/scaled"
    assert e5m2.name == plain.name + "/kv-e5m2/scaled"
    assert "k_scale" not in plain.options and e4m3.options["k_scale"] == 1.0
    assert (scaled.options["k_scale"], scaled.options["v_scale"]) == (0.5, 2.0)
    assert inputs.pool_key(e4m3) == inputs.pool_key(scaled) != inputs.pool_key(plain), "scales share a pool"
    assert inputs.pool_key(e5m2) != inputs.pool_key(scaled)
    assert not small(k_scale=0.5).scaled, "scales of a cache in the query's dtype are never used"


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_fp8_pools_hold_finite_nonzero_fp8_values(kv_dtype: str) -> None:
    case = small(kv_dtype=kv_dtype, k_scale=0.5, v_scale=2.0)
    pool = inputs.make_pool(case, rotations=2)
    for cache in (pool.key_cache, pool.value_cache):
        assert cache.dtype == numpy_dtype(kv_dtype)
        wide = cache.astype(np.float32)
        assert np.isfinite(wide).all() and (wide != 0).all()
        assert wide.std() > 0.5, "random values, not a constant"
    assert all(q.dtype == np.float32 for q in pool.queries), "queries keep the case's dtype"
    call = inputs.attention_case(case, pool, 1)
    problem = check_paged_attention(*call.args(), **call.options)
    assert problem.cache_dtype == kv_dtype and (problem.k_scale, problem.v_scale) == (0.5, 2.0)


def test_roofline_counts_one_byte_per_fp8_element() -> None:
    bf16 = small(dtype="bfloat16")
    fp8 = small(dtype="bfloat16", kv_dtype="float8_e5m2")
    w16 = case_work(bf16, inputs.make_pool(bf16, 1))
    w8 = case_work(fp8, inputs.make_pool(fp8, 1))
    assert w8.kv_bytes * 2 == w16.kv_bytes > 0
    assert w16.bytes - w8.bytes == w8.kv_bytes, "queries, output and indices stay the same"
    assert w8.flops == w16.flops
    assert inputs.kv_bytes_per_rotation(fp8) * 2 == inputs.kv_bytes_per_rotation(bf16)


def test_chunked_batches_query_their_last_chunk_positions_lower_right() -> None:
    case = small("chunked", context=40)
    assert case.q_lens == [8, 8, 8] and case.name.startswith("llama3-8b/chunked8/")
    assert small("chunked", context=5).q_lens == [5, 5, 5], "a chunk longer than the context is the context"
    assert shapes.Case(GQA, "chunked", 2, 8192, 16).kind_label == "chunked"
    call = inputs.attention_case(case, inputs.make_pool(case, 1), 0)
    problem = check_paged_attention(*call.args(), **call.options)
    assert call.query_start_loc is not None and list(call.query_start_loc) == [0, 8, 16, 24]
    _, positions = problem.token_positions()
    assert list(positions[:8]) == list(range(32, 40)), "the last 8 positions of 40"
    lo, hi = visible_ranges(problem)
    mask = peers.lower_right_causal(8, 40)
    assert (mask.sum(axis=1) == (hi - lo)[:8]).all(), "the SDPA peer's mask sees what the contract sees"
    assert peers.sdpa_query_len(case) == 8 and peers.sdpa_query_len(small("mixed")) is None


def test_kernel_gap_targets_name_exactly_the_set() -> None:
    names = [c.name for c in shapes.SETS["kernel-gaps"]]
    assert sorted(c for t in KERNEL_GAP_TARGETS for c in t.cases) == sorted(names)
    quick = {c.name for c in shapes.SETS["quick"]}
    assert {c for t in QUICK_DECODE_TARGETS for c in t.cases} <= quick
    by_name = {c.name: c for c in shapes.SETS["kernel-gaps"]}
    for target in KERNEL_GAP_TARGETS:
        cases = [by_name[n] for n in target.cases]
        assert sorted(c.block_size for c in cases) == [16, 32, 64], target.name
        assert len({inputs.pool_key(c) for c in cases}) == 1, f"{target.name}: one shape"
        if target.peers == FASTER_OF_CUDNN_AND_FLASH:
            assert all(inputs.kv_bytes_per_rotation(c) >= LARGE_KV_BYTES for c in cases), target.name


def test_kernel_gap_targets_cover_the_issue_shapes() -> None:
    fp8 = [t for t in KERNEL_GAP_TARGETS if t.name.startswith("fp8")]
    assert len(fp8) == 8 and all(t.min_pct_of_ceiling == 85.0 for t in fp8)
    by_name = {c.name: c for c in shapes.SETS["kernel-gaps"]}
    variants = {(by_name[t.cases[0]].cache_dtype, by_name[t.cases[0]].scaled, by_name[t.cases[0]].batch)
                for t in fp8}
    assert variants == {(kv, s, b) for kv in FP8_DTYPES for s in (False, True) for b in (64, 2)}
    layout = [by_name[t.cases[0]].model for t in KERNEL_GAP_TARGETS if t.peers == FASTER_OF_CUDNN_AND_FLASH]
    assert {m.head_dim for m in layout} == {64, 128, 256}
    assert {m.num_kv_heads for m in layout if m.head_dim == 128} == {1, 4, 8}
    assert all(m.softcap is None and m.sliding_window is None for m in layout), "SDPA takes every one"
    chunked = next(t for t in KERNEL_GAP_TARGETS if t.name.startswith("chunked"))
    assert chunked.min_speed_vs_reference == 1.3 and all("/chunked/b16/ctx8192/" in c for c in chunked.cases)
    assert all(m.source for m in shapes.MODELS.values())


LAYOUT = next(t for t in KERNEL_GAP_TARGETS if t.peers == FASTER_OF_CUDNN_AND_FLASH)


def _row(runner: str, case: str, seconds: float | None, status: str = "ok", pct: float = 95.0) -> Result:
    ok = status == "ok"
    return Result(runner, case, "m", "decode", 1, 1, int(case.split("/bs")[1].split("/")[0]), "bfloat16", status,
                  seconds=seconds if ok else None, one_call_s=seconds if ok else None,
                  graph_s=seconds if ok else None, pct_of_ceiling=pct if ok else None)


def _peers_at(sdpa: float | None, flash: float | None, flash_status: str = "ok") -> list[Result]:
    rows = [_row("kern", c, 1.0) for c in LAYOUT.cases]
    if sdpa is not None:
        rows += [_row("sdpa", c, sdpa) for c in LAYOUT.cases]
    if flash is not None or flash_status != "ok":
        rows += [_row("flash", c, flash, flash_status) for c in LAYOUT.cases]
    return rows


@pytest.mark.parametrize("sdpa, flash, flash_status, status, speed", [
    (1.2, 0.9, "ok", "missed", 0.9),  # flash is the faster: 0.9x it misses 0.95x
    (0.9, 1.2, "ok", "missed", 0.9),  # cuDNN the faster
    (1.0, 1.2, "ok", "met", 1.0),
    (1.2, None, "unsupported", "met", 1.2),  # flash cannot run it: the bar is cuDNN's alone
    (None, None, "unsupported", "not measured", None),  # no cuDNN rows
    (1.0, None, "error", "not measured", None),  # flash failed: never met on half the bar
    (1.2, None, "ok", "not measured", None),  # flash not run at all
])
def test_speed_bar_takes_the_faster_peer(sdpa: float | None, flash: float | None, flash_status: str, status: str,
                                         speed: float | None) -> None:
    verdict = judge("kern", LAYOUT, _peers_at(sdpa, flash, flash_status))
    assert verdict.status == status, verdict.reason
    assert verdict.worst_speed_vs_reference == (None if speed is None else pytest.approx(speed))
    if status == "missed":
        assert "the faster of sdpa and flash" in verdict.reason


def test_a_single_peer_target_ignores_other_peers() -> None:
    target = Target("t", LAYOUT.cases, min_speed_vs_reference=0.95)
    assert judge("kern", target, _peers_at(1.2, 0.5)).status == "met"
    assert "the faster of" not in target.bars() and ">= 0.95x sdpa" in target.bars()


def test_a_peer_note_is_numbered_beside_the_runner_and_listed() -> None:
    case = small(dtype="bfloat16", kv_dtype="float8_e4m3fn")
    note = peers.peer_note(case)
    assert "bfloat16" in note and "float8_e4m3fn" in note and "informational" in note
    assert peers.peer_note(small()) == ""
    row = _row("sdpa", case.name, 1e-5)
    row.note = note
    table = report.table_rows([_row("kern", case.name, 2e-5), row])
    assert table[0][0] == "kern" and table[1][0] == "sdpa [1]"
    assert report.reason_notes([row]) == [f"[1] sdpa note: {note}"]


def test_resolve_overrides_the_cache_dtype() -> None:
    (fp8,) = shapes.resolve(["llama3-8b/decode/b4/ctx256/bs16"], kv_dtype="float8_e5m2")
    assert fp8.cache_dtype == "float8_e5m2" and fp8.name.endswith("/kv-e5m2")
    plain = shapes.resolve(["kernel-gaps"], kv_dtype=shapes.KV_AS_QUERY)
    assert not any(c.fp8 or c.k_scale != 1.0 for c in plain)
    expected = {c.name.split("/kv-")[0] for c in shapes.SETS["kernel-gaps"]}
    assert [c.name for c in plain] == list(dict.fromkeys(c.name for c in plain)), "no repeats"
    assert {c.name for c in plain} == expected, "scaled and unscaled, e4m3 and e5m2: one case each"
    with pytest.raises(PagedAttentionError, match="kv_dtype: expected one of"):
        shapes.resolve(["cpu"], kv_dtype="int8")
    assert cli.parse_args(["--kv-dtype", "float8_e4m3fn"]).kv_dtype == "float8_e4m3fn"


FP8_CASE = "llama3-8b/decode/b2/ctx256/bs16/kv-e4m3/scaled"
CHUNKED_CASE = "llama3-70b-tp8/chunked16/b2/ctx128/bs16"


@pytest.mark.skipif(device.gpu_name() is not None, reason="the CPU path of the bench")
def test_bench_runs_an_fp8_and_a_chunked_case_on_the_cpu(tmp_path: Path) -> None:
    assert {FP8_CASE, CHUNKED_CASE} <= {c.name for c in shapes.SETS["cpu"]}
    rc = cli.main(["--backend", "numpy", "--shapes", FP8_CASE, CHUNKED_CASE, "--out", str(tmp_path),
                   "--budget", "0.02", "--no-plot"])
    assert rc == 0
    rows = {r["case"]: r for r in json.loads((tmp_path / "bench.json").read_text())["results"]}
    assert set(rows) == {FP8_CASE, CHUNKED_CASE} and all(r["status"] == "ok" for r in rows.values()), rows
    fp8, chunked = rows[FP8_CASE], rows[CHUNKED_CASE]
    assert fp8["cache_dtype"] == "float8_e4m3fn" and fp8["dtype"] == "float32"
    kv_bytes = 2 * 2 * 256 * 8 * 128 * 1  # one byte per element
    assert fp8["bytes"] == kv_bytes + 2 * 2 * 32 * 128 * 4 + 4 * (2 * 16 + 2)
    assert chunked["kind"] == "chunked" and chunked["flops"] == 4 * 128 * 8 * 2 * sum(range(113, 129))


def test_the_chunked_mask_is_torchs_lower_right_causal() -> None:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn((2, 4, n, 8), generator=gen) for n in (5, 12, 12))
    mask = torch.from_numpy(peers.lower_right_causal(5, 12))
    assert mask.sum(dim=1).tolist() == [8, 9, 10, 11, 12], "query i sits at position 7 + i"
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 12)))
