"""The block allocator (pagedattn.spec.allocator) and prefix caching (pagedattn.spec.prefix_cache).

Unit tests name one rule each; the rule-based state machine drives random add / append /
fork / free sequences against a shadow cache of token ids: whatever a sequence reads through
its block table must be the tokens it appended, and the allocator's invariants must hold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from pagedattn.errors import OutOfBlocksError, PagedAttentionError
from pagedattn.spec.allocator import BlockAllocator
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.prefix_cache import PrefixCache, block_hash, prefix_hashes

# -- fork, copy-on-write, slot mapping -----------------------------------------------


def test_append_returns_slot_block_times_block_size_plus_offset():
    alloc = BlockAllocator(8, 4)
    result = alloc.add_sequence(0, 6)
    table = alloc.block_table(0)
    expected = [table[p // 4] * 4 + p % 4 for p in range(6)]
    assert result.slot_mapping.tolist() == expected, (result.slot_mapping, table)
    assert result.slot_mapping.dtype == np.int64
    assert result.copies == []


def test_fork_shares_blocks_without_taking_any():
    alloc = BlockAllocator(8, 4)
    alloc.add_sequence(0, 6)
    free_before = alloc.num_free_blocks
    alloc.fork(0, 1)
    assert alloc.block_table(1) == alloc.block_table(0)
    assert alloc.num_free_blocks == free_before
    assert [alloc.refcount(b) for b in alloc.block_table(0)] == [2, 2]


def test_num_references_counts_what_every_table_would_hold_unshared():
    alloc = BlockAllocator(16, 4, prefix_caching=True)
    alloc.add_sequence(0, list(range(6)))  # 2 blocks
    alloc.fork(0, 1)
    alloc.fork(0, 2)
    assert (alloc.num_used_blocks, alloc.num_references) == (2, 6)
    alloc.append(1, [9])  # copy-on-write: 1's private copy of the partial block
    assert (alloc.num_used_blocks, alloc.num_references) == (3, 6)
    alloc.free(2)
    alloc.add_sequence(3, list(range(4)))  # its one full block from the prefix cache
    assert (alloc.num_used_blocks, alloc.num_references) == (3, 5)
    for seq in (0, 1, 3):
        alloc.free(seq)
    assert alloc.num_references == 0
    alloc.check_invariants()


def test_append_into_shared_partial_block_copies_it_first():
    alloc = BlockAllocator(8, 4)
    alloc.add_sequence(0, 6)  # blocks [a, b], b holds 2 of 4 slots
    alloc.fork(0, 1)
    a, b = alloc.block_table(0)
    result = alloc.append(1, 1)
    new_b = alloc.block_table(1)[1]
    assert result.copies == [(b, new_b)] and new_b != b
    assert result.slot_mapping.tolist() == [new_b * 4 + 2]
    assert alloc.block_table(1)[0] == a and alloc.refcount(a) == 2
    assert alloc.refcount(b) == 1 and alloc.refcount(new_b) == 1
    # the other owner now holds b alone: it appends in place, no copy
    again = alloc.append(0, 1)
    assert again.copies == [] and again.slot_mapping.tolist() == [b * 4 + 2]
    alloc.check_invariants()


def test_append_after_shared_full_block_copies_nothing():
    alloc = BlockAllocator(8, 4)
    alloc.add_sequence(0, 8)
    alloc.fork(0, 1)
    result = alloc.append(1, 1)
    assert result.copies == []
    assert alloc.block_table(1)[:2] == alloc.block_table(0)


def test_append_zero_tokens_to_shared_block_copies_nothing():
    alloc = BlockAllocator(8, 4)
    alloc.add_sequence(0, 3)
    alloc.fork(0, 1)
    result = alloc.append(1, 0)
    assert result.copies == [] and result.slot_mapping.shape == (0,)


# -- errors ---------------------------------------------------------------------------


def test_double_free_raises_naming_the_sequence():
    alloc = BlockAllocator(4, 4)
    alloc.add_sequence(3, 5)
    alloc.free(3)
    with pytest.raises(PagedAttentionError, match=r"seq_id: sequence 3 is not allocated"):
        alloc.free(3)
    assert alloc.num_free_blocks == 4


def test_exhaustion_raises_out_of_blocks_and_changes_nothing():
    alloc = BlockAllocator(4, 4)
    alloc.add_sequence(0, 10)  # 3 blocks
    alloc.fork(0, 1)
    before = alloc.state()
    with pytest.raises(OutOfBlocksError, match=r"needs 2 free blocks, 1 of 4 are free"):
        alloc.append(1, 3)  # copy-on-write of the partial block + one more block
    assert alloc.state() == before
    with pytest.raises(OutOfBlocksError):
        alloc.add_sequence(2, 5)
    assert alloc.state() == before and 2 not in alloc


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda a: a.add_sequence(0, 1), "seq_id"),  # exists
        (lambda a: a.append(9, 1), "seq_id"),
        (lambda a: a.append(0, -1), "tokens"),
        (lambda a: a.append(0, "abc"), "tokens"),
        (lambda a: a.fork(0, 0), "child_id"),
        (lambda a: a.fork(9, 1), "seq_id"),
        (lambda a: a.as_arrays(max_blocks_per_seq=0), "max_blocks_per_seq"),
        (lambda a: a.as_arrays([0], max_blocks_per_seq=1), "max_blocks_per_seq"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(call, argument):
    alloc = BlockAllocator(8, 2)
    alloc.add_sequence(0, 3)
    before = alloc.state()
    with pytest.raises(PagedAttentionError) as info:
        call(alloc)
    assert info.value.argument == argument, str(info.value)
    assert alloc.state() == before


def test_constructor_validates_sizes():
    with pytest.raises(PagedAttentionError, match="num_blocks"):
        BlockAllocator(0, 16)
    with pytest.raises(PagedAttentionError, match="block_size"):
        BlockAllocator(4, 0)


def test_prefix_caching_requires_token_ids():
    alloc = BlockAllocator(4, 2, prefix_caching=True)
    with pytest.raises(PagedAttentionError, match="token ids"):
        alloc.add_sequence(0, 3)


# -- array form -----------------------------------------------------------------------


def test_as_arrays_pads_with_minus_one_and_passes_check_paged_attention():
    alloc = BlockAllocator(16, 4)
    alloc.add_sequence(0, 9)
    alloc.add_sequence(1, 0)
    alloc.add_sequence(2, 4)
    tables, lens, ids = alloc.as_arrays()
    assert ids == [0, 1, 2]
    assert tables.dtype == np.int32 and lens.dtype == np.int32
    assert tables.shape == (3, 3)
    assert tables[0].tolist() == alloc.block_table(0)
    assert tables[1].tolist() == [-1, -1, -1]
    assert tables[2, 1:].tolist() == [-1, -1]
    assert lens.tolist() == [9, 0, 4]
    cache = np.zeros((16, 4, 1, 8), dtype=np.float32)
    query = np.zeros((3, 1, 8), dtype=np.float32)
    problem = check_paged_attention(query, cache, cache, tables, lens)
    assert problem.seq_lens.tolist() == [9, 0, 4]
    wide = alloc.as_arrays([2, 0], max_blocks_per_seq=5)
    assert wide.block_tables.shape == (2, 5) and wide.seq_lens.tolist() == [4, 9]


# -- prefix caching -----------------------------------------------------------------------


def test_block_hash_chains_the_prefix():
    assert block_hash(None, [1, 2]) == block_hash(None, [1, 2])
    assert block_hash(None, [1, 2]) != block_hash(None, [2, 1])
    first = block_hash(None, [1, 2])
    assert block_hash(first, [3, 4]) != block_hash(block_hash(None, [9, 9]), [3, 4])
    assert prefix_hashes([1, 2, 3, 4, 5], 2) == [first, block_hash(first, [3, 4])]


def test_prefix_cache_reuses_full_blocks_of_a_matching_prefix():
    alloc = BlockAllocator(16, 4, prefix_caching=True)
    system = list(range(100, 108))  # two full blocks
    alloc.add_sequence(0, [*system, 1, 2, 3])
    result = alloc.add_sequence(1, [*system, 7, 8])
    assert result.num_cached == 8
    assert result.slot_mapping[:8].tolist() == [-1] * 8
    assert alloc.block_table(1)[:2] == alloc.block_table(0)[:2]
    assert alloc.block_table(1)[2] != alloc.block_table(0)[2]
    assert [alloc.refcount(b) for b in alloc.block_table(1)[:2]] == [2, 2]
    other = alloc.add_sequence(2, [*system[:4], 0, 0, 0, 0])  # first block only
    assert other.num_cached == 4
    alloc.check_invariants()


def test_freed_cached_blocks_stay_cached_and_count_as_free():
    alloc = BlockAllocator(4, 2, prefix_caching=True)
    alloc.add_sequence(0, [1, 2, 3, 4])
    alloc.free(0)
    assert alloc.num_free_blocks == 4 and alloc.prefix_cache is not None
    assert alloc.prefix_cache.num_parked == 2
    result = alloc.add_sequence(1, [1, 2, 3, 4, 5])
    assert result.num_cached == 4 and alloc.prefix_cache.num_parked == 0
    alloc.check_invariants()


def test_eviction_takes_never_cached_blocks_first_then_least_recently_used():
    alloc = BlockAllocator(4, 1, prefix_caching=True)
    alloc.add_sequence(0, [10])
    alloc.add_sequence(1, [20])
    first, second = alloc.block_table(0)[0], alloc.block_table(1)[0]
    alloc.free(0)  # parked first: least recently used
    alloc.free(1)
    alloc.add_sequence(2, [30, 31])  # the two never-cached blocks
    assert alloc.prefix_cache is not None and alloc.prefix_cache.num_parked == 2
    alloc.add_sequence(3, [40])  # must evict: the oldest parked, seq 0's block
    assert alloc.block_table(3) == [first]
    assert alloc.add_sequence(4, [10]).num_cached == 0  # evicted: a miss
    assert alloc.block_table(4) == [second]  # took the last parked block
    alloc.check_invariants()


def test_duplicate_full_block_is_not_cached_twice():
    alloc = BlockAllocator(8, 2, prefix_caching=True)
    alloc.add_sequence(0, [5])
    alloc.add_sequence(1, [5])
    alloc.append(0, [6])
    alloc.append(1, [6])  # same hash as seq 0's block: stays uncached
    cache = alloc.prefix_cache
    assert cache is not None and len(cache) == 1
    alloc.free(1)
    assert cache.num_parked == 0 and alloc.num_free_blocks == 7
    alloc.check_invariants()


def test_prefix_cache_counts_queries_and_hits():
    cache = PrefixCache()
    cache.record_lookups(4, 3)
    assert (cache.queries, cache.hits) == (4, 3)


# -- the state machine ------------------------------------------------------------------

VOCAB = st.integers(0, 3)  # few token ids: prefixes repeat, the cache gets hits


class AllocatorMachine(RuleBasedStateMachine):
    """Random add / append / fork / free against a shadow cache of token ids."""

    seqs = Bundle("seqs")

    @initialize(
        num_blocks=st.integers(1, 12),
        block_size=st.sampled_from([1, 2, 3, 4, 16]),
        prefix_caching=st.booleans(),
    )
    def setup(self, num_blocks, block_size, prefix_caching):
        self.alloc = BlockAllocator(num_blocks, block_size, prefix_caching=prefix_caching)
        self.B = block_size
        self.shadow = np.full(num_blocks * block_size, -1, dtype=np.int64)  # token id per slot
        self.tokens: dict[int, list[int]] = {}  # what each live sequence appended
        self.next_id = 0

    def _apply(self, seq_id, token_ids, result):
        """Make the copies, then write; check each slot is (table[p // B], p % B), exclusive."""
        for src, dst in result.copies:
            B = self.B
            self.shadow[dst * B : (dst + 1) * B] = self.shadow[src * B : (src + 1) * B]
        table = self.alloc.block_table(seq_id)
        start = self.alloc.seq_len(seq_id) - len(token_ids)
        written = []
        for j, slot in enumerate(result.slot_mapping.tolist()):
            p = start + j
            if slot < 0:
                assert j < result.num_cached, f"slot -1 for token {j} past the cached prefix"
                continue
            block, offset = divmod(slot, self.B)
            assert (block, offset) == (table[p // self.B], p % self.B), (seq_id, p, slot, table)
            assert self.alloc.refcount(block) == 1, f"write into block {block} held by others"
            written.append(slot)
            self.shadow[slot] = token_ids[j]
        assert len(set(written)) == len(written), f"a slot returned twice: {written}"

    def _call(self, operation):
        """Run ``operation``; on OutOfBlocksError check that nothing changed and return None."""
        before = self.alloc.state()
        try:
            return operation()
        except OutOfBlocksError:
            assert self.alloc.state() == before, "OutOfBlocksError changed the allocator"
            return None

    @rule(target=seqs, token_ids=st.lists(VOCAB, max_size=12))
    def add(self, token_ids):
        seq_id, self.next_id = self.next_id, self.next_id + 1
        tokens = token_ids if self.alloc.prefix_caching else len(token_ids)
        needed = self.alloc.blocks_needed_to_add(tokens)
        result = self._call(lambda: self.alloc.add_sequence(seq_id, tokens))
        if result is None:
            assert needed > self.alloc.num_free_blocks
            return multiple()  # no sequence added
        self.tokens[seq_id] = list(token_ids)
        self._apply(seq_id, token_ids, result)
        return seq_id

    @rule(seq=seqs, token_ids=st.lists(VOCAB, max_size=6))
    def append(self, seq, token_ids):
        assume(seq in self.tokens)
        tokens = token_ids if self.alloc.prefix_caching else len(token_ids)
        needed = self.alloc.blocks_needed(seq, len(token_ids))
        result = self._call(lambda: self.alloc.append(seq, tokens))
        if result is None:
            assert needed > self.alloc.num_free_blocks
            return
        self.tokens[seq].extend(token_ids)
        self._apply(seq, token_ids, result)

    @rule(target=seqs, seq=seqs)
    def fork(self, seq):
        assume(seq in self.tokens)
        child, self.next_id = self.next_id, self.next_id + 1
        free_before = self.alloc.num_free_blocks
        self.alloc.fork(seq, child)
        assert self.alloc.num_free_blocks == free_before
        self.tokens[child] = list(self.tokens[seq])
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        assume(seq in self.tokens)
        self.alloc.free(seq)
        del self.tokens[seq]
        with pytest.raises(PagedAttentionError, match="not allocated"):
            self.alloc.free(seq)

    @invariant()
    def allocator_invariants_hold(self):
        if hasattr(self, "alloc"):
            self.alloc.check_invariants()

    @invariant()
    def every_sequence_reads_back_its_tokens(self):
        if not hasattr(self, "alloc"):
            return
        owners: dict[int, set[int]] = {}
        for seq_id, expected in self.tokens.items():
            table = self.alloc.block_table(seq_id)
            slots = [table[p // self.B] * self.B + p % self.B for p in range(len(expected))]
            got = self.shadow[slots].tolist()
            assert got == expected, f"sequence {seq_id} reads {got}, appended {expected}"
            for p, slot in enumerate(slots):
                owners.setdefault(slot, set()).add(p)
        shared_positions = {slot: ps for slot, ps in owners.items() if len(ps) > 1}
        assert not shared_positions, f"one slot holds several positions: {shared_positions}"

    def teardown(self):
        if not hasattr(self, "alloc"):
            return
        for seq_id in list(self.tokens):
            self.alloc.free(seq_id)
        assert all(self.alloc.refcount(b) == 0 for b in range(self.alloc.num_blocks))
        assert self.alloc.num_free_blocks == self.alloc.num_blocks
        assert self.alloc.num_stored_tokens == 0
        self.alloc.check_invariants()


AllocatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase
