"""The block allocator: a fixed pool of physical blocks, reference counts, and block tables.

``num_blocks`` physical blocks of ``block_size`` slots each; slot ``= block * block_size +
offset``. Each sequence owns a block table, the list of physical blocks holding its logical
positions ``p = 0 … L-1`` (position ``p`` in ``table[p // block_size]``, offset ``p %
block_size``; see :mod:`pagedattn.spec.arrays`). A block may be held by several sequences
(``fork`` for beam search and parallel sampling, prefix caching across requests); its
reference count is the number of (sequence, table column) entries that name it.

Rules:

- ``append`` returns the slot of every new token (the ``slot_mapping`` of ``write_kv``) and
  the block copies ``(src, dst)`` the caller must make with ``copy_blocks`` first: a sequence
  that appends into a shared, partly filled last block gets a private copy of it
  (copy-on-write). Full shared blocks are never written, so never copied.
- When a request needs more blocks than are free, :class:`~pagedattn.errors.OutOfBlocksError`
  is raised and nothing changes. Freeing a sequence twice raises
  :class:`~pagedattn.errors.PagedAttentionError`.
- With ``prefix_caching=True`` every block that fills up is cached under the hash of its
  tokens and its prefix (:mod:`pagedattn.spec.prefix_cache`); ``add_sequence`` reuses the
  cached blocks of the longest matching prefix. A cached block nobody holds stays cached,
  counts as free, and is evicted (least recently used first) only when no never-cached
  block is left.

This is a spec: plain Python, every operation checks its arguments first, and
:meth:`BlockAllocator.check_invariants` states what must always hold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from pagedattn.errors import OutOfBlocksError, PagedAttentionError
from pagedattn.spec.prefix_cache import BlockHash, PrefixCache, block_hash

Tokens = int | Sequence[int]


class AppendResult(NamedTuple):
    """What the caller must do after ``append`` / ``add_sequence``.

    slot_mapping: int64 ``[num_tokens]``, the slot of each new token (``-1``: already in the
    cache through prefix caching, nothing to write); copies: ``(src, dst)`` block pairs to
    copy with ``copy_blocks`` *before* writing; num_cached: tokens found in the prefix cache.
    """

    slot_mapping: np.ndarray
    copies: list[tuple[int, int]]
    num_cached: int = 0


class BlockTableArrays(NamedTuple):
    """The array form: block_tables int32 ``[num_seqs, max_blocks_per_seq]`` padded with -1,
    seq_lens int32 ``[num_seqs]``; rows in the order of ``seq_ids``."""

    block_tables: np.ndarray
    seq_lens: np.ndarray
    seq_ids: list[int]


@dataclass
class _Sequence:
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    # prefix caching only: hash of the last full block, token ids of the partial last block
    last_hash: BlockHash | None = None
    partial: list[int] = field(default_factory=list)


def _check_int(value: Any, argument: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise PagedAttentionError(argument, f"expected an integer >= {minimum}, received {value!r}")
    return int(value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockAllocator:
    """Physical blocks and the block tables of live sequences (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False) -> None:
        self.num_blocks = _check_int(num_blocks, "num_blocks", 1)
        self.block_size = _check_int(block_size, "block_size", 1)
        self._refcount = [0] * self.num_blocks
        self._fill = [0] * self.num_blocks  # slots written in each block
        self._free: deque[int] = deque(range(self.num_blocks))  # never-cached free blocks
        self._seqs: dict[int, _Sequence] = {}
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix_caching else None
        self.num_stored_tokens = 0  # sum of fills over held blocks: token state, shared once
        self.num_copies = 0  # copy-on-write block copies made so far
        self.num_references = 0  # sum of refcounts: the blocks every table would hold unshared

    # -- queries -----------------------------------------------------------------
    @property
    def prefix_caching(self) -> bool:
        return self.prefix_cache is not None

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: never-cached free ones plus parked cached ones."""
        parked = self.prefix_cache.num_parked if self.prefix_cache is not None else 0
        return len(self._free) + parked

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def seq_ids(self) -> list[int]:
        """Live sequences, in the order they were added."""
        return list(self._seqs)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def refcount(self, block: int) -> int:
        """Number of (sequence, table column) entries naming ``block`` (``0 <= block < num_blocks``)."""
        if isinstance(block, bool) or not isinstance(block, int | np.integer) or not 0 <= block < self.num_blocks:
            raise PagedAttentionError("block", f"expected a block id in [0, num_blocks={self.num_blocks}),"
                                               f" received {block!r}")
        return self._refcount[int(block)]

    def seq_len(self, seq_id: int) -> int:
        """Tokens of ``seq_id`` in the cache (its ``L``)."""
        return self._seq(seq_id).length

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of ``seq_id``'s block table (``ceil(L / block_size)`` physical blocks)."""
        return list(self._seq(seq_id).blocks)

    def room(self, seq_id: int) -> int:
        """Tokens ``seq_id`` can append with no new block and no copy (0: last block shared)."""
        seq = self._seq(seq_id)
        if not seq.blocks or self._refcount[seq.blocks[-1]] > 1:
            return 0
        return len(seq.blocks) * self.block_size - seq.length

    def blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """Free blocks ``append(seq_id, num_tokens)`` would take (copy-on-write included)."""
        seq = self._seq(seq_id)
        return self._blocks_for_append(seq, _check_int(num_tokens, "num_tokens", 0))

    def blocks_needed_to_add(self, tokens: Tokens) -> int:
        """Free blocks ``add_sequence(_, tokens)`` would take (hits on parked blocks count)."""
        count, token_ids = self._tokens(tokens)
        hits = self._cache_hits(token_ids) if token_ids is not None else []
        return self._blocks_for_add(count, hits)

    # -- operations ------------------------------------------------------------------
    def add_sequence(self, seq_id: int, tokens: Tokens = 0) -> AppendResult:
        """Create sequence ``seq_id`` holding ``tokens`` (a count, or token ids).

        With prefix caching (token ids required), the longest prefix of full blocks already
        cached is shared, not stored again: those tokens get slot ``-1`` in the returned
        ``slot_mapping`` and are counted in ``num_cached``. Raises OutOfBlocksError (nothing
        changed) when the rest does not fit.
        """
        if isinstance(seq_id, bool) or not isinstance(seq_id, int | np.integer):
            raise PagedAttentionError("seq_id", f"expected an int, received {seq_id!r}")
        if seq_id in self._seqs:
            raise PagedAttentionError("seq_id", f"sequence {seq_id} already exists")
        count, token_ids = self._tokens(tokens)
        hits = self._cache_hits(token_ids) if token_ids is not None else []
        needed = self._blocks_for_add(count, hits)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(
                "tokens",
                f"adding sequence {seq_id} with {count} tokens needs {needed} free blocks"
                f" ({len(hits)} found in the prefix cache), {self.num_free_blocks} of"
                f" {self.num_blocks} are free",
            )
        seq = _Sequence()
        self._seqs[int(seq_id)] = seq
        num_cached = len(hits) * self.block_size
        if self.prefix_cache is not None and token_ids is not None:
            self.prefix_cache.record_lookups(count // self.block_size, len(hits))
            for block in hits:
                self._hold(block)
                seq.blocks.append(block)
                seq.last_hash = self.prefix_cache.hash_of(block)
            seq.length = num_cached
        rest = None if token_ids is None else token_ids[num_cached:]
        slots = self._write(seq, count - num_cached, rest)
        mapping = np.concatenate([np.full(num_cached, -1, dtype=np.int64), slots])
        return AppendResult(mapping, [], num_cached)

    def append(self, seq_id: int, tokens: Tokens) -> AppendResult:
        """Append ``tokens`` (a count, or token ids: required with prefix caching) to ``seq_id``.

        Returns the new tokens' slots and the copy-on-write block copies to make first.
        Raises OutOfBlocksError (nothing changed) if the free blocks do not suffice.
        """
        seq = self._seq(seq_id)
        count, token_ids = self._tokens(tokens)
        needed = self._blocks_for_append(seq, count)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(
                "tokens",
                f"appending {count} tokens to sequence {seq_id} (seq_len {seq.length}) needs"
                f" {needed} free blocks, {self.num_free_blocks} of {self.num_blocks} are free",
            )
        copies: list[tuple[int, int]] = []
        if count and seq.length % self.block_size and self._refcount[seq.blocks[-1]] > 1:
            src = seq.blocks[-1]
            dst = self._take()
            self._fill[dst] = self._fill[src]
            self.num_stored_tokens += self._fill[dst]
            self._release(src)
            seq.blocks[-1] = dst
            copies.append((src, dst))
            self.num_copies += 1
        slots = self._write(seq, count, token_ids)
        return AppendResult(slots, copies, 0)

    def fork(self, parent_id: int, child_id: int) -> None:
        """Create ``child_id`` sharing every block of ``parent_id`` (no block is taken)."""
        parent = self._seq(parent_id)
        if isinstance(child_id, bool) or not isinstance(child_id, int | np.integer):
            raise PagedAttentionError("child_id", f"expected an int, received {child_id!r}")
        if child_id in self._seqs:
            raise PagedAttentionError("child_id", f"sequence {child_id} already exists")
        refcount = self._refcount
        for block in parent.blocks:  # held by the parent, so never parked: just count
            refcount[block] += 1
        self.num_references += len(parent.blocks)
        self._seqs[int(child_id)] = _Sequence(
            list(parent.blocks), parent.length, parent.last_hash, list(parent.partial)
        )

    def free(self, seq_id: int) -> None:
        """Release every block of ``seq_id`` and forget it; freeing it again raises."""
        if seq_id not in self._seqs:
            raise PagedAttentionError(
                "seq_id", f"sequence {seq_id} is not allocated (already freed, or never added)"
            )
        seq = self._seqs.pop(seq_id)
        refcount = self._refcount
        for block in reversed(seq.blocks):  # tail first: the LRU keeps a prefix's head longest
            if refcount[block] > 1:  # still held by another sequence
                refcount[block] -= 1
                self.num_references -= 1
            else:
                self._release(block)

    # -- array form ------------------------------------------------------------------
    def as_arrays(
        self, seq_ids: Iterable[int] | None = None, *, max_blocks_per_seq: int | None = None
    ) -> BlockTableArrays:
        """Return block_tables int32 ``[num_seqs, max_blocks_per_seq]`` (-1 past each sequence's
        blocks) and seq_lens int32 ``[num_seqs]`` for ``seq_ids`` (default: all live ones)."""
        ids = list(self._seqs) if seq_ids is None else [int(s) for s in seq_ids]
        seqs = [self._seq(s) for s in ids]
        widest = max((len(s.blocks) for s in seqs), default=0)
        width = max(widest, 1) if max_blocks_per_seq is None else _check_int(
            max_blocks_per_seq, "max_blocks_per_seq", 1
        )
        if widest > width:
            raise PagedAttentionError(
                "max_blocks_per_seq",
                f"{width} is less than the {widest} blocks of the longest sequence",
            )
        tables = np.full((len(ids), width), -1, dtype=np.int32)
        for row, seq in enumerate(seqs):
            tables[row, : len(seq.blocks)] = seq.blocks
        lens = np.array([s.length for s in seqs], dtype=np.int32)
        return BlockTableArrays(tables, lens, ids)

    # -- invariants ------------------------------------------------------------------
    def state(self) -> tuple[Any, ...]:
        """A comparable snapshot of everything the allocator holds ("nothing changed" checks)."""
        cache = self.prefix_cache
        seqs = tuple(
            (k, tuple(s.blocks), s.length, s.last_hash, tuple(s.partial))
            for k, s in self._seqs.items()
        )
        cached = None
        if cache is not None:
            cached = (tuple(sorted(cache.cached_blocks().items())), tuple(cache.parked_blocks()))
        return (
            tuple(self._refcount),
            tuple(self._fill),
            tuple(self._free),
            seqs,
            cached,
            self.num_stored_tokens,
            self.num_copies,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant.

        refcount == number of owners; a block is free, parked or held, exactly one of
        them; each table has ``ceil(L / block_size)`` distinct blocks; every owner of a block
        agrees on how many of its slots are filled; num_stored_tokens is their sum; cached
        blocks are full.
        """
        B = self.block_size
        owners = [0] * self.num_blocks
        fill_seen: dict[int, int] = {}
        for seq_id, seq in self._seqs.items():
            assert len(seq.blocks) == _ceil_div(seq.length, B), (
                f"sequence {seq_id}: {len(seq.blocks)} blocks for seq_len {seq.length},"
                f" block_size {B}"
            )
            assert len(set(seq.blocks)) == len(seq.blocks), (
                f"sequence {seq_id} names a block twice: {seq.blocks}"
            )
            for column, block in enumerate(seq.blocks):
                owners[block] += 1
                filled = min(B, seq.length - column * B)
                assert fill_seen.setdefault(block, filled) == filled, (
                    f"block {block}: sequence {seq_id} has {filled} slots filled,"
                    f" another owner {fill_seen[block]}"
                )
        for block in range(self.num_blocks):
            assert self._refcount[block] == owners[block], (
                f"block {block}: refcount {self._refcount[block]} but {owners[block]} owners"
            )
        free = list(self._free)
        assert len(set(free)) == len(free), f"free list holds a block twice: {free}"
        parked = set(self.prefix_cache.parked_blocks()) if self.prefix_cache is not None else set()
        held = {b for b in range(self.num_blocks) if owners[b] > 0}
        assert not (set(free) & parked), f"blocks both free and parked: {set(free) & parked}"
        on_lists = held & (set(free) | parked)
        assert not on_lists, f"held blocks on a free list: {on_lists}"
        assert len(free) + len(parked) + len(held) == self.num_blocks, (
            f"{len(free)} free + {len(parked)} parked + {len(held)} held"
            f" != {self.num_blocks} blocks"
        )
        for block in held:
            assert self._fill[block] == fill_seen[block], (
                f"block {block}: fill {self._fill[block]}, owners say {fill_seen[block]}"
            )
        assert self.num_references == sum(owners), (
            f"num_references {self.num_references} != {sum(owners)} table entries"
        )
        stored = sum(self._fill[b] for b in held)
        assert self.num_stored_tokens == stored, (
            f"num_stored_tokens {self.num_stored_tokens} != {stored}"
        )
        if self.prefix_cache is not None:
            for block in self.prefix_cache.cached_blocks():
                assert self._fill[block] == B, (
                    f"cached block {block} is not full ({self._fill[block]}/{B})"
                )
            for block in parked:
                assert self.prefix_cache.hash_of(block) is not None, (
                    f"parked block {block} is not cached"
                )

    # -- internals ------------------------------------------------------------------
    def _seq(self, seq_id: int) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise PagedAttentionError("seq_id", f"sequence {seq_id!r} is not allocated") from None

    def _tokens(self, tokens: Tokens) -> tuple[int, list[int] | None]:
        """Split ``tokens`` into (count, token ids or None); prefix caching requires ids."""
        if isinstance(tokens, int | np.integer) and not isinstance(tokens, bool):
            if self.prefix_cache is not None:
                raise PagedAttentionError(
                    "tokens", f"prefix caching needs token ids, received a count ({tokens})"
                )
            return _check_int(tokens, "tokens", 0), None
        try:
            token_ids = [int(t) for t in tokens]  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise PagedAttentionError(
                "tokens", f"expected a count or a sequence of token ids, received {tokens!r}"
            ) from None
        return len(token_ids), token_ids

    def _cache_hits(self, token_ids: Sequence[int]) -> list[int]:
        """Cached blocks of the longest prefix of full blocks of ``token_ids``."""
        if self.prefix_cache is None:
            return []
        hits: list[int] = []
        parent: BlockHash | None = None
        B = self.block_size
        for start in range(0, len(token_ids) - B + 1, B):
            parent = block_hash(parent, token_ids[start : start + B])
            block = self.prefix_cache.lookup(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def _blocks_for_add(self, count: int, hits: list[int]) -> int:
        parked = sum(1 for b in hits if self._refcount[b] == 0)  # taken back from the free count
        return _ceil_div(count, self.block_size) - len(hits) + parked

    def _blocks_for_append(self, seq: _Sequence, count: int) -> int:
        B = self.block_size
        new = _ceil_div(seq.length + count, B) - _ceil_div(seq.length, B)
        cow = count > 0 and seq.length % B != 0 and self._refcount[seq.blocks[-1]] > 1
        return new + int(cow)

    def _take(self) -> int:
        """A free block, refcount 1, empty: never-cached first, else evict the LRU parked one."""
        if self._free:
            block = self._free.popleft()
        else:
            assert self.prefix_cache is not None and self.prefix_cache.num_parked, "no free block"
            block = self.prefix_cache.evict()
        self._refcount[block] = 1
        self._fill[block] = 0
        self.num_references += 1
        return block

    def _hold(self, block: int) -> None:
        """One more owner of ``block`` (a parked cached block is taken back)."""
        if self._refcount[block] == 0:
            assert self.prefix_cache is not None and self.prefix_cache.is_parked(block)
            self.prefix_cache.unpark(block)
            self.num_stored_tokens += self._fill[block]
        self._refcount[block] += 1
        self.num_references += 1

    def _release(self, block: int) -> None:
        """One owner less; at zero the block is parked if cached, else returned to the free list."""
        if self._refcount[block] <= 0:
            raise PagedAttentionError(
                "block", f"block {block} released with refcount {self._refcount[block]}"
            )
        self._refcount[block] -= 1
        self.num_references -= 1
        if self._refcount[block]:
            return
        self.num_stored_tokens -= self._fill[block]
        if self.prefix_cache is not None and self.prefix_cache.hash_of(block) is not None:
            self.prefix_cache.park(block)
        else:
            self._fill[block] = 0
            self._free.append(block)

    def _write(self, seq: _Sequence, count: int, token_ids: Sequence[int] | None) -> np.ndarray:
        """Place ``count`` tokens after ``seq``'s last, taking blocks as needed; return slots."""
        B = self.block_size
        slots = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            offset = seq.length % B
            if offset == 0:
                seq.blocks.append(self._take())
            block = seq.blocks[-1]
            n = min(B - offset, count - done)
            slots[done : done + n] = block * B + offset + np.arange(n)
            self._fill[block] += n
            self.num_stored_tokens += n
            seq.length += n
            if self.prefix_cache is not None and token_ids is not None:
                seq.partial.extend(token_ids[done : done + n])
                if len(seq.partial) == B:
                    seq.last_hash = block_hash(seq.last_hash, seq.partial)
                    self.prefix_cache.insert(seq.last_hash, block)
                    seq.partial = []
            done += n
        return slots
