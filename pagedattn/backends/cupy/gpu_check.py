"""The cupy backend's GPU check: correctness, compute-sanitizer, and timings, in one run.

``python -m pagedattn.backends.cupy.gpu_check --out DIR`` (on a CUDA machine with torch):

1. correctness against :func:`pagedattn.spec.exact.exact_attention` within
   :func:`pagedattn.spec.error_model.tolerance` on a range of cases with poisoned pools
   (NaN and +-inf in unused slots and blocks, -1 / 2**31-1 / -2**31 in unused table columns:
   ``cases.make_case``), plus write_kv,
   copy_blocks, merge_states, bit-for-bit determinism and torch (DLPack) inputs;
2. ``compute-sanitizer`` memcheck and racecheck on a few small cases (``--sanitize`` mode,
   run as a child process without cupy's memory pool);
3. medians (CUDA events, warm-up, rotating input sets) of decode 64 x 4096 and 2 x 65536
   (32 q heads, 8 KV heads, d=128, bf16, block sizes 16/32/64) against the read bandwidth
   measured in the same run and cuDNN SDPA on contiguous K/V, and of causal prefill 8 x 4096
   against cuDNN's FLOP rate. A short table is printed last; logs go to ``--out``.

``--only-prefill`` keeps the tensor-core prefill cases (the 64-row mma.sync kernel's and the
Hopper kernel's); ``--only-wgmma`` only the Hopper kernel's (a one-warpgroup layout check of its
wgmma products, then its cases with ``PAGEDATTN_CUPY_PREFILL=wgmma``);
``--measure shapes`` times prefill 8 x 4,096 per kernel shape (``--shapes``) beside cuDNN.
``--only-decode`` keeps the decode cases (16-bit and fp8), fp8 ops and one case per other
kernel (about 40 s on an H200 with the compiles); ``--measure host,kernels`` adds the host
time per run (with a cProfile) and the device time per kernel (torch.profiler).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from pagedattn.backends.cupy import planning
from pagedattn.backends.cupy.backend import CupyBackend
from pagedattn.backends.cupy.cases import Case, make_case
from pagedattn.spec import kv_ops
from pagedattn.spec.dtypes import dtype_name
from pagedattn.spec.error_model import merge_tolerance, tolerance
from pagedattn.spec.exact import exact_attention
from pagedattn.spec.online_softmax import merge_states


def decode_cases(rng: np.random.Generator, small: bool = False) -> list[Case]:
    """Cases aimed at the tensor-core decode kernel: whole and edge sub-tiles, long ranges
    walked by one CTA (more than one batch of block-table entries per warp), every mask."""
    if small:
        return [
            make_case(
                "decode unsplit window softcap HND bs64",
                rng,
                seq_lens=[2500, 7, 0],
                num_q_heads=8,
                num_kv_heads=2,
                block_size=64,
                dtype="float16",
                kv_layout="HND",
                sliding_window=2300,
                softcap=30.0,
                split_kv=False,
            )
        ]
    return [
        make_case(
            "decode unsplit bs16 (5 table batches per warp)",
            rng,
            seq_lens=[9000, 2500, 0, 70],
            num_q_heads=8,
            num_kv_heads=2,
            split_kv=False,
        ),
        make_case(
            "decode unsplit MQA G=8 HND bs64 fp16",
            rng,
            seq_lens=[5000, 33],
            num_q_heads=8,
            num_kv_heads=1,
            block_size=64,
            dtype="float16",
            kv_layout="HND",
            split_kv=False,
        ),
        make_case(
            "decode softcap alibi scale",
            rng,
            seq_lens=[700, 5, 64, 65],
            num_q_heads=8,
            num_kv_heads=2,
            scale=0.2,
            softcap=30.0,
            alibi_slopes=(2.0 ** -np.arange(1, 9)).astype(np.float32),
        ),
        make_case(
            "decode window HND bs32 fp16",
            rng,
            seq_lens=[3000, 40, 16],
            num_q_heads=8,
            num_kv_heads=2,
            block_size=32,
            dtype="float16",
            kv_layout="HND",
            sliding_window=200,
        ),
        make_case(
            "decode d64 bs32", rng, seq_lens=[1000, 17, 1], head_dim=64, block_size=32
        ),
        make_case(
            "decode G=16", rng, seq_lens=[300, 2000], num_q_heads=16, num_kv_heads=1
        ),
    ]


def fp8_cases(rng: np.random.Generator, small: bool = False) -> list[Case]:
    """fp8 caches (converted in shared memory; k_scale in the score scale, v_scale on O) in
    the decode kernel and, for batches with more queries or G > 16, the tensor-core kernel."""
    scales: dict[str, Any] = {"k_scale": 0.37, "v_scale": 2.5}
    if small:
        return [
            make_case(
                "fp8 e4m3 decode bs32",
                rng,
                seq_lens=[700, 0, 33],
                block_size=32,
                cache_dtype="float8_e4m3fn",
                **scales,
            ),
            make_case(
                "fp8 e5m2 varlen fp16 HND",
                rng,
                seq_lens=[90, 33],
                q_lens=[70, 1],
                dtype="float16",
                kv_layout="HND",
                cache_dtype="float8_e5m2",
                **scales,
            ),
        ]
    cases = []
    for cache in ("float8_e4m3fn", "float8_e5m2"):
        for dtype, bs, layout in (("bfloat16", 16, "NHD"), ("float16", 64, "HND")):
            cases.append(
                make_case(
                    f"fp8 {cache} decode {dtype} bs{bs} {layout}",
                    rng,
                    seq_lens=[0, 1, 17, 300, 2100],
                    block_size=bs,
                    dtype=dtype,
                    kv_layout=layout,
                    cache_dtype=cache,
                    **scales,
                )
            )
            cases.append(
                make_case(
                    f"fp8 {cache} prefill {dtype} bs{bs} {layout}",
                    rng,
                    seq_lens=[300, 129, 64, 7],
                    q_lens=[300, 50, 64, 7],
                    block_size=bs,
                    dtype=dtype,
                    kv_layout=layout,
                    cache_dtype=cache,
                    **scales,
                )
            )
    cases += [
        make_case(  # batches of single queries with prefill beside: the tensor-core kernel
            "fp8 mixed d64 bs32",
            rng,
            seq_lens=[1, 40, 129, 300, 77],
            q_lens=[1, 40, 7, 1, 0],
            head_dim=64,
            block_size=32,
            cache_dtype="float8_e4m3fn",
            **scales,
        ),
        make_case(
            "fp8 decode G=24 (tensor-core prefill kernel)",
            rng,
            seq_lens=[500, 3],
            num_q_heads=48,
            num_kv_heads=2,
            cache_dtype="float8_e5m2",
            **scales,
        ),
        make_case(
            "fp8 long decode split-KV, window, softcap",
            rng,
            seq_lens=[20000, 5],
            num_q_heads=32,
            num_kv_heads=8,
            cache_dtype="float8_e4m3fn",
            sliding_window=5000,
            softcap=30.0,
            **scales,
        ),
        make_case(
            "fp8 pool view",
            rng,
            seq_lens=[300, 45],
            q_lens=[3, 45],
            kv_layout="HND",
            pool_view=True,
            cache_dtype="float8_e5m2",
        ),
    ]
    return cases


def wide_cases(rng: np.random.Generator, small: bool = False) -> list[Case]:
    """Long prefill (at least 512 rows per sequence on average: the Hopper kernel's on an sm_90
    device, the 64-row mma.sync kernel's elsewhere, with PAGEDATTN_CUPY_PREFILL=mma and for
    fp8 caches): whole, diagonal and edge tiles, every mask, GQA ratios that leave rows of a
    tile empty, fp8, split-KV partials."""
    if small:
        return [
            make_case(
                "wide prefill window bs32 HND",
                rng,
                seq_lens=[300, 77],
                q_lens=[300, 77],
                block_size=32,
                kv_layout="HND",
                sliding_window=100,
            )
        ]
    cases = [
        make_case(
            f"wide prefill {dtype} bs{bs} {layout}",
            rng,
            seq_lens=[700, 300, 64],
            q_lens=[700, 130, 64],
            block_size=bs,
            dtype=dtype,
            kv_layout=layout,
        )
        for dtype, bs, layout in (
            ("bfloat16", 16, "NHD"),
            ("float16", 32, "HND"),
            ("bfloat16", 64, "HND"),
            ("float16", 64, "NHD"),
        )
    ]
    cases += [
        make_case("wide non-causal", rng, seq_lens=[500, 200], q_lens=[400, 200], causal=False),
        make_case(
            "wide window d64 bs64", rng, seq_lens=[900, 260], q_lens=[700, 260], head_dim=64,
            block_size=64, sliding_window=129,
        ),
        make_case(
            "wide softcap alibi scale",
            rng,
            seq_lens=[400, 300],
            q_lens=[400, 150],
            scale=0.2,
            softcap=30.0,
            alibi_slopes=(2.0 ** -np.arange(1, 9)).astype(np.float32),
        ),
        make_case(
            "wide G=12 (rows of a tile left empty)",
            rng,
            seq_lens=[333, 90],
            q_lens=[333, 90],
            num_q_heads=24,
            num_kv_heads=2,
        ),
        make_case("wide G=7", rng, seq_lens=[301, 45], q_lens=[301, 45], num_q_heads=14),
        make_case("wide MHA", rng, seq_lens=[1100, 1000], q_lens=[1100, 900], num_q_heads=2),
        make_case(
            "wide chunked prefill split-KV", rng, seq_lens=[9000, 4000], q_lens=[200, 300]
        ),
        make_case(
            "wide negative scale", rng, seq_lens=[300, 260], q_lens=[300, 200], scale=-0.05
        ),
        *(
            make_case(
                f"wide fp8 {cache} bs{bs}",
                rng,
                seq_lens=[600, 129],
                q_lens=[600, 129],
                block_size=bs,
                cache_dtype=cache,
                k_scale=0.37,
                v_scale=2.5,
            )
            for cache, bs in (("float8_e4m3fn", 16), ("float8_e5m2", 64))
        ),
        make_case(
            "wide pool view HND", rng, seq_lens=[400, 300], q_lens=[400, 300], kv_layout="HND",
            pool_view=True,
        ),
    ]
    return cases


def correctness_cases(
    rng: np.random.Generator, small: bool = False, only_decode: bool = False
) -> list[Case]:
    """Cases covering the declared envelope (``small``: the few run under compute-sanitizer;
    ``only_decode``: the decode cases plus one case per other kernel, for a short GPU call)."""
    if small:
        return [
            make_case(
                "decode split-KV bs16",
                rng,
                seq_lens=[0, 1500, 17],
                num_q_heads=8,
                num_kv_heads=2,
                head_dim=128,
                block_size=16,
            ),
            *decode_cases(rng, small=True),
            *fp8_cases(rng, small=True),
            *wide_cases(rng, small=True),
            *(
                []
                if only_decode
                else [
                    make_case(
                        "varlen prefill HND bs32",
                        rng,
                        seq_lens=[70, 33],
                        q_lens=[70, 5],
                        block_size=32,
                        kv_layout="HND",
                        dtype="float16",
                        head_dim=64,
                    )
                ]
            ),
            make_case(
                "pool view fp32 window",
                rng,
                seq_lens=[300],
                q_lens=[3],
                block_size=64,
                dtype="float32",
                kv_layout="HND",
                pool_view=True,
                sliding_window=50,
            ),
        ]
    if only_decode:
        return [
            *(
                make_case(
                    f"decode {dtype} bs{bs} {layout} GQA4",
                    rng,
                    seq_lens=[0, 1, 15, 16, 17, 300, 2100],
                    num_q_heads=8,
                    num_kv_heads=2,
                    block_size=bs,
                    dtype=dtype,
                    kv_layout=layout,
                )
                for dtype in ("bfloat16", "float16")
                for bs in (16, 32, 64)
                for layout in ("NHD", "HND")
            ),
            *decode_cases(rng),
            make_case("decode MQA 8/1", rng, seq_lens=[33, 700], num_q_heads=8, num_kv_heads=1),
            make_case("decode G=7", rng, seq_lens=[33, 700], num_q_heads=14, num_kv_heads=2),
            make_case("decode MHA", rng, seq_lens=[33, 1000], num_q_heads=4, num_kv_heads=4),
            make_case("window decode", rng, seq_lens=[3000], sliding_window=100),
            make_case(
                "long decode split-KV", rng, seq_lens=[20000, 5], num_q_heads=32, num_kv_heads=8
            ),
            make_case(  # the CUDA-core kernel (launch arguments prepared in plan)
                "pool view decode fp32",
                rng,
                seq_lens=[1000, 3],
                dtype="float32",
                kv_layout="HND",
                pool_view=True,
                block_size=32,
            ),
            make_case(  # the tensor-core prefill kernel
                "prefill mma bf16 bs16 NHD",
                rng,
                seq_lens=[300, 129, 64, 7],
                q_lens=[300, 50, 64, 7],
                block_size=16,
            ),
            make_case(
                "mixed float16 bs32 HND",
                rng,
                seq_lens=[1, 40, 129, 300, 77],
                q_lens=[1, 40, 7, 1, 0],
                block_size=32,
                dtype="float16",
                kv_layout="HND",
            ),
            *fp8_cases(rng),
            *wide_cases(rng),
        ]
    cases = []
    for dtype in ("bfloat16", "float16", "float32"):
        for bs in (16, 32, 64):
            for layout in ("NHD", "HND"):
                cases.append(
                    make_case(
                        f"decode {dtype} bs{bs} {layout} GQA4",
                        rng,
                        seq_lens=[0, 1, 15, 16, 17, 300, 2100],
                        num_q_heads=8,
                        num_kv_heads=2,
                        block_size=bs,
                        dtype=dtype,
                        kv_layout=layout,
                    )
                )
                cases.append(
                    make_case(
                        f"mixed {dtype} bs{bs} {layout}",
                        rng,
                        seq_lens=[1, 40, 129, 300, 77],
                        q_lens=[1, 40, 7, 1, 0],
                        num_q_heads=8,
                        num_kv_heads=2,
                        block_size=bs,
                        dtype=dtype,
                        kv_layout=layout,
                    )
                )
    for dtype in ("bfloat16", "float16"):  # the tensor-core kernel: >= 8 queries per sequence
        for bs in (16, 32, 64):
            for layout in ("NHD", "HND"):
                cases.append(
                    make_case(
                        f"prefill mma {dtype} bs{bs} {layout}",
                        rng,
                        seq_lens=[300, 129, 64, 7],
                        q_lens=[300, 50, 64, 7],
                        num_q_heads=8,
                        num_kv_heads=2,
                        block_size=bs,
                        dtype=dtype,
                        kv_layout=layout,
                    )
                )
    cases.append(make_case("chunked prefill mma split-KV", rng, seq_lens=[6000], q_lens=[64]))
    for head_dim in (64, 256):
        cases.append(
            make_case(
                f"prefill d{head_dim}",
                rng,
                seq_lens=[200, 90],
                q_lens=[200, 30],
                head_dim=head_dim,
                dtype="float16",
            )
        )
    cases += [
        make_case("decode MQA 8/1", rng, seq_lens=[33, 700], num_q_heads=8, num_kv_heads=1),
        make_case("decode G=7", rng, seq_lens=[33, 700], num_q_heads=14, num_kv_heads=2),
        make_case("prefill G=12", rng, seq_lens=[50], q_lens=[50], num_q_heads=24, num_kv_heads=2),
        make_case("decode MHA", rng, seq_lens=[33, 1000], num_q_heads=4, num_kv_heads=4),
        make_case("non-causal", rng, seq_lens=[120, 64], q_lens=[20, 64], causal=False),
        make_case("sliding window", rng, seq_lens=[400, 100], q_lens=[30, 1], sliding_window=37),
        make_case("window decode", rng, seq_lens=[3000], sliding_window=100),
        make_case("softcap", rng, seq_lens=[300, 20], q_lens=[4, 20], softcap=5.0),
        make_case(
            "alibi",
            rng,
            seq_lens=[300, 20],
            q_lens=[4, 20],
            alibi_slopes=(2.0 ** -np.arange(1, 9)).astype(np.float32),
        ),
        make_case(
            "scale, window, softcap, alibi",
            rng,
            seq_lens=[500],
            q_lens=[9],
            scale=0.3,
            sliding_window=64,
            softcap=20.0,
            alibi_slopes=np.linspace(0.01, 0.2, 8).astype(np.float32),
        ),
        make_case("long decode split-KV", rng, seq_lens=[20000, 5], num_q_heads=32, num_kv_heads=8),
        *decode_cases(rng),
        *fp8_cases(rng),
        *wide_cases(rng),
        make_case(
            "pool view HND",
            rng,
            seq_lens=[300, 45],
            q_lens=[3, 45],
            kv_layout="HND",
            pool_view=True,
        ),
        make_case(
            "pool view decode fp32",
            rng,
            seq_lens=[1000, 3],
            dtype="float32",
            kv_layout="HND",
            pool_view=True,
            block_size=32,
        ),
    ]
    return cases


def device_inputs(backend: CupyBackend, case: Case) -> tuple[Any, Any, Any]:
    """Query and caches on the device; pool views for ``case.pool_view`` (HND only)."""
    if not case.pool_view:
        return tuple(backend.to_device(x) for x in (case.query, case.key_cache, case.value_cache))
    shape = case.key_cache.shape
    pool = np.full((shape[0], 2, 2, *shape[1:]), np.nan, dtype=np.float32).astype(
        case.key_cache.dtype
    )
    pool[:, 0, 1], pool[:, 1, 1] = case.key_cache, case.value_cache
    device_pool = backend.to_device(pool)
    return backend.to_device(case.query), device_pool[:, 0, 1], device_pool[:, 1, 1]


def run_case(backend: CupyBackend, case: Case, inputs: tuple[Any, Any, Any] | None = None) -> Any:
    q, k, v = inputs or device_inputs(backend, case)
    to_dev = backend.to_device
    options = dict(case.options)
    if "alibi_slopes" in options:
        options["alibi_slopes"] = to_dev(options["alibi_slopes"])
    choose_split = planning.choose_split
    if not case.split_kv:  # one part per range, however long
        planning.choose_split = lambda base_tiles, slots, **_: max(1, int(base_tiles.max()))  # type: ignore[assignment]
    try:
        out, lse = backend.paged_attention(
            q,
            k,
            v,
            to_dev(case.block_tables),
            to_dev(case.seq_lens),
            None if case.query_start_loc is None else to_dev(case.query_start_loc),
            return_lse=True,
            **options,
        )
    finally:
        planning.choose_split = choose_split
    return backend.to_numpy(out), backend.to_numpy(lse)


def check_case(backend: CupyBackend, case: Case, exact: Any = None) -> tuple[bool, str]:
    """Compare with the exact answer (``exact``: the case's, if already computed); return (ok,
    summary with the worst error / bound ratio)."""
    out, lse = run_case(backend, case)
    if exact is None:
        exact = exact_case(case)
    tol = tolerance(
        dtype_name(case.query.dtype),
        case.query.shape[-1],
        cache_dtype=dtype_name(case.key_cache.dtype),
    )
    out64 = out.astype(np.float64)
    bound = tol.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
    empty = exact.num_visible == 0
    problems = []
    if not np.isfinite(out64).all():
        problems.append(f"{int((~np.isfinite(out64)).sum())} non-finite outputs")
    error = np.abs(out64 - exact.out)
    ratio = float(np.divide(error, bound, out=np.zeros_like(error), where=bound > 0).max(initial=0.0))
    if ratio > 1.0:
        idx = np.unravel_index(
            np.argmax(np.abs(out64 - exact.out) / np.maximum(bound, 1e-300)), out.shape
        )
        problems.append(
            f"out error/bound {ratio:.3g} at (token, head, dim)={idx}: "
            f"{out64[idx]!r} vs {exact.out[idx]!r}"
        )
    if (out64[empty] != 0).any() or (lse[empty] != -np.inf).any():
        problems.append("empty rows are not out=0, lse=-inf")
    lse_bound = tol.lse_bound(exact.score_scale, exact.num_visible)
    full = ~empty
    lse_ratio = float(np.max(np.abs(lse[full] - exact.lse[full]) / lse_bound[full], initial=0.0))
    if lse_ratio > 1.0:
        problems.append(f"lse error/bound {lse_ratio:.3g}")
    summary = f"out err/bound {ratio:.3f}, lse err/bound {lse_ratio:.3f}"
    return not problems, summary + ("; " + "; ".join(problems) if problems else "")


def run_check(name: str, check: Callable[[], tuple[bool, str]]) -> tuple[str, bool, str]:
    """Run one check and print its line: ``(name, ok, summary)``; an exception fails it, with
    its type and message as the summary."""
    try:
        ok, summary = check()
    except Exception as error:
        ok, summary = False, f"{type(error).__name__}: {error}"
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {summary}", flush=True)
    return name, ok, summary


def exact_case(case: Case) -> Any:
    """The spec's exact answer for ``case``."""
    return exact_attention(*case.args(), **case.options)


def check_determinism(backend: CupyBackend, rng: np.random.Generator) -> tuple[bool, str]:
    """Same inputs twice, and the same logical K/V in other physical blocks: identical bits."""
    case = make_case("determinism", rng, seq_lens=[3000, 70], q_lens=[5, 70], block_size=16)
    first, second = run_case(backend, case), run_case(backend, case)
    moved = Case(**{**case.__dict__})
    perm = rng.permutation(case.key_cache.shape[0])
    inverse = np.argsort(perm)
    moved.key_cache, moved.value_cache = case.key_cache[perm], case.value_cache[perm]
    used = np.arange(case.block_tables.shape[1])[None, :] < -(-case.seq_lens[:, None] // 16)
    moved.block_tables = np.where(
        used, inverse[np.clip(case.block_tables, 0, len(perm) - 1)], case.block_tables
    ).astype(np.int32)
    third = run_case(backend, moved)
    same = all(
        np.array_equal(a.view(np.uint8), b.view(np.uint8))
        for x, y in ((first, second), (first, third))
        for a, b in zip(x, y, strict=True)
    )
    return same, "bit-identical twice and after moving blocks" if same else "bits differ"


def check_ops(backend: CupyBackend, rng: np.random.Generator) -> list[tuple[str, bool, str]]:
    """write_kv, copy_blocks (bit for bit) and merge_states (merge tolerance) against the spec."""
    results = []
    for dtype in ("bfloat16", "float16", "float32"):
        for layout in ("NHD", "HND"):
            case = make_case(
                "ops",
                rng,
                seq_lens=[40],
                num_kv_heads=2,
                head_dim=64,
                block_size=16,
                dtype=dtype,
                kv_layout=layout,
            )
            kc, vc = case.key_cache.copy(), case.value_cache.copy()
            T = 7
            key = rng.standard_normal((T, 2, 64)).astype(kc.dtype)
            value = rng.standard_normal((T, 2, 64)).astype(kc.dtype)
            slots = np.array([3, -1, 17, 40, 0, 63, -1], dtype=np.int64)
            dk, dv = backend.to_device(kc), backend.to_device(vc)
            backend.write_kv(
                backend.to_device(key),
                backend.to_device(value),
                dk,
                dv,
                backend.to_device(slots),
                kv_layout=layout,
            )
            kv_ops.write_kv(key, value, kc, vc, slots, kv_layout=layout)
            ok = all(
                np.array_equal(backend.to_numpy(d).view(np.uint8), h.view(np.uint8))
                for d, h in ((dk, kc), (dv, vc))
            )
            results.append((f"write_kv {dtype} {layout}", ok, "bit-identical" if ok else "differs"))
            pairs = np.array([[0, 1], [1, 2], [3, 0]], dtype=np.int64)  # chained: sources first
            backend.copy_blocks(dk, dv, backend.to_device(pairs), kv_layout=layout)
            kv_ops.copy_blocks(kc, vc, pairs, kv_layout=layout)
            ok = all(
                np.array_equal(backend.to_numpy(d).view(np.uint8), h.view(np.uint8))
                for d, h in ((dk, kc), (dv, vc))
            )
            results.append(
                (f"copy_blocks {dtype} {layout}", ok, "bit-identical" if ok else "differs")
            )
        shape = (9, 4, 64)
        out_a = rng.standard_normal(shape).astype(case.query.dtype)
        out_b = rng.standard_normal(shape).astype(case.query.dtype)
        lse_a = rng.standard_normal(shape[:2]).astype(np.float32) * 3
        lse_b = rng.standard_normal(shape[:2]).astype(np.float32) * 3
        lse_a[0, :2] = -np.inf
        lse_b[0, 1:3] = -np.inf
        out_a[0, :2] = np.nan  # an empty part's out is ignored, even NaN
        out, lse = backend.merge_states(
            *(backend.to_device(x) for x in (out_a, lse_a, out_b, lse_b))
        )
        out, lse = backend.to_numpy(out).astype(np.float64), backend.to_numpy(lse)
        ref_out, ref_lse = merge_states(out_a, lse_a, out_b, lse_b)
        tol = merge_tolerance(dtype)
        bound = 2 * (tol.u_out * np.abs(ref_out) + 4 * tol.u_p * np.abs(ref_out).max())
        finite = np.isfinite(ref_lse)
        ok = (
            np.isfinite(out).all()
            and (np.abs(out - ref_out) <= bound).all()
            and (lse[~finite] == -np.inf).all()
            and (
                np.abs(lse[finite] - ref_lse[finite]) <= 1e-5 * (1 + np.abs(ref_lse[finite]))
            ).all()
        )
        results.append(
            (f"merge_states {dtype}", bool(ok), "within merge tolerance" if ok else "differs")
        )
    return results


def check_fp8_ops(backend: CupyBackend, rng: np.random.Generator) -> list[tuple[str, bool, str]]:
    """write_kv into fp8 caches (x / scale as the spec rounds it; overflow, -0, subnormals)
    and copy_blocks of fp8 caches, bit for bit against the spec."""
    from pagedattn.spec.dtypes import numpy_dtype

    results = []
    for dtype, cache, layout in (
        ("bfloat16", "float8_e4m3fn", "NHD"),
        ("float16", "float8_e5m2", "HND"),
        ("float32", "float8_e4m3fn", "HND"),
        ("float32", "float8_e5m2", "NHD"),
    ):
        case = make_case(
            "fp8 ops",
            rng,
            seq_lens=[40],
            num_kv_heads=2,
            head_dim=64,
            block_size=16,
            dtype=dtype,
            kv_layout=layout,
            cache_dtype=cache,
        )
        kc, vc = case.key_cache.copy(), case.value_cache.copy()
        T = 7
        magnitude = np.exp(rng.uniform(-25.0, 12.0, (T, 2, 64)))  # subnormal to overflow
        key = (magnitude * rng.choice([-1.0, 1.0], (T, 2, 64))).astype(numpy_dtype(dtype))
        value = (rng.standard_normal((T, 2, 64)) * 300).astype(numpy_dtype(dtype))
        key[0, 0, :4] = [-0.0, 0.0, 464.0 * 0.37, 61440.0 * 2.5]  # -0, 0, rounding boundaries
        slots = np.array([3, -1, 17, 40, 0, 63, -1], dtype=np.int64)
        scales: dict[str, Any] = {"k_scale": 0.37, "v_scale": 2.5}
        dk, dv = backend.to_device(kc), backend.to_device(vc)
        backend.write_kv(
            backend.to_device(key),
            backend.to_device(value),
            dk,
            dv,
            backend.to_device(slots),
            kv_layout=layout,
            **scales,
        )
        kv_ops.write_kv(key, value, kc, vc, slots, kv_layout=layout, **scales)
        same = [
            backend.to_numpy(d).view(np.uint8) == h.view(np.uint8) for d, h in ((dk, kc), (dv, vc))
        ]
        ok = all(bool(x.all()) for x in same)
        detail = "bit-identical" if ok else f"{sum(int((~x).sum()) for x in same)} bytes differ"
        results.append((f"write_kv {dtype} -> {cache} {layout}", ok, detail))
        pairs = np.array([[0, 1], [1, 2], [3, 0]], dtype=np.int64)
        backend.copy_blocks(dk, dv, backend.to_device(pairs), kv_layout=layout)
        kv_ops.copy_blocks(kc, vc, pairs, kv_layout=layout)
        ok = all(
            np.array_equal(backend.to_numpy(d).view(np.uint8), h.view(np.uint8))
            for d, h in ((dk, kc), (dv, vc))
        )
        results.append((f"copy_blocks {cache} {layout}", ok, "bit-identical" if ok else "differs"))
    return results


def check_torch_inputs(backend: CupyBackend, rng: np.random.Generator) -> tuple[bool, str]:
    """torch CUDA tensors in (DLPack), torch tensors out, launched on torch's current stream."""
    import torch

    case = make_case("torch", rng, seq_lens=[500, 3], q_lens=[4, 3])
    to_torch = lambda x: torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()  # noqa: E731
    q, k, v = (to_torch(x) for x in (case.query, case.key_cache, case.value_cache))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, _ = backend.paged_attention(
            q,
            k,
            v,
            torch.from_numpy(case.block_tables).cuda(),
            torch.from_numpy(case.seq_lens).cuda(),
            torch.from_numpy(case.query_start_loc).cuda(),
            return_lse=True,
        )
    stream.synchronize()
    expected, _ = run_case(backend, case)
    got = backend.to_numpy(out)
    ok = isinstance(out, torch.Tensor) and np.array_equal(
        got.view(np.uint16), expected.view(np.uint16)
    )
    return ok, f"torch in/out, same bits as cupy inputs: {ok}"


def prefill_cases(rng: np.random.Generator) -> list[Case]:
    """The tensor-core prefill kernels' cases (``--only-prefill``): the wide (long prefill)
    cases, 64-row prefill at three block sizes, chunked prefill with split-KV, fp8 prefill."""
    keep = (
        "prefill mma bfloat16 bs16 NHD",
        "prefill mma float16 bs32 HND",
        "prefill mma bfloat16 bs64 HND",
        "chunked prefill mma split-KV",
        "prefill G=12",
        "non-causal",
        "sliding window",
        "alibi",
    )
    full = correctness_cases(rng)
    return [
        *wide_cases(rng),
        *(c for c in full if c.name in keep),
        *(c for c in full if c.name.startswith("fp8") and "prefill" in c.name),
    ]


def _column_map(got: np.ndarray, ref: np.ndarray, width: int = 8) -> str:
    """For a failed product: which reference column block (of ``width``) each column block of
    ``got`` matches best, as "got->ref" pairs; "-" where it matches none (rel err > 1e-2)."""
    pairs = []
    blocks = got.shape[1] // width
    for b in range(blocks):
        g = got[:, b * width:(b + 1) * width]
        errors = [
            float(np.linalg.norm(g - ref[:, c * width:(c + 1) * width]))
            / max(float(np.linalg.norm(ref[:, c * width:(c + 1) * width])), 1e-30)
            for c in range(blocks)
        ]
        best = int(np.argmin(errors))
        pairs.append(f"{b}->{best if errors[best] < 1e-2 else '-'}")
    return " ".join(pairs)


def check_wgmma_layout(backend: CupyBackend) -> list[tuple[str, bool, str]]:
    """One warpgroup's S = Q K^T and O = P V through the wgmma kernel's shared-memory layout and
    descriptors (``wgmma_layout_check``) against float64 products of the same rounded inputs."""
    import cupy

    from pagedattn.backends.cupy import runtime, specializations
    from pagedattn.spec.dtypes import numpy_dtype

    rng = np.random.default_rng(11)
    results = []
    for dtype in ("bfloat16", "float16"):
        for head_dim in (128, 64):
            name = f"wgmma layout {dtype} d{head_dim}"
            try:
                q, k, v = (
                    rng.standard_normal((64, head_dim)).astype(numpy_dtype(dtype)) for _ in range(3)
                )
                p = rng.random((64, 64)).astype(numpy_dtype(dtype))
                device = [cupy.asarray(np.ascontiguousarray(x).view(np.uint16)) for x in (q, k, p, v)]
                s_out = cupy.full((64, 64), np.nan, cupy.float32)
                o_out = cupy.full((64, head_dim), np.nan, cupy.float32)
                function = runtime.kernel(specializations.wgmma_layout_check(dtype, head_dim))
                function((1,), (128,), (*device, s_out, o_out))
                cupy.cuda.runtime.deviceSynchronize()
                s_got, o_got = cupy.asnumpy(s_out), cupy.asnumpy(o_out)
                s_ref = q.astype(np.float64) @ k.astype(np.float64).T
                o_ref = p.astype(np.float64) @ v.astype(np.float64)
                s_err = float(np.linalg.norm(s_got - s_ref) / np.linalg.norm(s_ref))
                o_err = float(np.linalg.norm(o_got - o_ref) / np.linalg.norm(o_ref))
                ok = bool(s_err < 1e-4 and o_err < 1e-4)
                summary = f"S rel err {s_err:.2e}, O rel err {o_err:.2e}"
                if not s_err < 1e-4:
                    summary += f"; S columns {_column_map(s_got, s_ref)}"
                    summary += f"; S rows {_column_map(s_got.T, s_ref.T)}"
                if not o_err < 1e-4:
                    summary += f"; O columns {_column_map(o_got, o_ref)}"
                    summary += f"; O rows {_column_map(o_got.T, o_ref.T)}"
            except Exception as error:
                ok, summary = False, f"{type(error).__name__}: {error}"
            results.append((name, ok, summary))
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {summary}", flush=True)
    return results


def wgmma_cases(rng: np.random.Generator) -> list[Case]:
    """Cases for the Hopper kernel (run with PAGEDATTN_CUPY_PREFILL=wgmma): the wide cases
    (fp8 ones check the fallback to the mma.sync kernel) and short prefill the switch forces
    onto 128-row tiles (mostly empty rows, split-KV, G=12, window, ALiBi)."""
    keep = (
        "prefill mma bfloat16 bs16 NHD",
        "prefill mma float16 bs32 HND",
        "chunked prefill mma split-KV",
        "prefill G=12",
        "non-causal",
        "sliding window",
        "alibi",
    )
    wide = [c for c in wide_cases(rng) if c.name != "wide chunked prefill split-KV"]  # (9,000 keys:
    # the slowest exact answer; "chunked prefill mma split-KV" below splits too)
    # head_dim 64 without a window (the first H200 run failed "wide window d64 bs64": ptxas
    # reused the registers holding Q); windows smaller than a tile and not tile-aligned, at
    # both head dims and block sizes 16 and 64
    windows = [
        make_case(
            "d64 bs64 no window", rng, seq_lens=[500, 200], q_lens=[500, 200], head_dim=64,
            block_size=64,
        ),
        make_case(
            "window d64 bs16 W=50 fp16", rng, seq_lens=[700, 130], q_lens=[600, 130],
            head_dim=64, block_size=16, dtype="float16", sliding_window=50,
        ),
        make_case(
            "window d128 bs64 W=129", rng, seq_lens=[900, 260], q_lens=[700, 260],
            block_size=64, sliding_window=129,
        ),
        make_case(
            "window d128 bs16 W=29 G=7", rng, seq_lens=[500, 90], q_lens=[450, 90],
            num_q_heads=14, block_size=16, sliding_window=29,
        ),
    ]
    return [*wide, *(c for c in correctness_cases(rng) if c.name in keep), *windows]


#: Passes of :func:`check_wgmma`: the schedules at 1 CTA/SM, and "2cta" (2 CTAs/SM,
#: PAGEDATTN_CUPY_WGMMA_CTAS=2: the serial schedule, Q read from shared memory by wgmma)
WGMMA_PASSES: tuple[str, ...] = ("overlap", "serial", "2cta")


@contextmanager
def wgmma_calls() -> Iterator[list[Any]]:
    """A list that collects the arguments of every ``specializations.wgmma_attention`` call
    made inside the block (planning makes one when the Hopper kernel takes a problem)."""
    from pagedattn.backends.cupy import specializations

    taken: list[Any] = []
    original = specializations.wgmma_attention

    def counting(*args: Any, **kwargs: Any) -> Any:
        taken.append(args)
        return original(*args, **kwargs)

    specializations.wgmma_attention = counting  # type: ignore[assignment]
    try:
        yield taken
    finally:
        specializations.wgmma_attention = original  # type: ignore[assignment]


def check_wgmma(
    backend: CupyBackend, rng: np.random.Generator, passes: tuple[str, ...] = WGMMA_PASSES
) -> list[tuple[str, bool, str]]:
    """The wgmma layout check, then :func:`wgmma_cases` and the determinism check with
    PAGEDATTN_CUPY_PREFILL=wgmma for each of ``passes``; each case also says whether the Hopper
    kernel took it (it must, except for fp8 caches, which must fall back)."""

    results = check_wgmma_layout(backend)
    keys = ("PAGEDATTN_CUPY_PREFILL", "PAGEDATTN_CUPY_WGMMA_SCHEDULE", "PAGEDATTN_CUPY_WGMMA_CTAS")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ["PAGEDATTN_CUPY_PREFILL"] = "wgmma"
    try:
        with wgmma_calls() as taken:
            cases = wgmma_cases(rng)
            exact = [exact_case(case) for case in cases]
            for schedule in passes:
                os.environ["PAGEDATTN_CUPY_WGMMA_SCHEDULE"] = "serial" if schedule == "2cta" else schedule
                os.environ["PAGEDATTN_CUPY_WGMMA_CTAS"] = "2" if schedule == "2cta" else "1"
                for index, (case, answer) in enumerate(zip(cases, exact, strict=True)):
                    d128 = case.query.shape[-1] == 128
                    if schedule == "overlap" and not d128:
                        continue  # head_dim 64 has the serial schedule only: checked once
                    if (
                        schedule == "serial" and d128 and index >= 4
                        and "G=12" not in case.name and "window" not in case.name
                    ):
                        continue  # the serial schedule at d = 128: the four layouts, G=12, windows
                    taken.clear()
                    fp8 = "fp8" in case.name
                    try:
                        ok, summary = check_case(backend, case, answer)
                        used = bool(taken)
                        if used == fp8:
                            ok = False
                        summary += "; wgmma kernel" if used else "; mma.sync kernel"
                    except Exception as error:
                        ok, summary = False, f"{type(error).__name__}: {error}"
                    name = f"wgmma {schedule} {case.name}"
                    results.append((name, ok, summary))
                    print(f"{'ok  ' if ok else 'FAIL'} {name}: {summary}", flush=True)
                results.append(
                    run_check(f"wgmma {schedule} determinism", partial(check_determinism, backend, rng))
                )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return results


def sanitize_main(only_decode: bool = False) -> int:
    """Small cases for compute-sanitizer: no memory pool, so out-of-bounds accesses are caught."""
    import cupy

    cupy.cuda.set_allocator(None)
    backend = CupyBackend()
    rng = np.random.default_rng(7)
    failures = 0
    for case in correctness_cases(rng, small=True, only_decode=only_decode):
        with wgmma_calls() as taken:
            ok, summary = check_case(backend, case)
        failures += not ok
        kernel = "; wgmma kernel" if taken else ""
        print(f"sanitize case {case.name}: {'ok' if ok else 'FAIL'} ({summary}{kernel})", flush=True)
    ops = check_fp8_ops(backend, rng)[:2] + ([] if only_decode else check_ops(backend, rng)[:4])
    for name, ok, detail in ops:
        failures += not ok
        print(f"sanitize op {name}: {'ok' if ok else 'FAIL'} ({detail})", flush=True)
    backend.synchronize()
    return 1 if failures else 0


# -- timing ------------------------------------------------------------------------
def median_ms(calls: list[Any], *, warmup: int = 3, repeats: int = 15) -> float:
    """Median ms per call: CUDA events around one pass over ``calls`` (rotating inputs)."""
    import torch

    for _ in range(warmup):
        for call in calls:
            call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        for call in calls:
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return float(np.median(times))


def read_bandwidth() -> tuple[float, float]:
    """(read GB/s of a bf16 sum over 4 GiB, copy GB/s counting read + write), same run."""
    import torch

    x = torch.randn(2**31 // 2, device="cuda").to(torch.bfloat16)  # 2 GiB
    y = torch.randn(2**31 // 2, device="cuda").to(torch.bfloat16)
    read_ms = median_ms([lambda: x.sum(dtype=torch.float32), lambda: y.sum(dtype=torch.float32)])
    z = torch.empty_like(x)
    copy_ms = median_ms([lambda: z.copy_(x), lambda: z.copy_(y)])
    return x.numel() * 2 / read_ms / 1e6, 2 * x.numel() * 2 / copy_ms / 1e6


def paged_inputs(batch: int, seq_len: int, block_size: int, q_len: int | None, seed: int) -> dict:
    """torch inputs: bf16 query, NHD caches with shuffled blocks, int32 index arrays."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    Hq, Hkv, D = 32, 8, 128
    blocks_per_seq = seq_len // block_size
    num_blocks = batch * blocks_per_seq
    tokens = batch if q_len is None else batch * q_len
    kc = torch.randn(
        (num_blocks, block_size, Hkv, D), device="cuda", generator=g, dtype=torch.bfloat16
    )
    vc = torch.randn(
        (num_blocks, block_size, Hkv, D), device="cuda", generator=g, dtype=torch.bfloat16
    )
    tables = torch.randperm(num_blocks, device="cuda", generator=g).to(torch.int32)
    return {
        "query": torch.randn((tokens, Hq, D), device="cuda", generator=g, dtype=torch.bfloat16),
        "key_cache": kc,
        "value_cache": vc,
        "block_tables": tables.reshape(batch, blocks_per_seq),
        "seq_lens": torch.full((batch,), seq_len, device="cuda", dtype=torch.int32),
        "query_start_loc": None
        if q_len is None
        else torch.arange(0, tokens + 1, q_len, device="cuda", dtype=torch.int32),
    }


def time_paged(
    backend: CupyBackend, batch: int, seq_len: int, block_size: int, q_len: int | None, sets: int
) -> float:
    calls = []
    keep = []
    for seed in range(sets):
        x = paged_inputs(batch, seq_len, block_size, q_len, seed)
        plan = backend.plan(
            x["query"],
            x["key_cache"],
            x["value_cache"],
            x["block_tables"],
            x["seq_lens"],
            x["query_start_loc"],
        )
        keep.append((plan, x))
        calls.append(
            lambda plan=plan, x=x: backend.run(plan, x["query"], x["key_cache"], x["value_cache"])
        )
    ms = median_ms(calls)
    print(f"timed cupy {batch}x{seq_len} q_len={q_len} bs={block_size}: {ms:.4f} ms", flush=True)
    return ms


def time_cudnn(
    batch: int, seq_len: int, q_len: int, sets: int, causal: bool
) -> tuple[float | None, str]:
    """cuDNN SDPA on contiguous K/V [B, 8, L, 128] with 32 query heads (GQA), bf16."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    calls = []
    for seed in range(sets):
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        q = torch.randn((batch, 32, q_len, 128), device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn((batch, 8, seq_len, 128), device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn((batch, 8, seq_len, 128), device="cuda", generator=g, dtype=torch.bfloat16)
        calls.append(
            lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, enable_gqa=True
            )
        )
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return median_ms(calls), "cuDNN GQA"
    except Exception as error:  # cuDNN may refuse a shape; say so rather than guess
        first = str(error).splitlines()[0][:120]
        return None, f"cuDNN failed: {first}"


def benchmarks(backend: CupyBackend, log: dict) -> list[list[str]]:
    rows = []
    read_gbs, copy_gbs = read_bandwidth()
    log["read_GBps"], log["copy_GBps"] = read_gbs, copy_gbs
    rows.append(["read bandwidth (bf16 sum, 2 GiB)", "", f"{read_gbs:.0f} GB/s", "", ""])
    rows.append(["copy bandwidth (read + write)", "", f"{copy_gbs:.0f} GB/s", "", ""])
    for batch, seq_len, sets in ((64, 4096, 3), (2, 65536, 4)):
        kv_bytes = batch * seq_len * 8 * 128 * 2 * 2
        cudnn_ms, note = time_cudnn(batch, seq_len, 1, sets, causal=False)
        cudnn_gbs = kv_bytes / cudnn_ms / 1e6 if cudnn_ms else None
        log[f"cudnn decode {batch}x{seq_len}"] = {"ms": cudnn_ms, "note": note}
        rows.append(
            [
                f"cuDNN SDPA decode {batch}x{seq_len} (contiguous)",
                "",
                f"{cudnn_ms:.4f} ms" if cudnn_ms else note,
                f"{cudnn_gbs:.0f} GB/s" if cudnn_gbs else "",
                "",
            ]
        )
        os.environ["PAGEDATTN_CUPY_DECODE"] = "simt"
        ms = time_paged(backend, batch, seq_len, 16, None, sets)
        del os.environ["PAGEDATTN_CUPY_DECODE"]
        gbs = kv_bytes / ms / 1e6
        log[f"cupy CUDA-core decode {batch}x{seq_len} bs16"] = {"ms": ms, "GBps": gbs}
        rows.append(
            [
                f"cupy CUDA-core decode {batch}x{seq_len}",
                "bs=16",
                f"{ms:.4f} ms",
                f"{gbs:.0f} GB/s = {gbs / read_gbs:.0%} of read",
                "",
            ]
        )
        for bs in (16, 32, 64):
            ms = time_paged(backend, batch, seq_len, bs, None, sets)
            gbs = kv_bytes / ms / 1e6
            log[f"cupy decode {batch}x{seq_len} bs{bs}"] = {"ms": ms, "GBps": gbs}
            vs = f"{cudnn_ms / ms:.2f}x cuDNN" if cudnn_ms else ""
            rows.append(
                [
                    f"cupy decode {batch}x{seq_len}",
                    f"bs={bs}",
                    f"{ms:.4f} ms",
                    f"{gbs:.0f} GB/s = {gbs / read_gbs:.0%} of read",
                    vs,
                ]
            )
    flops = 4 * 8 * 32 * 128 * (4096 * 4097 / 2)  # causal: QK^T and PV over the visible half
    cudnn_ms, note = time_cudnn(8, 4096, 4096, 2, causal=True)
    log["cudnn prefill 8x4096"] = {"ms": cudnn_ms, "note": note}
    rows.append(
        [
            "cuDNN SDPA causal prefill 8x4096",
            "",
            f"{cudnn_ms:.3f} ms" if cudnn_ms else note,
            f"{flops / cudnn_ms / 1e9:.0f} TFLOP/s" if cudnn_ms else "",
            "",
        ]
    )
    for bs in (16, 64):
        ms = time_paged(backend, 8, 4096, bs, 4096, 2)
        log[f"cupy prefill 8x4096 bs{bs}"] = {"ms": ms}
        rows.append(
            [
                "cupy causal prefill 8x4096",
                f"bs={bs}",
                f"{ms:.3f} ms",
                f"{flops / ms / 1e9:.0f} TFLOP/s",
                f"{cudnn_ms / ms:.2f}x cuDNN" if cudnn_ms else "",
            ]
        )
    return rows


#: Shapes of the tensor-core prefill kernels that ``--measure shapes`` compares: "64" is the
#: 64-row mma.sync kernel (paged_attention_mma.cu), "wgmma" / "wgmma-serial" the Hopper kernel
#: (paged_attention_wgmma.cu) at 1 CTA/SM with its overlap or serial schedule, "wgmma-2cta"
#: its 2-CTA/SM variant (the default)
PREFILL_SHAPES: tuple[str, ...] = ("64", "wgmma", "wgmma-serial", "wgmma-2cta")


def prefill_shapes(backend: CupyBackend, shapes: tuple[str, ...] = PREFILL_SHAPES) -> list[str]:
    """Causal prefill 8 x 4,096 (bf16, GQA 32/8, d=128) per tensor-core kernel shape
    (``PREFILL_SHAPES``) at block sizes 16/32/64 beside cuDNN SDPA on contiguous K/V, with each
    shape's registers and local memory (spills): which shape planning should take."""
    from pagedattn.backends.cupy import runtime, specializations

    unknown = [shape for shape in shapes if shape not in PREFILL_SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown {unknown}; expected some of {PREFILL_SHAPES}")
    flops = 4 * 8 * 32 * 128 * (4096 * 4097 / 2)  # causal: QK^T and PV over the visible half
    cudnn_ms, note = time_cudnn(8, 4096, 4096, 2, causal=True)
    lines = [
        f"cuDNN causal prefill 8x4096: {cudnn_ms:.3f} ms, {flops / cudnn_ms / 1e9:.0f} TFLOP/s"
        if cudnn_ms
        else note
    ]
    keys = (
        "PAGEDATTN_CUPY_PREFILL",
        "PAGEDATTN_CUPY_WGMMA_SCHEDULE",
        "PAGEDATTN_CUPY_WGMMA_CTAS",
    )
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for shape in shapes:
            wgmma = shape.startswith("wgmma")
            os.environ["PAGEDATTN_CUPY_PREFILL"] = "wgmma" if wgmma else "mma"
            os.environ["PAGEDATTN_CUPY_WGMMA_SCHEDULE"] = (
                "serial" if shape in ("wgmma-serial", "wgmma-2cta") else "overlap"
            )
            os.environ["PAGEDATTN_CUPY_WGMMA_CTAS"] = "2" if shape == "wgmma-2cta" else "1"
            for bs in (16, 32, 64):
                try:
                    spec = (
                        specializations.wgmma_attention("bfloat16", 128, bs)
                        if wgmma
                        else specializations.attention("bfloat16", 128, bs, specializations.MMA_ROWS)
                    )
                    compiled = runtime.kernel(spec)
                    ms = time_paged(backend, 8, 4096, bs, 4096, 2)
                    vs = f", {cudnn_ms / ms:.2f}x cuDNN" if cudnn_ms else ""
                    lines.append(
                        f"shape {shape} bs{bs}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s{vs}"
                        f" (regs {compiled.num_regs}, local {compiled.local_size_bytes} B)"
                    )
                except Exception as error:  # a measurement: report and go on
                    lines.append(f"shape {shape} bs{bs}: {type(error).__name__}: {error}")
                print(lines[-1], flush=True)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    # cuDNN again, after the shapes: how far the GPU's state (clocks, heat) moved the
    # reference over the run (the ratios above are against the first figure)
    again_ms, note = time_cudnn(8, 4096, 4096, 2, causal=True)
    lines.append(
        f"cuDNN causal prefill 8x4096 again, after the shapes: {again_ms:.3f} ms"
        if again_ms
        else note
    )
    print(lines[-1], flush=True)
    return lines


def host_overhead(backend: CupyBackend, out_dir: str, calls: int = 300) -> str:
    """Host time per ``run`` of a tiny decode plan (no synchronisation inside the loop), and a
    cProfile of those calls in ``host_profile.txt``: what a small batch costs the CPU."""
    import cProfile
    import io
    import pstats

    case = make_case("host", np.random.default_rng(0), seq_lens=[64] * 8, num_q_heads=32,
                     num_kv_heads=8)
    q, k, v = device_inputs(backend, case)
    plan = backend.plan(
        q, k, v, backend.to_device(case.block_tables), backend.to_device(case.seq_lens)
    )
    for _ in range(20):
        backend.run(plan, q, k, v)
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        backend.run(plan, q, k, v)
    per_call = (time.perf_counter() - start) / calls
    backend.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        backend.run(plan, q, k, v)
    profile.disable()
    backend.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    with open(os.path.join(out_dir, "host_profile.txt"), "w") as f:
        f.write(text.getvalue())
    return f"{per_call * 1e6:.1f} us of host time per run (8 x 64 decode, cupy arrays)"


def kernel_times(backend: CupyBackend, runs: int = 10) -> list[str]:
    """Device time per run of each kernel (torch.profiler, CUPTI) beside the CUDA-event time
    of the same runs, for decode 64 x 4,096 and 2 x 65,536 at block size 16 (the latter also
    planned for 2x and 3x the resident CTAs, i.e. more split-KV parts): what the kernels take
    apart from the host's share."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    lines = []
    for batch, seq_len, slots_factor in ((64, 4096, 1), (2, 65536, 1), (2, 65536, 2), (2, 65536, 3)):
        x = paged_inputs(batch, seq_len, 16, None, 0)
        resident = backend._resident_ctas

        def more_slots(problem: Any, f: int = slots_factor, r: Any = resident) -> int:
            return int(f * r(problem))

        backend._resident_ctas = more_slots  # type: ignore[method-assign]
        try:
            plan = backend.plan(
                x["query"], x["key_cache"], x["value_cache"], x["block_tables"], x["seq_lens"]
            )
        finally:
            del backend._resident_ctas

        def call(plan: Any = plan, x: dict = x) -> Any:
            return backend.run(plan, x["query"], x["key_cache"], x["value_cache"])

        event_ms = median_ms([call] * 10)  # back to back: the device, not the host, sets the pace
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                call()
            torch.cuda.synchronize()
        per_kernel: dict[str, float] = {}
        for event in prof.key_averages():
            device_us = float(
                getattr(event, "self_device_time_total", None)
                or getattr(event, "self_cuda_time_total", 0)
                or 0
            )
            if device_us > 0:
                per_kernel[event.key[:60]] = device_us / runs
        total = sum(per_kernel.values())
        detail = ", ".join(f"{k}: {v:.1f} us" for k, v in sorted(per_kernel.items()))
        lines.append(
            f"decode {batch}x{seq_len} bs16, {len(plan.state.work.items)} CTAs:"
            f" kernels {total:.1f} us per run ({detail}); CUDA events {event_ms * 1e3:.1f} us"
        )
    return lines


def run_sanitizer(
    out_dir: str, only_decode: bool = False, timeout: float = 110
) -> list[tuple[str, bool, str]]:
    results = []
    tool_path = shutil.which("compute-sanitizer")
    if tool_path is None:
        return [("compute-sanitizer", False, "not on PATH")]
    for tool in ("memcheck", "racecheck"):
        command = [
            tool_path,
            "--tool",
            tool,
            "--error-exitcode",
            "9",
            sys.executable,
            "-m",
            "pagedattn.backends.cupy.gpu_check",
            "--sanitize",
            *(["--only-decode"] if only_decode else []),
        ]
        started = time.time()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            results.append((f"compute-sanitizer {tool}", False, f"timed out after {timeout} s"))
            continue
        with open(os.path.join(out_dir, f"sanitizer_{tool}.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        summary = [
            line
            for line in (proc.stdout + proc.stderr).splitlines()
            if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line
        ]
        results.append(
            (
                f"compute-sanitizer {tool}",
                proc.returncode == 0,
                f"exit {proc.returncode}, {time.time() - started:.0f} s; "
                + ("; ".join(summary) or "no summary line"),
            )
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--sanitize", action="store_true", help="internal: the sanitizer's cases")
    parser.add_argument(
        "--skip", default="", help="comma list of parts to skip: sanitizer,bench"
    )
    parser.add_argument(
        "--measure",
        default="",
        help="comma list of extra measurements: host (host time per run, cProfile),"
        " kernels (device time per kernel, torch.profiler), shapes (prefill 8 x 4,096 per"
        " tensor-core kernel shape beside cuDNN)",
    )
    parser.add_argument(
        "--only-decode",
        action="store_true",
        help="decode cases plus one case per other kernel; no kv ops (a short GPU call)",
    )
    parser.add_argument(
        "--only-prefill",
        action="store_true",
        help="the tensor-core prefill cases (64-row and Hopper kernels), determinism, torch inputs;"
        " no ops",
    )
    parser.add_argument(
        "--only-wgmma",
        action="store_true",
        help="the Hopper kernel only: its layout check, its cases (PAGEDATTN_CUPY_PREFILL=wgmma)"
        " and determinism; no other cases, no ops",
    )
    parser.add_argument(
        "--shapes",
        default=",".join(PREFILL_SHAPES),
        help="comma list of kernel shapes for --measure shapes (64, wgmma, wgmma-serial, wgmma-2cta)",
    )
    parser.add_argument(
        "--wgmma-passes",
        default=",".join(WGMMA_PASSES),
        help="comma list of the wgmma kernel's checked variants (overlap, serial, 2cta)",
    )
    parser.add_argument("--sanitizer-timeout", type=float, default=110.0)
    args = parser.parse_args(argv)
    unknown = set(args.shapes.split(",")) - set(PREFILL_SHAPES)
    if unknown:
        parser.error(f"--shapes: unknown {sorted(unknown)}; expected some of {','.join(PREFILL_SHAPES)}")
    if args.sanitize:
        return sanitize_main(args.only_decode)
    import torch

    torch.zeros(1, device="cuda")  # initialise CUDA in torch: kernels go to its current stream
    os.makedirs(args.out, exist_ok=True)
    backend = CupyBackend()
    rng = np.random.default_rng(2026)
    checks: list[tuple[str, bool, str]] = []
    cases = (
        []
        if args.only_wgmma
        else prefill_cases(rng)
        if args.only_prefill
        else correctness_cases(rng, only_decode=args.only_decode)
    )
    for case in cases:
        checks.append(run_check(f"attention {case.name}", partial(check_case, backend, case)))
    os.environ["PAGEDATTN_CUPY_DECODE"] = "simt"  # the CUDA-core kernel on 16-bit decode too
    if args.only_wgmma or args.only_prefill:
        checks += check_wgmma(backend, rng, tuple(args.wgmma_passes.split(",")))
    quick = args.only_decode or args.only_prefill or args.only_wgmma
    for case in [] if quick else correctness_cases(rng)[:12:2]:
        ok, summary = check_case(backend, case)
        checks.append((f"attention (CUDA-core decode) {case.name}", ok, summary))
        print(f"{'ok  ' if ok else 'FAIL'} attention (CUDA-core decode) {case.name}: {summary}")
    del os.environ["PAGEDATTN_CUPY_DECODE"]
    for name, fn in () if args.only_wgmma else (
        ("determinism", check_determinism),
        ("torch inputs", check_torch_inputs),
    ):
        checks.append(run_check(name, partial(fn, backend, rng)))
    try:
        op_results = (
            []
            if args.only_prefill or args.only_wgmma
            else ([] if args.only_decode else check_ops(backend, rng)) + check_fp8_ops(backend, rng)
        )
    except Exception as error:
        op_results = [("ops", False, f"{type(error).__name__}: {error}")]
    for name, ok, summary in op_results:
        checks.append((name, ok, summary))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {summary}", flush=True)
    skip = set(args.skip.split(","))
    log: dict[str, Any] = {"device": backend.device_name(), "checks": checks}
    measure = set(args.measure.split(","))
    if "host" in measure:
        log["host_overhead"] = host_overhead(backend, args.out)
        print(f"host overhead: {log['host_overhead']}", flush=True)
    if "kernels" in measure:
        try:
            log["kernel_times"] = kernel_times(backend)
        except Exception as error:  # a measurement, not a check: report and go on
            log["kernel_times"] = [f"kernel times failed: {type(error).__name__}: {error}"]
        for line in log["kernel_times"]:
            print(f"kernel time: {line}", flush=True)
    if "shapes" in measure:
        log["prefill_shapes"] = prefill_shapes(backend, tuple(args.shapes.split(",")))
    rows = benchmarks(backend, log) if "bench" not in skip else []
    if "sanitizer" not in skip:
        for name, ok, summary in run_sanitizer(
            args.out, args.only_decode, args.sanitizer_timeout
        ):
            checks.append((name, ok, summary))
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {summary}", flush=True)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(log, f, indent=1, default=str)
    failed = [c for c in checks if not c[1]]
    print(
        f"\n{backend.device_name()}: {len(checks) - len(failed)}/{len(checks)} checks passed"
        + (f"; FAILED: {', '.join(c[0] for c in failed)}" if failed else "")
    )
    widths = [max(len(r[i]) for r in rows) for i in range(5)] if rows else []
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
