"""The triton kernels on a CUDA device against the exact spec, judged by the conformance checks.

Every case is a named :func:`cases.poisoned_case`, run on a backend built with the
constructor options it needs (forced split-KV, tile shapes). Skipped with the reason where
no CUDA device exists or where ``TRITON_INTERPRET=1`` selects Triton's CPU interpreter (the
interpreter's own tests: ``test_triton_backend.py``). ``sanitize`` marks the cases
``tools/sanitize`` runs under compute-sanitizer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from cases import FP8_SCALES, SLOPES, check_operation, gpu_case, huge_scores_param, operation_cases, poisoned_case

from pagedattn.conformance import checks
from pagedattn.conformance.assertions import ConformanceFailure, assert_bit_identical
from pagedattn.conformance.cases import run_case
from pagedattn.spec.case import AttentionCase


def gpu_reason() -> str | None:
    """Why the kernels cannot run on a GPU here, or None."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return "triton and torch are needed (pip install 'pagedattn[triton]')"
    import torch

    from pagedattn.backends.triton.backend import interpreter_mode

    if not torch.cuda.is_available():
        return "no CUDA device"
    if interpreter_mode():
        return "TRITON_INTERPRET=1 selects Triton's CPU interpreter"
    return None


REASON = gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"triton on a GPU: {REASON}")]
sanitize = pytest.mark.sanitize


def backend_for(**options: Any) -> Any:
    """A triton backend with constructor options; ``keys_major`` / ``block_n`` / ``num_stages`` set
    the decode tiles (from the ones it would choose for 4 query heads per KV head at d = 128)."""
    from pagedattn.backends.triton.backend import TritonBackend
    from pagedattn.backends.triton.launch_config import choose_tiles

    tile_options = {k: options.pop(k) for k in ("keys_major", "block_n", "num_stages") if k in options}
    if tile_options:
        options["tiles"] = replace(choose_tiles(1, 4, 128, "bfloat16"), **tile_options)
    return TritonBackend(**options)


def with_backend(case: Any, marks: Any = (), **options: Any) -> Any:
    """A :func:`cases.gpu_case` param with the backend's constructor options (see :func:`backend_for`)."""
    return pytest.param(*case.values, options, id=case.id, marks=marks)


MAJOR_TILES = {"block_n": 64, "num_stages": 5}
CASES = [
    *(with_backend(gpu_case(f"decode bs{bs} GQA 8/2", [1, 700, 0, 4097, 63], block_size=bs),
                   marks=sanitize if bs == 16 else ()) for bs in (16, 32, 64)),
    *(with_backend(gpu_case(f"decode HND bs32 N=64 s=5 {name}-major window=1000", [1, 2500, 0, 4097],
                                 block_size=32, kv_layout="HND", sliding_window=1000), keys_major=major, **MAJOR_TILES)
      for major, name in ((False, "rows"), (True, "keys"))),
    *(with_backend(gpu_case(f"decode fp8 e4m3 {name}-major split 3 softcap", [700, 2000],
                                 cache_dtype="float8_e4m3fn", softcap=20.0, **FP8_SCALES),
                   keys_major=major, num_splits=3, **MAJOR_TILES) for major, name in ((False, "rows"), (True, "keys"))),
    with_backend(gpu_case("decode fp16 HND MQA 8/1", [300, 1025], dtype="float16", kv_layout="HND",
                               num_kv_heads=1)),
    with_backend(gpu_case("decode fp32 d64", [77, 513], dtype="float32", head_dim=64)),
    with_backend(gpu_case("prefill causal 2x600", [600, 333], [600, 333])),
    with_backend(gpu_case("chunked mixed HND bs32", [900, 257, 40, 1], [129, 1, 40, 1], block_size=32,
                               kv_layout="HND")),
    with_backend(gpu_case("prefill fp16 non-causal window=100", [400, 130], [200, 130], dtype="float16",
                               causal=False, sliding_window=100)),
    with_backend(gpu_case("prefill softcap alibi", [300, 90], [150, 90], softcap=30.0, alibi_slopes=SLOPES)),
    with_backend(gpu_case("GQA 7/1 fp16 d80", [200, 45], [20, 1], dtype="float16", num_q_heads=7,
                               num_kv_heads=1, head_dim=80)),
    with_backend(gpu_case("fp32 prefill d128", [150], [150], dtype="float32")),
    # each sequence's last query times 2**32 (scores near 1e10): the max subtracted from the same
    # rounded scores it was taken over, never from a fused multiply-add's unrounded products
    *(with_backend(huge_scores_param(f"huge scores {kind} {d}", [700, 300, 17], q_lens, dtype=d))
      for kind, q_lens in (("decode", None), ("prefill", [700, 300, 17])) for d in ("bfloat16", "float32")),
    *(with_backend(gpu_case(f"decode cache {cache}", [500, 2000], cache_dtype=cache, **FP8_SCALES))
      for cache in ("float8_e4m3fn", "float8_e5m2")),
    *(with_backend(gpu_case(f"decode cache {cache} d{d} (values as pairs)", [300, 1500], cache_dtype=cache,
                            head_dim=d, **FP8_SCALES), marks=sanitize if d == 64 else ())
      for cache, d in (("float8_e4m3fn", 64), ("float8_e5m2", 256))),
    *(with_backend(gpu_case(f"prefill fp16 cache {cache} HND", [300], [100], dtype="float16", cache_dtype=cache,
                                 kv_layout="HND", k_scale=1.7, v_scale=0.3),
                   marks=sanitize if cache == "float8_e4m3fn" else ()) for cache in ("float8_e4m3fn", "float8_e5m2")),
    with_backend(gpu_case("split-KV heuristic 2x20000 decode", [20000, 9000])),
    with_backend(gpu_case("split-KV forced 5 window=3000", [9000, 100], sliding_window=3000), num_splits=5),
    with_backend(gpu_case("split-KV forced 3 chunked prefill", [3000, 50], [64, 50]), num_splits=3),
    with_backend(gpu_case("split 4 HND window=600", [700, 33, 0, 1500], [33, 33, 0, 1], kv_layout="HND",
                               sliding_window=600), marks=sanitize, num_splits=4),
    with_backend(gpu_case("prefill bs64", [300, 33, 1], [100, 33, 1], block_size=64), marks=sanitize),
    with_backend(gpu_case("speculative split-KV fp16", [2100, 0, 1500, 17], [3, 0, 1, 2], dtype="float16"),
                 marks=sanitize),
    with_backend(gpu_case("decode G=17 split-KV", [0, 1800, 9], num_q_heads=34), marks=sanitize),
    with_backend(gpu_case("decode fp8 e4m3 G=24 split-KV", [1300, 40], num_q_heads=48, cache_dtype="float8_e4m3fn",
                          **FP8_SCALES), marks=sanitize),
    with_backend(gpu_case("strided pool view", [300, 120], [10, 1], kv_layout="HND", pool=True)),
    with_backend(gpu_case("decode d512 GQA 2 split", [5000, 40], num_q_heads=8, num_kv_heads=4, head_dim=512),
                 marks=sanitize),
    with_backend(gpu_case("prefill d384 causal", [300, 90], [100, 90], num_q_heads=4, num_kv_heads=2,
                          head_dim=384)),
    with_backend(gpu_case("prefill fp32 d512", [120], [120], dtype="float32", num_q_heads=2, num_kv_heads=1,
                          head_dim=512)),
]


@pytest.mark.parametrize("make, options", CASES)
def test_kernels_match_the_spec(make: Callable[[], AttentionCase], options: dict[str, Any]) -> None:
    checks.matches_spec(backend_for(**options), make())


@pytest.mark.parametrize("num_splits", [None, 4])
@pytest.mark.parametrize("check", ["garbage_ignored", "relocation_invariant", "deterministic"])
def test_bits_depend_only_on_what_a_row_sees(check: str, num_splits: int | None) -> None:
    case = poisoned_case("bits", [700, 33, 0, 1500], [33, 33, 0, 1], sliding_window=600)
    checks.CHECKS[check](backend_for(num_splits=num_splits), case)


def test_the_merge_launched_with_or_without_pdl_gives_the_same_bits() -> None:
    """The split-KV merge as the attention kernel's programmatic dependent (the default from
    sm_90) and as a plain launch: the same bits, eager and through the direct relaunch path;
    and two runs of one plan queued back to back (one set of partials) each give the bits of
    a run alone."""
    import torch

    case = poisoned_case("pdl", [20000, 9000, 1])
    results = {}
    for pdl in (True, False):
        backend = backend_for(pdl=pdl)
        device = [None if a is None else backend.to_device(a) for a in case.args()]
        plan = backend.plan(*device, return_lse=True)
        assert plan.state.num_splits > 1, plan.state.num_splits
        on = pdl and torch.cuda.get_device_capability()[0] >= 9
        assert plan.state.merge_options.get("launch_pdl", False) is on
        results[pdl] = [[backend.to_numpy(x) for x in backend.run(plan, *device[:3])] for _ in range(2)]
        other_query = torch.flip(device[0], dims=(1,)).contiguous()
        alone = [backend.to_numpy(x) for x in backend.run(plan, other_query, *device[1:3])]
        queued = [backend.run(plan, query, *device[1:3]) for query in (device[0], other_query)]  # no sync between
        for (out, lse), expected in zip(queued, (results[pdl][0], alone), strict=True):
            assert_bit_identical("out", backend.to_numpy(out), expected[0], "a queued run changed the output", "[pdl]")
            assert_bit_identical("lse", backend.to_numpy(lse), expected[1], "a queued run changed lse", "[pdl]")
    for out, lse in (*results[True], results[False][1]):
        assert_bit_identical("out", out, results[False][0][0], "the merge's launch changed the output", "[pdl]")
        assert_bit_identical("lse", lse, results[False][0][1], "the merge's launch changed lse", "[pdl]")
    checks.matches_spec(backend_for(), case)


def test_a_pool_of_more_than_2_to_the_31_elements_gives_the_same_bits() -> None:
    """64-bit offsets: the sequences' blocks at the end of a pool past 2**31 elements."""
    import torch

    backend = backend_for()
    case = poisoned_case("huge pool", [3000, 517])
    small_k, small_v = case.key_cache, case.value_cache
    n_small, per_block = small_k.shape[0], int(np.prod(small_k.shape[1:]))
    n_big = 2**31 // per_block + n_small + 8
    big_k = torch.zeros((n_big, *small_k.shape[1:]), dtype=torch.bfloat16, device="cuda")
    big_v = torch.zeros_like(big_k)
    big_k[n_big - n_small:], big_v[n_big - n_small:] = backend.to_device(small_k), backend.to_device(small_v)
    tables = np.where(case.block_tables >= 0, case.block_tables.astype(np.int64) + n_big - n_small, -1)
    out, _ = backend.paged_attention(backend.to_device(case.query), big_k, big_v,
                                     backend.to_device(tables.astype(np.int32)), backend.to_device(case.seq_lens),
                                     return_lse=True)
    del big_k, big_v
    torch.cuda.empty_cache()
    checks.matches_spec(backend, case)
    assert_bit_identical("out", backend.to_numpy(out), run_case(backend, case).out,
                         "a pool past 2**31 elements changed the output", "[call: backend=triton huge pool]")


def test_one_plan_run_again_and_on_an_unaligned_query_gives_the_same_bits() -> None:
    """The direct relaunch path: one plan run three times, and once with a query one element off
    its allocation's alignment."""
    import torch

    backend = backend_for()
    case = poisoned_case("relaunch", [700, 33, 1500])
    device = [None if a is None else backend.to_device(a) for a in case.args()]
    plan = backend.plan(*device, return_lse=True)
    runs = [[backend.to_numpy(x) for x in backend.run(plan, *device[:3])] for _ in range(3)]
    raw = torch.empty(device[0].numel() + 1, dtype=device[0].dtype, device="cuda")
    unaligned = raw[1:].view(device[0].shape)
    unaligned.copy_(device[0])
    runs.append([backend.to_numpy(x) for x in backend.run(plan, unaligned, *device[1:3])])
    for index, (out, lse) in enumerate(runs[1:], start=1):
        call = f"[call: backend=triton relaunch {index}]"
        assert_bit_identical("out", out, runs[0][0], "a relaunched plan changed the output", call)
        assert_bit_identical("lse", lse, runs[0][1], "a relaunched plan changed lse", call)
    checks.matches_spec(backend, case)


def test_a_run_on_a_stream_of_its_own_fails_the_stream_check_and_triton_passes() -> None:
    """``checks.run_follows_callers_stream`` has teeth: triton made to launch on a stream of its own
    (not the caller's current one) races with the writes queued before it on the caller's stream
    and fails the check on a small decode case; triton as it is passes."""
    import torch

    from pagedattn.backends.triton.backend import TritonBackend

    class OwnStreamTriton(TritonBackend):
        """Triton launched on a stream of its own, whatever stream the caller is on."""

        def __init__(self) -> None:
            super().__init__()
            self._own_stream = torch.cuda.Stream()

        def run(self, plan: Any, query: Any, key_cache: Any, value_cache: Any) -> Any:
            with torch.cuda.stream(self._own_stream):
                return super().run(plan, query, key_cache, value_cache)

    case = poisoned_case("own stream", [700, 33, 1500])
    assert checks.run_follows_callers_stream(backend_for(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="a run on the caller's stream, behind a delay, differs"):
        checks.run_follows_callers_stream(OwnStreamTriton(), case)


def test_a_split_merge_on_a_stream_of_its_own_fails_the_stream_check_and_triton_passes() -> None:
    """``checks.run_follows_callers_stream`` on a split plan has teeth: triton whose split-KV merge
    alone launches on a stream of its own (the parts on the caller's) merges partials the parts
    have not written yet and fails the check; triton as it is passes."""
    import torch

    from pagedattn.backends.triton.attention_kernels import merge_splits_kernel
    from pagedattn.backends.triton.backend import TritonBackend

    class MergeOnItsOwnStream(TritonBackend):
        """Triton whose merge kernel launches on a stream of its own; every run through the JIT."""

        def __init__(self) -> None:
            super().__init__(num_splits=4)
            self._own_stream = torch.cuda.Stream()

        def _run(self, plan: Any, query: Any, key_cache: Any, value_cache: Any) -> Any:
            relauncher = plan.state.relauncher
            launch = relauncher.launch

            def merge_on_own_stream(kernel: Any, *args: Any, **kwargs: Any) -> Any:
                if kernel is not merge_splits_kernel:
                    return launch(kernel, *args, **kwargs)
                with torch.cuda.stream(self._own_stream):
                    return launch(kernel, *args, **kwargs)

            relauncher.launch = merge_on_own_stream
            try:
                return self._run_through_jit(plan, query, key_cache, value_cache)
            finally:
                del relauncher.launch

    case = poisoned_case("split merge stream", [9000, 700])
    assert checks.run_follows_callers_stream(backend_for(num_splits=4), case) <= 1.0
    with pytest.raises(ConformanceFailure):
        checks.run_follows_callers_stream(MergeOnItsOwnStream(), case)


#: One case of each operation (its first among ``operation_cases``) and its stream check.
STREAM_CHECKED_OPERATIONS = {
    "write_kv": ("write_kv bfloat16", checks.write_kv_follows_callers_stream),
    "copy_blocks": ("copy_blocks NHD", checks.copy_blocks_follows_callers_stream),
    "merge_states": ("merge_states bfloat16", checks.merge_states_follows_callers_stream),
}


@pytest.mark.parametrize("operation", sorted(STREAM_CHECKED_OPERATIONS))
def test_an_operation_on_a_stream_of_its_own_fails_the_stream_check_and_triton_passes(operation: str) -> None:
    """The operations' stream checks have teeth: triton made to call the operation on a stream of its
    own runs it before its inputs land on the caller's stream (or has its writes overwritten by
    them) and fails; triton as it is passes."""
    import torch

    from pagedattn.backends.triton.backend import TritonBackend

    class OwnStreamTriton(TritonBackend):
        """Triton whose ``operation`` launches on a stream of its own, whatever stream the caller is on."""

        def __init__(self) -> None:
            super().__init__()
            self._own_stream = torch.cuda.Stream()

        def __getattribute__(self, name: str) -> Any:
            method = super().__getattribute__(name)
            if name != operation:
                return method

            def on_own_stream(*args: Any, **kwargs: Any) -> Any:
                with torch.cuda.stream(self._own_stream):
                    return method(*args, **kwargs)
            return on_own_stream

    prefix, check = STREAM_CHECKED_OPERATIONS[operation]
    case = next(p.values[0] for p in operation_cases() if p.id.startswith(prefix))
    assert check(backend_for(), case) <= 1.0
    with pytest.raises(ConformanceFailure):
        check(OwnStreamTriton(), case)


@pytest.mark.parametrize("case", [pytest.param(p.values[0], id=p.id, marks=sanitize) for p in operation_cases()])
def test_cache_operations_match_the_spec(case: object) -> None:
    check_operation(backend_for(), case)  # type: ignore[arg-type]
