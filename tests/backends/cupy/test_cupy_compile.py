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
def test_tensor_core_decode_kernel_never_spills() -> None:
    """Every decode specialization, head_dim 256 (O split between warp pairs) included, keeps
    its state in registers: no spills, no stack, at most 255 registers (two 128-thread CTAs
    per SM)."""
    from pagedattn.backends.cupy.compile_check import compile_all

    results = compile_all("sm_90", only="paged_attention_decode<")
    at_256 = {r.name_expression for r in results if ", 256, " in r.name_expression}
    assert at_256 == {
        f"paged_attention_decode<{t}, 256, {bs}, {t}>" for t in ("half_t", "bfloat16_t") for bs in (16, 32, 64)
    }
    # 2 dtypes x 3 block sizes x (head_dim 64, 128: 3 caches; 256: the 16-bit cache)
    assert len(results) == 2 * 3 * (2 * 3 + 1), [r.name_expression for r in results]
    for r in results:
        assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0), r
        assert r.registers <= 255, r


@pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)
def test_host_and_kernel_agree_on_the_decode_kernels_shared_memory() -> None:
    """The bytes the host asks for (specializations.decode_smem_bytes) are those the kernel
    checks for (decode_smem_bytes in the .cu, which traps on fewer), at every head_dim and
    cache width: static_asserts compiled with the kernel's source."""
    from pagedattn.backends.cupy import compile_check
    from pagedattn.backends.cupy import specializations as sp

    asserts = "".join(
        f"static_assert(decode_smem_bytes<{d}, {sp.cache_bytes(cache)}>() == {sp.decode_smem_bytes(d, cache)});\n"
        for d in sp.DECODE_HEAD_DIMS
        for cache in ("bfloat16", "float8_e4m3fn")
    )
    text = sp.source("paged_attention_decode") + asserts + "__global__ void smem_probe() {}\n"
    compile_check.compile_module("paged_attention_decode", ["smem_probe"], text=text)
    wrong = text.replace(f"== {sp.decode_smem_bytes(256)})", f"== {sp.decode_smem_bytes(256) + 16})")
    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module("paged_attention_decode", ["smem_probe"], text=wrong)


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
