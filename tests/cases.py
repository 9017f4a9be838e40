"""Cases shared by the unit tests: drawn small ones (:func:`paged_configs`), named poisoned ones for
the GPU tests (:func:`poisoned_case`), and the cache operations' cases (:func:`operation_cases`).

Every attention case is the spec's :class:`~pagedattn.spec.case.AttentionCase`, built by
:func:`pagedattn.spec.pools.random_paged_inputs`.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from pagedattn.backends.interface import Backend
from pagedattn.conformance import checks
from pagedattn.conformance.cases import CopyBlocksCase, MergeCase, WriteKVCase
from pagedattn.conformance.strategies import HUGE_SCORES_FACTOR
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.pools import in_pool, random_paged_inputs

#: ALiBi slopes of 8 query heads (the GPU cases' default head count)
SLOPES = (2.0 ** -np.arange(1, 9)).astype(np.float32)
#: fp8 cache scales of the GPU cases
FP8_SCALES: dict[str, Any] = {"k_scale": 0.37, "v_scale": 2.5}


@st.composite
def paged_configs(
    draw: st.DrawFn,
    *,
    block_sizes: Sequence[int] = (1, 4, 16, 32),
    groups: Sequence[int] = (1, 2, 3, 7),
    max_seqs: int = 4,
    head_dim: int = 8,
    explicit_scale: bool = True,
) -> dict[str, Any]:
    """Draw a small case and options: ``{"case", "dtype", "cache_dtype", "options"}``.

    Block sizes, GQA groups, decode or varlen, every dtype, fp8 caches with scales, and the
    optional causal / sliding window / softcap (/ explicit scale) options.
    """
    block_size = draw(st.sampled_from(list(block_sizes)), label="block_size")
    num_seqs = draw(st.integers(1, max_seqs), label="num_seqs")
    lens = draw(st.lists(st.integers(0, 3 * block_size + 1), min_size=num_seqs, max_size=num_seqs), label="L")
    decode = draw(st.booleans(), label="decode")
    q_lens = None if decode else [draw(st.integers(0, n), label="q_len") for n in lens]
    kv_heads = draw(st.sampled_from([1, 2]), label="num_kv_heads")
    group = draw(st.sampled_from(list(groups)), label="group")
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]), label="dtype")
    cache_dtype = draw(st.sampled_from([None, None, "float8_e4m3fn", "float8_e5m2"]), label="cache_dtype")
    optional = {
        "causal": st.booleans(),
        "sliding_window": st.integers(1, 40),
        "softcap": st.floats(0.5, 50),
        "k_scale": st.floats(0.25, 4),
        "v_scale": st.floats(0.25, 4),
    }
    if explicit_scale:
        optional["scale"] = st.floats(0.01, 2)
    options = draw(st.fixed_dictionaries({}, optional=optional), label="options")
    if cache_dtype is None:
        options.pop("k_scale", None)
        options.pop("v_scale", None)
    case = random_paged_inputs(lens, q_lens, block_size=block_size, num_q_heads=kv_heads * group, num_kv_heads=kv_heads,
                     head_dim=head_dim, dtype=dtype, cache_dtype=cache_dtype,
                     kv_layout=draw(st.sampled_from(["NHD", "HND"]), label="layout"),
                     seed=draw(st.integers(0, 2**16), label="seed"))
    return {"case": case, "dtype": dtype, "cache_dtype": cache_dtype, "options": options}


def poisoned_case(name: str, seq_lens: Sequence[int], q_lens: Sequence[int] | None = None, *, pool: bool = False,
                  **settings: Any) -> AttentionCase:
    """A named GPU case: ``q_lens`` None is decode; NaN and +-inf in every slot it must not read and
    wild ids in unused block-table columns; bfloat16, head_dim 128, 8 query and 2 KV heads, block
    size 16 unless ``settings`` say otherwise (they take :func:`random_paged_inputs`' keywords and
    the call's options; ``return_lse`` is on). ``pool``: on views of a two-layer pool. The seed
    follows from the name."""
    shape = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dtype": "bfloat16", **settings}
    case = random_paged_inputs(list(seq_lens), None if q_lens is None else list(q_lens), garbage="wild",
                               seed=zlib.crc32(name.encode()) % 2**31, name=name, return_lse=True, **shape)
    return in_pool(case) if pool else case


def gpu_case(name: str, seq_lens: Sequence[int], q_lens: Sequence[int] | None = None, *, marks: Any = (),
             **settings: Any) -> Any:
    """A pytest param holding a builder of :func:`poisoned_case` (the arrays are made when a test
    runs, not when it is collected), with the case's name as its id."""
    return pytest.param(functools.partial(poisoned_case, name, seq_lens, q_lens, **settings), id=name, marks=marks)


def huge_scores_case(name: str, seq_lens: Sequence[int], q_lens: Sequence[int] | None = None,
                     **settings: Any) -> AttentionCase:
    """:func:`poisoned_case` with each sequence's last query times 2**32: its scores reach about 1e10,
    where a max subtracted from unrounded products (one fused multiply-add) gives inf or 0 weights."""
    case = poisoned_case(name, seq_lens, q_lens, **settings)
    query = case.query.astype(np.float64)
    starts = case.query_start_loc if case.query_start_loc is not None else np.arange(len(seq_lens) + 1)
    for start, stop in itertools.pairwise(starts):
        if stop > start:
            query[stop - 1] *= HUGE_SCORES_FACTOR
    return case.replace(query=query.astype(case.query.dtype))


def huge_scores_param(name: str, seq_lens: Sequence[int], q_lens: Sequence[int] | None = None, *,
                      marks: Any = (), **settings: Any) -> Any:
    """A pytest param holding a builder of :func:`huge_scores_case`, with the case's name as its id."""
    return pytest.param(functools.partial(huge_scores_case, name, seq_lens, q_lens, **settings), id=name,
                        marks=marks)


def check_operation(backend: Backend, case: WriteKVCase | CopyBlocksCase | MergeCase) -> None:
    """The conformance check of a cache operation's case."""
    check = {WriteKVCase: checks.write_kv_matches_spec, CopyBlocksCase: checks.copy_blocks_matches_spec,
             MergeCase: checks.merge_states_matches_spec}[type(case)]
    check(backend, case)  # type: ignore[operator]


def operation_cases() -> list[Any]:
    """write_kv at every query dtype into 16-bit, float32 and fp8 caches of both layouts (skipped
    slots, fp8 overflow, -0 and subnormals, scales), copy_blocks with chains and a cycle, and
    merge_states with empty sides (lse = -inf, NaN out); as pytest params with ids."""
    rng = np.random.default_rng(10)
    cases: list[Any] = []
    writes = [(d, None, layout) for d in ("bfloat16", "float16", "float32") for layout in ("NHD", "HND")]
    writes += [("bfloat16", "float8_e4m3fn", "NHD"), ("float16", "float8_e5m2", "HND"),
               ("float32", "float8_e4m3fn", "HND"), ("float32", "float8_e5m2", "NHD")]
    for dtype, cache, layout in writes:
        shape = (8, 16, 4, 64) if layout == "NHD" else (8, 4, 16, 64)
        caches = [rng.standard_normal(shape).astype(numpy_dtype(cache or dtype)) for _ in range(2)]
        magnitude = np.exp(rng.uniform(-25.0, 12.0 if cache else 4.0, (40, 4, 64)))  # fp8: subnormal to overflow
        with np.errstate(over="ignore"):  # 16-bit keys past their range are inf, as intended
            key = (magnitude * rng.choice([-1.0, 1.0], magnitude.shape)).astype(numpy_dtype(dtype))
            key[0, 0, :2] = [-0.0, 0.0]
            if cache:
                key[0, 0, 2:4] = [464.0 * 0.37, 61440.0 * 2.5]  # fp8 rounding boundaries
        value = (rng.standard_normal((40, 4, 64)) * 300).astype(numpy_dtype(dtype))
        slots = rng.permutation(128)[:40].astype(np.int64)
        slots[::7] = -1
        scales = FP8_SCALES if cache else {}
        cases.append(pytest.param(WriteKVCase(key, value, *caches, slots, layout, **scales),
                                  id=f"write_kv {dtype} -> {cache or dtype} {layout}"))
    for layout in ("NHD", "HND"):
        cache = rng.standard_normal((10, 16, 4, 64)).astype(numpy_dtype("bfloat16"))
        pairs = np.array([[0, 1], [1, 2], [2, 0], [5, 9]], dtype=np.int64)  # a cycle: sources first
        cases.append(pytest.param(CopyBlocksCase(cache, cache[::-1].copy(), pairs, layout), id=f"copy_blocks {layout}"))
    for dtype in ("bfloat16", "float16", "float32"):
        out_a, out_b = (rng.standard_normal((50, 8, 64)).astype(numpy_dtype(dtype)) for _ in range(2))
        lse_a, lse_b = (rng.normal(0, 4, (50, 8)).astype(np.float32) for _ in range(2))
        lse_a[0], out_a[0] = -np.inf, np.nan
        lse_a[1] = lse_b[1] = -np.inf
        cases.append(pytest.param(MergeCase(out_a, lse_a, out_b, lse_b), id=f"merge_states {dtype}"))
    return cases
