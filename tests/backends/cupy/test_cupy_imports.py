"""The cupy backend on the host: importing it imports no GPU library, it declares what it
compiles, and what it does not support raises before anything runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cases import poisoned_case

from pagedattn.backends.cupy.backend import CupyBackend
from pagedattn.errors import UnsupportedError


def test_importing_the_backend_imports_neither_cupy_nor_torch() -> None:
    code = (
        "import sys, pagedattn.backends.cupy.backend, pagedattn.backends.cupy.compile_check;"
        "print(sorted(m for m in ('cupy', 'torch', 'triton') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_capabilities_declare_what_is_compiled() -> None:
    from pagedattn.backends.cupy import specializations

    caps = CupyBackend().capabilities()
    assert caps.block_sizes == (16, 32, 64)
    assert caps.head_dims == specializations.HEAD_DIMS
    assert set(caps.dtypes) == set(specializations.CUDA_TYPES)
    assert caps.supports("fp8") and caps.supports("strided_caches")
    assert {"float8_e4m3fn", "float8_e5m2"} <= set(caps.cache_dtypes)
    assert {"write_kv", "copy_blocks", "merge_states", "lse", "alibi"} <= caps.features


@pytest.mark.parametrize(
    "dtype, head_dim", [("float32", 64), ("bfloat16", 256)], ids=["float32 query", "d256"]
)
def test_fp8_caches_outside_the_tensor_core_kernels_raise_unsupported(
    dtype: str, head_dim: int
) -> None:
    case = poisoned_case("fp8", seq_lens=[20],
        head_dim=head_dim,
        dtype=dtype,
        cache_dtype="float8_e4m3fn",
    )
    with pytest.raises(UnsupportedError, match="fp8 caches need float16/bfloat16") as error:
        CupyBackend().plan(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
        )
    assert error.value.capability == "fp8"




def test_unsupported_block_size_names_the_capability() -> None:
    case = poisoned_case("bs8", seq_lens=[20], head_dim=64, block_size=8)
    with pytest.raises(UnsupportedError, match="block_size 8"):
        CupyBackend().plan(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens
        )
