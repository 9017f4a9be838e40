"""A SASS invariant of the wgmma kernel: every S = Q K^T wgmma inside the tile loop reads A
fragments that an ``ldmatrix`` wrote inside that loop.

Why: with Q loaded into registers once before the loop, ptxas 13.0 gave those registers to
other values inside the loop at head_dim 64 (P, mask scratch), so from the second tile on S
was computed from the previous tile's P (docs/backends/cupy.md, the Hopper prefill kernel).
The kernel reads Q from shared memory before every S; this check keeps it so.
The 2-CTA/SM variant (``CTAS = 2``) gives wgmma Q's shared-memory descriptor instead: its S
wgmmas must all take A from shared memory.

``python -m pagedattn.backends.cupy.sass_check`` compiles every wgmma specialization with
``nvcc`` for sm_90a and disassembles it with ``cuobjdump`` (from the CUDA toolkit or Triton's
package); exit 1 on a violation, 2 when a tool is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

_INSTRUCTION = re.compile(
    r"/\*(?P<address>[0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?(?P<opcode>[A-Z][A-Z0-9_.]*)\s*(?P<operands>[^;]*);"
)
_FUNCTION = re.compile(r"Function : (\S+)")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: address, opcode (with modifiers), operand text."""

    address: int
    opcode: str
    operands: tuple[str, ...]


def parse_functions(sass: str) -> dict[str, list[Instruction]]:
    """``cuobjdump -sass`` text -> the instructions of each function, by (mangled) name."""
    functions: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for line in sass.splitlines():
        header = _FUNCTION.search(line)
        if header:
            current = functions.setdefault(header.group(1), [])
            continue
        match = _INSTRUCTION.search(line)
        if match and current is not None:
            operands = tuple(op.strip() for op in match["operands"].split(",") if op.strip())
            current.append(Instruction(int(match["address"], 16), match["opcode"], operands))
    return functions


def backward_branches(instructions: list[Instruction]) -> list[tuple[int, int]]:
    """(branch address, target) of every branch back to an earlier address: the loops."""
    branches = []
    for ins in instructions:
        if ins.opcode.startswith("BRA") and ins.operands:
            target = ins.operands[-1].split()[-1]
            if target.startswith("0x") and int(target, 16) <= ins.address:
                branches.append((ins.address, int(target, 16)))
    return branches


def is_s_wgmma(ins: Instruction) -> bool:
    """An S = Q K^T wgmma: an ``HGMMA`` without ``tnspB`` (P V reads V transposed)."""
    return (
        ins.opcode.startswith("HGMMA")
        and len(ins.operands) >= 3
        and not any("tnspB" in op for op in ins.operands)
    )


def s_wgmma_violations(instructions: list[Instruction]) -> tuple[int, list[str]]:
    """Check the invariant on one function: (S wgmmas found inside loops, violations).

    An S wgmma (:func:`is_s_wgmma`) whose A operand is a register is checked; its loop is the
    innermost backward branch around it; an ``LDSM`` writing that A register must lie between
    the loop's head and the wgmma."""
    branches = backward_branches(instructions)
    checked, violations = 0, []
    for ins in instructions:
        if not is_s_wgmma(ins) or not ins.operands[1].startswith("R"):
            continue
        heads = [t for b, t in branches if t <= ins.address < b]
        if not heads:
            continue  # not in a loop
        head, a_register = max(heads), ins.operands[1]
        checked += 1
        loaded = any(
            head <= other.address < ins.address
            and other.opcode.startswith("LDSM")
            and other.operands[0] == a_register
            for other in instructions
        )
        if not loaded:
            violations.append(
                f"HGMMA at {ins.address:#x} reads A from {a_register}, which no LDSM writes"
                f" between the loop head {head:#x} and it"
            )
    return checked, violations


def s_wgmma_shared_a(instructions: list[Instruction]) -> int:
    """S wgmmas inside a loop that read A from shared memory (a ``gdesc`` operand): the
    2-CTA/SM kernels (``..., 2>``), which have no Q registers for ptxas to reuse."""
    branches = backward_branches(instructions)
    return sum(
        1
        for ins in instructions
        if is_s_wgmma(ins)
        and ins.operands[1].startswith("gdesc")
        and any(t <= ins.address < b for b, t in branches)
    )


def find_tools() -> tuple[str, str] | None:
    """(nvcc, cuobjdump): nvcc from PATH; cuobjdump from PATH, else the copy in Triton's
    package (which reads nvcc 13.0's cubins; NVRTC 13.5's it rejects). None if either is
    missing."""
    nvcc, cuobjdump = shutil.which("nvcc"), shutil.which("cuobjdump")
    spec = importlib.util.find_spec("triton")
    if cuobjdump is None and spec is not None:
        for location in spec.submodule_search_locations or []:
            path = os.path.join(location, "backends", "nvidia", "bin", "cuobjdump")
            if os.access(path, os.X_OK):
                cuobjdump = path
    return (nvcc, cuobjdump) if nvcc and cuobjdump else None


def wgmma_sass(nvcc: str, cuobjdump: str) -> dict[str, list[Instruction]]:
    """Every declared wgmma attention specialization, compiled by ``nvcc`` for sm_90a and
    disassembled: instructions by mangled name (the ptxas of nvcc, not of NVRTC: the
    invariant is one of the source's structure)."""
    from pagedattn.backends.cupy.specializations import (
        COMPILE_OPTIONS,
        KERNEL_DIR,
        WGMMA_MODULE,
        all_specializations,
    )

    names = [
        spec.name_expression
        for spec in all_specializations()
        if spec.module == WGMMA_MODULE and spec.name_expression.startswith("paged_attention_wgmma")
    ]
    table = ",\n".join(f"  (const void*)&{name}" for name in names)
    unit = f'#include "{WGMMA_MODULE}.cu"\nconst void* sass_check_kernels[] = {{\n{table}}};\n'
    with tempfile.TemporaryDirectory() as folder:
        source, cubin = os.path.join(folder, "unit.cu"), os.path.join(folder, "unit.cubin")
        with open(source, "w") as f:
            f.write(unit)
        subprocess.run(
            [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", *COMPILE_OPTIONS,
             f"-I{KERNEL_DIR}", "-o", cubin, source],
            capture_output=True, text=True, check=True,
        )
        sass = subprocess.run(
            [cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    functions = parse_functions(sass)
    kernels = {name: code for name, code in functions.items() if "paged_attention_wgmma" in name}
    if len(kernels) != len(names):
        raise RuntimeError(f"expected {len(names)} wgmma kernels in the SASS, found {len(kernels)}")
    return kernels


def main() -> int:
    tools = find_tools()
    if tools is None:
        print("needs nvcc and cuobjdump (CUDA toolkit, or Triton's package for cuobjdump)", file=sys.stderr)
        return 2
    failed = 0
    for name, instructions in wgmma_sass(*tools).items():
        checked, violations = s_wgmma_violations(instructions)
        shared_a = s_wgmma_shared_a(instructions)
        two_ctas = "ELi2EEv" in name  # paged_attention_wgmma<..., 2>: Q read by wgmma itself
        ok = (shared_a > 0 and checked == 0 if two_ctas else checked > 0) and not violations
        failed += not ok
        print(
            f"{'ok  ' if ok else 'FAIL'} {name}: {checked} S wgmmas in loops checked"
            f" ({shared_a} reading Q from shared memory)"
        )
        for violation in violations:
            print(f"     {violation}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
