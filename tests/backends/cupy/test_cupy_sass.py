"""The SASS invariants of pagedattn.backends.cupy.sass_check: every S = Q K^T wgmma inside the
wgmma kernel's tile loop reads A fragments an ldmatrix wrote inside that loop, and the fp8
decode kernels multiply in float16 with K and V converted in registers. The checkers are
tested on hand-written listings (the failing structures and the fixed ones); the real
kernels are checked where nvcc and cuobjdump exist."""

from __future__ import annotations

import re

import pytest

from pagedattn.backends.cupy.sass_check import (
    find_tools,
    fp8_decode_head_dim,
    fp8_decode_violations,
    parse_functions,
    s_wgmma_shared_a,
    s_wgmma_violations,
)

# Shaped like cuobjdump -sass output: Q loaded once before the loop (the failing structure) ...
HOISTED = """
        Function : _Z21paged_attention_wgmmaI10bfloat16_tLi64ELi64ELb0EEv
        /*4820*/                   LDSM.16.M88.4 R88, [R13] ;                /* 0x0 */
        /*5070*/                   DEPBAR.LE SB0, 0x2 ;                      /* 0x0 */
        /*5170*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;             /* 0x0 */
        /*51b0*/                   HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR24], RZ, !UPT ; /* 0x0 */
        /*fa90*/                   F2FP.BF16.F32.PACK_AB R88, R43, R133 ;    /* 0x0 */
        /*fba0*/                   HGMMA.64x64x16.F32.BF16 R56, R88, gdesc[UR24].tnspB, R56 ; /* 0x0 */
        /*fcb0*/              @!P0 BRA 0x5070 ;                              /* 0x0 */
"""
# ... and read again before every S (the fix)
RELOADED = """
        Function : _Z21paged_attention_wgmmaI10bfloat16_tLi64ELi64ELb0EEv
        /*4ab0*/                   DEPBAR.LE SB0, 0x2 ;                      /* 0x0 */
        /*4bb0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;             /* 0x0 */
        /*4c80*/                   LDSM.16.M88.4 R88, [R14+0x10000] ;        /* 0x0 */
        /*4d40*/                   HGMMA.64x64x16.F32.BF16 R24, R88, gdesc[UR16], RZ, !UPT ; /* 0x0 */
        /*f430*/                   HGMMA.64x64x16.F32.BF16 R56, R88, gdesc[UR16].tnspB, R56 ; /* 0x0 */
        /*f5b0*/              @!P0 BRA 0x4ab0 ;                              /* 0x0 */
"""


def _only(listing: str) -> list:  # type: ignore[type-arg]
    (instructions,) = parse_functions(listing).values()
    return instructions


def test_a_q_fragment_loaded_before_the_loop_is_a_violation() -> None:
    checked, violations = s_wgmma_violations(_only(HOISTED))
    assert checked == 1, "the S wgmma inside the loop is checked; P V (tnspB) is not"
    assert len(violations) == 1 and "R88" in violations[0] and "0x5070" in violations[0], violations


def test_a_q_fragment_loaded_inside_the_loop_passes() -> None:
    assert s_wgmma_violations(_only(RELOADED)) == (1, [])


def test_an_s_wgmma_outside_any_loop_is_not_checked() -> None:
    listing = RELOADED.replace("@!P0 BRA 0x4ab0", "@!P0 BRA 0xf600")  # a forward branch
    assert s_wgmma_violations(_only(listing)) == (0, [])


# An fp8 decode step loop at head_dim 4 (2 conversions a sub-tile, two sub-tiles a step): K and
# V converted in registers ...
FP8_IN_REGISTERS = """
        Function : _Z22paged_attention_decodeI10bfloat16_tLi4ELi16E10fp8_e4m3_tEv
        /*0100*/                   LDS.128 R112, [R112+0x1000] ;             /* 0x0 */
        /*0110*/                   SHF.R.U32.HI R125, RZ, 0x10, R112 ;       /* 0x0 */
        /*0120*/                   F2FP.F16.E4M3.UNPACK_B R124, R112 ;       /* 0x0 */
        /*0130*/                   F2FP.F16.E4M3.UNPACK_B R125, R125 ;       /* 0x0 */
        /*0140*/                   HMMA.16816.F32 R124, R4, R124, RZ ;       /* 0x0 */
        /*0150*/                   SHF.R.U32.HI R127, RZ, 0x10, R113 ;       /* 0x0 */
        /*0160*/                   F2FP.F16.E4M3.UNPACK_B R126, R113 ;       /* 0x0 */
        /*0170*/                   F2FP.F16.E4M3.UNPACK_B R127, R127 ;       /* 0x0 */
        /*0180*/                   HMMA.16816.F32 R128, R4, R126, RZ ;       /* 0x0 */
        /*0190*/              @!P0 BRA 0x100 ;                               /* 0x0 */
"""
# ... and converted to bfloat16 through shared memory (the structure that ran at bf16 speed)
FP8_THROUGH_SHARED = """
        Function : _Z22paged_attention_decodeI10bfloat16_tLi4ELi16E10fp8_e4m3_tEv
        /*0100*/                   LDS.128 R112, [R112+0x1000] ;             /* 0x0 */
        /*0110*/                   F2FP.F16.E4M3.UNPACK_B R124, R112 ;       /* 0x0 */
        /*0120*/                   HADD2.F32 R8, -RZ, R124.H0_H0 ;           /* 0x0 */
        /*0130*/                   F2FP.F16.E4M3.UNPACK_B R125, R113 ;       /* 0x0 */
        /*0140*/                   STS.128 [R3], R8 ;                        /* 0x0 */
        /*0150*/                   LDSM.16.M88.4 R12, [R3] ;                 /* 0x0 */
        /*0160*/                   HMMA.16816.F32.BF16 R124, R4, R12, RZ ;   /* 0x0 */
        /*0170*/              @!P0 BRA 0x100 ;                               /* 0x0 */
"""


def test_fp8_decode_converted_in_registers_passes() -> None:
    (name,) = parse_functions(FP8_IN_REGISTERS)
    assert fp8_decode_head_dim(name) == 4
    assert fp8_decode_violations(_only(FP8_IN_REGISTERS), 4) == []


def test_fp8_decode_through_shared_memory_in_bfloat16_is_a_violation() -> None:
    violations = fp8_decode_violations(_only(FP8_THROUGH_SHARED), 4)
    assert any("BF16" in v for v in violations), violations
    assert any(v.startswith("STS") for v in violations) and any(v.startswith("LDSM") for v in violations)
    assert fp8_decode_violations(_only(FP8_IN_REGISTERS), 8) != [], "a missing conversion is one"


def test_only_fp8_decode_names_are_checked() -> None:
    assert fp8_decode_head_dim("_Z22paged_attention_decodeI10bfloat16_tLi128ELi16ES0_Ev") is None
    assert fp8_decode_head_dim("_Z22paged_attention_decodeI6half_tLi64ELi32E10fp8_e5m2_tEv") == 64


TOOLS = find_tools()


@pytest.mark.skipif(TOOLS is None, reason="needs nvcc and cuobjdump (CUDA toolkit or triton's package)")
def test_every_wgmma_kernel_reads_q_inside_its_tile_loop() -> None:
    from pagedattn.backends.cupy.sass_check import wgmma_sass

    assert TOOLS is not None
    kernels = wgmma_sass(*TOOLS)
    assert len(kernels) == 30, sorted(kernels)
    for name, instructions in kernels.items():
        checked, violations = s_wgmma_violations(instructions)
        head_dim = int(re.search(r"_tLi(\d+)E", name).group(1))  # type: ignore[union-attr]
        if "ELi2EEv" in name:  # 2 CTAs/SM: Q from shared memory, one S wgmma per k-step
            assert (checked, s_wgmma_shared_a(instructions)) == (0, head_dim // 16), name
            continue
        assert checked == head_dim // 16, (name, checked)  # one S wgmma per 16-wide k-step
        assert not violations, (name, violations)


@pytest.mark.skipif(TOOLS is None, reason="needs nvcc and cuobjdump (CUDA toolkit or triton's package)")
def test_fp8_decode_kernels_multiply_in_float16_from_registers() -> None:
    """Every fp8 decode specialization (both query types, e4m3 and e5m2, head_dim 64 and 128,
    block sizes 16, 32, 64) takes the float16 route; the 16-bit ones keep their own type."""
    from pagedattn.backends.cupy.sass_check import decode_sass

    assert TOOLS is not None
    kernels = decode_sass(*TOOLS)
    fp8 = {name: fp8_decode_head_dim(name) for name in kernels if fp8_decode_head_dim(name)}
    assert len(fp8) == 24, sorted(kernels)
    for name, head_dim in fp8.items():
        assert head_dim is not None
        assert fp8_decode_violations(kernels[name], head_dim) == [], name
    for name, instructions in kernels.items():
        if name not in fp8 and "bfloat16_t" in name:
            assert any(i.opcode.startswith("HMMA") and "BF16" in i.opcode for i in instructions), name
