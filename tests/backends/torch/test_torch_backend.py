"""The torch backend against the spec: exact_attention within the error model, cache operations.

Each case builds a batch whose unused block-table entries and slots hold poison (NaN,
out-of-range ids), runs the torch backend, and checks every element against
:func:`pagedattn.spec.exact.exact_attention` with bounds from :func:`tolerance` only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pagedattn.backends.torch.backend import TorchBackend  # noqa: E402
from pagedattn.errors import PagedAttentionError  # noqa: E402
from pagedattn.spec import kv_ops  # noqa: E402
from pagedattn.spec.dtypes import numpy_dtype  # noqa: E402
from pagedattn.spec.error_model import merge_tolerance, tolerance  # noqa: E402
from pagedattn.spec.exact import exact_attention  # noqa: E402
from pagedattn.spec.online_softmax import merge_states  # noqa: E402
from pagedattn.spec.pools import random_paged_inputs  # noqa: E402


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return TorchBackend()


def make_batch(rng: np.random.Generator, *, seq_lens: list[int], q_lens: list[int] | None, num_q_heads: int,
               num_kv_heads: int, head_dim: int, block_size: int, dtype: str, cache_dtype: str | None = None,
               kv_layout: str = "NHD", spare_blocks: int = 3) -> dict[str, Any]:
    """A random batch with shuffled physical blocks; unused slots are NaN, unused table entries -1."""
    case = random_paged_inputs(seq_lens, q_lens, block_size=block_size, num_q_heads=num_q_heads,
                               num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, cache_dtype=cache_dtype,
                               kv_layout=kv_layout, spare_blocks=spare_blocks, seed=int(rng.integers(2**31)),
                               garbage="nan")
    return {"query": case.query, "key_cache": case.key_cache, "value_cache": case.value_cache,
            "block_tables": case.block_tables, "seq_lens": case.seq_lens, "query_start_loc": case.query_start_loc}


def check_against_spec(backend: TorchBackend, batch: dict[str, Any], *, key_cache: Any = None,
                       value_cache: Any = None, **options: Any) -> None:
    """Run the backend and assert out (and lse) within the error model's bounds of the spec."""
    exact = exact_attention(**batch, **options)
    dev = {name: backend.to_device(batch[name]) for name in ("query", "key_cache", "value_cache")}
    if key_cache is not None:
        dev["key_cache"], dev["value_cache"] = key_cache, value_cache
    result = backend.paged_attention(
        dev["query"], dev["key_cache"], dev["value_cache"], batch["block_tables"], batch["seq_lens"],
        batch["query_start_loc"], **options,
    )
    out, lse = result if options.get("return_lse") else (result, None)
    dtype = str(batch["query"].dtype)
    cache_dtype = str(batch["key_cache"].dtype)
    tol = tolerance(dtype, batch["query"].shape[2], cache_dtype=cache_dtype)
    got = backend.to_numpy(out).astype(np.float64)
    assert np.isfinite(got).all(), f"non-finite output at {np.argwhere(~np.isfinite(got))[:5]}"
    bound = tol.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
    err = np.abs(got - exact.out)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (
        f"out: {(err > bound).sum()} of {err.size} outside the error model; worst (token, head, dim)="
        f"{tuple(int(i) for i in worst)}: got {got[worst]}, exact {exact.out[worst]}, bound {bound[worst]}"
    )
    empty = exact.num_visible == 0
    assert (got[empty] == 0).all(), "a query with no visible key must give out = 0"
    if lse is not None:
        lse_np = backend.to_numpy(lse).astype(np.float64)
        assert lse_np.dtype == np.float64 and backend.to_numpy(lse).dtype == np.float32
        assert np.isneginf(lse_np[empty]).all(), "lse must be -inf where nothing is visible"
        lse_bound = tol.lse_bound(exact.score_scale, exact.num_visible)
        lse_err = np.abs(np.where(empty, 0.0, lse_np - np.where(empty, 0.0, exact.lse)))
        assert (lse_err <= lse_bound).all(), f"lse: max error {lse_err.max()} beyond bound"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_decode_matches_spec(backend: TorchBackend, dtype: str, kv_layout: str) -> None:
    rng = np.random.default_rng(1)
    batch = make_batch(rng, seq_lens=[1, 17, 40, 0, 33], q_lens=None, num_q_heads=8, num_kv_heads=2,
                       head_dim=32, block_size=16, dtype=dtype, kv_layout=kv_layout)
    check_against_spec(backend, batch, kv_layout=kv_layout)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_padding_decode_gives_zeros(backend: TorchBackend, dtype: str) -> None:
    rng = np.random.default_rng(10)
    batch = make_batch(rng, seq_lens=[0, 0], q_lens=None, num_q_heads=2, num_kv_heads=1, head_dim=8,
                       block_size=4, dtype=dtype)
    check_against_spec(backend, batch)
    check_against_spec(backend, batch, return_lse=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_uniform_decode_and_prefill_take_sdpa_shortcuts(backend: TorchBackend, dtype: str) -> None:
    rng = np.random.default_rng(2)
    decode = make_batch(rng, seq_lens=[24, 24, 24], q_lens=None, num_q_heads=4, num_kv_heads=4,
                        head_dim=16, block_size=8, dtype=dtype)
    check_against_spec(backend, decode)
    prefill = make_batch(rng, seq_lens=[20, 20], q_lens=[20, 20], num_q_heads=6, num_kv_heads=2,
                         head_dim=16, block_size=8, dtype=dtype)
    check_against_spec(backend, prefill)


@pytest.mark.parametrize("window", [8, 11, 64])
@pytest.mark.parametrize("q_len", [1, 3])
def test_sliding_window_gathers_only_the_window(backend: TorchBackend, window: int, q_len: int) -> None:
    """Equal lengths: the blocks before the window are skipped (aligned, unaligned, wider window)."""
    from pagedattn.backends.torch.groups import plan_groups
    from pagedattn.spec.arrays import check_paged_attention

    rng = np.random.default_rng(11)
    batch = make_batch(rng, seq_lens=[40, 40], q_lens=[q_len, q_len], num_q_heads=4, num_kv_heads=2,
                       head_dim=8, block_size=8, dtype="bfloat16")
    (group,) = plan_groups(check_paged_attention(**batch, sliding_window=window))
    assert group.offset == max(0, 40 - q_len + 1 - window) // 8 * 8
    expected = "all" if q_len == 1 and window in (8, 64) else "mask"
    assert group.pattern == expected
    check_against_spec(backend, batch, sliding_window=window)
    check_against_spec(backend, batch, sliding_window=window, causal=False, return_lse=True)


def test_groups_hold_a_bounded_number_of_elements(backend: TorchBackend, monkeypatch) -> None:
    """A q_len's sequences are cut into groups of at most GROUP_ELEMENTS gathered elements, each
    sequence in exactly one, and the answer is the spec's."""
    from pagedattn.backends.torch import groups
    from pagedattn.spec.arrays import check_paged_attention

    monkeypatch.setattr(groups, "GROUP_ELEMENTS", 4 * 4 * (8 * (1 + 2 * 40) + 40))  # four sequences of 40 keys
    rng = np.random.default_rng(5)
    batch = make_batch(rng, seq_lens=[40, 3, 17, 40, 9, 33, 25, 40, 1, 12], q_lens=None, num_q_heads=4,
                       num_kv_heads=2, head_dim=8, block_size=8, dtype="float16")
    planned = groups.plan_groups(check_paged_attention(**batch))
    assert [len(g.seqs) for g in planned] == [4, 4, 2]
    assert sorted(np.concatenate([g.seqs for g in planned]).tolist()) == list(range(10))
    check_against_spec(backend, batch)


@pytest.mark.parametrize("options", [{}, {"softcap": 5.0, "return_lse": True}, {"sliding_window": 30}],
                         ids=["causal", "explicit", "window"])
def test_a_long_prefill_attends_its_rows_in_chunks(backend: TorchBackend, monkeypatch, options: dict) -> None:
    """One sequence whose scores pass GROUP_ELEMENTS is attended in row chunks, each within it
    (a top-left causal prefill's chunks masked), and the answer is the spec's."""
    from pagedattn.backends.torch import groups
    from pagedattn.backends.torch.attention import GroupTensors
    from pagedattn.backends.torch.backend import holds_scores

    elements = 4 * 90 * 20  # 20 rows of 4 query heads over 90 keys
    monkeypatch.setattr(groups, "GROUP_ELEMENTS", elements)
    rng = np.random.default_rng(11)
    batch = make_batch(rng, seq_lens=[90], q_lens=[90], num_q_heads=4, num_kv_heads=2, head_dim=8, block_size=16,
                       dtype="bfloat16")
    chunks = []
    original = GroupTensors.row_chunks

    def recorded(self: GroupTensors, num_q_heads: int, limit: int) -> list[GroupTensors]:
        result = original(self, num_q_heads, limit)
        chunks.extend(result)
        return result

    monkeypatch.setattr(GroupTensors, "row_chunks", recorded)
    check_against_spec(backend, batch, **options)
    explicit = "softcap" in options or options.get("return_lse", False)
    pattern = "mask" if "sliding_window" in options else "causal"
    if not holds_scores(explicit, backend.device.type, pattern):
        assert chunks == []  # flash SDPA on CUDA with its own causal pattern: no scores held
        return
    assert [c.q_len for c in chunks] == [20, 20, 20, 20, 10]
    assert all(c.tokens.shape[0] * 4 * c.q_len * c.max_length <= elements for c in chunks)
    assert {c.pattern for c in chunks} == {"mask"}  # a causal chunk's first query is not position 0


def test_only_paths_that_hold_scores_take_row_chunks() -> None:
    from pagedattn.backends.torch.backend import holds_scores

    assert holds_scores(True, "cuda", "causal") and holds_scores(False, "cpu", "all")  # explicit; SDPA's math
    assert holds_scores(False, "cuda", "mask")  # a mask of queries x keys
    assert not holds_scores(False, "cuda", "causal") and not holds_scores(False, "cuda", "all")  # flash, no mask


OPTION_CASES = {
    "varlen_causal": {},
    "non_causal": {"causal": False},
    "sliding_window": {"sliding_window": 5},
    "softcap": {"softcap": 2.0, "scale": 1.5},
    "alibi": {"alibi_slopes": np.linspace(0.1, 1.0, 6).astype(np.float32)},
    "lse": {"return_lse": True, "sliding_window": 9},
    "everything": {"return_lse": True, "softcap": 5.0, "sliding_window": 7, "causal": True,
                   "alibi_slopes": np.linspace(-0.5, 0.5, 6).astype(np.float32)},
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_varlen_options_match_spec(backend: TorchBackend, dtype: str, case: str) -> None:
    rng = np.random.default_rng(3)
    batch = make_batch(rng, seq_lens=[30, 5, 17, 12], q_lens=[7, 5, 1, 0], num_q_heads=6, num_kv_heads=3,
                       head_dim=16, block_size=4, dtype=dtype, kv_layout="HND" if case == "lse" else "NHD")
    check_against_spec(backend, batch, kv_layout="HND" if case == "lse" else "NHD", **OPTION_CASES[case])


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fp8_caches_with_scales(backend: TorchBackend, dtype: str, cache_dtype: str) -> None:
    rng = np.random.default_rng(4)
    batch = make_batch(rng, seq_lens=[19, 40], q_lens=[3, 1], num_q_heads=4, num_kv_heads=1,
                       head_dim=16, block_size=16, dtype=dtype, cache_dtype=cache_dtype)
    check_against_spec(backend, batch, k_scale=0.5, v_scale=2.0)


def test_strided_pool_view(backend: TorchBackend) -> None:
    """One layer of a ``[num_blocks, 2, num_layers, Hkv, block_size, D]`` pool (an HND view)."""
    rng = np.random.default_rng(5)
    batch = make_batch(rng, seq_lens=[9, 26, 13], q_lens=None, num_q_heads=4, num_kv_heads=2,
                       head_dim=8, block_size=8, dtype="float16", kv_layout="HND")
    num_blocks = batch["key_cache"].shape[0]
    pool = rng.standard_normal((num_blocks, 2, 3, 2, 8, 8)).astype(np.float16)
    pool[:, 0, 1], pool[:, 1, 1] = batch["key_cache"], batch["value_cache"]
    pool_dev = backend.to_device(pool)
    kc, vc = pool_dev[:, 0, 1], pool_dev[:, 1, 1]
    assert not kc.is_contiguous()
    check_against_spec(backend, batch, key_cache=kc, value_cache=vc, kv_layout="HND")


def test_poison_and_placement_do_not_change_bits(backend: TorchBackend) -> None:
    rng = np.random.default_rng(6)
    batch = make_batch(rng, seq_lens=[21, 3], q_lens=[2, 3], num_q_heads=2, num_kv_heads=1,
                       head_dim=8, block_size=4, dtype="bfloat16")
    args = [backend.to_device(batch[n]) for n in ("query", "key_cache", "value_cache")]
    first = backend.to_numpy(backend.paged_attention(*args, batch["block_tables"], batch["seq_lens"],
                                                     batch["query_start_loc"]))
    poisoned = batch["key_cache"].astype(np.float32)
    poisoned[np.isnan(poisoned)] = np.inf
    args[1] = backend.to_device(poisoned.astype(batch["key_cache"].dtype))
    again = backend.to_numpy(backend.paged_attention(*args, batch["block_tables"], batch["seq_lens"],
                                                     batch["query_start_loc"]))
    assert first.tobytes() == again.tobytes(), "output changed with the contents of unused slots"
    # move every block elsewhere: same logical K/V, other physical blocks
    perm = rng.permutation(batch["key_cache"].shape[0])
    inverse = np.argsort(perm)
    moved = [backend.to_device(batch["query"]), backend.to_device(batch["key_cache"][inverse]),
             backend.to_device(batch["value_cache"][inverse])]
    tables = np.where(batch["block_tables"] >= 0, perm[np.maximum(batch["block_tables"], 0)], -1).astype(np.int32)
    placed = backend.to_numpy(backend.paged_attention(*moved, tables, batch["seq_lens"], batch["query_start_loc"]))
    assert first.tobytes() == placed.tobytes(), "output changed with the physical placement of blocks"


@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_write_kv_matches_spec(backend: TorchBackend, kv_layout: str, cache_dtype: str) -> None:
    rng = np.random.default_rng(7)
    shape = (6, 4, 2, 8) if kv_layout == "NHD" else (6, 2, 4, 8)
    kc = rng.standard_normal(shape).astype(numpy_dtype(cache_dtype))
    vc = rng.standard_normal(shape).astype(numpy_dtype(cache_dtype))
    key = rng.standard_normal((5, 2, 8)).astype(numpy_dtype("bfloat16"))
    value = rng.standard_normal((5, 2, 8)).astype(numpy_dtype("bfloat16"))
    slots = np.array([3, -1, 17, 0, 23], dtype=np.int32)
    scales = {"k_scale": 0.5, "v_scale": 4.0} if cache_dtype.startswith("float8") else {}
    kc_dev, vc_dev = backend.to_device(kc), backend.to_device(vc)
    backend.write_kv(backend.to_device(key), backend.to_device(value), kc_dev, vc_dev,
                     backend.to_device(slots), kv_layout=kv_layout, **scales)
    kv_ops.write_kv(key, value, kc, vc, slots, kv_layout=kv_layout, **scales)
    assert backend.to_numpy(kc_dev).tobytes() == kc.tobytes()
    assert backend.to_numpy(vc_dev).tobytes() == vc.tobytes()


def test_write_kv_bad_input_writes_nothing(backend: TorchBackend) -> None:
    kc = backend.to_device(np.ones((2, 4, 1, 4), dtype=np.float32))
    vc = backend.to_device(np.ones((2, 4, 1, 4), dtype=np.float32))
    key = backend.to_device(np.zeros((2, 1, 4), dtype=np.float32))
    with pytest.raises(PagedAttentionError, match="slot_mapping"):
        backend.write_kv(key, key, kc, vc, np.array([1, 1], dtype=np.int32))
    assert (backend.to_numpy(kc) == 1).all()


def test_copy_blocks_reads_sources_first(backend: TorchBackend) -> None:
    rng = np.random.default_rng(8)
    kc = rng.standard_normal((5, 2, 1, 4)).astype(np.float32)
    vc = rng.standard_normal((5, 2, 1, 4)).astype(np.float32)
    pairs = np.array([[0, 1], [1, 2], [4, 0]])
    kc_dev, vc_dev = backend.to_device(kc), backend.to_device(vc)
    backend.copy_blocks(kc_dev, vc_dev, pairs)
    kv_ops.copy_blocks(kc, vc, pairs)
    np.testing.assert_array_equal(backend.to_numpy(kc_dev), kc)
    np.testing.assert_array_equal(backend.to_numpy(vc_dev), vc)


@pytest.mark.parametrize("chunk_elements", [None, 8])  # None: the module's; 8: a token at a time
def test_merge_states_matches_spec(backend: TorchBackend, monkeypatch, chunk_elements: int | None) -> None:
    if chunk_elements is not None:
        monkeypatch.setattr("pagedattn.backends.torch.backend.MERGE_CHUNK_ELEMENTS", chunk_elements)
    rng = np.random.default_rng(9)
    out_a = rng.standard_normal((3, 2, 4)).astype(np.float32)
    out_b = rng.standard_normal((3, 2, 4)).astype(np.float32)
    lse_a = rng.standard_normal((3, 2)).astype(np.float32)
    lse_b = rng.standard_normal((3, 2)).astype(np.float32)
    lse_a[0, 0] = -np.inf
    out_a[0, 0] = np.nan  # an empty side's out is ignored
    lse_a[1, 1] = lse_b[1, 1] = -np.inf
    out, lse = backend.merge_states(*(backend.to_device(x) for x in (out_a, lse_a, out_b, lse_b)))
    want_out, want_lse = merge_states(out_a, lse_a, out_b, lse_b)
    tol = merge_tolerance("float32")
    got = backend.to_numpy(out).astype(np.float64)
    assert np.isfinite(got).all()
    value_scale = np.fmax(np.abs(np.where(np.isneginf(lse_a)[..., None], 0, out_a)), np.abs(out_b)).max(-1)
    bound = tol.out_bound(want_out, value_scale, np.zeros((3, 2)), np.full((3, 2), 2))
    assert (np.abs(got - want_out) <= bound).all(), f"max error {np.abs(got - want_out).max()}"
    assert (got[1, 1] == 0).all() and np.isneginf(backend.to_numpy(lse)[1, 1])
    np.testing.assert_allclose(backend.to_numpy(lse)[np.isfinite(want_lse)], want_lse[np.isfinite(want_lse)],
                               rtol=4 * 2.0**-24, atol=4 * 2.0**-24)


def test_importing_the_backend_module_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import pagedattn.backends.torch.backend, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
