"""Compile the Triton backend's attention kernels for a GPU without one, and report resources.

    python -m pagedattn.backends.triton.compile_check [--arch 90] [--ptx DIR]

The CPU interpreter runs the kernels' Python, never the GPU compiler, so a change can pass
every interpreter test and still fail to compile for the GPU. This check plans each
configuration the launch tables can choose (:data:`CONFIGS`) on small host arrays, captures
the launches the backend makes (arguments, compile-time parameters, warps, stages, register
cap) without running them, and compiles each with ``triton.compile`` for ``sm_<arch>a``
under the JIT's own specialization of those arguments. It then runs the ``ptxas`` bundled
with Triton on the PTX and reports registers, spills and shared memory; any compile error
fails. Run it in a fresh process: the kernel module must be imported for compiling before
anything imports it for the interpreter.
``--ptx DIR`` also writes each kernel's PTX without debug lines (to compare two builds).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Config:
    """One batch whose launches are compiled: a decode or prefill case of the launch tables."""

    name: str
    seq_lens: tuple[int, ...]
    q_lens: tuple[int, ...] | None  # None: decode
    block_size: int = 16
    num_q_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 128
    dtype: str = "bfloat16"
    cache_dtype: str | None = None
    options: tuple[tuple[str, Any], ...] = ()


CONFIGS: tuple[Config, ...] = (
    Config("decode bf16 bs16 (one table read per tile)", (300, 40), None, block_size=16),
    Config("decode bf16 bs32", (300, 40), None, block_size=32),
    Config("decode bf16 bs64 + split-KV merge", (4000,), None, block_size=64),
    Config("decode fp16 fp8-e4m3 cache, window, softcap", (300,), None, block_size=32, dtype="float16",
           cache_dtype="float8_e4m3fn", options=(("sliding_window", 100), ("softcap", 30.0))),
    Config("decode bf16 fp8-e5m2 cache head_dim 64", (300, 40), None, block_size=16, head_dim=64,
           cache_dtype="float8_e5m2"),
    Config("prefill bf16 causal (128-row tiles, register cap)", (256,), (256,)),
    Config("prefill bf16 fp8-e4m3 cache", (200,), (200,), cache_dtype="float8_e4m3fn"),
    Config("prefill fp16 alibi, lse, non-causal", (200, 90), (80, 90), dtype="float16",
           options=(("causal", False), ("return_lse", True), ("alibi", True))),
    Config("prefill float32 (ieee)", (96,), (96,), dtype="float32", head_dim=64),
    Config("prefill bf16 head_dim 256", (96,), (96,), head_dim=256),
    Config("decode bf16 head_dim 512 + split-KV merge", (4000, 40), None, num_q_heads=8, num_kv_heads=4, head_dim=512),
    Config("decode fp16 fp8-e5m2 cache head_dim 384", (300,), None, dtype="float16", head_dim=384,
           cache_dtype="float8_e5m2"),
    Config("prefill bf16 head_dim 512", (96,), (96,), num_q_heads=8, num_kv_heads=4, head_dim=512),
    Config("prefill float32 head_dim 512", (96,), (96,), dtype="float32", head_dim=512),
)


@dataclass(frozen=True)
class Launch:
    """A launch the backend made: the kernel's name, its arguments and launch options."""

    kernel: str
    args: tuple[Any, ...]
    constexprs: dict[str, Any]
    options: dict[str, Any]


@dataclass(frozen=True)
class Report:
    """One compiled kernel: config, kernel, tiles, and what ptxas says."""

    config: str
    kernel: str
    tiles: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    ptx: str


def case_arrays(config: Config) -> tuple[Any, ...]:
    """Host arrays of ``config``: query, caches, block tables, seq_lens, query_start_loc."""
    from pagedattn.spec.pools import random_paged_inputs

    return random_paged_inputs(config.seq_lens, config.q_lens, block_size=config.block_size,
                               num_q_heads=config.num_q_heads, num_kv_heads=config.num_kv_heads,
                               head_dim=config.head_dim, dtype=config.dtype, cache_dtype=config.cache_dtype).args()


def capture_launches(config: Config) -> list[Launch]:
    """Plan and run ``config`` on the triton backend (interpreter) with launches recorded, not run."""
    from pagedattn.backends.registry import load_backend
    from pagedattn.backends.triton import relaunch

    captured: list[Launch] = []

    def record(self: Any, kernel: Any, grid: Any, key: Any, args: list[Any], constexprs: dict[str, Any],
               options: dict[str, Any], interpret: bool) -> None:
        captured.append(Launch(kernel.__name__, tuple(args), {**constexprs, "INTERPRET": False}, dict(options)))

    backend = load_backend("triton")
    query, key_cache, value_cache, tables, seq_lens, qsl = case_arrays(config)
    options = dict(config.options)
    if options.pop("alibi", False):
        options["alibi_slopes"] = np.linspace(0.05, 0.5, config.num_q_heads).astype(np.float32)
    original = relaunch.Relauncher.launch
    relaunch.Relauncher.launch = record  # type: ignore[method-assign]
    try:
        q, kc, vc = backend.to_device(query), backend.to_device(key_cache), backend.to_device(value_cache)
        plan = backend.plan(q, kc, vc, tables, seq_lens, qsl, **options)
        backend.run(plan, q, kc, vc)
    finally:
        relaunch.Relauncher.launch = original  # type: ignore[method-assign]
    return captured


@contextmanager
def _interpreter_off() -> Iterator[None]:
    from triton import knobs

    before = knobs.runtime.interpret
    knobs.runtime.interpret = False
    try:
        yield
    finally:
        knobs.runtime.interpret = before


def compiled_kernels() -> Any:
    """The kernel module with ``@triton.jit`` functions that compile (never interpret).

    Must be the first import of the module in this process: the interpreter patches
    ``triton.language`` once it has wrapped a kernel, after which nothing compiles here.
    """
    name = "pagedattn.backends.triton.attention_kernels"
    if name in sys.modules:
        module = sys.modules[name]
        if type(module.paged_attention_kernel).__name__ != "JITFunction":
            raise RuntimeError("the kernels were imported for the interpreter: run compile_check in a fresh process")
        return module
    with _interpreter_off():
        return importlib.import_module(name)


def _specialize(module: Any, launch: Launch, arch: int) -> tuple[Any, ...]:
    """The JIT's binding of ``launch`` for ``sm_<arch>a``: kernel, target, backend, kwargs and its specialization."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = getattr(module, launch.kernel)
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**launch.constexprs, **launch.options}
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    return kernel, target, backend, kwargs, bound_args, specialization, options


def jit_key(module: Any, launch: Launch, arch: int = 90) -> str:
    """What the JIT compiles ``launch`` under: two launches with equal keys share one binary."""
    _, _, _, kwargs, _, specialization, _ = _specialize(module, launch, arch)
    return repr((launch.kernel, specialization, sorted(kwargs.items())))


def compile_launch(module: Any, launch: Launch, arch: int) -> Any:
    """``triton.compile`` of one captured launch for ``sm_<arch>a``, specialized as the JIT would."""
    import triton
    from triton.compiler import ASTSource

    kernel, target, backend, kwargs, bound_args, specialization, options = _specialize(module, launch, arch)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def ptxas_report(ptx: str, arch: int) -> tuple[int, int]:
    """(registers, spill bytes) from ``ptxas -v`` (Triton's bundled ptxas) on ``ptx``."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", str(source), "-o",
                               str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    registers = max((int(n) for n in re.findall(r"Used (\d+) registers", text)), default=0)
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", text))
    return registers, spills


DEBUG_LINE = re.compile(r"^\s*(\.loc|\.file|\$L__tmp\d+:)")  # source lines and inlining-scope labels


def strip_debug(ptx: str) -> str:
    """PTX without source lines, inlining-scope labels and debug sections: equal for equal code."""
    keep = [line for line in ptx.splitlines() if not DEBUG_LINE.match(line)]
    return "\n".join(keep).split(".section\t.debug", 1)[0]


def _tiles(launch: Launch) -> str:
    c, o = launch.constexprs, launch.options
    shape = f"M={c['BLOCK_M']} N={c['BLOCK_N']} " if "BLOCK_M" in c else ""
    major = "keys-major " if c.get("KEYS_MAJOR") else ""
    cap = f" maxnreg={o['maxnreg']}" if "maxnreg" in o else ""
    return f"{shape}{major}w={o.get('num_warps')} s={o.get('num_stages', 3)}{cap}"


def check(configs: Sequence[Config] = CONFIGS, arch: int = 90) -> list[Report]:
    """Compile every launch of ``configs``; raise on any compile error (the error names the config).

    Plans through the interpreter-mode backend (``TRITON_INTERPRET=1`` is set for this process).
    """
    module = compiled_kernels()
    os.environ["TRITON_INTERPRET"] = "1"  # the backend plans on the CPU; its kernels stay compiled
    reports = []
    for config in configs:
        launches = capture_launches(config)
        if not launches:
            raise RuntimeError(f"{config.name}: the backend launched nothing")
        for launch in launches:
            try:
                compiled = compile_launch(module, launch, arch)
            except Exception as error:
                raise RuntimeError(f"{config.name}: {launch.kernel} does not compile for sm_{arch}a: {error}") \
                    from error
            ptx = compiled.asm["ptx"]
            registers, spills = ptxas_report(ptx, arch)
            reports.append(Report(config.name, launch.kernel, _tiles(launch), registers, spills,
                                  int(compiled.metadata.shared), strip_debug(ptx)))
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (sm_90a)")
    parser.add_argument("--ptx", type=Path, help="write each kernel's PTX (debug lines removed) here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from pagedattn.console import print_table

    reports = check(arch=args.arch)
    rows = [(r.config, r.kernel, r.tiles, r.registers, r.spill_bytes, f"{r.shared_bytes / 1024:.0f} KB")
            for r in reports]
    print_table(("config", "kernel", "tiles", "registers", "spill bytes", "shared memory"), rows,
                title=f"triton kernels compiled for sm_{args.arch}a")
    if args.ptx:
        args.ptx.mkdir(parents=True, exist_ok=True)
        for i, r in enumerate(reports):
            (args.ptx / f"{i:02d}-{r.kernel}.ptx").write_text(r.ptx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
