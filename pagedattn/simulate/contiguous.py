"""Contiguous preallocation: each sequence reserves its maximum length in one range.

The KV memory is one flat address space of ``capacity`` token slots. A request admitted
reserves, for each of its ``n`` samples, one range of ``prompt_len + max_tokens`` slots
(``reserve="max"``, what a server must do when it cannot know the output length), or of
its true final length (``reserve="oracle"``), found first fit. So both kinds of waste
show: *internal* fragmentation (reserved slots not holding tokens: the part the sequence
will still fill and the part it never will) and *external* fragmentation (free slots
between ranges, too small for the next request). Requests are admitted first come first
served; a range never grows, so nothing is ever preempted. A beam-search request reserves
one range per beam (the beams' caches are reordered in place, which this scheme does not
count).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from pagedattn.errors import PagedAttentionError
from pagedattn.simulate.meter import Meter, Summary, summarize
from pagedattn.simulate.workload import Request


class FlatSpace:
    """Free ranges of a flat address space, first fit; adjacent free ranges are merged."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._starts: list[int] = [0]  # sorted starts of free ranges
        self._sizes: list[int] = [capacity]
        self.free = capacity

    def allocate(self, size: int) -> int | None:
        """Return the start of the first free range of ``size`` slots (now reserved), or None."""
        for i, hole in enumerate(self._sizes):
            if hole >= size:
                start = self._starts[i]
                if hole == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += size
                    self._sizes[i] -= size
                self.free -= size
                return start
        return None

    def release(self, start: int, size: int) -> None:
        """Return ``[start, start + size)`` to the free ranges, merging with its neighbours."""
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and start + size > self._starts[i]:
            raise PagedAttentionError(
                "start", f"range [{start}, {start + size}) overlaps a free range"
            )
        if i and self._starts[i - 1] + self._sizes[i - 1] > start:
            raise PagedAttentionError(
                "start", f"range [{start}, {start + size}) overlaps a free range"
            )
        self.free += size
        if i < len(self._starts) and start + size == self._starts[i]:  # merge right
            size += self._sizes[i]
            del self._starts[i], self._sizes[i]
        if i and self._starts[i - 1] + self._sizes[i - 1] == start:  # merge left
            self._sizes[i - 1] += size
            return
        self._starts.insert(i, start)
        self._sizes.insert(i, size)

    @property
    def largest(self) -> int:
        return max(self._sizes, default=0)

    def ranges(self) -> list[tuple[int, int]]:
        """Free ranges as (start, size), in address order."""
        return list(zip(self._starts, self._sizes, strict=True))


@dataclass
class _Sample:
    start: int
    size: int
    length: int
    final: int


def simulate_contiguous(
    requests: list[Request], capacity: int, *, reserve: str = "max", max_steps: int = 1_000_000
) -> tuple[Summary, Meter]:
    """Replay ``requests`` on ``capacity`` token slots with contiguous preallocation.

    Each step: running samples decode one token; finished ones release their range;
    waiting requests are admitted first come first served while their ranges fit.
    """
    if reserve not in ("max", "oracle"):
        raise PagedAttentionError("reserve", f"expected 'max' or 'oracle', received {reserve!r}")
    space = FlatSpace(capacity)
    meter = Meter(capacity)
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    waiting: deque[Request] = deque()
    running: list[list[_Sample]] = []
    completed = rejected = 0
    step = 0
    while (pending or waiting or running) and step < max_steps:
        while pending and pending[0].arrival <= step:
            waiting.append(pending.popleft())
        still = []
        for samples in running:  # decode one token of every sample
            alive = []
            for sample in samples:
                sample.length += 1
                if sample.length >= sample.final:
                    space.release(sample.start, sample.size)
                else:
                    alive.append(sample)
            if alive:
                still.append(alive)
            else:
                completed += 1
        running = still
        while waiting:  # admit, first come first served
            request = waiting[0]
            outputs = request.output_lens
            if request.beam_width > 1:
                outputs = outputs[:1] * request.beam_width
            sizes = [
                request.prompt_len + (request.max_tokens if reserve == "max" else out)
                for out in outputs
            ]
            if sum(sizes) > capacity:
                waiting.popleft()
                rejected += 1
                continue
            starts: list[int] = []
            for size in sizes:
                start = space.allocate(size)
                if start is None:
                    break
                starts.append(start)
            if len(starts) < len(sizes):
                for start, size in zip(starts, sizes, strict=False):
                    space.release(start, size)
                break
            waiting.popleft()
            running.append(
                [
                    _Sample(start, size, request.prompt_len, request.prompt_len + out)
                    for start, size, out in zip(starts, sizes, outputs, strict=True)
                ]
            )
        stored = sum(s.length for samples in running for s in samples)
        reserved = capacity - space.free
        meter.record(
            stored=stored,
            reserved=reserved,
            external=space.free - space.largest,
            running=len(running),
            waiting=len(waiting),
        )
        step += 1
    name = "contiguous" if reserve == "max" else "contiguous (oracle)"
    return summarize(meter, name, completed=completed, rejected=rejected, preempted=0), meter
