"""Drawn small paged-attention cases shared by the unit tests (fixed ones: :mod:`pagedattn.spec.pools`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from pagedattn.spec.pools import random_paged_inputs


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
