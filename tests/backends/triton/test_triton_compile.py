"""The Triton kernels compile for sm_90a here, without a GPU (``compile_check`` in a fresh process).

The interpreter tests never run the GPU compiler; this does, for every tile configuration
the launch tables choose, and reads ptxas' report.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("triton and torch are needed (pip install 'pagedattn[triton]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import json, sys
from dataclasses import asdict
from pagedattn.backends.triton import compile_check
reports = compile_check.check()
json.dump([{k: v for k, v in asdict(r).items() if k != "ptx"} for r in reports], sys.stdout)
"""


def run_fresh(script: str) -> Any:
    """Run ``script`` in a fresh Python (the kernels imported for compiling first); its stdout as JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert done.returncode == 0, f"the compile check failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def reports() -> list[dict[str, object]]:
    return list(run_fresh(CHECK))


def test_every_config_compiles_for_sm90a(reports: list[dict[str, object]]) -> None:
    from pagedattn.backends.triton.compile_check import CONFIGS

    assert {r["config"] for r in reports} == {c.name for c in CONFIGS}
    assert {r["kernel"] for r in reports} == {"paged_attention_kernel", "merge_splits_kernel"}
    assert all(int(str(r["registers"])) > 0 for r in reports)
    # the attention kernel stages K/V in shared memory (a merge of few splits may need none)
    assert all(int(str(r["shared_bytes"])) > 0 for r in reports if r["kernel"] == "paged_attention_kernel")


#: Shared memory a block may hold on sm_90 (227 KB): a kernel past it fails to launch.
SM90_SHARED_BYTES = 227 * 1024


def test_every_config_fits_an_sm90_block(reports: list[dict[str, object]]) -> None:
    too_big = [(r["config"], r["shared_bytes"]) for r in reports if int(str(r["shared_bytes"])) > SM90_SHARED_BYTES]
    assert not too_big, too_big


#: Spill bytes the decode tiles of head dims past 256 (HUGE_DECODE_TILES: 2 warps hold a 16 x 512
#: float32 accumulator) may take: 168 measured at head_dim 512, 296 at 384 with an fp8 cache; 2
#: warps ran 35 % faster than 8 warps without spills on an H200 (launch_config).
HUGE_DECODE_SPILL_BYTES = 512
#: Spill bytes of the fp8 tiles at head_dim 64: ptxas holds them at 128 registers and spills 4 bytes
#: (at 4, 5 or 6 stages alike), and they ran 19-20 % faster on an H200 than the unspilled tiles of the
#: 16-bit table at four times the keys (launch_config.FP8_DECODE_TILES).
FP8_HEAD_DIM_64_SPILL_BYTES = 8


def test_decode_tiles_do_not_spill(reports: list[dict[str, object]]) -> None:
    """Decode tiles spill nothing, 16-bit and fp8 caches alike (the fp8 tiles' values read as
    16-bit words); head dims past 256 at most :data:`HUGE_DECODE_SPILL_BYTES`, fp8 caches at
    head_dim 64 at most :data:`FP8_HEAD_DIM_64_SPILL_BYTES`."""
    decode = [r for r in reports if str(r["config"]).startswith("decode")]
    huge = [r for r in decode if re.search(r"head_dim (384|512)", str(r["config"]))]
    assert huge and all(int(str(r["spill_bytes"])) <= HUGE_DECODE_SPILL_BYTES for r in huge), huge
    fp8_64 = [r for r in decode if "fp8" in str(r["config"]) and "head_dim 64" in str(r["config"])]
    assert fp8_64 and all(int(str(r["spill_bytes"])) <= FP8_HEAD_DIM_64_SPILL_BYTES for r in fp8_64), fp8_64
    decode = [r for r in decode if r not in huge and r not in fp8_64]
    assert any("fp8" in str(r["config"]) for r in decode), decode
    assert decode and all(r["spill_bytes"] == 0 for r in decode), decode


# Batches that differ only in run-time values: sequence count and lengths, head counts (so
# the group size), splits, causal, window, lse. Each family must map to one JIT key, so the
# conformance profiles' draws do not each pay for a compile.
SAME_BINARY = """
import json, sys
from pagedattn.backends.triton import compile_check as cc
module = cc.compiled_kernels()
import os
os.environ["TRITON_INTERPRET"] = "1"
C = cc.Config
families = {
    "decode": [C("a", (300, 40), None, block_size=32), C("b", (4000,), None, block_size=32),
               C("c", (17, 1, 300), None, block_size=32, num_q_heads=2),
               C("d", (300, 40), None, block_size=32, num_q_heads=6, options=(("sliding_window", 100),)),
               C("e", (300,), None, block_size=32, num_q_heads=16, num_kv_heads=4, options=(("return_lse", True),))],
    "prefill": [C("a", (256,), (256,)), C("b", (200, 90), (200, 90), options=(("causal", False),)),
                C("c", (300,), (150,), options=(("sliding_window", 7), ("return_lse", True)))],
}
keys = {name: sorted({cc.jit_key(module, launch) for config in configs for launch in cc.capture_launches(config)
                      if launch.kernel == "paged_attention_kernel"}) for name, configs in families.items()}
json.dump({name: len(k) for name, k in keys.items()}, sys.stdout)
"""


def test_run_time_values_share_one_binary() -> None:
    assert run_fresh(SAME_BINARY) == {"decode": 1, "prefill": 1}
