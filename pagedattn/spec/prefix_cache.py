"""Prefix caching: full blocks found again by a hash of their tokens and of the prefix before them.

A full block's hash chains the hash of the block before it (``None`` for the first block)
with the block's ``block_size`` token ids, so two sequences get the same hash for block
``i`` exactly when their first ``(i + 1) * block_size`` tokens agree. :class:`PrefixCache`
maps hashes to physical blocks. A cached block whose reference count drops to zero is not
forgotten: it is parked, least recently used first, and the allocator evicts it only when
it runs out of never-cached free blocks. A hit on a parked block takes it back.

The cache holds no reference counts; :class:`pagedattn.spec.allocator.BlockAllocator`
owns those and calls :meth:`PrefixCache.park` / :meth:`PrefixCache.unpark` /
:meth:`PrefixCache.evict`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BlockHash = bytes


def block_hash(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Return the 16-byte hash of a full block: ``blake2b(parent hash, token ids as int64)``."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent if parent is not None else b"\x00" * 16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Return the chained hashes of every full block of ``token_ids`` (a partial tail has none)."""
    hashes: list[BlockHash] = []
    parent: BlockHash | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Hash -> physical block for full blocks, and the LRU list of cached blocks nobody holds."""

    def __init__(self) -> None:
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self._parked: OrderedDict[int, None] = OrderedDict()  # refcount 0, oldest first
        self.queries = 0  # blocks looked up
        self.hits = 0  # blocks found

    def __len__(self) -> int:
        return len(self._block_of)

    @property
    def num_parked(self) -> int:
        """Cached blocks that no sequence holds (they count as free: evicted on demand)."""
        return len(self._parked)

    def lookup(self, h: BlockHash) -> int | None:
        """Return the block cached under ``h``, or None (does not count as a query)."""
        return self._block_of.get(h)

    def record_lookups(self, queries: int, hits: int) -> None:
        """Count ``queries`` block lookups of one admission, ``hits`` of them found."""
        self.queries += queries
        self.hits += hits

    def hash_of(self, block: int) -> BlockHash | None:
        """The hash ``block`` is cached under, or None if it is not cached."""
        return self._hash_of.get(block)

    def is_parked(self, block: int) -> bool:
        return block in self._parked

    def insert(self, h: BlockHash, block: int) -> bool:
        """Cache a just-filled ``block`` under ``h``; False (nothing changed) if ``h`` is cached."""
        if h in self._block_of or block in self._hash_of:
            return False
        self._block_of[h] = block
        self._hash_of[block] = h
        return True

    def park(self, block: int) -> None:
        """``block`` (cached) lost its last owner: keep it, as the most recently used."""
        self._parked[block] = None
        self._parked.move_to_end(block)

    def unpark(self, block: int) -> None:
        """A parked ``block`` was hit: it is held again and no longer evictable."""
        del self._parked[block]

    def evict(self) -> int:
        """Forget the least recently used parked block and return it (now a plain free block)."""
        block, _ = self._parked.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block

    def parked_blocks(self) -> list[int]:
        """Parked blocks, least recently used first."""
        return list(self._parked)

    def cached_blocks(self) -> dict[int, BlockHash]:
        """Every cached block and its hash (a copy)."""
        return dict(self._hash_of)
