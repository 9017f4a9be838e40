"""Triton kernels of the other operations: write_kv, copy_blocks and merge_states.

They must match :mod:`pagedattn.spec.kv_ops` (bit for bit) and
:func:`pagedattn.spec.online_softmax.merge_states` (within the merge tolerance).
This module imports triton: import it only inside functions.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pagedattn.backends.triton.attention_kernels import cast_for_store


@triton.jit
def _quantize_fp8_bits(x, scale, MANT_BITS: tl.constexpr, EXP_BIAS: tl.constexpr, MAX: tl.constexpr,
                       OVERFLOW_BITS: tl.constexpr):
    """Return the fp8 bit pattern (int32, 0..255) of ``x / scale`` rounded to nearest even.

    As the spec does: the quotient is taken in float64 (``scale`` is float64), then rounded
    once to fp8. The rounding is float64 arithmetic and the bits are assembled by hand, so
    the GPU and the interpreter (whose fp8 casts do not round to nearest even) agree.
    Values that round beyond the largest finite fp8 ``MAX``, and inf, become ``OVERFLOW_BITS``
    (NaN for float8_e4m3fn, inf for float8_e5m2), as ml_dtypes rounds; NaN stays NaN. Both are
    decided before any clamp: ``tl.minimum`` of NaN is ``MAX`` on the GPU (``min.f64``).
    """
    EMIN: tl.constexpr = 1 - EXP_BIAS  # smallest normal exponent; subnormals share its ulp
    NAN_BITS: tl.constexpr = 0x7F if MANT_BITS == 3 else 0x7E  # ml_dtypes' NaN: S.1111.111, S.11111.10
    q = x.to(tl.float64) / scale  # float64 division is correctly rounded (div.rn.f64)
    negative = q.to(tl.int64, bitcast=True) < 0
    is_nan = q != q
    a = tl.where(is_nan, 0.0, tl.abs(q))
    e = ((a.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023  # exponent of a (float64)
    e = tl.minimum(tl.maximum(e, EMIN), 1023 - 52)  # past 2**971 (inf too) a overflows fp8 anyway
    ulp = ((e - MANT_BITS + 1023) << 52).to(tl.float64, bitcast=True)  # 2**(e - MANT_BITS)
    magic = ulp * 4503599627370496.0  # 2**52 ulp: adding it rounds a to a multiple of ulp, ties to even
    r = (a + magic) - magic
    overflow = r > MAX  # inf: inf + magic - magic is inf
    r = tl.minimum(r, MAX)
    r_bits = r.to(tl.float32).to(tl.int32, bitcast=True)  # r has at most 4 significant bits: exact
    r_exp = ((r_bits >> 23) & 0xFF) - 127
    normal = (r_exp >= EMIN) & (r > 0.0)
    normal_bits = ((r_exp + EXP_BIAS) << MANT_BITS) | ((r_bits >> (23 - MANT_BITS)) & ((1 << MANT_BITS) - 1))
    sub_bits = (r / ulp).to(tl.int32)  # r = k * 2**(EMIN - MANT_BITS), 0 <= k < 2**MANT_BITS
    bits = tl.where(normal, normal_bits, sub_bits)
    bits = tl.where(overflow, OVERFLOW_BITS, bits)
    bits = tl.where(is_nan, NAN_BITS, bits)
    return tl.where(negative, bits | 0x80, bits)


@triton.jit
def write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, scales_ptr,  #
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,  #
    stride_kcb, stride_kcs, stride_kch, stride_kcd,  #
    stride_vcb, stride_vcs, stride_vch, stride_vcd,  #
    num_tokens,  #
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, TOKENS: tl.constexpr,  #
    TO_FP8: tl.constexpr, MANT_BITS: tl.constexpr, EXP_BIAS: tl.constexpr, FP8_MAX: tl.constexpr,  #
    OVERFLOW_BITS: tl.constexpr,  #
):
    """Store the keys/values of ``TOKENS`` consecutive tokens t (``program_id(0)`` on the grid's
    x axis, which takes 2**31 - 1 programs) of one KV head at slots ``slot_mapping[t]`` (-1 = skip).

    Caches of the key's dtype get the bits unchanged; fp8 caches (passed as uint8 views)
    get ``x / scale`` rounded to nearest even; scales_ptr: float64 ``[2]`` = (k_scale, v_scale).
    """
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    in_batch = t < num_tokens
    slot = tl.load(slot_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    ok = (offs_d < HEAD_DIM)[None, :] & (slot >= 0)[:, None]
    t2, d2 = t[:, None], offs_d[None, :]
    k = tl.load(key_ptr + t2 * stride_kt + h * stride_kh + d2 * stride_kd, mask=ok, other=0.0)
    v = tl.load(value_ptr + t2 * stride_vt + h * stride_vh + d2 * stride_vd, mask=ok, other=0.0)
    block2, offset2 = block[:, None], offset[:, None]
    k_dst = k_cache_ptr + block2 * stride_kcb + offset2 * stride_kcs + h * stride_kch + d2 * stride_kcd
    v_dst = v_cache_ptr + block2 * stride_vcb + offset2 * stride_vcs + h * stride_vch + d2 * stride_vcd
    if TO_FP8:
        k_scale = tl.load(scales_ptr)  # float64, as the spec divides
        v_scale = tl.load(scales_ptr + 1)
        k_bits = _quantize_fp8_bits(k.to(tl.float32), k_scale, MANT_BITS, EXP_BIAS, FP8_MAX, OVERFLOW_BITS)
        v_bits = _quantize_fp8_bits(v.to(tl.float32), v_scale, MANT_BITS, EXP_BIAS, FP8_MAX, OVERFLOW_BITS)
        tl.store(k_dst, k_bits.to(tl.uint8), mask=ok)
        tl.store(v_dst, v_bits.to(tl.uint8), mask=ok)
    else:
        tl.store(k_dst, k, mask=ok)
        tl.store(v_dst, v, mask=ok)


@triton.jit
def copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr,  #
    stride_sb, stride_s1, stride_s2, stride_s3,  #
    stride_db, stride_d1, stride_d2, stride_d3,  #
    DIM2: tl.constexpr, DIM2_PAD: tl.constexpr, DIM3: tl.constexpr, DIM3_PAD: tl.constexpr,  #
):
    """Copy row ``program_id(1)`` of block ``src_ids[i]`` of ``src`` to block ``dst_ids[i]`` of ``dst``.

    A block is ``[DIM1, DIM2, DIM3]`` (either layout); bits are copied unchanged.
    """
    i = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    src_block = tl.load(src_ids_ptr + i).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + i).to(tl.int64)
    offs_2 = tl.arange(0, DIM2_PAD)
    offs_3 = tl.arange(0, DIM3_PAD)
    ok = (offs_2 < DIM2)[:, None] & (offs_3 < DIM3)[None, :]
    src = src_ptr + src_block * stride_sb + r * stride_s1 + offs_2[:, None] * stride_s2 + offs_3[None, :] * stride_s3
    dst = dst_ptr + dst_block * stride_db + r * stride_d1 + offs_2[:, None] * stride_d2 + offs_3[None, :] * stride_d3
    tl.store(dst, tl.load(src, mask=ok), mask=ok)


@triton.jit
def merge_states_kernel(
    out_ptr, lse_ptr, out_a_ptr, lse_a_ptr, out_b_ptr, lse_b_ptr,  #
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, INTERPRET: tl.constexpr,  #
):
    """Merge two partial results of one (token, head) row (contiguous ``[rows, D]`` arrays).

    A side with lse = -inf is empty and its out is never read (NaN there is ignored);
    both empty gives out = 0, lse = -inf. A side that is not empty is read whatever its
    weight: a NaN there reaches the row even where exp(lse - max) rounds to 0, and a NaN
    lse makes the row NaN.
    """
    row = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    lse_a = tl.load(lse_a_ptr + row)
    lse_b = tl.load(lse_b_ptr + row)
    m = tl.maximum(lse_a, lse_b)
    shift = tl.where(m == float("-inf"), 0.0, m)
    w_a = tl.exp(lse_a - shift)
    w_b = tl.exp(lse_b - shift)
    zeros = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    a_ok = d_ok & ((zeros + lse_a) != float("-inf"))  # an empty side is never read: its out may be NaN
    b_ok = d_ok & ((zeros + lse_b) != float("-inf"))
    o_a = tl.load(out_a_ptr + row * HEAD_DIM + offs_d, mask=a_ok, other=0.0).to(tl.float32)
    o_b = tl.load(out_b_ptr + row * HEAD_DIM + offs_d, mask=b_ok, other=0.0).to(tl.float32)
    total = w_a + w_b  # NaN if a side's lse is NaN: the row stays NaN
    empty = total == 0.0
    safe = tl.where(empty, 1.0, total)
    o = (w_a * o_a + w_b * o_b) / safe
    tl.store(out_ptr + row * HEAD_DIM + offs_d, cast_for_store(o, out_ptr.dtype.element_ty, INTERPRET), mask=d_ok)
    tl.store(lse_ptr + row, tl.where(empty, float("-inf"), shift + tl.log(safe)))
