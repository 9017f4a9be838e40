"""The cupy kernels against the exact spec on poisoned pools, judged by the conformance checks.

Every case is a named :func:`cases.poisoned_case`; its hand-picked shape aims at one kernel
and one of its edges (whole and edge tiles, long ranges one CTA walks, every mask, fp8,
pool views, split-KV). Without a CUDA device every test is skipped with the backend's
availability reason. ``sanitize`` marks the few small cases ``tools/sanitize`` runs under
compute-sanitizer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cases import FP8_SCALES, SLOPES, check_operation, gpu_case, huge_scores_param, operation_cases, poisoned_case

from pagedattn.backends.cupy.backend import CupyBackend
from pagedattn.backends.cupy.specializations import DECODE_ROWS
from pagedattn.conformance import checks
from pagedattn.conformance.cases import run_case
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.dtypes import numpy_dtype

REASON = CupyBackend.availability()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"cupy backend unavailable: {REASON}")]
FP8 = ("float8_e4m3fn", "float8_e5m2")
sanitize = pytest.mark.sanitize


def grid(kind: str, seq_lens: list[int], q_lens: list[int] | None, dtypes: tuple[str, ...]) -> list[Any]:
    """One case per dtype, block size (16, 32, 64) and layout."""
    return [gpu_case(f"{kind} {d} bs{bs} {layout}", seq_lens, q_lens, dtype=d, block_size=bs, kv_layout=layout)
            for d in dtypes for bs in (16, 32, 64) for layout in ("NHD", "HND")]


#: Small cases, one per kernel path: the ones compute-sanitizer runs.
SMALL = [
    gpu_case("small decode split-KV bs16", [0, 1500, 17]),
    gpu_case("small decode d256 split-KV HND bs32", [0, 700, 17], head_dim=256, block_size=32, kv_layout="HND"),
    gpu_case("small fp8 e4m3 decode bs32", [700, 0, 33], block_size=32, cache_dtype=FP8[0], **FP8_SCALES),
    gpu_case("small fp8 e5m2 varlen fp16 HND", [90, 33], [70, 1], dtype="float16", kv_layout="HND",
                  cache_dtype=FP8[1], **FP8_SCALES),
    gpu_case("small wide prefill window bs32 HND", [300, 77], [300, 77], block_size=32, kv_layout="HND",
                  sliding_window=100),
    gpu_case("small varlen prefill HND bs32", [70, 33], [70, 5], block_size=32, kv_layout="HND",
                  dtype="float16", head_dim=64),
    gpu_case("small pool view fp32 window", [300], [3], block_size=64, dtype="float32", kv_layout="HND",
                  pool=True, sliding_window=50),
    gpu_case("small decode softcap alibi bs16", [0, 900, 17], softcap=30.0, alibi_slopes=SLOPES),
    # split plans of the shapes the long cells draw beside engines: ragged draft counts
    # (speculative decoding) with a padding entry, and groups wider than one row tile
    gpu_case("small speculative split-KV fp16", [2100, 0, 1500, 17], [3, 0, 1, 2], dtype="float16"),
    gpu_case("small decode G=17 split-KV", [0, 1800, 9], num_q_heads=34),
    gpu_case("small fp8 e4m3 decode G=24 split-KV", [1300, 40], num_q_heads=48, cache_dtype=FP8[0], **FP8_SCALES),
    # fp8 decode items hold at most 8 query heads: at G=12 two CTAs share each KV head's range
    gpu_case("small fp8 e5m2 decode G=12 d64 split-KV", [1300, 0, 40], num_q_heads=24, head_dim=64,
             cache_dtype=FP8[1], **FP8_SCALES),
]

#: Long prefill: at least 512 rows per sequence on average (the Hopper kernel's on sm_90, the
#: 64-row mma.sync kernel's elsewhere and for fp8): whole, diagonal and edge tiles, every mask,
#: GQA ratios that leave rows of a tile empty, fp8, split-KV partials.
WIDE = [
    *(gpu_case(f"wide prefill {d} bs{bs} {layout}", [700, 300, 64], [700, 130, 64], block_size=bs, dtype=d,
                    kv_layout=layout)
      for d, bs, layout in (("bfloat16", 16, "NHD"), ("float16", 32, "HND"), ("bfloat16", 64, "HND"),
                            ("float16", 64, "NHD"))),
    gpu_case("wide non-causal", [500, 200], [400, 200], causal=False),
    gpu_case("wide window d64 bs64", [900, 260], [700, 260], head_dim=64, block_size=64, sliding_window=129),
    gpu_case("wide softcap alibi scale", [400, 300], [400, 150], scale=0.2, softcap=30.0, alibi_slopes=SLOPES),
    gpu_case("wide G=12 (rows of a tile left empty)", [333, 90], [333, 90], num_q_heads=24),
    gpu_case("wide G=7", [301, 45], [301, 45], num_q_heads=14),
    gpu_case("wide MHA", [1100, 1000], [1100, 900], num_q_heads=2),
    gpu_case("wide negative scale", [300, 260], [300, 200], scale=-0.05),
    *(gpu_case(f"wide fp8 {cache} bs{bs}", [600, 129], [600, 129], block_size=bs, cache_dtype=cache,
                    **FP8_SCALES) for cache, bs in zip(FP8, (16, 64), strict=True)),
    gpu_case("wide pool view HND", [400, 300], [400, 300], kv_layout="HND", pool=True),
    huge_scores_param("wide huge scores", [900, 700], [900, 700]),
]

#: Short prefill the Hopper switch forces onto 128-row tiles (mostly empty rows, split-KV,
#: G=12, windows smaller than a tile and not tile-aligned at both head dims).
SHORT_PREFILL = [
    gpu_case("chunked prefill mma split-KV", [6000], [64]),
    gpu_case("prefill G=12", [50], [50], num_q_heads=24),
    gpu_case("non-causal", [120, 64], [20, 64], causal=False),
    gpu_case("sliding window", [400, 100], [30, 1], sliding_window=37),
    gpu_case("alibi", [300, 20], [4, 20], alibi_slopes=SLOPES),
    gpu_case("d64 bs64 no window", [500, 200], [500, 200], head_dim=64, block_size=64),
    gpu_case("window d64 bs16 W=50 fp16", [700, 130], [600, 130], head_dim=64, dtype="float16",
                  sliding_window=50),
    gpu_case("window d128 bs64 W=129", [900, 260], [700, 260], block_size=64, sliding_window=129),
    gpu_case("window d128 bs16 W=29 G=7", [500, 90], [450, 90], num_q_heads=14, sliding_window=29),
]

FP8_CASES = [
    *(gpu_case(f"fp8 {cache} {kind} {d} bs{bs} {layout}", lens, q_lens, block_size=bs, dtype=d,
                    kv_layout=layout, cache_dtype=cache, **FP8_SCALES)
      for cache in FP8 for d, bs, layout in (("bfloat16", 16, "NHD"), ("float16", 64, "HND"))
      for kind, lens, q_lens in (("decode", [0, 1, 17, 300, 2100], None),
                                 ("prefill", [300, 129, 64, 7], [300, 50, 64, 7]))),
    gpu_case("fp8 mixed d64 bs32", [1, 40, 129, 300, 77], [1, 40, 7, 1, 0], head_dim=64, block_size=32,
                  cache_dtype=FP8[0], **FP8_SCALES),
    gpu_case("fp8 decode G=24 (tensor-core prefill kernel)", [500, 3], num_q_heads=48, cache_dtype=FP8[1],
                  **FP8_SCALES),
    gpu_case("fp8 long decode split-KV, window, softcap", [20000, 5], num_q_heads=32, num_kv_heads=8,
                  cache_dtype=FP8[0], sliding_window=5000, softcap=30.0, **FP8_SCALES),
    gpu_case("fp8 pool view", [300, 45], [3, 45], kv_layout="HND", pool=True, cache_dtype=FP8[1]),
]

def rescaled_query_case(name: str, seq_lens: list[int], magnitudes: tuple[float, ...], k_scale: float,
                        **settings: Any) -> AttentionCase:
    """An fp8 decode case whose query heads are standard normal times ``magnitudes`` (cycled over
    the heads) and whose keys are the cache times ``k_scale``: rows beyond float16's range or
    in its subnormals, which the decode kernel's float16 route rescales row by row."""
    case = poisoned_case(name, seq_lens, **settings)
    heads = case.query.shape[1]
    factor = np.array([magnitudes[h % len(magnitudes)] for h in range(heads)])[None, :, None]
    query = (case.query.astype(np.float64) * factor).astype(case.query.dtype)
    return case.replace(query=query).with_options(k_scale=k_scale)


def fp8_decode_param(name: str, seq_lens: list[int], magnitudes: tuple[float, ...], k_scale: float,
                     **settings: Any) -> Any:
    return pytest.param(functools.partial(rescaled_query_case, name, seq_lens, magnitudes, k_scale, **settings),
                        id=name)


#: fp8 decode on the tensor-core decode kernel (its float16 route): both fp8 formats, both query
#: dtypes, every block size, with and without scales; query rows at the edges of float16's range
#: (and heads of one KV head at very different magnitudes, so one CTA's rows take different shifts).
FP8_DECODE = [
    *(gpu_case(f"fp8 decode {cache} {d} bs{bs} {'scaled' if scaled else 'unscaled'}", [0, 1, 17, 300, 2100],
               block_size=bs, dtype=d, kv_layout="HND" if bs == 32 else "NHD", cache_dtype=cache,
               **(FP8_SCALES if scaled else {}))
      for cache in FP8 for d in ("bfloat16", "float16") for bs in (16, 32, 64) for scaled in (True, False)),
    *(gpu_case(f"fp8 decode {cache} d64 bs{bs}", [5, 700, 33], head_dim=64, block_size=bs, cache_dtype=cache,
               **FP8_SCALES) for cache in FP8 for bs in (16, 64)),
    fp8_decode_param("fp8 decode bf16 rows beyond float16", [900, 40], (3e5,), 1e-5, cache_dtype=FP8[0]),
    fp8_decode_param("fp8 decode bf16 rows in float16 subnormals", [900, 40], (3e-6,), 1e5, cache_dtype=FP8[1]),
    fp8_decode_param("fp8 decode bf16 heads of mixed magnitudes", [1500, 7], (1e30, 1e-30, 2e4, 1.0), 1.0,
                     cache_dtype=FP8[0], block_size=32),
    fp8_decode_param("fp8 decode fp16 large k_scale", [900, 40], (1.0,), 64.0, dtype="float16",
                     cache_dtype=FP8[1]),
    # rows whose score factor scale * log2 e * 2^-shift is no normal float: the kernel's scores
    # are scaled before the softmax, not in it
    fp8_decode_param("fp8 decode bf16 rows near bfloat16's smallest normal", [900, 40], (1e-36, 1.0), 1.0,
                     cache_dtype=FP8[0]),
    gpu_case("fp8 decode negative scale", [700, 33], cache_dtype=FP8[1], scale=-0.05, **FP8_SCALES),
]

#: Decode at head_dim 256: the tensor-core decode kernel with warp pairs (each half of O's
#: columns), at every block size and layout, GQA 2 (gemma2-9b's heads) and 16, softcap,
#: windows, ALiBi, split-KV; float32 and G=24 stay on the CUDA-core kernel.
D256 = [
    *(gpu_case(f"decode d256 {d} bs{bs} {layout}", [0, 1, 15, 16, 17, 300, 2100], head_dim=256, dtype=d,
               block_size=bs, kv_layout=layout, num_q_heads=16, num_kv_heads=8)
      for d in ("bfloat16", "float16") for bs in (16, 32, 64) for layout in ("NHD", "HND")),
    gpu_case("decode d256 G=16 softcap 50 split-KV", [9000, 33], head_dim=256, num_q_heads=16, num_kv_heads=1,
             softcap=50.0),
    gpu_case("decode d256 window alibi scale HND bs32", [3000, 40, 16], head_dim=256, block_size=32,
             kv_layout="HND", sliding_window=200, scale=0.2, alibi_slopes=SLOPES),
    gpu_case("decode d256 pool view fp16 bs64", [1000, 3], head_dim=256, dtype="float16", block_size=64,
             kv_layout="HND", pool=True),
    gpu_case("decode d256 fp32 (CUDA cores)", [700, 5], head_dim=256, dtype="float32"),
    gpu_case("decode d256 G=24 (CUDA cores)", [700, 5], head_dim=256, num_q_heads=48),
]

CASES = [
    *grid("decode", [0, 1, 15, 16, 17, 300, 2100], None, ("bfloat16", "float16", "float32")),
    *grid("mixed", [1, 40, 129, 300, 77], [1, 40, 7, 1, 0], ("bfloat16", "float16", "float32")),
    *grid("prefill mma", [300, 129, 64, 7], [300, 50, 64, 7], ("bfloat16", "float16")),
    *(gpu_case(f"prefill d{d}", [200, 90], [200, 30], head_dim=d, dtype="float16") for d in (64, 256)),
    gpu_case("decode MQA 8/1", [33, 700], num_kv_heads=1),
    gpu_case("decode G=7", [33, 700], num_q_heads=14),
    gpu_case("decode MHA", [33, 1000], num_q_heads=4, num_kv_heads=4),
    gpu_case("decode G=16", [300, 2000], num_q_heads=16, num_kv_heads=1),
    gpu_case("decode d64 bs32", [1000, 17, 1], head_dim=64, block_size=32),
    gpu_case("decode softcap alibi scale", [700, 5, 64, 65], scale=0.2, softcap=30.0, alibi_slopes=SLOPES),
    gpu_case("decode negative scale", [700, 5, 64, 65], scale=-0.05),
    # each sequence's last query times 2**32 (scores near 1e10): the Hopper kernel's one-FFMA weights
    # of whole tiles are kept only below |m| = 2**19, where its rounding error is small
    *(huge_scores_param(f"huge scores {kind} {d}", [700, 300, 17], q_lens, dtype=d)
      for kind, q_lens in (("decode", None), ("prefill", [700, 300, 17])) for d in ("bfloat16", "float32")),
    huge_scores_param("huge scores fp8 decode", [900, 40], cache_dtype=FP8[0], **FP8_SCALES),
    huge_scores_param("huge scores fp8 prefill", [300, 129], [300, 50], cache_dtype=FP8[1], **FP8_SCALES),
    gpu_case("decode window HND bs32 fp16", [3000, 40, 16], block_size=32, dtype="float16", kv_layout="HND",
                  sliding_window=200),
    gpu_case("window decode", [3000], sliding_window=100),
    gpu_case("softcap", [300, 20], [4, 20], softcap=5.0),
    gpu_case("scale, window, softcap, alibi", [500], [9], scale=0.3, sliding_window=64, softcap=20.0,
                  alibi_slopes=np.linspace(0.01, 0.2, 8).astype(np.float32)),
    gpu_case("long decode split-KV", [20000, 5], num_q_heads=32, num_kv_heads=8),
    gpu_case("wide chunked prefill split-KV", [9000, 4000], [200, 300]),
    gpu_case("pool view HND", [300, 45], [3, 45], kv_layout="HND", pool=True),
    gpu_case("pool view decode fp32", [1000, 3], dtype="float32", kv_layout="HND", pool=True, block_size=32),
    *SHORT_PREFILL,
    *D256,
    *FP8_CASES,
    *FP8_DECODE,
    *WIDE,
]

#: Long ranges one CTA walks whole (planned without split-KV): more than one batch of
#: block-table entries per warp.
UNSPLIT = [
    gpu_case("decode unsplit bs16 (5 table batches per warp)", [9000, 2500, 0, 70]),
    gpu_case("decode unsplit MQA G=8 HND bs64 fp16", [5000, 33], num_kv_heads=1, block_size=64,
                  dtype="float16", kv_layout="HND"),
    gpu_case("decode unsplit window softcap HND bs64", [2500, 7, 0], block_size=64, dtype="float16",
                  kv_layout="HND", sliding_window=2300, softcap=30.0),
    gpu_case("decode unsplit d256 bs32 (6 table batches per stream)", [6000, 2500, 0, 70], head_dim=256,
                  block_size=32, num_q_heads=16, num_kv_heads=8),
]


@pytest.fixture(scope="module")
def backend() -> CupyBackend:
    """The backend; with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (as tools/sanitize runs) cupy allocates
    without its memory pool too, so that compute-sanitizer sees each array's own bounds."""
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        import cupy

        cupy.cuda.set_allocator(None)
    return CupyBackend()


def kernel_of(backend: CupyBackend, case: AttentionCase) -> str:
    """The attention kernel the backend's plan picks for ``case``."""
    device = [None if a is None else backend.to_device(a) for a in case.args()]
    options = {k: backend.to_device(v) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
    return str(backend.plan(*device, **options).state.work.kernel)


@pytest.mark.parametrize("make", [*(pytest.param(*p.values, id=p.id, marks=sanitize) for p in SMALL), *CASES])
def test_kernels_match_the_spec(backend: CupyBackend, make: Callable[[], AttentionCase]) -> None:
    checks.matches_spec(backend, make())


@pytest.mark.parametrize("make", [p for p in D256 if "CUDA cores" not in str(p.id)])
def test_head_dim_256_decode_runs_on_the_tensor_core_decode_kernel(
    backend: CupyBackend, make: Callable[[], AttentionCase]
) -> None:
    case = make()
    device = [None if a is None else backend.to_device(a) for a in case.args()]
    options = {k: backend.to_device(v) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
    assert backend.plan(*device, **options).state.attention.module == "paged_attention_decode"


@pytest.mark.parametrize("make", UNSPLIT)
def test_long_ranges_walked_by_one_cta_match_the_spec(backend: CupyBackend, make: Callable[[], AttentionCase]) -> None:
    unsplit = CupyBackend(split_kv=False)  # (the fixture has set the allocator)
    case = make()
    device = [None if a is None else unsplit.to_device(a) for a in case.args()]
    assert unsplit.plan(*device, **case.options).state.work.num_partials == 0, "no range split"
    checks.matches_spec(unsplit, case)


@pytest.mark.parametrize("check", ["deterministic", "relocation_invariant", "garbage_ignored"])
def test_bits_depend_only_on_what_a_row_sees(backend: CupyBackend, check: str) -> None:
    checks.CHECKS[check](backend, poisoned_case("bits", [3000, 70], [5, 70]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cache", FP8)
def test_fp8_decode_takes_the_decode_kernel_and_propagates_nonfinite(backend: CupyBackend, cache: str,
                                                                      dtype: str) -> None:
    """fp8 decode goes to the tensor-core decode kernel; NaN/inf in a row's query or in a key or
    value it sees reaches its out and lse as IEEE arithmetic says (the float16 route keeps
    non-finite query elements out of the row's rescaling), and garbage stays unseen."""
    case = poisoned_case(f"fp8 nonfinite {cache} {dtype}", [300, 45, 1, 900], dtype=dtype, cache_dtype=cache,
                         **FP8_SCALES)
    device = [None if a is None else backend.to_device(a) for a in case.args()]
    assert backend.plan(*device, **case.options).state.work.rows == DECODE_ROWS, "the decode kernel"
    checks.nonfinite_propagates(backend, case)
    checks.garbage_ignored(backend, case)


@pytest.mark.parametrize("check", ["deterministic", "relocation_invariant", "garbage_ignored"])
def test_head_dim_256_decode_bits_depend_only_on_what_a_row_sees(backend: CupyBackend, check: str) -> None:
    """The warp pairs' merge order and their copies beyond L (zero-filled) change no bit."""
    case = poisoned_case("bits d256", [3000, 70, 1], head_dim=256, num_q_heads=16, num_kv_heads=8, block_size=32)
    checks.CHECKS[check](backend, case)


#: (schedule, CTAs per SM) of the Hopper kernel's variants
SCHEDULES = {"overlap": ("overlap", 1), "serial": ("serial", 1), "2cta": ("serial", 2)}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("make", [*WIDE, *SHORT_PREFILL])
def test_hopper_kernel_matches_the_spec(backend: CupyBackend, make: Callable[[], AttentionCase], schedule: str) -> None:
    """With the Hopper prefill kernel switched on for every prefill it supports: it takes each case
    but the fp8 ones (which fall back to the mma.sync kernel), and the answers match the spec."""
    from pagedattn.backends.cupy import planning

    if not planning.device_has_wgmma():
        pytest.skip("the Hopper (wgmma) kernel needs a compute capability 9.0 device")
    case = make()
    if schedule == "overlap" and case.head_dim != 128:
        pytest.skip("head_dim 64 has the serial schedule only")
    hopper = CupyBackend(prefill="wgmma", wgmma_schedule=SCHEDULES[schedule][0], wgmma_ctas=SCHEDULES[schedule][1])
    assert kernel_of(hopper, case) == ("mma" if case.cache_dtype in FP8 else "wgmma")
    checks.matches_spec(hopper, case)
    checks.deterministic(hopper, case)


def _column_map(got: np.ndarray, ref: np.ndarray, width: int = 8) -> str:
    """For a failed product: which reference column block (of ``width``) each column block of
    ``got`` matches best, as "got->ref" pairs; "-" where it matches none (rel err > 1e-2)."""
    pairs = []
    blocks = got.shape[1] // width
    for b in range(blocks):
        g = got[:, b * width:(b + 1) * width]
        errors = [float(np.linalg.norm(g - ref[:, c * width:(c + 1) * width]))
                  / max(float(np.linalg.norm(ref[:, c * width:(c + 1) * width])), 1e-30) for c in range(blocks)]
        best = int(np.argmin(errors))
        pairs.append(f"{b}->{best if errors[best] < 1e-2 else '-'}")
    return " ".join(pairs)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wgmma_products_read_the_kernels_shared_memory_layout(dtype: str, head_dim: int) -> None:
    """One warpgroup's S = Q K^T and O = P V through the Hopper kernel's shared-memory layout and
    descriptors (``wgmma_layout_check``) equal float64 products of the same rounded inputs; a
    failure names which reference column/row block each result block matches (a permutation)."""
    import cupy

    from pagedattn.backends.cupy import planning, runtime, specializations

    if not planning.device_has_wgmma():
        pytest.skip("wgmma needs a compute capability 9.0 device")
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((64, head_dim)).astype(numpy_dtype(dtype)) for _ in range(3))
    p = rng.random((64, 64)).astype(numpy_dtype(dtype))
    device = [cupy.asarray(np.ascontiguousarray(x).view(np.uint16)) for x in (q, k, p, v)]
    s_out = cupy.full((64, 64), np.nan, cupy.float32)
    o_out = cupy.full((64, head_dim), np.nan, cupy.float32)
    runtime.kernel(specializations.wgmma_layout_check(dtype, head_dim))((1,), (128,), (*device, s_out, o_out))
    cupy.cuda.runtime.deviceSynchronize()
    for name, got, ref in (("S", cupy.asnumpy(s_out), q.astype(np.float64) @ k.astype(np.float64).T),
                           ("O", cupy.asnumpy(o_out), p.astype(np.float64) @ v.astype(np.float64))):
        error = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        assert error < 1e-4, (f"{name} rel err {error:.2e}; columns {_column_map(got, ref)};"
                              f" rows {_column_map(got.T, ref.T)}")


def test_torch_tensors_in_and_out_on_torchs_current_stream(backend: CupyBackend) -> None:
    """torch CUDA tensors in (DLPack), torch tensors out, launched on torch's current stream: the
    same bits as the same call on cupy arrays."""
    import torch

    case = poisoned_case("torch", [500, 3], [4, 3])
    to_torch = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()  # noqa: E731
    q, k, v = (to_torch(x.view(np.int16)).view(torch.bfloat16) for x in (case.query, case.key_cache, case.value_cache))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, _ = backend.paged_attention(q, k, v, to_torch(case.block_tables), to_torch(case.seq_lens),
                                         to_torch(case.query_start_loc), return_lse=True)
    stream.synchronize()
    assert isinstance(out, torch.Tensor)
    expected = run_case(backend, case).out
    assert np.array_equal(backend.to_numpy(out).view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("case", [pytest.param(p.values[0], id=p.id, marks=sanitize) for p in operation_cases()])
def test_cache_operations_match_the_spec(backend: CupyBackend, case: object) -> None:
    check_operation(backend, case)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["decode split-KV", "varlen prefill"])
def test_direct_runs_of_torch_tensors_give_the_checked_run_s_bits(backend: CupyBackend, shape: str) -> None:
    """One plan of torch tensors run three times (the second and third go direct), then with a
    strided query and caches of other strides (the checking path), then directly again: the same
    bits every time, and the spec's answer."""
    import torch

    from pagedattn.conformance.assertions import assert_bit_identical

    case = poisoned_case(shape, [700, 33, 1500], None if shape.startswith("decode") else [70, 33, 9])
    to_torch = lambda x: torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).cuda().view(torch.bfloat16)  # noqa: E731
    q, k, v = (to_torch(x) for x in (case.query, case.key_cache, case.value_cache))
    index = [None if x is None else torch.from_numpy(np.asarray(x)).cuda() for x in case.args()[3:]]
    plan = backend.plan(q, k, v, *index, return_lse=True)
    runs = [backend.run(plan, q, k, v) for _ in range(3)]
    def padded(x: Any) -> Any:  # the same values, shape and dtype; rows 8 elements apart
        copy = torch.empty((*x.shape[:-1], x.shape[-1] + 8), dtype=x.dtype, device="cuda")[..., : x.shape[-1]]
        return copy.copy_(x)

    runs.append(backend.run(plan, padded(q), padded(k), padded(v)))
    runs.append(backend.run(plan, q, k, v))
    assert plan.state.torch_strides == (k.stride(), v.stride())
    first = [backend.to_numpy(x) for x in runs[0]]
    for index_, (out, lse) in enumerate(runs[1:], start=1):
        call = f"[call: backend=cupy direct run {index_}]"
        assert_bit_identical("out", backend.to_numpy(out), first[0], "a direct run changed the output", call)
        assert_bit_identical("lse", backend.to_numpy(lse), first[1], "a direct run changed lse", call)
    checks.matches_spec(backend, case)


#: Split plans of each attention kernel (with the options that pick it): the 16-bit decode
#: kernel at head_dim 128 and 256, fp8 decode, the CUDA-core kernel, the mma.sync and the
#: Hopper prefill kernels.
MERGE_CASES: dict[str, tuple[Callable[[], AttentionCase], dict[str, str]]] = {
    "decode": (functools.partial(poisoned_case, "merge decode", [0, 1500, 17]), {}),
    "decode d256": (functools.partial(poisoned_case, "merge decode d256", [0, 700, 17], head_dim=256,
                                      block_size=32), {}),
    "fp8 decode": (functools.partial(poisoned_case, "merge fp8 decode", [1300, 40], num_q_heads=48,
                                     cache_dtype=FP8[0], **FP8_SCALES), {}),
    "CUDA cores": (functools.partial(poisoned_case, "merge simt", [0, 1500, 17], dtype="float16"),
                   {"decode": "simt"}),
    "mma prefill": (functools.partial(poisoned_case, "merge mma", [6000], [64]), {"prefill": "mma"}),
    "wgmma prefill": (functools.partial(poisoned_case, "merge wgmma", [9000, 4000], [200, 300]),
                      {"prefill": "wgmma"}),
}


@pytest.mark.parametrize("name", list(MERGE_CASES))
def test_the_fused_merge_gives_the_merge_kernel_s_bits(backend: CupyBackend, name: str) -> None:
    """A split plan merged by the last part of each range (``merge="fused"``) gives the bits of the
    same plan merged by ``merge_partials``; runs queued back to back (the counters each run sets
    back to zero) give a run alone's bits; and the answer is the spec's."""
    from pagedattn.conformance.assertions import assert_bit_identical

    make, options = MERGE_CASES[name]
    case = make()
    results = {}
    for merge in ("kernel", "fused"):
        merging = CupyBackend(merge=merge, **options)  # type: ignore[arg-type]
        device = [None if a is None else merging.to_device(a) for a in case.args()]
        call_options = {k: merging.to_device(v) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
        plan = merging.plan(*device, **call_options)
        assert plan.state.work.num_partials > 0, "the plan splits"
        assert (plan.state.merge_block is None) == (merge == "fused")
        runs = [merging.run(plan, *device[:3]) for _ in range(3)]  # queued, then read
        results[merge] = [[merging.to_numpy(x) for x in run] for run in runs]
    expected = results["kernel"][0]
    for merge, runs in results.items():
        for index, (out, lse) in enumerate(runs):
            call = f"[call: backend=cupy merge={merge} run {index}]"
            assert_bit_identical("out", out, expected[0], "the merges differ", call)
            assert_bit_identical("lse", lse, expected[1], "the merges differ", call)
    checks.matches_spec(CupyBackend(**options), case)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_to_device_copies_without_a_pinned_staging_copy(dtype: str) -> None:
    """An upload goes straight from the host array: cupy's pinned pool gains nothing (a far pool's
    staging copy would hold gigabytes of host memory), and the bits arrive."""
    import cupy

    pool = cupy.get_default_pinned_memory_pool()
    requested: list[int] = []

    def counting_allocator(size: int) -> Any:
        requested.append(size)
        return pool.malloc(size)

    host = np.random.default_rng(0).standard_normal((2**22,)).astype(numpy_dtype(dtype))  # 4 to 16 MiB
    cupy.cuda.set_pinned_memory_allocator(counting_allocator)
    try:
        device = CupyBackend().to_device(host)
    finally:
        cupy.cuda.set_pinned_memory_allocator(pool.malloc)
    assert requested == [], f"the upload staged {sum(requested)} bytes in pinned host memory"
    width = f"u{host.dtype.itemsize}"
    assert np.array_equal(CupyBackend().to_numpy(device).view(width), host.view(width))
