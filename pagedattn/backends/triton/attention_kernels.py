"""Triton kernels of paged attention: one varlen kernel (decode, prefill, chunked prefill) and
the split-KV merge.

Algorithm: FlashAttention-2's online softmax (Dao, 2023, https://arxiv.org/abs/2307.08691)
walked over a block table, with the split-KV ("flash decoding") partials merged by the
spec's :func:`pagedattn.spec.online_softmax.merge_states`. The kernel must match
:func:`pagedattn.spec.exact.exact_attention` within :mod:`pagedattn.spec.error_model`.

One program serves one work item (a tile of ``BLOCK_Q`` consecutive queries of one
sequence), one KV head and ``GROUP_TILE`` of its query heads, and one split of the key
range. The query heads of a KV head are packed into the M dimension of ``tl.dot``: row
``r`` is query ``r // GROUP_TILE`` of the tile and head ``r % GROUP_TILE`` of the group,
so every K/V byte a program loads serves the whole group. Keys come in tiles of
``BLOCK_N`` logical positions ``p``; each position's physical block is looked up in the
block table (only for ``p < L``), so any block size and both layouts work through strides.
Tiles where every key is visible to every row skip the masks. fp8 values are read as 16-bit
words of two head dimensions (``V_PAIRS``): ``P V`` becomes two products, over the even and
the odd dimensions, whose accumulators are interleaved once at the end.

This module imports triton: import it only inside functions.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): scores are kept in base 2 so exp2 can be used
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): converts the base-2 lse back to natural log
#: int32 fields of a work item's record: sequence, first query, L, the sequence's first token, q_len
WORK_FIELDS = tl.constexpr(5)


@triton.jit
def _tanh(x):
    """tanh in float32 to a few ulp (libdevice's tanh is not available to the interpreter).

    Near 0 an odd Taylor series (terms to x**15, truncation below 1e-10 for |x| < 0.35);
    elsewhere (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.5, where 1 - e is exact.
    """
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    far = (1.0 - e) / (1.0 + e)
    a_near = tl.minimum(a, 0.35)  # the series is used below 0.35 only; clamping keeps it finite
    x2 = a_near * a_near
    poly = -0.0014558343870513183  # -929569 / 638512875
    poly = poly * x2 + 0.003592128036572481  # 21844 / 6081075
    poly = poly * x2 - 0.008863235529902197  # -1382 / 155925
    poly = poly * x2 + 0.021869488536155203  # 62 / 2835
    poly = poly * x2 - 0.05396825396825397  # -17 / 315
    poly = poly * x2 + 0.13333333333333333  # 2 / 15
    poly = poly * x2 - 0.3333333333333333  # -1 / 3
    near = a_near + a_near * (x2 * poly)
    t = tl.where(a < 0.35, near, far)
    return tl.where(x < 0, -t, t)


@triton.jit
def _mul_rn(a, b, INTERPRET: tl.constexpr):
    """``a * b`` rounded to float32 on its own (``mul.rn``), never fused into a later subtraction.

    A score the row max was taken over must be the same float when the max is subtracted from
    it: fused into ``fma(qk, scale, -m)`` the max key's weight is exp2 of its product's rounding
    error, which past scores of 2**32 (log2 units) is beyond float32's range: inf, or 0.
    """
    if INTERPRET:
        return a * b
    else:
        return libdevice.mul_rn(a, b)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, INTERPRET: tl.constexpr):
    """``a @ b`` accumulated in float32. The interpreter's bf16 dot is wrong: float32 there."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _operand(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """A tl.dot operand in ``DTYPE`` (exact for fp8 -> 16-bit); float32 in the interpreter,
    whose bf16 dot is wrong, whose fp8 -> float16 cast loses subnormals and whose fp8 ->
    float32 cast reads NaN and inf as finite numbers (float8_e4m3fn's NaN S.1111.111 as 480)."""
    if INTERPRET:
        y = x.to(tl.float32)
        if x.dtype == tl.float8e4nv:
            bits = x.to(tl.uint8, bitcast=True) & 0x7F
            y = tl.where(bits == 0x7F, float("nan"), y)
        elif x.dtype == tl.float8e5:
            bits = x.to(tl.uint8, bitcast=True) & 0x7F
            y = tl.where(bits > 0x7C, float("nan"), tl.where(bits == 0x7C, y * float("inf"), y))
        return y
    else:
        return x.to(DTYPE)


@triton.jit
def _float16_rows(q):
    """bfloat16 rows ``q`` ``[BLOCK_M, D]`` as float16 times a power of two per row, and that
    power's inverse ``[BLOCK_M]`` (float32), which multiplies ``q . k`` back exactly.

    fp8 caches convert exactly and cheaply to float16 (one instruction per pair), not to
    bfloat16, so their products run in float16; a bfloat16 row (8 significant bits) fits
    float16's 11 once scaled so its largest magnitude lies in [2**14, 2**15): only elements
    below 2**-38 of the row's largest lose bits (the error model's u_op). NaN and inf stay.
    """
    amax = tl.max(tl.abs(q.to(tl.float32)), 1)
    exponent = ((amax.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127  # floor(log2), -127 for 0
    shift = tl.minimum(tl.maximum(exponent - 14, -126), 113)
    scale = ((127 - shift) << 23).to(tl.float32, bitcast=True)  # 2**-shift
    unscale = ((127 + shift) << 23).to(tl.float32, bitcast=True)  # 2**shift
    return (q.to(tl.float32) * scale[:, None]).to(tl.float16), unscale


@triton.jit
def _round_to_bfloat16(x):
    """float32 -> bfloat16 rounded to nearest even by integer arithmetic.

    Used in interpreter mode only, whose own float32 -> bfloat16 cast truncates.
    """
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def cast_for_store(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Round float32 ``x`` to ``DTYPE`` (nearest even) for a store."""
    if INTERPRET and DTYPE == tl.bfloat16:  # noqa: SIM300
        return _round_to_bfloat16(x)
    else:
        return x.to(DTYPE)


@triton.jit
def _key_slots(bt_row, t, L, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, TABLE_MODE: tl.constexpr,
               MASKED: tl.constexpr):
    """Key tile ``t``: positions ``p``, ``p < L`` (all true unmasked), and its 64-bit physical blocks and slots.

    ``TABLE_MODE`` 0: one block-table read per key, ``physical`` ``[BLOCK_N]``, only for
    ``p < L``. 1 (``BLOCK_N`` divides ``BLOCK_SIZE``): the tile lies in one block, read once,
    ``physical`` a scalar; a visited tile's first key is always ``< L``. 2 (``BLOCK_SIZE``
    divides ``BLOCK_N``): one read per block holding some ``p < L``, each key's entry picked
    in registers (a one-hot sum: ``tl.reshape`` of a broadcast compiled without cp.async).
    """
    p = t * BLOCK_N + tl.arange(0, BLOCK_N)
    in_seq = p < L if MASKED else p >= 0
    if TABLE_MODE == 1:
        physical = tl.load(bt_row + (t * BLOCK_N) // BLOCK_SIZE).to(tl.int64)
        slot = ((t * BLOCK_N) % BLOCK_SIZE + tl.arange(0, BLOCK_N)).to(tl.int64)
    elif TABLE_MODE == 2:
        NUM_BLOCKS: tl.constexpr = BLOCK_N // BLOCK_SIZE
        block = t * NUM_BLOCKS + tl.arange(0, NUM_BLOCKS)
        if MASKED:  # noqa: SIM108 (constexpr branches)
            entries = tl.load(bt_row + block, mask=block * BLOCK_SIZE < L, other=0)
        else:
            entries = tl.load(bt_row + block)
        which = tl.arange(0, BLOCK_N) // BLOCK_SIZE
        pick = which[:, None] == tl.arange(0, NUM_BLOCKS)[None, :]
        physical = tl.sum(tl.where(pick, entries[None, :], 0), axis=1).to(tl.int64)
        slot = (tl.arange(0, BLOCK_N) % BLOCK_SIZE).to(tl.int64)
    else:
        if MASKED:
            physical = tl.load(bt_row + p // BLOCK_SIZE, mask=in_seq, other=0).to(tl.int64)
        else:
            physical = tl.load(bt_row + p // BLOCK_SIZE).to(tl.int64)
        slot = (p % BLOCK_SIZE).to(tl.int64)
    return p, in_seq, physical, slot


@triton.jit
def _load_kv_tile(base, physical, slot, stride_b, stride_s, stride_d, kv_ok,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr):
    """A K or V tile ``[BLOCK_N, HEAD_DIM_PAD]`` at (physical, slot): zero where ``kv_ok`` is false."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    rows = physical * stride_b + slot * stride_s  # [BLOCK_N] (physical: [BLOCK_N] or one block)
    ptrs = base + rows[:, None] + offs_d[None, :] * stride_d
    if MASKED or HEAD_DIM != HEAD_DIM_PAD:  # noqa: SIM108 (constexpr branches)
        tile = tl.load(ptrs, mask=kv_ok, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _fp8_pair_halves(words, FP8: tl.constexpr, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """16-bit words of two fp8 values each as two ``DTYPE`` tensors: the low bytes and the high bytes.

    A product's operand has two keys of one column in a 32-bit register, which an fp8 tile
    could only gather byte by byte; 16-bit words are moved whole (``ldmatrix`` with transpose),
    and to float16 each register of two words takes one byte permute and two conversions.
    """
    if not INTERPRET and DTYPE == tl.float16:  # noqa: SIM300
        FORMAT: tl.constexpr = "e4m3x2" if FP8 == tl.float8e4nv else "e5m2x2"  # noqa: SIM300
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $2, 0, 0x3120; mov.b32 {lo, hi}, t; "
            "cvt.rn.f16x2." + FORMAT + " $0, lo; cvt.rn.f16x2." + FORMAT + " $1, hi; }",
            "=r,=r,r", [words], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    low = (words & 0xFF).to(tl.uint8).to(FP8, bitcast=True)
    high = (words >> 8).to(tl.uint8).to(FP8, bitcast=True)
    return _operand(low, DTYPE, INTERPRET), _operand(high, DTYPE, INTERPRET)


@triton.jit
def _stage_tiles(stage: tl.constexpr, t_a, f_a, f_b, t_b):
    """Key tiles ``[begin, end)`` of a stage: 0 masked before ``f_a``, 1 unmasked, 2 masked from ``f_b``."""
    if stage == 0:
        begin = t_a
        end = f_a
    elif stage == 1:
        begin = f_a
        end = f_b
    else:
        begin = f_b
        end = t_b
    return begin, end


@triton.jit
def _along_keys(x, KEYS_MAJOR: tl.constexpr):
    """A per-key vector ``[BLOCK_N]`` shaped to broadcast against the scores."""
    if KEYS_MAJOR:
        return x[:, None]
    else:
        return x[None, :]


@triton.jit
def _along_rows(x, KEYS_MAJOR: tl.constexpr):
    """A per-row vector ``[BLOCK_M]`` shaped to broadcast against the scores."""
    if KEYS_MAJOR:
        return x[None, :]
    else:
        return x[:, None]


@triton.jit
def _attend_tiles(
    acc, acc_odd, l_i, m_i, q,  #
    k_base, v_base, bt_row,  #
    stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,  #
    L, p_q, p_last, slopes, qk_scale2, sm_scale, softcap, window, q_unscale,  #
    t_begin, t_end,  #
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, TABLE_MODE: tl.constexpr,  #
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,  #
    MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,  #
    Q_SCALED: tl.constexpr, KEYS_MAJOR: tl.constexpr, V_PAIRS: tl.constexpr, IEEE: tl.constexpr,
    INTERPRET: tl.constexpr,  #
):
    """Fold key tiles ``t_begin <= t < t_end`` (positions ``t * BLOCK_N + n``) into (m, l, O).

    ``MASKED=False`` only for tiles where every key is visible to every valid row: no
    bounds, causal or window masks there. A row sees ``p_q - window < p <= p_last``, ``p < L``
    (``p_last``: ``p_q`` if causal, else ``L - 1``). m_i is in base-2 units (scores times log2 e).
    Scores are ``[BLOCK_M, BLOCK_N]``, or with ``KEYS_MAJOR`` ``[BLOCK_N, BLOCK_M]``: then
    ``s^T = K q^T`` and ``O^T += V^T p^T``, so the key tile is the matrix unit's M side (at
    least 64 rows: warpgroup MMA on sm_90, K and V read from shared memory) and the few query
    rows of a decode tile its N side; ``acc`` and ``q`` come transposed, ``[HEAD_DIM_PAD, BLOCK_M]``.
    With ``Q_SCALED``, row r of ``q`` holds the query times ``1 / q_unscale[r]`` (a power of two),
    and ``q . k`` is multiplied back by ``q_unscale`` before anything else. With ``V_PAIRS``
    (fp8 values, ``stride_vd`` 1 and the other strides even), ``acc`` and ``acc_odd`` hold the
    output's even and odd dimensions ``[BLOCK_M, HEAD_DIM_PAD // 2]``; otherwise ``acc_odd`` is unused.
    """
    KEY_AXIS: tl.constexpr = 0 if KEYS_MAJOR else 1  # the scores' axis reduced per row
    d_ok = tl.arange(0, HEAD_DIM_PAD) < HEAD_DIM
    q_dtype = q.dtype
    for t in range(t_begin, t_end):
        p, in_seq, physical, slot = _key_slots(bt_row, t, L, BLOCK_SIZE, BLOCK_N, TABLE_MODE, MASKED)
        kv_ok = in_seq[:, None] & d_ok[None, :]
        # -- compute qk: K tile [BLOCK_N, HEAD_DIM_PAD], zero outside the sequence
        k = _load_kv_tile(k_base, physical, slot, stride_kb, stride_ks, stride_kd, kv_ok, HEAD_DIM, HEAD_DIM_PAD,
                          MASKED)
        if KEYS_MAJOR:
            qk = _dot(_operand(k, q_dtype, INTERPRET), q, IEEE, INTERPRET)
        else:
            qk = _dot(q, tl.trans(_operand(k, q_dtype, INTERPRET)), IEEE, INTERPRET)
        if Q_SCALED:  # exact: a power of two per row
            qk = qk * _along_rows(q_unscale, KEYS_MAJOR)
        p_k = _along_keys(p, KEYS_MAJOR)
        p_r = _along_rows(p_q, KEYS_MAJOR)
        # -- scores in base 2: scale, softcap, ALiBi, in the contract's order
        if HAS_SOFTCAP or HAS_ALIBI:
            s = qk * sm_scale
            if HAS_SOFTCAP:
                s = softcap * _tanh(s / softcap)
            if HAS_ALIBI:
                s = s + _along_rows(slopes, KEYS_MAJOR) * (p_k - p_r).to(tl.float32)
            s = _mul_rn(s, LOG2E, INTERPRET)
        else:
            s = _mul_rn(qk, qk_scale2, INTERPRET)
        if MASKED:
            visible = _along_keys(in_seq, KEYS_MAJOR) & (p_k <= _along_rows(p_last, KEYS_MAJOR)) & (p_k > p_r - window)
            s = tl.where(visible, s, float("-inf"))  # replaced, never added to: no NaN leaks
        # -- update m_i and l_i; a row with no finite score yet keeps m = -inf, l = 0
        m_new = tl.maximum(m_i, tl.max(s, KEY_AXIS))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p_ij = tl.math.exp2(s - _along_rows(shift, KEYS_MAJOR))
        alpha = tl.math.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p_ij, KEY_AXIS)
        # -- update the output accumulator: V tile [BLOCK_N, HEAD_DIM_PAD]
        if V_PAIRS:  # the tile as [BLOCK_N, HEAD_DIM_PAD // 2] 16-bit words of two values
            words = _load_kv_tile(v_base.to(tl.pointer_type(tl.uint16)), physical, slot, stride_vb // 2,
                                  stride_vs // 2, 1, in_seq[:, None], HEAD_DIM // 2, HEAD_DIM_PAD // 2, MASKED)
            v_even, v_odd = _fp8_pair_halves(words, v_base.dtype.element_ty, q_dtype, INTERPRET)
            p_op = _operand(p_ij, q_dtype, INTERPRET)
            acc = acc * alpha[:, None] + _dot(p_op, v_even, IEEE, INTERPRET)
            acc_odd = acc_odd * alpha[:, None] + _dot(p_op, v_odd, IEEE, INTERPRET)
        else:
            v = _load_kv_tile(v_base, physical, slot, stride_vb, stride_vs, stride_vd, kv_ok, HEAD_DIM, HEAD_DIM_PAD,
                              MASKED)
            if KEYS_MAJOR:
                pv = _dot(tl.trans(_operand(v, q_dtype, INTERPRET)), _operand(p_ij, q_dtype, INTERPRET), IEEE,
                          INTERPRET)
                acc = acc * alpha[None, :] + pv
            else:
                pv = _dot(_operand(p_ij, q_dtype, INTERPRET), _operand(v, q_dtype, INTERPRET), IEEE, INTERPRET)
                acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, acc_odd, l_i, m_i


# Per-call counts and flags are run-time values, never specialized: each distinct value class
# (1, a multiple of 16) of a specialized integer would be one more compile, while only the
# arrays' strides, the tiles and the features shape the code.
@triton.jit(do_not_specialize=["num_tokens", "num_q_heads", "num_splits", "num_head_programs", "stride_bt",
                               "causal", "window", "group_size", "num_group_tiles", "store_lse", "write_partials"])
def paged_attention_kernel(
    out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,  #
    q_ptr, k_cache_ptr, v_cache_ptr,  #
    block_tables_ptr, work_ptr, alibi_ptr,  #
    stride_qt, stride_qh, stride_qd,  #
    stride_ot, stride_oh,  #
    stride_kb, stride_ks, stride_kh, stride_kd,  #
    stride_vb, stride_vs, stride_vh, stride_vd,  #
    stride_bt,  #
    num_tokens, num_q_heads, num_splits, num_head_programs,  #
    qk_scale2, sm_scale, v_scale, softcap, causal, window,  #
    group_size, num_group_tiles, store_lse, write_partials,  #
    GROUP_TILE: tl.constexpr,  #
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,  #
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TABLE_MODE: tl.constexpr,  #
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, Q_SCALED: tl.constexpr,  #
    HEADS_FASTEST: tl.constexpr, KEYS_MAJOR: tl.constexpr, V_PAIRS: tl.constexpr, IEEE: tl.constexpr,
    INTERPRET: tl.constexpr,  #
):
    """Paged attention of one (work item, KV head and head tile, split): see the module doc.

    Writes ``out`` (and ``lse`` if ``store_lse``) directly, or with ``write_partials`` the float32 partials ``part_out``
    ``[num_splits, T, Hq, D]`` and ``part_lse`` ``[num_splits, T, Hq]`` (natural log) that
    :func:`merge_splits_kernel` combines.
    """
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_TILE  # queries per tile
    if not INTERPRET:  # a merge launched as its dependent (PDL) may start once every program runs
        gdc_launch_dependents()
    if HEADS_FASTEST:  # grid (work x head programs, splits): a sequence's heads run side by side
        work = tl.program_id(0) // num_head_programs
        head_program = tl.program_id(0) % num_head_programs
        split = tl.program_id(1)
    else:  # grid (work, head programs, splits): consecutive work items share a head's K/V in L2
        work = tl.program_id(0)
        head_program = tl.program_id(1)
        split = tl.program_id(2)
    kv_head = head_program // num_group_tiles
    g0 = (head_program % num_group_tiles) * GROUP_TILE

    # -- the work item's record (the plan's, in one round trip): sequence s, its first query
    #    q_tile, L, the sequence's first token q_begin and q_len
    record = work_ptr + work * WORK_FIELDS
    seq = tl.load(record)
    q_tile = tl.load(record + 1)
    L = tl.load(record + 2)
    q_begin = tl.load(record + 3)
    q_len = tl.load(record + 4)

    # -- rows: (query qi, head g); p_q = L - q_len + j
    rows = tl.arange(0, BLOCK_M)
    qi = rows // GROUP_TILE
    g = g0 + rows % GROUP_TILE
    row_ok = (q_tile + qi < q_len) & (g < group_size)
    token = (q_begin + q_tile + qi).to(tl.int64)
    head = kv_head * group_size + g
    p_q = L - q_len + q_tile + qi
    p_lo = L - q_len + q_tile  # first query's position
    p_hi = tl.minimum(p_lo + BLOCK_Q - 1, L - 1)  # last valid query's position

    # -- load q: it stays in registers throughout
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if Q_SCALED:
        q, q_unscale = _float16_rows(q)
    else:
        q_unscale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if HAS_ALIBI:  # noqa: SIM108
        slopes = tl.load(alibi_ptr + head, mask=row_ok, other=0.0)
    else:
        slopes = tl.zeros([BLOCK_M], dtype=tl.float32)

    # -- key range [kv_start, kv_end) any row may see, and [full_lo, full_hi) all rows see;
    #    row r sees p_q - window < p <= p_last (no window: window = 2**31 - 1, all of p >= 0)
    is_causal = causal != 0
    p_last = tl.where(is_causal, p_q, L - 1)
    kv_end = tl.where(is_causal, p_hi + 1, L)
    full_hi = tl.where(is_causal, p_lo + 1, L)
    kv_start = tl.maximum(p_lo - window + 1, 0)
    full_lo = tl.maximum(p_hi - window + 1, 0)
    # -- this split's tiles [t_a, t_b); inside it, unmasked tiles [f_a, f_b)
    t_lo = kv_start // BLOCK_N
    t_hi = tl.cdiv(kv_end, BLOCK_N)
    per_split = tl.cdiv(t_hi - t_lo, num_splits)
    t_a = tl.minimum(t_lo + split * per_split, t_hi)
    t_b = tl.minimum(t_a + per_split, t_hi)
    f_a = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N), t_a), t_b)
    f_b = tl.maximum(tl.minimum(full_hi // BLOCK_N, t_b), f_a)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if V_PAIRS:
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD // 2], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    acc_odd = tl.zeros([BLOCK_M, HEAD_DIM_PAD // 2], dtype=tl.float32)
    k_base = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    if KEYS_MAJOR:  # decode: scores [BLOCK_N, BLOCK_M], the accumulator and q transposed
        acc = tl.zeros([HEAD_DIM_PAD, BLOCK_M], dtype=tl.float32)
        q = tl.trans(q)
    for stage in tl.static_range(3):  # masked tiles before, unmasked tiles, masked tiles after
        begin, end = _stage_tiles(stage, t_a, f_a, f_b, t_b)
        acc, acc_odd, l_i, m_i = _attend_tiles(
            acc, acc_odd, l_i, m_i, q,  #
            k_base, v_base, bt_row,  #
            stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,  #
            L, p_q, p_last, slopes, qk_scale2, sm_scale, softcap, window, q_unscale,  #
            begin, end,  #
            BLOCK_SIZE, BLOCK_N, TABLE_MODE, HEAD_DIM, HEAD_DIM_PAD,  #
            stage != 1, HAS_SOFTCAP, HAS_ALIBI,  #
            Q_SCALED, KEYS_MAJOR, V_PAIRS, IEEE, INTERPRET,  #
        )
    if KEYS_MAJOR:
        acc = tl.trans(acc)
    if V_PAIRS:  # dimension 2c is acc[:, c], 2c + 1 is acc_odd[:, c]
        acc = tl.reshape(tl.join(acc, acc_odd), [BLOCK_M, HEAD_DIM_PAD])

    # -- epilogue: out = O / l * v_scale and lse = m + log l; (0, -inf) where nothing was visible
    empty = l_i == 0.0
    safe_l = tl.where(empty, 1.0, l_i)
    o = acc * tl.where(empty, 0.0, v_scale / safe_l)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(safe_l)) * LN2)
    store_ok = row_ok[:, None] & d_ok[None, :]
    if write_partials:
        row = (split.to(tl.int64) * num_tokens + token) * num_q_heads + head
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=store_ok)
        tl.store(part_lse_ptr + row, lse, mask=row_ok)
    else:
        o_ptrs = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, cast_for_store(o, out_ptr.dtype.element_ty, INTERPRET), mask=store_ok)
        if store_lse:
            tl.store(lse_ptr + token * num_q_heads + head, lse, mask=row_ok)


@triton.jit(do_not_specialize=["num_tokens", "num_q_heads", "num_splits"])
def merge_splits_kernel(
    out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,  #
    num_tokens, num_q_heads, num_splits, stride_ot, stride_oh,  #
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,  #
    STORE_LSE: tl.constexpr, INTERPRET: tl.constexpr,  #
):
    """Merge the split partials of one (token, head): the spec's ``merge_states`` over splits.

    An empty split (lse = -inf) weighs exactly zero and its out is never taken into the sum.
    Launched as the attention kernel's programmatic dependent (PDL), it waits for that kernel's
    partials before it reads them (``gdc_wait``: a no-op in a plain launch).
    """
    if not INTERPRET:
        gdc_wait()
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_ok = offs_s < num_splits
    d_ok = offs_d < HEAD_DIM
    row = (offs_s.to(tl.int64) * num_tokens + token) * num_q_heads + head
    lse_s = tl.load(part_lse_ptr + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - shift)  # 0 for empty splits
    # every split wrote its partial: loaded beside lse, in one round trip; an empty split's
    # out is replaced by 0, while a NaN out of a split whose w underflowed to 0 stays NaN
    o_s = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0)
    o_s = tl.where((lse_s != float("-inf"))[:, None], o_s, 0.0)
    total = tl.sum(w, 0)  # NaN if a split's lse is NaN: it stays NaN
    safe = tl.where(total == 0.0, 1.0, total)
    o = tl.sum(w[:, None] * o_s, 0) / safe
    o_ptrs = out_ptr + token * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, cast_for_store(o, out_ptr.dtype.element_ty, INTERPRET), mask=d_ok)
    if STORE_LSE:
        lse = tl.where(total == 0.0, float("-inf"), shift + tl.log(safe))
        tl.store(lse_ptr + token * num_q_heads + head, lse)
