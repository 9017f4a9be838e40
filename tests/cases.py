"""Small paged-attention inputs built from a seed, shared by the unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

from pagedattn.spec.dtypes import numpy_dtype


class PagedCase(NamedTuple):
    """Inputs of one paged-attention call on NumPy arrays."""

    query: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    kv_layout: str

    def args(self) -> tuple[Any, ...]:
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc)


def make_case(
    seq_lens: list[int],
    q_lens: list[int] | None = None,
    *,
    block_size: int = 16,
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    dtype: str = "float32",
    cache_dtype: str | None = None,
    kv_layout: str = "NHD",
    spare_blocks: int = 3,
    seed: int = 0,
    poison: bool = False,
) -> PagedCase:
    """Build a case with shuffled physical blocks and -1 in unused block-table entries.

    ``q_lens=None`` means decode (one query per sequence, ``query_start_loc=None``).
    ``poison=True`` fills every slot at position ``>= L`` of a used block and every spare
    block with NaN, which a conforming backend never reads.
    """
    rng = np.random.default_rng(seed)
    needed = [-(-length // block_size) for length in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    max_blocks = max([*needed, 1]) + 1
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max_blocks), -1, dtype=np.int32)
    used = 0
    for s, n in enumerate(needed):
        tables[s, :n] = perm[used : used + n]
        used += n
    shape = (
        (num_blocks, block_size, num_kv_heads, head_dim)
        if kv_layout == "NHD"
        else (num_blocks, num_kv_heads, block_size, head_dim)
    )
    cdt = numpy_dtype(cache_dtype or dtype)
    key_cache = rng.standard_normal(shape).astype(cdt)
    value_cache = rng.standard_normal(shape).astype(cdt)
    if poison:
        slots_k = key_cache if kv_layout == "NHD" else key_cache.swapaxes(1, 2)  # views
        slots_v = value_cache if kv_layout == "NHD" else value_cache.swapaxes(1, 2)
        for s, (length, n) in enumerate(zip(seq_lens, needed, strict=True)):
            for p in range(length, n * block_size):
                slots_k[tables[s, p // block_size], p % block_size] = np.nan
                slots_v[tables[s, p // block_size], p % block_size] = np.nan
        slots_k[perm[used:]] = np.nan
        slots_v[perm[used:]] = np.nan
    if q_lens is None:
        num_tokens, starts = len(seq_lens), None
    else:
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        num_tokens = int(starts[-1])
    query = rng.standard_normal((num_tokens, num_q_heads, head_dim)).astype(numpy_dtype(dtype))
    return PagedCase(query, key_cache, value_cache, tables, np.asarray(seq_lens, dtype=np.int32), starts,
                     kv_layout)


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
    case = make_case(lens, q_lens, block_size=block_size, num_q_heads=kv_heads * group, num_kv_heads=kv_heads,
                     head_dim=head_dim, dtype=dtype, cache_dtype=cache_dtype,
                     kv_layout=draw(st.sampled_from(["NHD", "HND"]), label="layout"),
                     seed=draw(st.integers(0, 2**16), label="seed"))
    return {"case": case, "dtype": dtype, "cache_dtype": cache_dtype, "options": options}
