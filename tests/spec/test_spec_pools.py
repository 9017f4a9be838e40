"""spec.pools: the seeded paged inputs lay data out as the contract says and put garbage only where nothing is read."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.errors import PagedAttentionError
from pagedattn.spec import exact_attention
from pagedattn.spec.pools import WILD_BLOCK_IDS, random_paged_inputs

CASES = [
    dict(seq_lens=[5, 0, 40], q_lens=None, block_size=4),
    dict(seq_lens=[17, 33], q_lens=[4, 33], block_size=16, kv_layout="HND", dtype="bfloat16"),
    dict(seq_lens=[9, 1], q_lens=[2, 1], block_size=8, cache_dtype="float8_e4m3fn", dtype="float16"),
]


@pytest.mark.parametrize("kw", CASES)
def test_block_tables_map_each_used_block_once(kw: dict) -> None:
    inputs = random_paged_inputs(**kw, spare_blocks=2, spare_columns=2, seed=1)
    bs = kw["block_size"]
    needed = [-(-n // bs) for n in kw["seq_lens"]]
    used = np.concatenate([inputs.block_tables[s, :n] for s, n in enumerate(needed)])
    assert len(set(used.tolist())) == len(used) == sum(needed)
    assert inputs.key_cache.shape[0] == sum(needed) + 2 and inputs.block_tables.shape[1] == max(needed) + 2
    assert all((inputs.block_tables[s, n:] == -1).all() for s, n in enumerate(needed))


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("garbage", ["nan", "wild"])
def test_garbage_only_where_nothing_is_read(kw: dict, garbage: str) -> None:
    clean = random_paged_inputs(**kw, seed=4)
    dirty = random_paged_inputs(**kw, seed=4, garbage=garbage)
    layout = kw.get("kv_layout", "NHD")
    expected = exact_attention(*clean.args(), kv_layout=layout)
    actual = exact_attention(*dirty.args(), kv_layout=layout)
    assert np.array_equal(actual.out, expected.out)  # the read data are the same draws
    assert not np.isfinite(dirty.key_cache.astype(np.float32)).all()  # and there is garbage beside them
    bs = kw["block_size"]
    needed = [-(-n // bs) for n in kw["seq_lens"]]
    unused = np.concatenate([dirty.block_tables[s, n:] for s, n in enumerate(needed)])
    assert set(unused.tolist()) <= (set(WILD_BLOCK_IDS) if garbage == "wild" else {-1})


def test_unknown_garbage_is_refused() -> None:
    with pytest.raises(PagedAttentionError, match="garbage: expected one of"):
        random_paged_inputs([3], garbage="zeros")
