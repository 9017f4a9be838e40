"""SASS invariants of two kernels.

The wgmma kernel: every S = Q K^T wgmma inside the tile loop reads A fragments that an
``ldmatrix`` wrote inside that loop.

Why: with Q loaded into registers once before the loop, ptxas 13.0 gave those registers to
other values inside the loop at head_dim 64 (P, mask scratch), so from the second tile on S
was computed from the previous tile's P (docs/backends/cupy.md, the Hopper prefill kernel).
The kernel reads Q from shared memory before every S; this check keeps it so.
The 2-CTA/SM variant (``CTAS = 2``) gives wgmma Q's shared-memory descriptor instead: its S
wgmmas must all take A from shared memory.

The decode kernel with fp8 caches (:func:`fp8_decode_violations`): every tensor-core product is
a float16 one, whatever the query type, and its sub-tile loop converts K and V in registers:
one fp8-pair conversion per pair a lane multiplies (HEAD_DIM / 2 per 16-key sub-tile), no
shared-memory store and no ``ldmatrix``. Why: converting to bfloat16 took four instructions
per pair and a round trip through shared memory, and fp8 decode ran at the speed of bf16
(docs/backends/cupy.md, fp8 caches).

``python -m pagedattn.backends.cupy.sass_check`` compiles every wgmma specialization with
``nvcc`` for sm_90a and every decode specialization for sm_90, and disassembles them with
``cuobjdump`` (from the CUDA toolkit or Triton's package); exit 1 on a violation, 2 when a
tool is missing.
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


def innermost_loop(instructions: list[Instruction], opcode: str) -> list[Instruction]:
    """The instructions of the smallest loop (backward branch and its target) holding an
    ``opcode`` instruction; empty if none does."""
    loops = [
        (b - t, t, b)
        for b, t in backward_branches(instructions)
        if any(t <= i.address <= b and i.opcode.startswith(opcode) for i in instructions)
    ]
    if not loops:
        return []
    _, head, branch = min(loops)
    return [i for i in instructions if head <= i.address <= branch]


def fp8_decode_violations(instructions: list[Instruction], head_dim: int) -> list[str]:
    """Check the fp8 decode invariant on one ``paged_attention_decode<T, head_dim, _, fp8>``:
    every HMMA multiplies float16 (no ``.BF16``), and the innermost loop holding the HMMAs (the
    step loop, ``DECODE_FP8_STEP_SUBS`` sub-tiles a step) has ``head_dim / 2``
    ``F2FP.F16.E4M3``/``E5M2`` conversions a sub-tile and no ``STS`` or ``LDSM``."""
    from pagedattn.backends.cupy.specializations import DECODE_FP8_STEP_SUBS

    violations = [
        f"HMMA at {i.address:#x} is {i.opcode}, not float16"
        for i in instructions
        if i.opcode.startswith("HMMA") and "BF16" in i.opcode
    ]
    loop = innermost_loop(instructions, "HMMA")
    if not loop:
        return [*violations, "no loop holds an HMMA"]
    unpacks = sum(1 for i in loop if re.match(r"F2FP\.F16\.E(4M3|5M2)", i.opcode))
    expected = head_dim // 2 * DECODE_FP8_STEP_SUBS
    if unpacks != expected:
        violations.append(f"{unpacks} fp8-pair conversions in the step loop, expected {expected}")
    violations.extend(
        f"{i.opcode} at {i.address:#x} in the step loop"
        for i in loop
        if i.opcode.startswith(("STS", "LDSM"))
    )
    return violations


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


def compiled_sass(
    nvcc: str, cuobjdump: str, module: str, prefix: str, arch: str
) -> dict[str, list[Instruction]]:
    """Every declared specialization of ``module`` whose name expression starts with
    ``prefix``, compiled by ``nvcc`` for ``arch`` (``sm_90a``, ``sm_90``) and disassembled:
    instructions by mangled name (the ptxas of nvcc, not of NVRTC: the invariants are ones
    of the source's structure)."""
    from pagedattn.backends.cupy.specializations import (
        COMPILE_OPTIONS,
        KERNEL_DIR,
        all_specializations,
    )

    names = [
        spec.name_expression
        for spec in all_specializations()
        if spec.module == module and spec.name_expression.startswith(prefix)
    ]
    table = ",\n".join(f"  (const void*)&{name}" for name in names)
    unit = f'#include "{module}.cu"\nconst void* sass_check_kernels[] = {{\n{table}}};\n'
    compute = arch.replace("sm_", "compute_")
    with tempfile.TemporaryDirectory() as folder:
        source, cubin = os.path.join(folder, "unit.cu"), os.path.join(folder, "unit.cubin")
        with open(source, "w") as f:
            f.write(unit)
        subprocess.run(
            [nvcc, "-cubin", f"-gencode=arch={compute},code={arch}", *COMPILE_OPTIONS,
             f"-I{KERNEL_DIR}", "-o", cubin, source],
            capture_output=True, text=True, check=True,
        )
        sass = subprocess.run(
            [cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    functions = parse_functions(sass)
    kernels = {name: code for name, code in functions.items() if prefix in name}
    if len(kernels) != len(names):
        raise RuntimeError(f"expected {len(names)} {prefix} kernels in the SASS, found {len(kernels)}")
    return kernels


def wgmma_sass(nvcc: str, cuobjdump: str) -> dict[str, list[Instruction]]:
    """Every declared wgmma attention specialization, compiled for sm_90a and disassembled."""
    from pagedattn.backends.cupy.specializations import WGMMA_ARCH, WGMMA_MODULE

    return compiled_sass(nvcc, cuobjdump, WGMMA_MODULE, "paged_attention_wgmma", WGMMA_ARCH)


def decode_sass(nvcc: str, cuobjdump: str) -> dict[str, list[Instruction]]:
    """Every declared decode specialization, compiled for sm_90 and disassembled."""
    return compiled_sass(nvcc, cuobjdump, "paged_attention_decode", "paged_attention_decode", "sm_90")


def fp8_decode_head_dim(name: str) -> int | None:
    """head_dim of a mangled ``paged_attention_decode`` name with an fp8 cache, else None."""
    match = re.search(r"_tLi(\d+)ELi\d+E10fp8_e[45]m[23]_t", name)
    return int(match.group(1)) if match else None


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
    for name, instructions in decode_sass(*tools).items():
        head_dim = fp8_decode_head_dim(name)
        if head_dim is None:
            continue
        violations = fp8_decode_violations(instructions, head_dim)
        failed += bool(violations)
        print(f"{'FAIL' if violations else 'ok  '} {name}: float16 products, K and V converted in registers")
        for violation in violations:
            print(f"     {violation}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
