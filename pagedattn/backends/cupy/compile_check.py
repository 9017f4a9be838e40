"""Compile every declared specialization for sm_90 (wgmma: sm_90a) with NVRTC, without a GPU, and report resources.

``python -m pagedattn.backends.cupy.compile_check`` compiles each kernel module once with all
its name expressions (:func:`.specializations.all_specializations`), fails (exit 1) on any
compile error, and prints registers, stack frame and spills per specialization from ptxas'
verbose report. Needs cupy (for its NVRTC binding) and libnvrtc, not a CUDA driver.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass

from pagedattn.backends.cupy.specializations import all_specializations

ARCH = "sm_90"
_RESOURCES = re.compile(
    r"Function properties for (?P<name>\S+)\s*\n"
    r"ptxas\s+\.\s+(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads\s*\n"
    r"ptxas info\s+: Used (?P<registers>\d+) registers"
)


@dataclass(frozen=True)
class CompiledKernel:
    """ptxas' resource report of one specialization."""

    name_expression: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


class CompileError(RuntimeError):
    """NVRTC rejected a kernel module; the message holds its log."""


def compile_module(
    module: str, name_expressions: list[str], arch: str = ARCH, text: str | None = None
) -> list[CompiledKernel]:
    """Compile ``module`` (``text``: this source in place of its file) with
    ``name_expressions`` for ``arch``; return their resource reports."""
    from pagedattn.backends.cupy.runtime import KernelLaunchError, compile_cubin

    try:
        _, names, log = compile_cubin(module, name_expressions, arch, ("-Xptxas=-v",), text)
    except KernelLaunchError as error:
        raise CompileError(str(error)) from None
    lowered = {low: name for name, low in names.items()}
    if "instructions are serialized" in log:  # ptxas serialised wgmma (C7513-C7518)
        raise CompileError(f"{module}.cu: wgmma serialised by ptxas\n{log}")
    reports = {}
    for match in _RESOURCES.finditer(log):
        if match["name"] in lowered:
            reports[lowered[match["name"]]] = CompiledKernel(
                lowered[match["name"]],
                int(match["registers"]),
                int(match["stack"]),
                int(match["stores"]),
                int(match["loads"]),
            )
    missing = [name for name in name_expressions if name not in reports]
    if missing:
        raise CompileError(f"{module}.cu: no ptxas report for {missing}\n{log}")
    return [reports[name] for name in name_expressions]


def compile_to_ptx(module: str, name_expressions: list[str], arch: str = ARCH, text: str | None = None) -> None:
    """Compile ``module`` (``text``: this source in place of its file) with ``name_expressions``
    to the PTX of ``arch``'s virtual architecture (no ptxas, so no resource report): raises
    CompileError as :func:`compile_module` does."""
    from pagedattn.backends.cupy.runtime import KernelLaunchError, compile_cubin

    try:
        _, names, _ = compile_cubin(module, name_expressions, arch, text=text, ptx=True)
    except KernelLaunchError as error:
        raise CompileError(str(error)) from None
    missing = [name for name in name_expressions if not names.get(name)]
    if missing:
        raise CompileError(f"{module}.cu: no lowered name for {missing}")


def compile_all(arch: str = ARCH, only: str | None = None, module: str | None = None) -> list[CompiledKernel]:
    """Compile every declared specialization (those containing ``only``, those of kernel module
    ``module``, if given), each for its own ``arch`` when it names one (wgmma: sm_90a), else for
    ``arch``."""
    by_module: dict[tuple[str, str], list[str]] = defaultdict(list)
    for spec in all_specializations():
        if (only is None or only in spec.name_expression) and (module is None or spec.module == module):
            by_module[(spec.module, spec.arch or arch)].append(spec.name_expression)
    results: list[CompiledKernel] = []
    for (module, module_arch), names in by_module.items():
        results.extend(compile_module(module, names, module_arch))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=ARCH)
    parser.add_argument(
        "--only", default=None, help="compile only name expressions containing this"
    )
    args = parser.parse_args(argv)
    try:
        results = compile_all(args.arch, args.only)
    except CompileError as error:
        print(f"compile error: {error}", file=sys.stderr)
        return 1
    if not results:
        print(f"no specialization's name expression contains {args.only!r}", file=sys.stderr)
        return 2
    width = max(len(r.name_expression) for r in results)
    print(f"{'specialization':<{width}}  regs  stack  spill st/ld (bytes)  [{args.arch}; wgmma: sm_90a]")
    for r in results:
        print(
            f"{r.name_expression:<{width}}  {r.registers:4d}  {r.stack_bytes:5d}"
            f"  {r.spill_store_bytes}/{r.spill_load_bytes}"
        )
    spilling = [r for r in results if r.spill_store_bytes or r.spill_load_bytes]
    print(
        f"{len(results)} specializations compiled for {args.arch}; {len(spilling)} of them spill"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
