"""Paging: the same workload through the spec's :class:`~pagedattn.spec.allocator.BlockAllocator`.

``capacity // block_size`` blocks. A request is admitted (first come first served) when
its prompt's blocks fit with a 1% watermark left for decoding; with prefix caching the
cached blocks of its system prompt are shared, not stored again. Its ``n`` samples are
forks of the prompt (shared blocks, copy-on-write of the last partial one). Each step
every running sample appends one token; when no block is free the youngest running
request is preempted: its blocks are freed and it goes back to the head of the queue,
to start again (recomputation).

Appends that land inside a sample's own last block need no allocator call: they are
counted as ``pending`` and handed to the allocator at the next block boundary (the same
blocks result; the simulation just makes fewer calls).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pagedattn.errors import OutOfBlocksError, PagedAttentionError
from pagedattn.simulate.meter import Meter, Summary, summarize
from pagedattn.simulate.workload import Request, TokenIds
from pagedattn.spec.allocator import BlockAllocator


@dataclass(eq=False)
class _Sample:
    seq_id: int
    output_len: int
    generated: int = 0
    pending: int = 0  # tokens appended but not yet given to the allocator
    room: int = 0  # tokens that still fit in place in its own last block


@dataclass(eq=False)
class _Running:
    request: Request
    order: int  # admission order; the largest is the youngest
    samples: list[_Sample] = field(default_factory=list)
    alive: bool = True  # False once preempted or finished
    remaining: int = 0  # samples still generating


def simulate_paged(
    requests: list[Request],
    capacity: int,
    *,
    block_size: int,
    prefix_caching: bool = False,
    watermark: float = 0.01,
    max_steps: int = 1_000_000,
    check_invariants: bool = False,
) -> tuple[Summary, Meter]:
    """Replay ``requests`` on ``capacity`` token slots cut into blocks of ``block_size``.

    ``check_invariants=True`` checks the allocator's invariants after every step (slow; tests).
    """
    num_blocks = capacity // block_size
    if num_blocks < 1:
        raise PagedAttentionError("capacity", f"{capacity} tokens hold no block of {block_size}")
    alloc = BlockAllocator(num_blocks, block_size, prefix_caching=prefix_caching)
    ids = TokenIds()
    meter = Meter(num_blocks * block_size)
    watermark_blocks = int(watermark * num_blocks)
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    waiting: deque[Request] = deque()
    running: list[_Running] = []
    completed = rejected = preempted = 0
    prompt_tokens = cached_tokens = 0
    pending_total = 0  # sum of every sample's pending tokens
    next_seq = 0
    order = 0
    step = 0

    def preempt_youngest() -> None:
        nonlocal pending_total, preempted
        victim = running.pop()  # running is in admission order
        while not victim.alive:  # finished earlier in this step: just drop it
            victim = running.pop()
        for sample in victim.samples:
            if sample.generated < sample.output_len:  # finished samples are freed already
                alloc.free(sample.seq_id)
                pending_total -= sample.pending
        victim.alive = False
        waiting.appendleft(victim.request)
        preempted += 1

    def worst_case_blocks(r: Request) -> int:
        per_sample = -(-(r.prompt_len + r.max_tokens) // block_size)
        return per_sample * r.n

    while (pending or waiting or running) and step < max_steps:
        while pending and pending[0].arrival <= step:
            waiting.append(pending.popleft())
        # decode one token of every running sample, oldest request first
        for entry in list(running):
            if not entry.alive:  # preempted earlier in this step
                continue
            for sample in entry.samples:
                if sample.generated >= sample.output_len:
                    continue
                if sample.room > 0:
                    sample.room -= 1
                    sample.pending += 1
                    pending_total += 1
                else:
                    count = sample.pending + 1
                    tokens = ids.fresh(count) if prefix_caching else count
                    while entry.alive:
                        try:
                            alloc.append(sample.seq_id, tokens)
                            break
                        except OutOfBlocksError:
                            preempt_youngest()
                    if not entry.alive:
                        break
                    pending_total -= sample.pending
                    sample.pending = 0
                    sample.room = alloc.room(sample.seq_id)
                sample.generated += 1
                if sample.generated == sample.output_len:  # finished: free it now
                    alloc.free(sample.seq_id)
                    pending_total -= sample.pending
                    sample.pending = 0
                    entry.remaining -= 1
            if entry.alive and entry.remaining == 0:
                entry.alive = False
                completed += 1
        running = [entry for entry in running if entry.alive]
        # admit waiting requests, first come first served
        while waiting:
            request = waiting[0]
            if worst_case_blocks(request) > num_blocks:
                waiting.popleft()
                rejected += 1
                continue
            tokens = ids.prompt(request) if prefix_caching else request.prompt_len
            if alloc.blocks_needed_to_add(tokens) > alloc.num_free_blocks - watermark_blocks:
                break
            waiting.popleft()
            entry = _Running(request, order, remaining=request.n)
            order += 1
            first = next_seq
            result = alloc.add_sequence(first, tokens)
            prompt_tokens += request.prompt_len
            cached_tokens += result.num_cached
            for i, out in enumerate(request.output_lens):
                if i:
                    alloc.fork(first, next_seq)
                entry.samples.append(_Sample(next_seq, out))
                next_seq += 1
            for sample in entry.samples:
                sample.room = alloc.room(sample.seq_id)
            running.append(entry)
        meter.record(
            stored=alloc.num_stored_tokens + pending_total,
            reserved=alloc.num_used_blocks * block_size,
            external=0,
            running=len(running),
            waiting=len(waiting),
        )
        if check_invariants:
            alloc.check_invariants()
            live = sum(s.generated < s.output_len for e in running for s in e.samples)
            assert len(alloc.seq_ids) == live, f"{len(alloc.seq_ids)} sequences, {live} samples"
        step += 1
    if check_invariants:
        assert alloc.num_used_blocks == 0 or step >= max_steps, "blocks held after the last request"
    name = f"paged B={block_size}" + (" +prefix cache" if prefix_caching else "")
    return summarize(
        meter,
        name,
        completed=completed,
        rejected=rejected,
        preempted=preempted,
        cached_fraction=cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        copies=alloc.num_copies,
    ), meter
