"""A NumPy model of one warp's 16-key sub-tile in the decode kernel with fp8 caches
(kernels/paged_attention_decode.cu): which elements each lane reads, as the kernel indexes
them, put through the m16n8k16 fragment layouts of the PTX ISA with the keys on the M side
(S^T = K Q^T, P^T through movmatrix, O^T = V^T P^T), gives Q K^T and P V; its
shared-memory loads are free of bank conflicts at head_dim 128; and the float16 route of
bfloat16 queries (row rescaling by 2^shift, P * 2^15) stays within the spec's error model.

The model mirrors the kernel's index expressions (``fp8_swizzle``, the lanes' K and V words,
the permuted Q fragments, the epilogue's head-dim map) and ``q_row_shift``; the gpu tests run
the kernel itself."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pagedattn.spec.error_model import SAFETY, tolerance

SUB_N = 16  # keys per sub-tile
LANES = [(lane // 4, lane % 4) for lane in range(32)]  # (g, tig)


# -- the kernel's index expressions -------------------------------------------------------------
def fp8_swizzle(n: int, c: int, head_dim: int) -> int:
    """16-byte chunk of a stage holding chunk ``c`` of key row ``n`` (fp8: head_dim / 16 per row)."""
    per_row = head_dim // 16
    return n * per_row + (c ^ (n % per_row))


def stage_bytes(tile: np.ndarray) -> np.ndarray:
    """A [SUB_N, head_dim] sub-tile laid out as cp.async writes it (chunk c of row n at
    fp8_swizzle(n, c)); element values stand for bytes."""
    head_dim = tile.shape[1]
    stage = np.full(SUB_N * head_dim, np.nan)
    for n in range(SUB_N):
        for c in range(head_dim // 16):
            at = fp8_swizzle(n, c, head_dim)
            stage[16 * at:16 * at + 16] = tile[n, 16 * c:16 * c + 16]
    return stage


def k_words(stage: np.ndarray, g: int, tig: int, t: int, head_dim: int) -> np.ndarray:
    """The lane's K bytes of key g + 8 t: chunks tig * K_LANE_CHUNKS + i, as kernel words [kk, 4]."""
    chunks = head_dim // 64
    raw = [stage[16 * fp8_swizzle(g + 8 * t, tig * chunks + i, head_dim):][:16] for i in range(chunks)]
    return np.concatenate(raw).reshape(head_dim // 16, 4)


def v_words(stage: np.ndarray, g: int, tig: int, q: int, head_dim: int) -> np.ndarray:
    """The lane's V bytes of key 2 tig + (q & 1) + 8 (q >> 1): O_TILES bytes from O_TILES * g."""
    n = 2 * tig + (q & 1) + 8 * (q >> 1)
    o_tiles = head_dim // 8
    # head_dim 128: chunk g (uint4); 64: half g % 2 of chunk g / 2 (uint2)
    start = 16 * fp8_swizzle(n, g, head_dim) if o_tiles == 16 else 16 * fp8_swizzle(n, g // 2, head_dim) + 8 * (g % 2)
    return stage[start:start + o_tiles]


def q_fragments(q: np.ndarray, g: int, tig: int) -> np.ndarray:
    """The lane's permuted Q^T B fragments [K_STEPS, 2 registers, 2 halves] of row g."""
    head_dim = q.shape[1]
    frag = np.zeros((head_dim // 16, 2, 2))
    lane_chunks = head_dim // 32
    for i in range(lane_chunks):
        chunk = q[g, 8 * (tig * lane_chunks + i):][:8]
        for m in range(4):
            frag[2 * i + m // 2, m % 2] = chunk[2 * m:2 * m + 2]
    return frag


# -- m16n8k16 fragment layouts and movmatrix (PTX ISA) ---------------------------------------------
def mma(a: dict, b: dict) -> np.ndarray:  # type: ignore[type-arg]
    """D = A B for A given per lane as 4 registers of 2 halves, B as 2 registers of 2 halves."""
    A, B = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    for lane, (g, tig) in enumerate(LANES):
        for e in range(2):
            A[g, 2 * tig + e], A[g + 8, 2 * tig + e] = a[lane][0][e], a[lane][1][e]
            A[g, 2 * tig + 8 + e], A[g + 8, 2 * tig + 8 + e] = a[lane][2][e], a[lane][3][e]
            B[2 * tig + e, g], B[2 * tig + 8 + e, g] = b[lane][0][e], b[lane][1][e]
    assert not np.isnan(A).any() and not np.isnan(B).any(), "every fragment element set"
    return A @ B


def c_fragment(d: np.ndarray, g: int, tig: int) -> np.ndarray:
    """The lane's accumulator c0..c3: rows g, g + 8, columns 2 tig, 2 tig + 1."""
    return np.array([d[g, 2 * tig], d[g, 2 * tig + 1], d[g + 8, 2 * tig], d[g + 8, 2 * tig + 1]])


def transpose_8x8(pairs: dict) -> dict:  # type: ignore[type-arg]
    """movmatrix.trans: lane (g, tig) gives row g, columns 2 tig, 2 tig + 1 of an 8 x 8 matrix
    and gets those of its transpose."""
    m = np.full((8, 8), np.nan)
    for lane, (g, tig) in enumerate(LANES):
        m[g, 2 * tig:2 * tig + 2] = pairs[lane]
    return {lane: m.T[g, 2 * tig:2 * tig + 2] for lane, (g, tig) in enumerate(LANES)}


def sub_tile(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S = Q K^T and O = S V of one sub-tile of 16 keys and 8 query rows as the kernel's lanes
    compute them, keys on the M side: S^T = K Q^T, P^T through movmatrix, O^T = V^T P^T (P = S
    here, the layout is what is modelled); both returned un-permuted, as the epilogue stores O."""
    head_dim = q.shape[1]
    k_stage, v_stage = stage_bytes(k), stage_bytes(v)
    s = np.zeros((32, 4))  # per lane: c0..c3 of S^T (keys g, g + 8; rows 2 tig, 2 tig + 1)
    for kk in range(head_dim // 16):
        a, b = {}, {}
        for lane, (g, tig) in enumerate(LANES):
            lo, hi = (k_words(k_stage, g, tig, t, head_dim)[kk] for t in range(2))  # keys g, g + 8
            a[lane] = (lo[0:2], hi[0:2], lo[2:4], hi[2:4])  # low pairs a0, a1; high pairs a2, a3
            b[lane] = q_fragments(q, g, tig)[kk]
        d = mma(a, b)
        for lane, (g, tig) in enumerate(LANES):
            s[lane] += c_fragment(d, g, tig)
    S = np.zeros((8, 16))
    for lane, (g, tig) in enumerate(LANES):
        S[2 * tig:2 * tig + 2, g] = s[lane, 0:2]
        S[2 * tig:2 * tig + 2, g + 8] = s[lane, 2:4]
    # P V: B = P^T, the S^T pairs of keys g and g + 8 transposed to row g's keys 2 tig, + 1 of each 8
    p_lo = transpose_8x8({lane: s[lane, 0:2] for lane in range(32)})
    p_hi = transpose_8x8({lane: s[lane, 2:4] for lane in range(32)})
    b = {lane: (p_lo[lane], p_hi[lane]) for lane in range(32)}
    o_merge = np.full((8, head_dim), np.nan)
    for mt in range(head_dim // 16):  # m-tile mt of V^T: bytes 2 mt (rows g), 2 mt + 1 (rows g + 8)
        a = {}
        for lane, (g, tig) in enumerate(LANES):
            vw = [v_words(v_stage, g, tig, q_, head_dim) for q_ in range(4)]
            a[lane] = ((vw[0][2 * mt], vw[1][2 * mt]), (vw[0][2 * mt + 1], vw[1][2 * mt + 1]),
                       (vw[2][2 * mt], vw[3][2 * mt]), (vw[2][2 * mt + 1], vw[3][2 * mt + 1]))
        d = mma(a, b)
        for g, tig in LANES:
            c = c_fragment(d, g, tig)
            for half in range(2):  # dst[D/8 g + 2 mt] = o[mt][half], dst[D/8 g + 2 mt + 1] = o[mt][2 + half]
                o_merge[2 * tig + half, head_dim // 8 * g + 2 * mt] = c[half]
                o_merge[2 * tig + half, head_dim // 8 * g + 2 * mt + 1] = c[2 + half]
    assert not np.isnan(o_merge).any(), "every output column written"
    return S, o_merge


@pytest.mark.parametrize("head_dim", [64, 128])
def test_lane_fragments_give_q_kt_and_p_v(head_dim: int) -> None:
    rng = np.random.default_rng(head_dim)
    q = rng.integers(-8, 9, (8, head_dim)).astype(np.float64)
    k, v = (rng.integers(-8, 9, (16, head_dim)).astype(np.float64) for _ in range(2))
    S, O = sub_tile(q, k, v)
    np.testing.assert_array_equal(S, q @ k.T)
    np.testing.assert_array_equal(O, S @ v)


def test_the_model_sees_a_wrong_permutation() -> None:
    """A lane reading its Q in the unpermuted order gives another S (the model can fail)."""
    rng = np.random.default_rng(0)
    q = rng.integers(-8, 9, (8, 128)).astype(np.float64)
    k, v = (rng.integers(-8, 9, (16, 128)).astype(np.float64) for _ in range(2))
    S, _ = sub_tile(q[:, ::-1].copy(), k, v)
    assert not np.array_equal(S, q @ k.T)


def _wavefronts(addresses: list[int], width: int) -> int:
    """Shared-memory wavefronts of one warp's loads of ``width`` bytes at byte ``addresses``:
    lanes go in phases of 128 / width; a phase needs as many wavefronts as the most distinct
    128-byte lines hitting one bank."""
    per_phase = 128 // width
    total = 0
    for start in range(0, 32, per_phase):
        banks: dict[int, set[int]] = {}
        for address in addresses[start:start + per_phase]:
            for word in range(address // 4, (address + width) // 4):
                banks.setdefault(word % 32, set()).add(word // 32)
        total += max(len(lines) for lines in banks.values())
    return total


def test_k_and_v_loads_have_no_bank_conflicts_at_head_dim_128() -> None:
    head_dim, minimum = 128, 4  # a 16-byte load of 32 lanes takes 4 wavefronts at best
    for t in range(2):
        for i in range(2):
            k_loads = [16 * fp8_swizzle(g + 8 * t, tig * 2 + i, head_dim) for g, tig in LANES]
            assert _wavefronts(k_loads, 16) == minimum, (t, i)
    for q in range(4):
        v_loads = [16 * fp8_swizzle(2 * tig + (q & 1) + 8 * (q >> 1), g, head_dim) for g, tig in LANES]
        assert _wavefronts(v_loads, 16) == minimum, q
    unswizzled = [16 * ((2 * tig) * 8 + g) for g, tig in LANES]
    assert _wavefronts(unswizzled, 16) > minimum, "the check sees conflicts"


# -- the float16 route of bfloat16 queries ---------------------------------------------------------
def q_row_shift(amax: np.float32) -> int:
    """kernels/fp8.cuh q_row_shift: 15 - floor(log2 amax) (a subnormal reads as 2^-127), <= 126."""
    if amax == 0:
        return 0
    exponent = int((np.asarray(amax, np.float32).view(np.int32) >> 23) & 0xFF) - 127
    return min(15 - exponent, 126)


def route_q(row: np.ndarray) -> tuple[np.ndarray, int]:
    """A bfloat16 row as the kernel multiplies it: q * 2^shift rounded to float16, and shift."""
    x = row.astype(np.float32)
    finite = np.abs(x)[np.isfinite(x)]
    shift = q_row_shift(np.float32(finite.max(initial=0.0)))
    with np.errstate(over="ignore", under="ignore"):
        scaled = (x * np.float32(2.0**shift)).astype(np.float16)
    return scaled, shift


def bf16(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float64).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("magnitude", [2.0**-133, 2.0**-126, 1e-30, 1e-3, 1.0, 3.0, 65280.0, 1e30, 3.3e38])
def test_bfloat16_rows_reach_float16_exactly_and_never_overflow(magnitude: float) -> None:
    rng = np.random.default_rng(1)
    row = bf16(rng.uniform(-1.0, 1.0, 128) * magnitude)
    row[0] = bf16(np.array([magnitude]))[0]
    scaled, shift = route_q(row)
    exact = row.astype(np.float64) * 2.0**shift
    assert np.isfinite(scaled).all(), "no element overflows float16"
    big = np.abs(row.astype(np.float64)) >= np.abs(row.astype(np.float64)).max() * 2.0**-32
    if shift < 126:  # the row max lands in [2^15, 2^16)
        assert 2.0**15 <= np.abs(scaled.astype(np.float64)).max() < 2.0**16
        np.testing.assert_array_equal(scaled.astype(np.float64)[big], exact[big])
    assert -112 <= shift <= 126


def test_non_finite_query_elements_pass_through() -> None:
    row = bf16(np.array([np.inf, -np.inf, np.nan, 1e-3, -2.0, 0.0] + [0.5] * 122))
    scaled, shift = route_q(row)
    assert shift == 15 - 1, "the largest finite |q| (2) sets the shift"
    assert np.isposinf(scaled[0]) and np.isneginf(scaled[1]) and np.isnan(scaled[2])
    assert scaled[4] == -(2.0**15)
    assert q_row_shift(np.float32(0.0)) == 0


def _route_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """A row's scores as the float16 route computes them (float64 accumulation; the rounding
    the route adds: q to float16 after 2^shift); ``scale`` holds k_scale, as the kernel's does."""
    q16, shift = route_q(q)
    return (k.astype(np.float64) @ q16.astype(np.float64)) * 2.0**-shift * scale


def _route_output(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """O from the route's scores, P * 2^15 rounded to float16 for P V."""
    p = np.exp(s - s.max())
    p16 = (p * 2.0**15).astype(np.float16).astype(np.float64)
    return (p16 @ v.astype(np.float64)) / p.sum() * 2.0**-15


#: (q magnitude, k_scale) of each kind of row: scores of order one throughout
ROWS = {"normal": (1.0, 1.0), "large row": (1e6, 1e-6), "small row": (1e-6, 1e6), "wide row": (1.0, 1.0),
        "tiny weights": (1.0, 1.0)}


@pytest.mark.parametrize("cache", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("kind", list(ROWS))
def test_the_float16_route_is_within_the_error_model(cache: str, kind: str) -> None:
    """Against exact float64 attention on the same bfloat16 q and fp8 K/V (times k_scale): rows
    beyond float16's range (large), in its subnormals (small), with elements over 40 binades
    (some below float16 after the rescale), and keys most of whose weights fall below float16's
    normal range; within the model for bfloat16 queries, and within the one for float16."""
    rng = np.random.default_rng(len(kind))
    n, d, scale = 4096, 128, 128**-0.5
    magnitude, k_scale = ROWS[kind]
    q = rng.standard_normal(d) * magnitude
    if kind == "wide row":
        q *= 2.0 ** rng.integers(-40, 1, d)
    q = bf16(q)
    k = rng.standard_normal((n, d)).astype(ml_dtypes.finfo(cache).dtype)
    v = rng.standard_normal((n, d)).astype(ml_dtypes.finfo(cache).dtype)
    if kind == "tiny weights":  # one dominant key; the rest at weights around 2^-20
        k[0] = (q.astype(np.float64) * (30.0 / scale / float(np.abs(q.astype(np.float64)).sum()))).astype(k.dtype)
    qe, ke, ve = q.astype(np.float64), k.astype(np.float64) * k_scale, v.astype(np.float64)
    s = ke @ qe * scale
    w = np.exp(s - s.max())
    exact = w @ ve / w.sum()
    got_s = _route_scores(q, k, scale * k_scale)
    got = _route_output(got_s, v)
    score_scale = np.array([[abs(scale) * np.abs(ke * qe).sum(axis=1).max()]])
    for model in (tolerance("bfloat16", d, cache_dtype=cache), tolerance("float16", d)):
        score_bound = SAFETY * model.score_error(score_scale)[0, 0]
        assert (np.abs(got_s - s) <= score_bound).all(), float((np.abs(got_s - s) / score_bound).max())
        bound = model.out_bound(exact[None, None], np.array([[np.abs(ve).max()]]), score_scale, np.array([[n]]))
        assert (np.abs(got - exact) <= bound[0, 0]).all(), float((np.abs(got - exact) / bound[0, 0]).max())
