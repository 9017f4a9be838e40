"""Every declared kernel specialization compiles for sm_90 with NVRTC (no GPU needed: to a cubin
where a check reads ptxas' report of its registers and spills, else to PTX), a compile error
fails, and a kernel's source text changes with its headers."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_NVRTC = importlib.util.find_spec("cupy") is not None


# -- compile check (CPU, CI) ----------------------------------------------------------------
#: The kernel modules, each compiled by a test of its own (so that pytest-xdist spreads them).
KERNEL_MODULES = ("paged_attention", "paged_attention_decode", "paged_attention_mma", "paged_attention_wgmma",
                  "kv_ops")
needs_nvrtc = pytest.mark.skipif(
    not HAVE_NVRTC and not os.environ.get("CI"),
    reason="cupy (NVRTC binding) not installed: pip install 'pagedattn[cupy]'",
)


SIMPLE_DECODE = "paged_attention<bfloat16_t, 128, 16, 4>"


def _simple_kernels(results: list) -> None:
    [decode] = results
    assert decode.name_expression == SIMPLE_DECODE
    assert decode.spill_store_bytes <= 64, f"decode kernel spills {decode.spill_store_bytes} bytes"


def _tensor_core_decode(results: list) -> None:
    """Every decode specialization, head_dim 256 (O split between warp pairs) included, keeps
    its state in registers: no spills, no stack, and few enough registers for the CTAs per SM
    its launch bounds ask for (two 128-thread CTAs: 255; fp8 caches: DECODE_FP8_CTAS_PER_SM)."""
    from pagedattn.backends.cupy import specializations as sp

    results = [r for r in results if r.name_expression.startswith("paged_attention_decode<")]
    at_256 = {r.name_expression for r in results if ", 256, " in r.name_expression}
    assert at_256 == {
        f"paged_attention_decode<{t}, 256, {bs}, {t}>" for t in ("half_t", "bfloat16_t") for bs in (16, 32, 64)
    }
    # 2 dtypes x 3 block sizes x (head_dim 64, 128: 3 caches; 256: the 16-bit cache)
    assert len(results) == 2 * 3 * (2 * 3 + 1), [r.name_expression for r in results]
    for r in results:
        assert (r.spill_store_bytes, r.spill_load_bytes, r.stack_bytes) == (0, 0, 0), r
    # fp8: DECODE_FP8_CTAS_PER_SM 128-thread CTAs share an SM's 64 K registers
    fp8_cap = min(255, 65536 // (sp.DECODE_FP8_CTAS_PER_SM * sp.DECODE_THREADS) // 8 * 8)
    fp8 = [r for r in results if "fp8" in r.name_expression]
    assert len(fp8) == 24 and all(r.registers <= fp8_cap for r in fp8), fp8


def _wgmma(results: list) -> None:
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


#: What each module's kernels must keep beyond compiling (registers, spills), where it says more.
MODULE_CHECKS = {"paged_attention": _simple_kernels, "paged_attention_decode": _tensor_core_decode,
                 "paged_attention_wgmma": _wgmma}
#: The specializations each check reads ptxas' report of, by module (every one where absent).
#: The others compile to PTX only: the C++ and every template instantiation, in about half the time.
CHECKED = {"paged_attention": lambda name: name == SIMPLE_DECODE}


def test_the_kernel_modules_are_those_of_the_declared_specializations() -> None:
    from pagedattn.backends.cupy.specializations import all_specializations

    assert set(KERNEL_MODULES) == {s.module for s in all_specializations()}


@needs_nvrtc
@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_every_declared_specialization_compiles_for_sm90(module: str) -> None:
    from pagedattn.backends.cupy.compile_check import compile_module, compile_to_ptx
    from pagedattn.backends.cupy.specializations import all_specializations

    specs = [s for s in all_specializations() if s.module == module]
    [arch] = {s.arch or "sm_90" for s in specs}
    check = MODULE_CHECKS.get(module)
    chosen = CHECKED.get(module, lambda _: check is not None)
    checked = [s.name_expression for s in specs if chosen(s.name_expression)]
    rest = [s.name_expression for s in specs if not chosen(s.name_expression)]
    if rest:
        compile_to_ptx(module, rest, arch)
    if check is not None:
        results = compile_module(module, checked, arch)
        assert [r.name_expression for r in results] == checked
        assert all(0 < r.registers <= 255 for r in results)
        check(results)


@needs_nvrtc
def test_host_and_kernel_agree_on_the_decode_kernels_shared_memory() -> None:
    """The bytes the host asks for (specializations.decode_smem_bytes) are those the kernel
    checks for (decode_smem_bytes in the .cu, which traps on fewer), at every head_dim and
    cache width, and the fp8 stages, CTAs per SM, step and rows: static_asserts compiled with
    the kernel's source."""
    from pagedattn.backends.cupy import compile_check
    from pagedattn.backends.cupy import specializations as sp

    asserts = "".join(
        f"static_assert(decode_smem_bytes<{d}, {sp.cache_bytes(cache)}>() == {sp.decode_smem_bytes(d, cache)});\n"
        for d in sp.DECODE_HEAD_DIMS
        for cache in ("bfloat16", "float8_e4m3fn")
    )
    asserts += f"static_assert(decode_stages<1>() == {sp.DECODE_FP8_STAGES});\n"
    asserts += f"static_assert(decode_stages<2>() == {sp.DECODE_STAGES});\n"
    asserts += f"static_assert(DEC_FP8_CTAS_PER_SM == {sp.DECODE_FP8_CTAS_PER_SM});\n"
    asserts += f"static_assert(DEC_FP8_STEP_SUBS == {sp.DECODE_FP8_STEP_SUBS});\n"
    asserts += f"static_assert(DEC_FP8_ROWS == {sp.DECODE_FP8_ROWS});\n"
    text = sp.source("paged_attention_decode") + asserts + "__global__ void smem_probe() {}\n"
    compile_check.compile_module("paged_attention_decode", ["smem_probe"], text=text)
    wrong = text.replace(f"== {sp.decode_smem_bytes(256)})", f"== {sp.decode_smem_bytes(256) + 16})")
    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module("paged_attention_decode", ["smem_probe"], text=wrong)


@needs_nvrtc
def test_compile_check_fails_on_a_compile_error() -> None:
    from pagedattn.backends.cupy import compile_check

    with pytest.raises(compile_check.CompileError):
        compile_check.compile_module("kv_ops", ["write_kv<float>"], text="this is not C++;")
    with pytest.raises(compile_check.CompileError):
        compile_check.compile_to_ptx("kv_ops", ["write_kv<float>"], text="this is not C++;")


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


def test_compile_check_reports_an_only_that_matches_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """``--only`` naming no specialization is a usage error with its own status, not an empty table."""
    from pagedattn.backends.cupy import compile_check

    assert compile_check.main(["--only", "no_such_kernel<"]) == 2
    assert "no_such_kernel<" in capsys.readouterr().err
