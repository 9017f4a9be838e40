"""Every declared kernel specialization compiles for sm_90 with NVRTC (no GPU needed), a
compile error fails, and a kernel's source text changes with its headers."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_NVRTC = importlib.util.find_spec("cupy") is not None


# -- compile check (CPU, CI) ----------------------------------------------------------------
@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_every_declared_specialization_compiles_for_sm90() -> None:
    from pagedattn.backends.cupy.compile_check import compile_all
    from pagedattn.backends.cupy.specializations import all_specializations

    results = compile_all("sm_90")
    compiled = {r.name_expression for r in results}
    assert compiled == {s.name_expression for s in all_specializations()}
    assert all(0 < r.registers <= 255 for r in results)
    decode = next(
        r for r in results if r.name_expression == "paged_attention<bfloat16_t, 128, 16, 4>"
    )
    assert decode.spill_store_bytes <= 64, f"decode kernel spills {decode.spill_store_bytes} bytes"
    # the tensor-core decode kernel: 2 dtypes x (own, e4m3, e5m2 caches) x head_dim 64, 128 x
    # block sizes 16, 32, 64, none of them spilling (fp8 holds its K and V words in registers)
    tc_decode = [r for r in results if r.name_expression.startswith("paged_attention_decode")]
    assert len(tc_decode) == 36, [r.name_expression for r in tc_decode]
    assert all(r.spill_store_bytes == 0 and r.stack_bytes == 0 for r in tc_decode), tc_decode
    # fp8: at most 168 registers, so that three 128-thread CTAs share an SM's 64 K registers
    fp8_decode = [r for r in tc_decode if "fp8" in r.name_expression]
    assert len(fp8_decode) == 24 and all(r.registers <= 168 for r in fp8_decode), fp8_decode
    wgmma = [r for r in results if r.name_expression.startswith("paged_attention_wgmma")]
    # 2 dtypes x block sizes 16, 32, 64 x (1 CTA/SM: head_dim 64 serial, 128 serial and
    # overlap; 2 CTAs/SM: serial at both head dims)
    assert len(wgmma) == 30, [r.name_expression for r in wgmma]
    one_cta = [r for r in wgmma if not r.name_expression.endswith(", 2>")]
    assert all(r.spill_store_bytes == 0 and r.stack_bytes == 0 for r in one_cta), one_cta
    # 2 CTAs/SM: at most 128 registers (two 256-thread CTAs in 64 K registers), a few spills
    two_cta = [r for r in wgmma if r.name_expression.endswith(", 2>")]
    assert len(two_cta) == 12 and all(r.registers <= 128 for r in two_cta), two_cta
    assert all(r.spill_store_bytes <= 64 for r in two_cta), two_cta


@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_decode_shared_memory_agrees_between_host_and_kernel() -> None:
    """The bytes the host gives paged_attention_decode (specializations.decode_smem_bytes) are
    the kernel's own decode_smem_bytes (which traps on fewer) for every cache type and head_dim,
    and the fp8 kernels take DECODE_FP8_STAGES stages and DECODE_FP8_CTAS_PER_SM CTAs an SM."""
    from pagedattn.backends.cupy import compile_check
    from pagedattn.backends.cupy import specializations as sp

    module = "paged_attention_decode"
    asserts = [
        f"static_assert(decode_smem_bytes<{d}, {sp.cache_bytes(cache)}>() == {sp.decode_smem_bytes(d, cache)});"
        for d in sp.MMA_HEAD_DIMS
        for cache in ("bfloat16", *sp.FP8_TYPES)
    ]
    asserts.append(f"static_assert(decode_stages<1>() == {sp.DECODE_FP8_STAGES});")
    asserts.append(f"static_assert(decode_stages<2>() == {sp.DECODE_STAGES});")
    asserts.append(f"static_assert(DEC_FP8_CTAS_PER_SM == {sp.DECODE_FP8_CTAS_PER_SM});")
    text = sp.source(module) + "\n".join(asserts) + "\n"
    name = sp.attention("bfloat16", 64, 16, sp.DECODE_ROWS, "float8_e4m3fn").name_expression
    (report,) = compile_check.compile_module(module, [name], text=text)
    assert report.spill_store_bytes == 0
    wrong = text + f"static_assert(decode_smem_bytes<128, 1>() == {sp.decode_smem_bytes(128, 'float8_e5m2') + 16});\n"
    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module(module, [name], text=wrong)


@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_compile_check_fails_on_a_compile_error() -> None:
    from pagedattn.backends.cupy import compile_check

    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module("kv_ops", ["write_kv<float>"], text="this is not C++;")


def test_kernel_source_changes_with_its_headers(tmp_path: Path) -> None:
    """cupy caches compiled modules by their source text: an edited header must change it."""
    from pagedattn.backends.cupy import specializations as sp

    (tmp_path / "kernel.cu").write_text('#include "common.cuh"\n__global__ void k() {}\n')
    (tmp_path / "common.cuh").write_text("#pragma once\n")
    before = sp.source("kernel", tmp_path)
    assert before.startswith('#include "common.cuh"')
    assert sp.source("kernel", tmp_path) == before, "the same files give the same text"
    (tmp_path / "common.cuh").write_text("#pragma once\n#define CHANGED 1\n")
    assert sp.source("kernel", tmp_path) != before
