"""A tiny inference-engine loop over any backend, checked against the spec after every step.

:class:`EngineLoop` keeps a paged KV cache on a backend and a :class:`BlockAllocator`
(with or without prefix caching). Requests are added (prefix-cache hits are not written
again), tokens appended (allocate, copy-on-write through ``backend.copy_blocks``, then
``backend.write_kv``), sequences forked for beam search or parallel sampling, finished and
freed; when the pool is exhausted the youngest other sequence is preempted (freed).

The K/V of a token is a fixed function of (token id, position), the way a model's K/V
depends on the token and its place, so a cached block is valid for any sequence whose
prefix matches. Each live sequence therefore has a *contiguous* K/V, built from its
tokens alone; :meth:`EngineLoop.check_attention` runs ``backend.paged_attention`` on the
paged cache and compares every sequence with :func:`pagedattn.spec.exact.exact_attention`
on that contiguous K/V, within :func:`pagedattn.spec.error_model.tolerance`.

:func:`make_engine_machine` wraps the loop in a hypothesis ``RuleBasedStateMachine``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pagedattn.backends.interface import Backend
from pagedattn.errors import OutOfBlocksError
from pagedattn.spec.allocator import AppendResult, BlockAllocator
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.error_model import tolerance
from pagedattn.spec.exact import exact_attention

#: the operations a backend must declare to run the engine loop
REQUIRED_OPERATIONS: tuple[str, ...] = ("write_kv", "copy_blocks")


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of the loop: small on purpose (CPU tests). ``max_seq_len`` bounds every sequence."""

    num_blocks: int = 12
    block_size: int = 4
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 8
    vocab_size: int = 4
    max_seq_len: int = 32
    prefix_caching: bool = True
    dtype: str = "float32"
    kv_layout: str = "NHD"


def unsupported_reason(backend: Backend, config: EngineConfig | None = None) -> str | None:
    """Why ``backend`` cannot run the engine loop of ``config`` (None: :func:`fit_config`'s),
    or None: a missing operation, or a dtype, layout, block size or head dim it does not declare."""
    caps = backend.capabilities()
    missing = [op for op in REQUIRED_OPERATIONS if not caps.supports(op)]
    if missing:
        return f"backend {backend.name!r} does not declare {', '.join(missing)}"
    config = config or fit_config(backend)
    if config.dtype not in caps.dtypes or config.dtype not in caps.cache_dtypes:
        return f"backend {backend.name!r} supports no query dtype usable as a cache dtype"
    if config.kv_layout not in caps.kv_layouts:
        return f"backend {backend.name!r} declares no KV layout"
    if caps.block_sizes is not None and config.block_size not in caps.block_sizes:
        return (f"backend {backend.name!r} does not declare block_size {config.block_size}"
                f" (supported: {list(caps.block_sizes)})")
    if caps.head_dims is not None and config.head_dim not in caps.head_dims:
        return (f"backend {backend.name!r} does not declare head_dim {config.head_dim}"
                f" (supported: {list(caps.head_dims)})")
    return None


def fit_config(backend: Backend, config: EngineConfig | None = None) -> EngineConfig:
    """Return ``config`` fitted to the backend's block sizes, head dims, dtypes and layouts."""
    config = config or EngineConfig()
    caps = backend.capabilities()
    changes: dict[str, Any] = {}
    if caps.block_sizes is not None and config.block_size not in caps.block_sizes:
        changes["block_size"] = min(caps.block_sizes)
    if caps.head_dims is not None and config.head_dim not in caps.head_dims:
        changes["head_dim"] = min(caps.head_dims)
    if config.dtype not in caps.dtypes or config.dtype not in caps.cache_dtypes:
        usable = [d for d in caps.dtypes if d in caps.cache_dtypes]
        changes["dtype"] = usable[0] if usable else config.dtype
    if config.kv_layout not in caps.kv_layouts and caps.kv_layouts:
        changes["kv_layout"] = caps.kv_layouts[0]
    fitted = replace(config, **changes)
    if "block_size" in changes:  # keep the pool's capacity in tokens about the same
        capacity = config.num_blocks * config.block_size
        fitted = replace(fitted, num_blocks=max(4, -(-capacity // fitted.block_size)),
                         max_seq_len=max(config.max_seq_len, 2 * fitted.block_size))
    return fitted


class EngineLoop:
    """A paged KV cache on ``backend`` managed by a :class:`BlockAllocator`."""

    def __init__(
        self, backend: Backend, config: EngineConfig | None = None, *, seed: int = 0
    ) -> None:
        self.backend = backend
        self.config = config = config or fit_config(backend)
        reason = unsupported_reason(backend, config)
        if reason is not None:
            from pagedattn.errors import UnsupportedError

            raise UnsupportedError("backend", reason, backend=backend.name, capability="write_kv")
        self.allocator = BlockAllocator(config.num_blocks, config.block_size,
                                        prefix_caching=config.prefix_caching)
        self.np_dtype = numpy_dtype(config.dtype)
        rng = np.random.default_rng(seed)
        shape = (config.vocab_size, config.max_seq_len, 2, config.num_kv_heads, config.head_dim)
        self.kv_table = rng.standard_normal(shape).astype(np.float32).astype(self.np_dtype)
        B, Hkv, D = config.block_size, config.num_kv_heads, config.head_dim
        nhd = config.kv_layout == "NHD"
        cache_shape = (config.num_blocks, B, Hkv, D) if nhd else (config.num_blocks, Hkv, B, D)
        # NaN in never-written slots: a backend reading one would show it
        empty = np.full(cache_shape, np.nan, dtype=np.float32).astype(self.np_dtype)
        self.key_cache = backend.to_device(empty)
        self.value_cache = backend.to_device(empty.copy())
        self.tokens: dict[int, list[int]] = {}
        self.preempted: list[int] = []
        self.num_copies = 0
        self.num_cached_tokens = 0
        self._next_id = 0

    # -- the loop's operations ---------------------------------------------------------
    def contiguous_kv(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V ``[L, Hkv, D]`` of ``seq_id`` from its tokens alone, in the cache dtype."""
        tokens = np.asarray(self.tokens[seq_id], dtype=np.int64)
        kv = self.kv_table[tokens, np.arange(tokens.shape[0])]
        return kv[:, 0], kv[:, 1]

    def add_request(self, prompt: list[int]) -> int | None:
        """Admit a prompt (preempting others if needed); its id, or None if it cannot fit at all."""
        self._check_tokens(prompt, 0)
        seq_id, self._next_id = self._next_id, self._next_id + 1
        tokens = prompt if self.config.prefix_caching else len(prompt)
        result = self._with_preemption(lambda: self.allocator.add_sequence(seq_id, tokens), seq_id)
        if result is None:
            return None
        self.tokens[seq_id] = list(prompt)
        self.num_cached_tokens += result.num_cached
        self._store(seq_id, 0, result)
        return seq_id

    def append(self, seq_id: int, token_ids: list[int]) -> bool:
        """Append tokens to a live sequence; False if it was preempted instead (pool too small)."""
        self._check_tokens(token_ids, len(self.tokens[seq_id]))
        tokens = token_ids if self.config.prefix_caching else len(token_ids)
        result = self._with_preemption(lambda: self.allocator.append(seq_id, tokens), seq_id)
        if result is None:
            self._preempt(seq_id)
            return False
        start = len(self.tokens[seq_id])
        self.tokens[seq_id].extend(token_ids)
        self._store(seq_id, start, result)
        return True

    def fork(self, seq_id: int) -> int:
        """Fork a live sequence (beam search / parallel sampling); the child shares its blocks."""
        child, self._next_id = self._next_id, self._next_id + 1
        self.allocator.fork(seq_id, child)
        self.tokens[child] = list(self.tokens[seq_id])
        return child

    def beam_step(self, beams: list[int], parents: list[int], token_ids: list[int]) -> list[int]:
        """One beam-search step over the live ``beams`` (best first), as an engine makes it.

        Survivor ``i`` descends from ``beams[parents[i]]`` and appends ``token_ids[i]``: beams
        no survivor descends from are freed first, each parent forks one child per extra
        survivor, then every survivor's token goes to the allocator. The copy-on-write pairs
        of all the appends go to one ``copy_blocks``, then all the tokens to one ``write_kv``.
        Returns the survivors' ids (a parent's own first); empty if the pool could not hold
        them even after preempting every other sequence (the beams are then freed).
        """
        if len(parents) != len(token_ids) or not parents:
            raise ValueError("need one token per survivor, and at least one survivor")
        if any(not 0 <= p < len(beams) for p in parents):
            raise ValueError(f"parents must index the {len(beams)} beams, received {parents}")
        for beam in beams:
            self._check_tokens([0], len(self.tokens[beam]))
        self._check_tokens(token_ids, 0)
        counts = [parents.count(rank) for rank in range(len(beams))]
        for beam, count in zip(beams, counts, strict=True):
            if not count:
                self.finish(beam)
        survivors: list[int] = []
        tokens: list[int] = []
        for rank, (beam, count) in enumerate(zip(beams, counts, strict=True)):
            if not count:
                continue
            picks = [t for p, t in zip(parents, token_ids, strict=True) if p == rank]
            survivors.append(beam)
            survivors.extend(self.fork(beam) for _ in range(count - 1))
            tokens.extend(picks)
        copies: list[tuple[int, int]] = []
        slots: list[np.ndarray] = []
        for seq_id, token in zip(survivors, tokens, strict=True):
            ids = [token] if self.config.prefix_caching else 1
            result = self._with_preemption(
                lambda s=seq_id, t=ids: self.allocator.append(s, t), set(survivors)
            )
            if result is None:  # the survivors alone do not fit: drop the whole beam group
                for beam in survivors:
                    self._preempt(beam)
                return []
            copies.extend(result.copies)
            slots.append(result.slot_mapping)
        for seq_id, token in zip(survivors, tokens, strict=True):
            self.tokens[seq_id].append(token)
        positions = np.asarray([len(self.tokens[s]) - 1 for s in survivors], dtype=np.int64)
        self._copy_then_write(
            copies, np.concatenate(slots), np.asarray(tokens, dtype=np.int64), positions
        )
        return survivors

    def finish(self, seq_id: int) -> None:
        """Free a finished sequence's blocks."""
        self.allocator.free(seq_id)
        del self.tokens[seq_id]

    # -- checks ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The allocator's invariants, and every sequence's K/V read back bit-exactly."""
        self.allocator.check_invariants()
        assert set(self.tokens) == set(self.allocator.seq_ids), "engine and allocator disagree"
        key_cache = np.asarray(self.backend.to_numpy(self.key_cache))
        value_cache = np.asarray(self.backend.to_numpy(self.value_cache))
        if self.config.kv_layout == "HND":
            key_cache, value_cache = np.swapaxes(key_cache, 1, 2), np.swapaxes(value_cache, 1, 2)
        B = self.config.block_size
        for seq_id in self.tokens:
            k, v = self.contiguous_kv(seq_id)
            p = np.arange(k.shape[0])
            blocks = np.asarray(self.allocator.block_table(seq_id), dtype=np.int64)[p // B]
            for name, cache, want in (("key", key_cache, k), ("value", value_cache, v)):
                got = cache[blocks, p % B]
                same = got.view(np.uint8) == want.view(np.uint8)
                if not same.all():
                    bad = int(np.argmax(~same.reshape(p.shape[0], -1).all(axis=1)))
                    raise AssertionError(
                        f"{name} of sequence {seq_id} at position {bad} (block {blocks[bad]},"
                        f" offset {bad % B}) differs from its contiguous copy"
                        f" [backend {self.backend.name}]"
                    )

    def check_attention(self, *, seed: int = 0, varlen: bool = False) -> int:
        """Run paged attention over every live sequence with L >= 1; compare each with the exact
        softmax on its contiguous K/V. Returns the number of sequences checked."""
        ids = [s for s, t in self.tokens.items() if t]
        if not ids:
            return 0
        cfg = self.config
        rng = np.random.default_rng(seed)
        arrays = self.allocator.as_arrays(ids)
        lens = arrays.seq_lens.astype(np.int64)
        q_lens = rng.integers(1, np.minimum(lens, 3) + 1) if varlen else np.ones_like(lens)
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        num_tokens = int(starts[-1])
        query = rng.standard_normal((num_tokens, cfg.num_q_heads, cfg.head_dim)).astype(np.float32)
        query = query.astype(self.np_dtype)
        caps = self.backend.capabilities()
        options: dict[str, Any] = {"kv_layout": cfg.kv_layout, "return_lse": caps.supports("lse")}
        dev = self.backend.to_device
        result = self.backend.paged_attention(
            dev(query), self.key_cache, self.value_cache, dev(arrays.block_tables),
            dev(arrays.seq_lens), dev(starts) if varlen else None, **options,
        )
        out, lse = result if options["return_lse"] else (result, None)
        out = np.asarray(self.backend.to_numpy(out)).astype(np.float64)
        lse = None if lse is None else np.asarray(self.backend.to_numpy(lse)).astype(np.float64)
        tol = tolerance(cfg.dtype, cfg.head_dim, tf32=caps.tf32)
        for row, seq_id in enumerate(ids):
            k, v = self.contiguous_kv(seq_id)
            L = k.shape[0]
            a, b = int(starts[row]), int(starts[row + 1])
            exact = exact_attention(
                query[a:b], k[None], v[None], np.zeros((1, 1), np.int32),
                np.array([L], np.int32), np.array([0, b - a], np.int32),
            )
            bound = tol.out_bound(
                exact.out, exact.value_scale, exact.score_scale, exact.num_visible
            )
            error = np.abs(out[a:b] - exact.out)
            if not (error <= bound).all():
                j, h, d = np.unravel_index(int(np.argmax(error - bound)), error.shape)
                raise AssertionError(
                    f"out of sequence {seq_id} (seq_len {L}, query {j}, head {h}, dim {d}):"
                    f" {float(out[a + j, h, d])!r} vs exact {float(exact.out[j, h, d])!r}, |error|"
                    f" {error[j, h, d]:.3g} > bound {bound[j, h, d]:.3g}"
                    f" [backend {self.backend.name}, dtype {cfg.dtype},"
                    f" block_size {cfg.block_size}]"
                )
            if lse is not None:
                lse_bound = tol.lse_bound(exact.score_scale, exact.num_visible)
                lse_error = np.abs(lse[a:b] - exact.lse)
                assert (lse_error <= lse_bound).all(), (
                    f"lse of sequence {seq_id}: max |error| {lse_error.max():.3g}"
                    f" [backend {self.backend.name}]"
                )
        return len(ids)

    # -- internals ------------------------------------------------------------------------
    def _check_tokens(self, token_ids: list[int], start: int) -> None:
        if start + len(token_ids) > self.config.max_seq_len:
            raise ValueError(f"sequence would exceed max_seq_len={self.config.max_seq_len}")
        if any(not 0 <= t < self.config.vocab_size for t in token_ids):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")

    def _with_preemption(self, operation: Any, requester: int | set[int]) -> AppendResult | None:
        """Run an allocation; on OutOfBlocksError preempt the youngest sequence other than the
        requester(s) and retry; None when none is left."""
        keep = requester if isinstance(requester, set) else {requester}
        while True:
            try:
                result: AppendResult = operation()
                return result
            except OutOfBlocksError:
                victims = [s for s in self.tokens if s not in keep]
                if not victims:
                    return None
                self._preempt(victims[-1])

    def _preempt(self, seq_id: int) -> None:
        self.finish(seq_id)
        self.preempted.append(seq_id)

    def _store(self, seq_id: int, start: int, result: AppendResult) -> None:
        """Copy-on-write copies first, then write the new tokens' K/V at their slots."""
        tokens = np.asarray(self.tokens[seq_id][start:], dtype=np.int64)
        positions = start + np.arange(tokens.shape[0])
        self._copy_then_write(result.copies, result.slot_mapping, tokens, positions)

    def _copy_then_write(
        self,
        copies: list[tuple[int, int]],
        slot_mapping: np.ndarray,
        tokens: np.ndarray,
        positions: np.ndarray,
    ) -> None:
        """``copy_blocks`` over every copy-on-write pair, then one ``write_kv`` of the tokens'
        K/V (slot ``-1``: already cached, skipped by ``write_kv``)."""
        dev = self.backend.to_device
        if copies:
            pairs = np.asarray(copies, dtype=np.int64)
            self.backend.copy_blocks(self.key_cache, self.value_cache, dev(pairs),
                                     kv_layout=self.config.kv_layout)
            self.num_copies += len(copies)
        if slot_mapping.shape[0] == 0:
            return
        kv = self.kv_table[tokens, positions]
        self.backend.write_kv(
            dev(np.ascontiguousarray(kv[:, 0])), dev(np.ascontiguousarray(kv[:, 1])),
            self.key_cache, self.value_cache, dev(slot_mapping),
            kv_layout=self.config.kv_layout,
        )


#: beam-search steps the state machines made: with a parent of 2+ children and a loser freed
#: in one step, and with copy-on-write (tests check these happened)
BEAM_COVERAGE: Counter[str] = Counter()


def make_engine_machine(backend: str | Backend, config: EngineConfig | None = None) -> type[Any]:
    """Return a hypothesis ``RuleBasedStateMachine`` class driving an :class:`EngineLoop` on
    ``backend`` (a registered name or an instance): add, append, fork, attend, finish, with
    preemption under memory pressure; after every step the allocator's invariants hold, the
    cache reads back each sequence's K/V, and attention equals the spec."""
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        Bundle,
        RuleBasedStateMachine,
        consumes,
        initialize,
        invariant,
        multiple,
        precondition,
        rule,
    )

    if isinstance(backend, str):
        from pagedattn.backends.registry import load_backend

        instance = load_backend(backend)
    else:
        instance = backend
    base = fit_config(instance, config)
    caps = instance.capabilities()
    # every float dtype the backend takes as query and cache dtype alike; both layouts if declared
    float_dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    dtypes = [d for d in float_dtypes if d in caps.dtypes and d in caps.cache_dtypes] or [base.dtype]
    all_layouts: tuple[str, ...] = ("NHD", "HND")
    layouts = [layout for layout in all_layouts if layout in caps.kv_layouts] or [base.kv_layout]
    vocab = st.integers(0, base.vocab_size - 1)
    B = base.block_size
    # a few shared "system prompts" of whole blocks, so the prefix cache gets hits
    system_prompts = [[], [1] * B, [1] * B + [2] * B, [3] * B]
    prompts = st.builds(
        lambda system, rest: (system + rest)[: base.max_seq_len] or [0],
        st.sampled_from(system_prompts),
        st.lists(vocab, max_size=B + 2),
    )

    class EngineMachine(RuleBasedStateMachine):
        seqs = Bundle("seqs")

        def __init__(self) -> None:
            super().__init__()
            self.engine: EngineLoop | None = None
            self.step = 0

        @initialize(
            target=seqs,
            prefix_caching=st.booleans(),
            dtype=st.sampled_from(dtypes),
            kv_layout=st.sampled_from(layouts),
            seed=st.integers(0, 2**16),
            prompt=prompts,
            parents=st.lists(st.integers(0, 2), min_size=3, max_size=3).filter(
                lambda p: len(set(p)) < 3
            ),
            token_ids=st.lists(vocab, min_size=6, max_size=6),
        )
        def start(
            self,
            prefix_caching: bool,
            dtype: str,
            kv_layout: str,
            seed: int,
            prompt: list[int],
            parents: list[int],
            token_ids: list[int],
        ) -> Any:
            """A fresh engine, opened by two beam-search steps of 3 beams over one prompt: the
            prompt forks 3 ways, then a parent wins 2+ places while another beam loses."""
            config = replace(base, prefix_caching=prefix_caching, dtype=dtype, kv_layout=kv_layout)
            self.engine = engine = EngineLoop(instance, config, seed=seed)
            first = engine.add_request(prompt[: base.max_seq_len - 2])
            if first is None:
                return multiple()
            beams = self._beam([first], [0, 0, 0], token_ids[:3])
            if len(beams) == 3:
                beams = self._beam(beams, parents, token_ids[3:])
            return multiple(*beams)

        def _beam(self, live: list[int], parents: list[int], token_ids: list[int]) -> list[int]:
            """``EngineLoop.beam_step``, counting in BEAM_COVERAGE what the step exercised."""
            assert self.engine is not None
            copies = self.engine.num_copies
            survivors = self.engine.beam_step(live, parents, token_ids)
            counts = [parents.count(rank) for rank in range(len(live))]
            if survivors and max(counts) > 1 and 0 in counts:
                BEAM_COVERAGE["fork several, free some"] += 1
            if self.engine.num_copies > copies:
                BEAM_COVERAGE["copy-on-write"] += 1
            return survivors

        def _live(self, seq: int) -> bool:
            return self.engine is not None and seq in self.engine.tokens

        @rule(target=seqs, prompt=prompts)
        def add_request(self, prompt: list[int]) -> Any:
            assert self.engine is not None
            seq = self.engine.add_request(prompt)
            return multiple() if seq is None else seq

        @rule(seq=seqs, token_ids=st.lists(vocab, min_size=1, max_size=base.block_size + 1))
        def append_tokens(self, seq: int, token_ids: list[int]) -> None:
            assert self.engine is not None
            if not self._live(seq):
                return
            room = base.max_seq_len - len(self.engine.tokens[seq])
            if token_ids[:room]:
                self.engine.append(seq, token_ids[:room])

        @rule(target=seqs, seq=seqs)
        def fork(self, seq: int) -> Any:
            assert self.engine is not None
            return self.engine.fork(seq) if self._live(seq) else multiple()

        @rule(target=seqs, seq=seqs, first=vocab, second=vocab)
        def beam_step(self, seq: int, first: int, second: int) -> Any:
            """Fork, then both beams append one token: copy-on-write if the block is partial."""
            assert self.engine is not None
            if not self._live(seq) or len(self.engine.tokens[seq]) >= base.max_seq_len:
                return multiple()
            child = self.engine.fork(seq)
            if self.engine.append(child, [first]) and self._live(seq):
                self.engine.append(seq, [second])
            return child if self._live(child) else multiple()

        @rule(
            target=seqs,
            picks=st.lists(st.integers(0, 15), min_size=1, max_size=3),
            parents=st.lists(st.integers(0, 2), min_size=1, max_size=4),
            token_ids=st.lists(vocab, min_size=4, max_size=4),
        )
        def beam_search_step(self, picks: list[int], parents: list[int], token_ids: list[int]) -> Any:
            """A beam-search step over some live sequences (``picks`` index them): losers freed,
            parents forked (several children each), every survivor appends; one copy_blocks
            and one write_kv for the whole step."""
            assert self.engine is not None
            engine = self.engine
            room = [s for s, t in engine.tokens.items() if len(t) < base.max_seq_len]
            if not room:
                return multiple()
            live = list(dict.fromkeys(room[p % len(room)] for p in picks))
            parents = [p % len(live) for p in parents]
            survivors = self._beam(live, parents, token_ids[: len(parents)])
            return multiple(*[s for s in survivors if s not in live])

        @rule(seq=consumes(seqs))
        def finish(self, seq: int) -> None:
            assert self.engine is not None
            if self._live(seq):
                self.engine.finish(seq)

        @precondition(lambda self: instance.capabilities().supports("varlen"))
        @rule(seed=st.integers(0, 2**16))
        def attend_prefill(self, seed: int) -> None:
            assert self.engine is not None
            self.engine.check_attention(seed=seed, varlen=True)

        @invariant()
        def cache_and_allocator_agree(self) -> None:
            if self.engine is not None:
                self.engine.check_invariants()

        @invariant()
        def attention_matches_spec(self) -> None:
            if self.engine is not None:
                self.step += 1
                self.engine.check_attention(seed=self.step)

    EngineMachine.__name__ = EngineMachine.__qualname__ = f"EngineMachine_{instance.name}"
    return EngineMachine
