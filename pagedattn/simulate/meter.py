"""What a simulation measures, step by step, and the summary ``pagedattn simulate`` prints.

Per step, in tokens of KV state (bytes = tokens * bytes per token): ``stored`` holds token
state (a shared block counted once), ``reserved`` is held by running requests (stored +
reserved-but-empty), ``external`` is free but outside the largest free range (contiguous
only: it cannot serve a request larger than that range), ``running`` counts requests,
``preempted`` the requests preempted in the step. Paging also records ``blocks`` held,
``references`` (the blocks every sequence's table names, a shared block once per table:
what the same sequences would hold if each had its own copy) and ``copies`` (block copies
made in the step: copy-on-write, or whole caches when forks copy).

Averages are taken over the *loaded* steps, those with a request waiting (memory is then
what limits the batch); if no request ever waited, over every step with one running.
Utilization is ``sum(stored) / sum(reserved)`` over those steps; fragmentation is a
share of the whole budget: internal ``(reserved - stored) / capacity``, external
``external / capacity``. (What sharing saves is reduced in :mod:`pagedattn.simulate.sharing`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Meter:
    """Step-by-step series of one simulation run."""

    capacity: int  # tokens of KV state the budget holds
    stored: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    external: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    references: list[int] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)

    def record(
        self,
        *,
        stored: int,
        reserved: int,
        external: int,
        running: int,
        waiting: int,
        preempted: int = 0,
        blocks: int = 0,
        references: int = 0,
        copies: int = 0,
    ) -> None:
        assert 0 <= stored <= reserved <= self.capacity, (stored, reserved, self.capacity)
        assert 0 <= external <= self.capacity - reserved, (external, reserved, self.capacity)
        self.stored.append(stored)
        self.reserved.append(reserved)
        self.external.append(external)
        self.running.append(running)
        self.waiting.append(waiting)
        self.preempted.append(preempted)
        self.blocks.append(blocks)
        self.references.append(references)
        self.copies.append(copies)


@dataclass(frozen=True)
class Summary:
    """One row of the report."""

    scheme: str
    utilization: float  # stored / reserved over loaded steps
    internal: float  # (reserved - stored) / capacity
    external: float  # external / capacity
    used: float  # stored / capacity
    peak_running: int
    mean_running: float
    completed: int
    rejected: int
    preempted: int
    steps: int
    cached_fraction: float = 0.0  # prompt tokens found in the prefix cache
    copies: int = 0  # block copies: copy-on-write, or whole caches when forks copy
    blocks_held: float = 0.0  # mean blocks held (paging)
    blocks_unshared: float = 0.0  # mean blocks the same sequences would hold unshared
    copies_per_step: float = 0.0  # mean block copies per step


def summarize(
    meter: Meter,
    scheme: str,
    *,
    completed: int,
    rejected: int,
    preempted: int,
    cached_fraction: float = 0.0,
    copies: int = 0,
) -> Summary:
    """Reduce a run's series to its :class:`Summary` (see the module docstring)."""
    stored = np.asarray(meter.stored, dtype=np.float64)
    reserved = np.asarray(meter.reserved, dtype=np.float64)
    running = np.asarray(meter.running, dtype=np.float64)
    loaded = np.asarray(meter.waiting) > 0
    if not loaded.any():
        loaded = running > 0
    if not loaded.any():
        loaded = np.ones_like(running, dtype=bool)
    total_reserved = reserved[loaded].sum()

    def mean(series: list[int]) -> float:
        return float(np.asarray(series, dtype=np.float64)[loaded].mean())

    capacity = float(meter.capacity)
    return Summary(
        scheme=scheme,
        utilization=float(stored[loaded].sum() / total_reserved) if total_reserved else 0.0,
        internal=float((reserved - stored)[loaded].mean() / capacity),
        external=float(np.asarray(meter.external, dtype=np.float64)[loaded].mean() / capacity),
        used=float(stored[loaded].mean() / capacity),
        peak_running=int(running.max(initial=0)),
        mean_running=float(running[loaded].mean()),
        completed=completed,
        rejected=rejected,
        preempted=preempted,
        steps=len(meter.running),
        cached_fraction=cached_fraction,
        copies=copies,
        blocks_held=mean(meter.blocks),
        blocks_unshared=mean(meter.references),
        copies_per_step=mean(meter.copies),
    )
