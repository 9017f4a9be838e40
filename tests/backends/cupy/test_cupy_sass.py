"""The wgmma kernel's SASS invariant (pagedattn.backends.cupy.sass_check): every S = Q K^T
wgmma inside the tile loop reads A fragments an ldmatrix wrote inside that loop. The checker
is tested on two hand-written listings (the first H200 run's failing structure and the
fixed one); the real kernels are checked where nvcc and cuobjdump exist."""

from __future__ import annotations

import re

import pytest

from pagedattn.backends.cupy.sass_check import (
    find_tools,
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
