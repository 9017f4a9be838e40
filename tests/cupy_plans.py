"""The kernel and work plan a cupy backend built with given options makes, for the host-side
planning tests (``sm90``: planned as on an H100/H200, on any machine)."""

from __future__ import annotations

from typing import Any

from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.planning import KernelChoice, WorkPlan, build_work, choose_kernel
from pagedattn.spec.arrays import AttentionProblem


def kernel_of(problem: AttentionProblem, *, sm90: bool = False, **options: Any) -> KernelChoice:
    """The kernel ``CupyBackend(**options)`` picks for ``problem``."""
    return choose_kernel(problem, CupyOptions(**options), sm90=sm90)


def rows_of(problem: AttentionProblem, *, sm90: bool = False, **options: Any) -> int:
    """Rows per CTA of that kernel."""
    return kernel_of(problem, sm90=sm90, **options).rows


def work_of(problem: AttentionProblem, *, sm90: bool = False, slots: int = 132, min_tiles_per_split: int = 4,
            **options: Any) -> WorkPlan:
    """The work plan of ``CupyBackend(**options)`` for ``slots`` resident CTAs."""
    choice = kernel_of(problem, sm90=sm90, **options)
    split_kv = options.get("split_kv", True)
    return build_work(problem, choice, slots=slots, min_tiles_per_split=min_tiles_per_split, split_kv=split_kv,
                      num_splits=options.get("num_splits") or None)
