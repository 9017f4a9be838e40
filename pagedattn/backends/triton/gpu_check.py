"""Check and measure the ``triton`` backend on a CUDA GPU in one run.

    python -m pagedattn.backends.triton.gpu_check --out DIR [--sweep] [--no-sanitizer] [--decode-only]
        [--bench-sweep [--sweep-prefill]] [--then-bench "BENCH ARGS"] [--deadline SECONDS]

1. correctness against :func:`pagedattn.spec.exact.exact_attention` under the error model
   (decode, prefill, chunked, GQA, layouts, masks, softcap, ALiBi, fp8, split-KV, strided
   pool views, a pool of more than 2**31 elements), garbage-filled pools bit-identical,
   write_kv / copy_blocks bit-exact, merge_states;
2. ``compute-sanitizer --tool memcheck`` on a few cases with garbage-filled pools and
   garbage block-table entries (a child run of this module with ``--sanitize-child``);
3. medians (``triton.testing.do_bench``, L2 flushed before every repetition; K/V far larger
   than L2) of decode 64 x 4096 and 2 x 65536 (32 query heads, 8 KV heads, head_dim 128,
   bfloat16, block sizes 16/32/64) against the read bandwidth of a large reduction measured
   in the same run and cuDNN SDPA (torch, contiguous K/V), and causal prefill 8 x 4096 against
   cuDNN's FLOP rate. ``--sweep`` also times a few other tile choices.

``--bench-sweep`` first times decode tile choices (and with ``--sweep-prefill`` prefill ones)
with the perf suite's own pools, tables and timer and applies the fastest for the rest of
the run (the sanitizer child included); ``--then-bench`` runs ``pagedattn bench`` in-process.

Logs and a JSON of all numbers go to ``--out``; a short table is printed last.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.spec import exact_attention, kv_ops, tolerance
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.error_model import merge_tolerance
from pagedattn.spec.online_softmax import merge_states as spec_merge
from pagedattn.spec.pools import random_paged_inputs

LOG: list[str] = []
BANDWIDTH: list[float] = [float("nan")]  # the read bandwidth measured in this run, GB/s
LOG_FILE: list[Path] = []  # set by main: every line is appended at once, so a killed run keeps its log


def say(text: str) -> None:
    print(text, flush=True)
    LOG.append(text)
    if LOG_FILE:
        with LOG_FILE[0].open("a") as f:
            f.write(text + "\n")


# -- inputs -------------------------------------------------------------------------------------

def make_case(seq_lens: list[int], q_lens: list[int] | None, *, block_size: int = 16, num_q_heads: int = 8,
              num_kv_heads: int = 2, head_dim: int = 128, dtype: str = "bfloat16", cache_dtype: str | None = None,
              kv_layout: str = "NHD", seed: int = 0, poison: bool = False) -> dict[str, Any]:
    """Host arrays of one call: shuffled blocks; with ``poison`` NaN/inf in every unread slot and
    wild values (-1, 2**31-1, -2**31) in unread block-table entries."""
    inputs = random_paged_inputs(seq_lens, q_lens, block_size=block_size, num_q_heads=num_q_heads,
                                 num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, cache_dtype=cache_dtype,
                                 kv_layout=kv_layout, spare_columns=2, seed=seed,
                                 garbage="wild" if poison else "none")
    return inputs._asdict()


def args_of(case: dict[str, Any]) -> list[Any]:
    return [case[n] for n in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc")]


# -- 1. correctness -----------------------------------------------------------------------------

def compare(backend: Any, case: dict[str, Any], device_args: list[Any] | None = None,
            cache_dtype: str | None = None, **options: Any) -> tuple[bool, str, np.ndarray, np.ndarray]:
    """Run on the device and compare with the spec under the error model."""
    expected = exact_attention(*args_of(case), kv_layout=case["kv_layout"], **options)
    if device_args is None:
        device_args = [None if a is None else backend.to_device(a) for a in args_of(case)]
    out_d, lse_d = backend.paged_attention(*device_args, kv_layout=case["kv_layout"], return_lse=True, **options)
    out, lse = backend.to_numpy(out_d), backend.to_numpy(lse_d)
    dtype = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}.get(case["query"].dtype, "bfloat16")
    tol = tolerance(dtype, case["query"].shape[-1], cache_dtype=cache_dtype, tf32=backend.capabilities().tf32)
    bound = tol.out_bound(expected.out, expected.value_scale, expected.score_scale, expected.num_visible)
    err = np.abs(out.astype(np.float64) - expected.out)
    ratio = float(np.max(err / np.maximum(bound, 1e-300), initial=0.0))
    empty = np.isneginf(expected.lse)
    lse_ok = np.array_equal(np.isneginf(lse), empty) and bool(
        (np.abs(lse[~empty] - expected.lse[~empty]) <= tol.lse_bound(expected.score_scale,
                                                                     expected.num_visible)[~empty]).all())
    ok = bool((err <= bound).all()) and not np.isnan(out).any() and lse_ok and bool((out[empty] == 0).all())
    return ok, f"worst err/bound {ratio:.3f}, lse {'ok' if lse_ok else 'WRONG'}", out, lse


def correctness(torch: Any, backend_cls: Any, decode_only: bool = False) -> tuple[int, int]:
    """Run the correctness cases (with ``decode_only``, the decode and garbage ones); return (passed, total)."""
    be = backend_cls()
    slopes = (2.0 ** -np.arange(1, 9)).astype(np.float32)
    cases: list[tuple[str, Callable[[], tuple[bool, str]]]] = []

    def add(name: str, case_kw: dict[str, Any], backend: Any = None, cache_dtype: str | None = None,
            **options: Any) -> None:
        def check() -> tuple[bool, str]:
            ok, text, _, _ = compare(backend or be, make_case(**case_kw), cache_dtype=cache_dtype, **options)
            return ok, text
        cases.append((name, check))

    for bs in (16, 32, 64):
        add(f"decode bf16 NHD bs={bs} GQA 8/2", {"seq_lens": [1, 700, 0, 4097, 63], "q_lens": None, "block_size": bs})
    from pagedattn.backends.triton.launch_config import choose_tiles

    for major in (False, True):
        tiles = replace(choose_tiles(1, 4, 128, "bfloat16"), block_n=64, num_stages=5, keys_major=major)
        add(f"decode bf16 HND bs=32 N=64 s=5 {'keys' if major else 'rows'}-major, window=1000",
            {"seq_lens": [1, 2500, 0, 4097], "q_lens": None, "block_size": 32, "kv_layout": "HND"},
            backend=backend_cls(tiles=tiles), sliding_window=1000)
        add(f"decode bf16 fp8 e4m3 cache {'keys' if major else 'rows'}-major, split 3, softcap",
            {"seq_lens": [700, 2000], "q_lens": None, "cache_dtype": "float8_e4m3fn"},
            backend=backend_cls(tiles=tiles, num_splits=3), cache_dtype="float8_e4m3fn", k_scale=0.37,
            v_scale=2.5, softcap=20.0)
    add("decode fp16 HND bs=16 MQA 8/1", {"seq_lens": [300, 1025], "q_lens": None, "dtype": "float16",
                                          "kv_layout": "HND", "num_kv_heads": 1})
    add("decode fp32 NHD d=64", {"seq_lens": [77, 513], "q_lens": None, "dtype": "float32", "head_dim": 64})
    add("prefill bf16 causal 2x600", {"seq_lens": [600, 333], "q_lens": [600, 333]})
    add("chunked mixed bf16 HND bs=32", {"seq_lens": [900, 257, 40, 1], "q_lens": [129, 1, 40, 1], "block_size": 32,
                                         "kv_layout": "HND"})
    add("prefill fp16 non-causal window=100", {"seq_lens": [400, 130], "q_lens": [200, 130], "dtype": "float16"},
        causal=False, sliding_window=100)
    add("prefill bf16 softcap=30 alibi", {"seq_lens": [300, 90], "q_lens": [150, 90]}, softcap=30.0,
        alibi_slopes=slopes)
    add("GQA 7/1 fp16 d=80 bs=16", {"seq_lens": [200, 45], "q_lens": [20, 1], "dtype": "float16", "num_q_heads": 7,
                                    "num_kv_heads": 1, "head_dim": 80})
    add("fp32 prefill d=128", {"seq_lens": [150], "q_lens": [150], "dtype": "float32"})
    for cache in ("float8_e4m3fn", "float8_e5m2"):
        add(f"decode bf16 cache={cache}", {"seq_lens": [500, 2000], "q_lens": None, "cache_dtype": cache},
            cache_dtype=cache, k_scale=0.37, v_scale=2.5)
        add(f"prefill fp16 cache={cache} HND", {"seq_lens": [300], "q_lens": [100], "dtype": "float16",
                                               "cache_dtype": cache, "kv_layout": "HND"},
            cache_dtype=cache, k_scale=1.7, v_scale=0.3)
    add("split-KV heuristic 2x20000 decode", {"seq_lens": [20000, 9000], "q_lens": None})
    add("split-KV forced 5, window=3000", {"seq_lens": [9000, 100], "q_lens": None}, backend=backend_cls(num_splits=5),
        sliding_window=3000)
    add("split-KV forced 3, chunked prefill", {"seq_lens": [3000, 50], "q_lens": [64, 50]},
        backend=backend_cls(num_splits=3))

    def garbage(split: int | None, layout: str) -> tuple[bool, str]:
        backend = backend_cls(num_splits=split)
        kw: dict[str, Any] = {"seq_lens": [700, 33, 0, 1500], "q_lens": [33, 33, 0, 1], "kv_layout": layout,
                              "seed": 5}
        _, _, out_a, lse_a = compare(backend, make_case(**kw), sliding_window=600)
        ok, text, out_b, lse_b = compare(backend, make_case(**kw, poison=True), sliding_window=600)
        same = out_a.tobytes() == out_b.tobytes() and lse_a.tobytes() == lse_b.tobytes()
        return ok and same, text + (", bit-identical with garbage" if same else ", CHANGED BY GARBAGE")

    cases.append(("garbage pools, NHD", lambda: garbage(None, "NHD")))
    cases.append(("garbage pools, HND, split 4", lambda: garbage(4, "HND")))

    def strided_pool() -> tuple[bool, str]:
        rng = np.random.default_rng(7)
        pool = rng.standard_normal((40, 2, 3, 2, 16, 128)).astype(numpy_dtype("bfloat16"))
        case = make_case([300, 120], [10, 1], kv_layout="HND", seed=8)
        case["key_cache"], case["value_cache"] = pool[:, 0, 2], pool[:, 1, 2]
        case["block_tables"] = rng.permutation(40)[:38].reshape(2, 19).astype(np.int32)
        pool_d = be.to_device(pool)
        dev = [be.to_device(case["query"]), pool_d[:, 0, 2], pool_d[:, 1, 2], be.to_device(case["block_tables"]),
               be.to_device(case["seq_lens"]), be.to_device(case["query_start_loc"])]
        ok, text, _, _ = compare(be, case, device_args=dev)
        return ok, text

    cases.append(("strided pool view [blocks, 2, layers, H, bs, D]", strided_pool))

    def huge_pool() -> tuple[bool, str]:
        # a pool of more than 2**31 elements; the sequences' blocks sit at its end
        case = make_case([3000, 517], None, seed=9)
        small_k, small_v = case["key_cache"], case["value_cache"]
        n_small = small_k.shape[0]
        per_block = int(np.prod(small_k.shape[1:]))
        n_big = (2**31) // per_block + n_small + 8
        big_k = torch.zeros((n_big, *small_k.shape[1:]), dtype=torch.bfloat16, device="cuda")
        big_v = torch.zeros_like(big_k)
        big_k[n_big - n_small:] = be.to_device(small_k)
        big_v[n_big - n_small:] = be.to_device(small_v)
        tables = case["block_tables"].astype(np.int64)
        tables = np.where(tables >= 0, tables + (n_big - n_small), -1).astype(np.int32)
        dev = [be.to_device(case["query"]), big_k, big_v, be.to_device(tables), be.to_device(case["seq_lens"]), None]
        ok, text, out, _ = compare(be, case, device_args=dev)
        _, _, out_small, _ = compare(be, case)
        same = out.tobytes() == out_small.tobytes()
        del big_k, big_v
        torch.cuda.empty_cache()
        return ok and same, f"{n_big * per_block} elements per cache, {text}, " + (
            "bit-identical to the small pool" if same else "DIFFERS from the small pool")

    cases.append(("pool > 2**31 elements (64-bit offsets)", huge_pool))

    def relaunch() -> tuple[bool, str]:
        # one plan run again and again (the direct relaunch path) and with an unaligned query
        case = make_case([700, 33, 1500], None, seed=13)
        dev: list[Any] = [None if a is None else be.to_device(a) for a in args_of(case)]
        plan = be.plan(*dev, kv_layout="NHD", return_lse=True)
        runs = [be.run(plan, dev[0], dev[1], dev[2]) for _ in range(3)]
        first_out, first_lse = runs[0][0].cpu().view(torch.int16), runs[0][1].cpu()
        same = all(o.cpu().view(torch.int16).equal(first_out) and l.cpu().equal(first_lse) for o, l in runs)
        raw = torch.empty(dev[0].numel() + 1, dtype=dev[0].dtype, device="cuda")
        unaligned = raw[1:].view(dev[0].shape)
        unaligned.copy_(dev[0])
        out_u = be.run(plan, unaligned, dev[1], dev[2])[0]
        same_u = out_u.cpu().view(torch.int16).equal(first_out)
        ok, text, _, _ = compare(be, case)
        return ok and same and same_u, f"{text}, 3 runs {'identical' if same else 'DIFFER'}, unaligned query " + (
            "identical" if same_u else "DIFFERS")

    cases.append(("decode relaunch: one plan run 3 times, unaligned query", relaunch))
    cases.append(("write_kv fp8/bf16, both layouts", lambda: check_write_kv(be)))
    cases.append(("copy_blocks with a cycle", lambda: check_copy_blocks(be)))
    cases.append(("merge_states", lambda: check_merge(be)))

    if decode_only:
        cases = [(n, c) for n, c in cases if n.startswith(("decode", "split-KV", "garbage"))]
    passed = 0
    for name, check in cases:
        start = time.perf_counter()
        try:
            ok, text = check()
        except Exception as exc:  # report and continue: one failure must not hide the others
            ok, text = False, f"raised {type(exc).__name__}: {exc}"
            LOG.append(traceback.format_exc())
        passed += ok
        say(f"  {'PASS' if ok else 'FAIL'}  {name}: {text} ({time.perf_counter() - start:.1f}s)")
    return passed, len(cases)


def check_write_kv(be: Any) -> tuple[bool, str]:
    rng = np.random.default_rng(10)
    bad = 0
    for layout in ("NHD", "HND"):
        for dtype, cache, scale in (("bfloat16", None, 1.0), ("bfloat16", "float8_e4m3fn", 0.37),
                                    ("float16", "float8_e5m2", 3.0), ("float32", "float8_e4m3fn", 1.0)):
            shape = (8, 16, 4, 128) if layout == "NHD" else (8, 4, 16, 128)
            cdt = numpy_dtype(cache or dtype)
            kc, vc = rng.standard_normal(shape).astype(cdt), rng.standard_normal(shape).astype(cdt)
            key = (rng.standard_normal((40, 4, 128)) * 50).astype(numpy_dtype(dtype))
            value = (rng.standard_normal((40, 4, 128)) * 50).astype(numpy_dtype(dtype))
            slots = rng.permutation(128)[:40].astype(np.int64)
            slots[::7] = -1
            ek, ev = kc.copy(), vc.copy()
            kv_ops.write_kv(key, value, ek, ev, slots, kv_layout=layout, k_scale=scale, v_scale=scale)
            dk, dv = be.to_device(kc), be.to_device(vc)
            be.write_kv(be.to_device(key), be.to_device(value), dk, dv, be.to_device(slots), kv_layout=layout,
                        k_scale=scale, v_scale=scale)
            bad += int((be.to_numpy(dk).view(np.uint8) != ek.view(np.uint8)).sum())
            bad += int((be.to_numpy(dv).view(np.uint8) != ev.view(np.uint8)).sum())
    return bad == 0, f"{bad} bytes differ from the spec"


def check_copy_blocks(be: Any) -> tuple[bool, str]:
    rng = np.random.default_rng(11)
    cache = rng.standard_normal((10, 16, 4, 128)).astype(numpy_dtype("bfloat16"))
    pairs = np.array([[0, 1], [1, 2], [2, 0], [5, 9]])
    ek, ev = cache.copy(), cache[::-1].copy()
    kv_ops.copy_blocks(ek, ev, pairs)
    dk, dv = be.to_device(cache), be.to_device(cache[::-1].copy())
    be.copy_blocks(dk, dv, pairs)
    ok = be.to_numpy(dk).tobytes() == ek.tobytes() and be.to_numpy(dv).tobytes() == ev.tobytes()
    return ok, "bit-exact" if ok else "DIFFERS"


def check_merge(be: Any) -> tuple[bool, str]:
    rng = np.random.default_rng(12)
    out_a = rng.standard_normal((50, 8, 128)).astype(numpy_dtype("bfloat16"))
    out_b = rng.standard_normal((50, 8, 128)).astype(numpy_dtype("bfloat16"))
    lse_a = rng.normal(0, 4, (50, 8)).astype(np.float32)
    lse_b = rng.normal(0, 4, (50, 8)).astype(np.float32)
    lse_a[0], out_a[0] = -np.inf, np.nan
    lse_a[1] = lse_b[1] = -np.inf
    expected, expected_lse = spec_merge(out_a, lse_a, out_b, lse_b)
    out, lse = (be.to_numpy(x) for x in be.merge_states(*(be.to_device(x) for x in (out_a, lse_a, out_b, lse_b))))
    scale = np.nan_to_num(np.maximum(np.abs(out_a.astype(np.float64)), np.abs(out_b.astype(np.float64))))
    bound = merge_tolerance("bfloat16").out_bound(expected, scale.max(-1), np.zeros((50, 8)), np.full((50, 8), 2))
    fin = np.isfinite(expected_lse)
    ok = bool((np.abs(out.astype(np.float64) - expected) <= bound).all()) and bool(
        np.allclose(lse[fin], expected_lse[fin], atol=1e-5)) and bool(np.isneginf(lse[1]).all())
    return ok, "within the merge tolerance" if ok else "OUTSIDE the merge tolerance"


# -- 2. compute-sanitizer -----------------------------------------------------------------------

def sanitize_child(backend_cls: Any) -> int:
    """Cases run under compute-sanitizer: garbage-filled pools, garbage table entries."""
    be = backend_cls()
    runs: list[tuple[dict[str, Any], int | None, dict[str, Any]]] = [
        ({"seq_lens": [700, 33, 0, 1500], "q_lens": None, "poison": True}, None, {}),
        ({"seq_lens": [700, 33, 0, 1500], "q_lens": None, "poison": True, "kv_layout": "HND"}, 4,
         {"sliding_window": 600}),
        ({"seq_lens": [300, 33, 1], "q_lens": [100, 33, 1], "poison": True, "block_size": 64}, None, {}),
        ({"seq_lens": [300, 45], "q_lens": [7, 1], "poison": True, "cache_dtype": "float8_e4m3fn",
          "block_size": 32}, None, {"softcap": 20.0}),
    ]
    failures = 0
    for case_kw, splits, options in runs:
        backend = backend_cls(num_splits=splits) if splits else be
        ok, text, _, _ = compare(backend, make_case(**case_kw), cache_dtype=case_kw.get("cache_dtype"), **options)
        failures += not ok
        print(f"sanitized case {case_kw} splits={splits} {options}: {'ok' if ok else 'WRONG'} {text}", flush=True)
    for name, check in (("write_kv", check_write_kv), ("copy_blocks", check_copy_blocks), ("merge", check_merge)):
        ok, text = check(be)
        failures += not ok
        print(f"sanitized {name}: {text}", flush=True)
    return 1 if failures else 0


def run_sanitizer(out_dir: Path, decode_tiles: str | None = None, prefill_tiles: str | None = None,
                  limit_s: float = 150.0) -> str:
    command = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-m",
               "pagedattn.backends.triton.gpu_check", "--sanitize-child"]
    if decode_tiles:
        command += ["--decode-tiles", decode_tiles]
    if prefill_tiles:
        command += ["--prefill-tiles", prefill_tiles]
    start = time.perf_counter()
    try:
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")  # one allocation per tensor: exact bounds
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, env=env)
    except FileNotFoundError:
        return "compute-sanitizer not found"
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        (out_dir / "sanitizer.log").write_text(partial)
        return f"compute-sanitizer timed out after {limit_s:.0f} s (its output so far: sanitizer.log)"
    (out_dir / "sanitizer.log").write_text(done.stdout + done.stderr)
    summary = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR SUMMARY" in line]
    last = summary[-1].strip() if summary else "no summary"
    return f"exit {done.returncode}, {last} ({time.perf_counter() - start:.0f}s)"


# -- 3. speed -----------------------------------------------------------------------------------

def median_us(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")) * 1e3


def graph_us(fn: Callable[[], Any]) -> float | None:
    """Median of CUDA-graph replays (no launch overhead), or None if capture fails."""
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=300, return_mode="median")) * 1e3
    except Exception as exc:
        LOG.append(f"graph capture failed: {exc}")
        return None


def read_bandwidth(torch: Any) -> float:
    """GB/s of a large reduction: torch.sum over 4 GiB of float32."""
    x = torch.randn(2**30, device="cuda", dtype=torch.float32)
    us = median_us(lambda: x.sum())
    return x_bytes(2**30 * 4) / us


def x_bytes(n: int) -> float:
    return n / 1e3  # bytes per microsecond -> GB/s when divided by microseconds


def paged_inputs(torch: Any, batch: int, length: int, block_size: int, q_len: int, seed: int) -> dict[str, Any]:
    """Random bfloat16 query and shuffled paged K/V on the GPU (32 q heads, 8 KV heads, d=128)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_seq = length // block_size
    num_blocks = batch * blocks_per_seq
    k = torch.randn((num_blocks, block_size, 8, 128), device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn((num_blocks, block_size, 8, 128), device="cuda", dtype=torch.bfloat16, generator=gen)
    tables = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32).view(batch, blocks_per_seq)
    q = torch.randn((batch * q_len, 32, 128), device="cuda", dtype=torch.bfloat16, generator=gen)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    starts = None if q_len == 1 else torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device="cuda")
    return {"q": q, "k": k, "v": v, "tables": tables, "seq_lens": seq_lens, "starts": starts}


def contiguous_kv(inp: dict[str, Any], batch: int, length: int) -> tuple[Any, Any]:
    """The same K/V gathered to contiguous [batch, 8, length, 128] for SDPA."""
    def gather(cache: Any) -> Any:
        return cache[inp["tables"].long()].reshape(batch, length, 8, 128).transpose(1, 2).contiguous()
    return gather(inp["k"]), gather(inp["v"])


def cudnn_sdpa(torch: Any, q: Any, k: Any, v: Any, causal: bool) -> tuple[Callable[[], Any], str]:
    """A callable running SDPA on cuDNN (GQA without copying K/V), and the path's name."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def call() -> Any:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    call()
    torch.cuda.synchronize()
    return call, "cuDNN SDPA (enable_gqa)"


def _time_paged(torch: Any, bandwidth: float | None = None) -> Callable[..., dict[str, Any]]:
    """A function timing one paged call of the backend on fresh random inputs (block size ``bs``)."""
    if bandwidth is None:
        bandwidth = BANDWIDTH[0]

    def time_paged(label: str, batch: int, length: int, bs: int, q_len: int, backend: Any,
                   ref: dict[str, float] | None) -> dict[str, Any]:
        inp = paged_inputs(torch, batch, length, bs, q_len, seed=bs)
        plan = backend.plan(inp["q"], inp["k"], inp["v"], inp["tables"], inp["seq_lens"], inp["starts"])
        out = backend.run(plan, inp["q"], inp["k"], inp["v"])
        us = median_us(lambda: backend.run(plan, inp["q"], inp["k"], inp["v"]))
        kv_bytes = 2 * batch * length * 8 * 128 * 2
        row: dict[str, Any] = {"case": label, "block_size": bs, "us": us, "splits": plan.state.num_splits,
                               "tiles": str(plan.state.tiles)}
        if q_len == 1:
            row["gbs"] = x_bytes(kv_bytes + 2 * inp["q"].numel() * 2) / us
            row["pct_ceiling"] = 100 * row["gbs"] / bandwidth
        else:
            flops = 4 * batch * 32 * 128 * (length * (length + 1) / 2)
            row["tflops"] = flops / us / 1e6
        row["us_graph"] = graph_us(lambda: backend.run(plan, inp["q"], inp["k"], inp["v"]))
        if ref is not None:
            row["ratio_to_cudnn"] = ref["us"] / us
            if ref.get("us_graph") and row["us_graph"]:
                row["ratio_to_cudnn_graph"] = ref["us_graph"] / row["us_graph"]
        assert out is not None
        return row

    return time_paged


def bench(torch: Any, backend_cls: Any, decode_only: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    bandwidth = read_bandwidth(torch)
    BANDWIDTH[:] = [bandwidth]
    say(f"read bandwidth (torch.sum over 4 GiB float32): {bandwidth:.0f} GB/s")
    rows.append({"case": "read bandwidth: sum of 4 GiB", "us": x_bytes(2**32) / bandwidth, "gbs": bandwidth})

    time_paged = _time_paged(torch, bandwidth)

    for batch, length in ((64, 4096), (2, 65536)):
        inp = paged_inputs(torch, batch, length, 64, 1, seed=99)
        k4, v4 = contiguous_kv(inp, batch, length)
        q4 = inp["q"].view(batch, 1, 32, 128).transpose(1, 2)
        ref: dict[str, Any] | None
        try:
            call, path = cudnn_sdpa(torch, q4, k4, v4, causal=False)
            ref = {"us": median_us(call), "us_graph": graph_us(call)}
            row = {"case": f"decode {batch}x{length} {path}", "us": ref["us"], "us_graph": ref["us_graph"],
                   "gbs": x_bytes(2 * batch * length * 8 * 128 * 2) / ref["us"]}
            row["pct_ceiling"] = 100 * row["gbs"] / bandwidth
            rows.append(row)
        except Exception as exc:
            ref = None
            say(f"cuDNN SDPA decode {batch}x{length} failed: {exc}")
        del inp, k4, v4
        for bs in (16, 32, 64):
            rows.append(time_paged(f"decode {batch}x{length} triton", batch, length, bs, 1, backend_cls(), ref))
            say(str(rows[-1]))

    if decode_only:
        return rows
    inp = paged_inputs(torch, 8, 4096, 64, 4096, seed=98)
    k4, v4 = contiguous_kv(inp, 8, 4096)
    q4 = inp["q"].view(8, 4096, 32, 128).transpose(1, 2)
    try:
        call, path = cudnn_sdpa(torch, q4, k4, v4, causal=True)
        ref_p: dict[str, Any] | None = {"us": median_us(call), "us_graph": graph_us(call)}
        assert ref_p is not None
        flops = 4 * 8 * 32 * 128 * (4096 * 4097 / 2)
        rows.append({"case": f"prefill 8x4096 causal {path}", "us": ref_p["us"], "us_graph": ref_p["us_graph"],
                     "tflops": flops / ref_p["us"] / 1e6})
    except Exception as exc:
        ref_p = None
        say(f"cuDNN SDPA prefill failed: {exc}")
    del inp, k4, v4
    for bs in (16, 64):
        rows.append(time_paged("prefill 8x4096 causal triton", 8, 4096, bs, 4096, backend_cls(), ref_p))
        say(str(rows[-1]))

    return rows


def sweep(torch: Any, backend_cls: Any) -> list[dict[str, Any]]:
    """Other tile and split choices at block size 16 (not used by the backend unless its table changes)."""
    from pagedattn.backends.triton.launch_config import choose_tiles

    rows: list[dict[str, Any]] = []
    time_paged = _time_paged(torch)
    base_d = choose_tiles(1, 4, 128, "bfloat16")
    for block_n, warps, stages in ((64, 4, 3), (128, 4, 4), (128, 8, 3)):
        tiles = replace(base_d, block_n=block_n, num_warps=warps, num_stages=stages)
        row = time_paged(f"sweep decode 64x4096 N={block_n} w={warps} s={stages}", 64, 4096, 16, 1,
                         backend_cls(tiles=tiles), None)
        rows.append(row)
        say(str(row))
    for splits in (8, 33):
        row = time_paged(f"sweep decode 2x65536 splits={splits}", 2, 65536, 16, 1, backend_cls(num_splits=splits),
                         None)
        rows.append(row)
        say(str(row))
    return rows


DECODE_CONFIGS = (  # launch_config.DecodeTiles: (keys per tile, warps, stages, resident, keys major, table by block)
    (128, 4, 3, 2, False, True), (64, 4, 5, 2, True, False), (64, 4, 5, 2, True, True),
    (32, 4, 5, 4, False, False), (32, 4, 5, 4, False, True), (32, 4, 7, 4, False, True), (32, 2, 5, 4, False, True),
    (16, 4, 7, 4, False, True), (16, 4, 9, 4, False, True), (16, 2, 7, 4, False, True),
)
DECODE_SHAPES = ("llama3-8b/decode/b64/ctx4096", "llama3-8b/decode/b2/ctx65536")


def bench_sweep(torch: Any, backend_cls: Any, budget: float = 0.2, batch_s: float = 0.02) -> tuple[
        list[dict[str, Any]], dict[int, Any]]:
    """Decode tile choices timed the perf suite's way (its pools, tables, timer) at block sizes 16, 32, 64.

    Per block size the choice with the least ``t(64 x 4096) + 2 t(2 x 65536)`` wins (the
    second shape reads half the bytes). Also, on 64 x 4096: the median of CUDA-graph replays
    of the same plan (device time, no host gaps), and at block size 16 the host time of one
    ``run`` call. Returns the rows and the winners by block size.
    """
    import triton.testing

    from pagedattn.backends.triton import launch_config as lc
    from pagedattn.perf import inputs, shapes, timing
    from pagedattn.perf.ceilings import measure_gpu
    from pagedattn.perf.measure import DevicePool, case_work, measure_backend, measure_peer
    from pagedattn.perf.peers import SdpaPeer

    ceilings = measure_gpu()
    policy = timing.TimingPolicy(**{**timing.GPU_POLICY.__dict__, "budget_s": budget, "target_batch_s": batch_s})
    say(f"bench-sweep ceiling: read {ceilings.read_bytes_per_s / 1e9:.0f} GB/s")
    rows: list[dict[str, Any]] = []
    score: dict[tuple[int, tuple[Any, ...]], float] = {}
    for weight, shape in zip((1.0, 2.0), DECODE_SHAPES, strict=True):
        cases = shapes.resolve([f"{shape}/bs{bs}" for bs in (16, 32, 64)])
        pool = inputs.make_pool(cases[0], inputs.rotations_for(cases[0], 256 << 20))
        sdpa = measure_peer(SdpaPeer(), cases[0], pool.rotations, case_work(cases[0], pool), ceilings, policy)
        attend = SdpaPeer().prepare(cases[0], 1)
        rows.append({"case": f"sweep sdpa {shape}", "us": (sdpa.seconds or float("nan")) * 1e6, "gbs": sdpa.gbps,
                     "pct_ceiling": sdpa.pct_of_ceiling, "us_graph": graph_us(functools.partial(attend, 0))})
        del attend
        say(str(rows[-1]))
        device_pool = DevicePool(backend_cls(), pool)
        for config in DECODE_CONFIGS:
            block_n, warps, stages, resident, keys_major, by_block = config
            tiles = replace(lc.choose_tiles(1, 4, 128, "bfloat16"), block_n=block_n, num_warps=warps,
                            num_stages=stages, resident=resident, keys_major=keys_major, table_by_block=by_block)
            backend = backend_cls(tiles=tiles)
            for case in cases:
                result = measure_backend(backend, case, device_pool, case_work(case, pool), ceilings, policy)
                if result.status != "ok" or result.seconds is None:
                    say(f"sweep {config} {case.name} failed: {result.reason}")
                    score[(case.block_size, config)] = float("inf")
                    continue
                key = (case.block_size, config)
                score[key] = score.get(key, 0.0) + weight * result.seconds
                row = {"case": f"sweep {shape} N={block_n} w={warps} s={stages} r={resident}"
                       + (" keys-major" if keys_major else "") + (" table-by-block" if by_block else ""),
                       "block_size": case.block_size, "table_mode": tiles.table_mode(case.block_size),
                       "us": result.seconds * 1e6, "gbs": result.gbps, "pct_ceiling": result.pct_of_ceiling,
                       "ratio_to_cudnn": (sdpa.seconds or float("nan")) / result.seconds}
                if weight == 1.0:
                    kc, vc = device_pool.caches(case)
                    t = inputs.make_tables(case, pool, 0)
                    q = device_pool.queries[0]
                    plan = backend.plan(q, kc, vc, t.block_tables, t.seq_lens, t.query_start_loc)

                    def once(backend: Any = backend, plan: Any = plan, q: Any = q, kc: Any = kc,
                             vc: Any = vc) -> Any:
                        return backend.run(plan, q, kc, vc)

                    row["us_graph"] = graph_us(once)
                if weight == 1.0 and case.block_size == 16:
                    row["us_events"] = float(triton.testing.do_bench(once, warmup=20, rep=100,
                                                                     return_mode="median")) * 1e3
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(20):
                        once()
                    row["host_us"] = (time.perf_counter() - start) / 20 * 1e6
                    torch.cuda.synchronize()
                rows.append(row)
                say(str(row))
        del device_pool
        torch.cuda.empty_cache()
    best: dict[int, Any] = {}
    for bs in (16, 32, 64):
        times = {config: score.get((bs, config), float("inf")) for config in DECODE_CONFIGS}
        best[bs] = min(times, key=times.__getitem__)
    say(f"fastest decode tiles by block size (N, warps, stages, resident, keys major): {best}")
    return rows, best


def decode_table_from_json(text: str) -> dict[int | None, Any]:
    """``{"16": [N, warps, stages, resident, keys_major(, table_by_block)], ..., "any": [...]}`` ->
    launch_config.DECODE_TABLE."""
    from pagedattn.backends.triton import launch_config as lc

    table: dict[int | None, Any] = {}
    for key, (n, w, st, r, km, *by_block) in json.loads(text).items():
        table[None if key == "any" else int(key)] = lc.DecodeTiles(int(n), int(w), int(st), int(r), bool(km),
                                                                   bool(by_block[0]) if by_block else True)
    if None not in table:
        table[None] = lc.DECODE_TABLE[None]
    return table


PREFILL_CONFIGS = (  # (rows, keys per tile, warps, stages, register cap or 0, table by block): see launch_config
    (128, 64, 8, 3, 128, False), (128, 64, 8, 3, 128, True), (128, 64, 8, 4, 128, True), (128, 32, 8, 3, 128, True),
    (128, 128, 8, 2, 0, True),
)


def bench_sweep_prefill(torch: Any, backend_cls: Any, budget: float = 0.2) -> tuple[list[dict[str, Any]],
                                                                                   tuple[int, ...]]:
    """Prefill tile choices timed the perf suite's way on its causal 8 x 4096 case at block sizes 16, 32, 64;
    the least sum over the block sizes wins."""
    from pagedattn.backends.triton import launch_config as lc
    from pagedattn.perf import inputs, shapes, timing
    from pagedattn.perf.ceilings import measure_gpu
    from pagedattn.perf.measure import DevicePool, case_work, measure_backend, measure_peer
    from pagedattn.perf.peers import SdpaPeer

    ceilings = measure_gpu()
    policy = timing.TimingPolicy(**{**timing.GPU_POLICY.__dict__, "budget_s": budget})
    cases = shapes.resolve([f"llama3-8b/prefill/b8/ctx4096/bs{bs}" for bs in (16, 32, 64)])
    pool = inputs.make_pool(cases[0], inputs.rotations_for(cases[0], 256 << 20))
    work = case_work(cases[0], pool)
    sdpa = measure_peer(SdpaPeer(), cases[0], pool.rotations, work, ceilings, policy)
    rows: list[dict[str, Any]] = [{"case": "sweep sdpa prefill 8x4096", "us": (sdpa.seconds or float("nan")) * 1e6,
                                   "tflops": sdpa.tflops}]
    say(str(rows[-1]))
    device_pool = DevicePool(backend_cls(), pool)
    times: dict[tuple[int, ...], float] = {}
    for config in PREFILL_CONFIGS:
        block_m, block_n, warps, stages, registers, by_block = config
        tiles = replace(lc.choose_tiles(4096, 4, 128, "bfloat16"), block_m=block_m, block_n=block_n,
                        num_warps=warps, num_stages=stages, max_registers=registers or None, table_by_block=by_block)
        for case in cases:
            result = measure_backend(backend_cls(tiles=tiles), case, device_pool, case_work(case, pool), ceilings,
                                     policy)
            if result.status != "ok" or result.seconds is None:
                say(f"sweep prefill {config} {case.name} failed: {result.reason}")
                times[config] = float("inf")
                continue
            times[config] = times.get(config, 0.0) + result.seconds
            rows.append({"case": f"sweep prefill 8x4096 M={block_m} N={block_n} w={warps} s={stages} "
                                 f"maxnreg={registers} table mode {tiles.table_mode(case.block_size)}",
                         "block_size": case.block_size, "us": result.seconds * 1e6, "tflops": result.tflops,
                         "ratio_to_cudnn": (sdpa.seconds or float("nan")) / result.seconds})
            say(str(rows[-1]))
    del device_pool
    torch.cuda.empty_cache()
    best = min(times, key=lambda c: times[c]) if times else PREFILL_CONFIGS[0]
    say(f"fastest prefill tiles (rows, N, warps, stages, register cap, table by block): {best}")
    return rows, best


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | block size | us (median) | us (graph/events) | GB/s | % of read bw | TFLOP/s | x cuDNN |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        other = r.get("us_graph") or r.get("us_events")
        lines.append("| {} | {} | {:.1f} | {} | {} | {} | {} | {} |".format(
            r["case"], r.get("block_size", ""), r["us"], f"{other:.1f}" if other else "",
            f"{r['gbs']:.0f}" if "gbs" in r else "", f"{r['pct_ceiling']:.1f}" if "pct_ceiling" in r else "",
            f"{r['tflops']:.0f}" if "tflops" in r else "",
            f"{r['ratio_to_cudnn']:.2f}" if "ratio_to_cudnn" in r else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for logs and JSON")
    parser.add_argument("--sweep", action="store_true", help="also time other tile choices")
    parser.add_argument("--no-sanitizer", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--decode-only", action="store_true",
                        help="decode correctness cases and decode timings, plus the other launch order")
    parser.add_argument("--bench-sweep", action="store_true",
                        help="time the decode tile choices on the perf suite's inputs first and use the fastest")
    parser.add_argument("--then-bench", metavar="ARGS",
                        help="finally run `pagedattn bench ARGS` (one quoted string) in this process")
    parser.add_argument("--decode-tiles", metavar="JSON",
                        help='replace launch_config.DECODE_TABLE for this run: {"16": [64, 4, 5, 2, 1], "any": [...]}')
    parser.add_argument("--sweep-prefill", action="store_true",
                        help="time the prefill tile choices on the perf suite's inputs first and use the fastest")
    parser.add_argument("--prefill-tiles", metavar="ROWS,N,WARPS,STAGES,REGISTERS[,BY_BLOCK]",
                        help="replace launch_config's prefill tile table for this run (REGISTERS 0: no cap)")
    parser.add_argument("--deadline", type=float, metavar="SECONDS",
                        help="wall-clock budget of this run: the sanitizer gets what is left of it")
    parser.add_argument("--sanitize-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import torch
    import triton

    from pagedattn.backends.triton import launch_config as lc
    from pagedattn.backends.triton.backend import TritonBackend

    if args.decode_tiles:
        lc.DECODE_TABLE = decode_table_from_json(args.decode_tiles)
    if args.prefill_tiles:
        m, n, w, st, r, *by_block = (int(x) for x in args.prefill_tiles.split(","))
        lc.PREFILL_ROWS, lc.PREFILL_BLOCK_N, lc.PREFILL_WARPS, lc.PREFILL_STAGES = m, n, w, st
        lc.PREFILL_MAX_REGISTERS = r or None
        lc.PREFILL_TABLE_BY_BLOCK = bool(by_block[0]) if by_block else True
    if args.sanitize_child:
        return sanitize_child(TritonBackend)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    LOG_FILE[:] = [out_dir / "gpu_check.log"]
    props = torch.cuda.get_device_properties(0)
    say(f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, "
        f"triton {triton.__version__}, cuDNN {torch.backends.cudnn.version()}")
    results: dict[str, Any] = {"device": props.name}
    sweep_rows: list[dict[str, Any]] = []
    if args.bench_sweep:
        say("0. decode tile choices on the perf suite's inputs")
        sweep_rows, best = bench_sweep(torch, TritonBackend)
        args.decode_tiles = json.dumps({**{str(bs): list(c) for bs, c in best.items()}, "any": list(best[16])})
        lc.DECODE_TABLE = decode_table_from_json(args.decode_tiles)
    if args.sweep_prefill:
        say("0b. prefill tile choices on the perf suite's inputs")
        rows_p, best_p = bench_sweep_prefill(torch, TritonBackend)
        sweep_rows += rows_p
        lc.PREFILL_ROWS, lc.PREFILL_BLOCK_N, lc.PREFILL_WARPS, lc.PREFILL_STAGES = best_p[:4]
        lc.PREFILL_MAX_REGISTERS = best_p[4] or None
        lc.PREFILL_TABLE_BY_BLOCK = bool(best_p[5])
        args.prefill_tiles = ",".join(str(int(x)) for x in best_p)
    results["decode_tiles"] = {str(k): tuple(v) for k, v in lc.DECODE_TABLE.items()}
    results["prefill_tiles"] = (lc.PREFILL_ROWS, lc.PREFILL_BLOCK_N, lc.PREFILL_WARPS, lc.PREFILL_STAGES,
                                lc.PREFILL_MAX_REGISTERS, lc.PREFILL_TABLE_BY_BLOCK)
    say(f"decode tiles by block size (N, warps, stages, resident, keys major): {results['decode_tiles']}; "
        f"prefill tiles (rows, N, warps, stages, register cap, table by block): {results['prefill_tiles']}")
    start = time.perf_counter()
    say("1. correctness against the spec (error model; bit-exact where the contract says so)")
    passed, total = correctness(torch, TritonBackend, args.decode_only)
    results["correctness"] = f"{passed}/{total} passed"
    say(f"   {passed}/{total} passed ({time.perf_counter() - start:.0f}s)")
    rows: list[dict[str, Any]] = []
    if not args.no_bench:
        say("2. speed (medians of triton.testing.do_bench, L2 flushed before each repetition)")
        try:
            rows = bench(torch, TritonBackend, args.decode_only)
        except Exception:
            say(traceback.format_exc())
    print(table(rows), flush=True)
    if args.then_bench is not None:  # before the sanitizer: a run cut short still has its figures
        from pagedattn.perf.cli import main as bench_main

        say(f"2b. pagedattn bench {args.then_bench}")
        try:
            results["bench_exit"] = bench_main(shlex.split(args.then_bench))
        except Exception:
            say(traceback.format_exc())
    if not args.no_sanitizer:
        say("3. compute-sanitizer --tool memcheck, garbage-filled pools")
        limit = 150.0 if args.deadline is None else max(10.0, args.deadline - (time.perf_counter() - started) - 8)
        results["sanitizer"] = run_sanitizer(out_dir, args.decode_tiles, args.prefill_tiles, limit)
        say(f"   {results['sanitizer']}")
    if args.decode_only and not args.no_bench:
        time_paged = _time_paged(torch)
        other = replace(lc.choose_tiles(1, 4, 128, "bfloat16"), heads_fastest=False)
        for batch, length in ((64, 4096), (2, 65536)):
            row = time_paged(f"sweep decode {batch}x{length} work-major launch order", batch, length, 16, 1,
                             TritonBackend(tiles=other), None)
            rows.append(row)
            say(str(row))
    if args.sweep:
        say("4. other tile choices")
        try:
            rows += sweep(torch, TritonBackend)
        except Exception:
            say(traceback.format_exc())
    rows += sweep_rows
    results["rows"] = rows
    (out_dir / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "gpu_check_full.log").write_text("\n".join(LOG))
    print()
    print(f"correctness: {results['correctness']}; sanitizer: {results.get('sanitizer', 'not run')}; "
          f"decode tiles: {results['decode_tiles']}; prefill tiles: {results['prefill_tiles']}")
    print(table([r for r in rows if not r["case"].startswith("sweep")]))
    sweep_rows = [r for r in rows if r["case"].startswith("sweep")]
    if sweep_rows:
        print(table(sweep_rows))
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
