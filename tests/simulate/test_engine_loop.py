"""The engine loop (pagedattn.simulate.engine_loop) on every available backend.

A hypothesis state machine adds requests, appends tokens (write_kv, copy-on-write through
copy_blocks), forks, finishes and preempts; after every step each sequence's attention
through the paged cache must equal the exact softmax on its contiguous K/V. A backend that
does not declare write_kv and copy_blocks is reported as unsupported.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.backends.registry import backend_status, list_backends, load_backend
from pagedattn.simulate.engine_loop import (
    BEAM_COVERAGE,
    EngineConfig,
    EngineLoop,
    fit_config,
    make_engine_machine,
    unsupported_reason,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    BACKENDS = [entry.name for entry in list_backends()]


def _backend(name: str):
    """The backend ``name``, skipped with the reason when it cannot run here or lacks an op."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = backend_status(name)
    if not status.available:
        pytest.skip(f"UNAVAILABLE: {status.reason}")
    backend = load_backend(name)
    reason = unsupported_reason(backend)
    if reason is not None:
        pytest.skip(f"UNSUPPORTED: {reason}")
    return backend


def _settings(name: str) -> settings:
    fast = name == "numpy"  # others may be interpreted kernels (TRITON_INTERPRET) on a CPU
    return settings(
        max_examples=40 if fast else 8,
        stateful_step_count=25 if fast else 10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize("name", BACKENDS)
def test_engine_loop_state_machine(name):
    _backend(name)
    BEAM_COVERAGE.clear()
    run_state_machine_as_test(make_engine_machine(name), settings=_settings(name))
    assert BEAM_COVERAGE["fork several, free some"] > 0, BEAM_COVERAGE
    assert BEAM_COVERAGE["copy-on-write"] > 0, BEAM_COVERAGE


def _beam_config(backend) -> EngineConfig:
    """The beam search's pool fitted to ``backend``'s capabilities (block_size 4 where declared,
    else its smallest), with room for 3 beams of a prompt of block_size + 1 tokens and 7 steps."""
    config = fit_config(backend, EngineConfig(num_blocks=16, block_size=4, max_seq_len=16, prefix_caching=False))
    max_seq_len = max(config.max_seq_len, config.block_size + 8)
    per_beam = -(-max_seq_len // config.block_size)
    return replace(config, max_seq_len=max_seq_len, num_blocks=max(config.num_blocks, 4 * per_beam))


def _beam_search(engine: EngineLoop) -> int:
    """A beam search of 3 beams over a prompt of block_size + 1 tokens, checked every step.

    Steps: the prompt's one beam forks 3 children; one parent wins all three places (two
    forks, two losers freed); the three beams each keep one child; two parents split the
    places (a fork and a free). Returns the copy-on-write block copies made.
    """
    def check():
        engine.check_invariants()
        engine.check_attention(seed=len(engine.tokens))

    vocab = engine.config.vocab_size
    prompt = engine.add_request([(i + 1) % vocab for i in range(engine.config.block_size + 1)])
    assert prompt is not None
    check()
    beams = engine.beam_step([prompt], [0, 0, 0], [0, 1, 2])
    assert len(beams) == 3 and beams[0] == prompt
    check()
    held = engine.allocator.num_used_blocks
    schedule = ([0, 0, 0], [0, 1, 2], [0, 0, 2], [1, 1, 1], [0, 1, 2], [0, 2, 2])
    for step, parents in enumerate(schedule):
        before = set(beams)
        winners = {beams[p] for p in parents}
        beams = engine.beam_step(beams, parents, [(step + i) % 4 for i in range(3)])
        assert len(beams) == 3, "the pool holds three beams"
        for loser in before - winners:
            assert loser not in engine.tokens, f"losing beam {loser} was not freed"
        check()
    assert engine.allocator.num_used_blocks >= held
    for beam in beams:
        engine.finish(beam)
    check()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    return engine.num_copies


@pytest.mark.parametrize("name", BACKENDS)
def test_beam_search_steps_copy_on_write_through_the_backend(name):
    backend = _backend(name)
    copies = _beam_search(EngineLoop(backend, _beam_config(backend)))
    # a parent's partial last block is copied once per extra child: the prompt's
    # block_size + 1 tokens fill 1 slot of the second block, so the first step copies 2 blocks
    assert copies >= 2


def test_beam_search_runs_within_restricted_capabilities():
    backend = _Restricted()
    config = _beam_config(backend)
    assert (config.block_size, config.head_dim, config.dtype, config.kv_layout) == (16, 64, "float16", "HND")
    assert _beam_search(EngineLoop(backend, config)) >= 2


def test_beam_search_without_copy_blocks_is_caught():
    backend = _NoCopyBackend()
    with pytest.raises(AssertionError, match="differs from its contiguous copy"):
        _beam_search(EngineLoop(backend, _beam_config(backend)))


def test_a_config_outside_the_capabilities_is_reported_unsupported():
    from pagedattn.errors import UnsupportedError

    backend = _Restricted()
    config = EngineConfig(block_size=4, head_dim=64, dtype="float16", kv_layout="HND")
    assert unsupported_reason(backend, config) == (
        "backend 'restricted' does not declare block_size 4 (supported: [16])"
    )
    with pytest.raises(UnsupportedError):
        EngineLoop(backend, config)
    assert unsupported_reason(backend, fit_config(backend, config)) is None


def test_beam_step_preempts_others_then_drops_the_group_when_it_cannot_fit():
    config = EngineConfig(num_blocks=4, block_size=4, max_seq_len=16, prefix_caching=False)
    engine = EngineLoop(NumpyBackend(), config)
    other = engine.add_request([1, 1, 1, 1, 2])  # 2 blocks
    prompt = engine.add_request([3, 3, 3])  # 1 block
    assert other is not None and prompt is not None
    beams = engine.beam_step([prompt], [0, 0], [0, 1])  # one copy: the 4th block
    assert len(beams) == 2 and other in engine.tokens
    beams = engine.beam_step(beams, [0, 1], [2, 3])  # both blocks full: 2 new blocks needed
    assert len(beams) == 2 and engine.preempted == [other]
    engine.check_invariants()
    engine.check_attention()
    # two parents of two children each: a copy-on-write with no block free and nothing
    # else to preempt, so the whole group goes back (freed), and nothing is written
    assert engine.beam_step(beams, [0, 0, 1, 1], [0, 1, 2, 3]) == []
    assert not engine.tokens and {other, *beams} <= set(engine.preempted)
    engine.check_invariants()
    assert engine.allocator.num_free_blocks == config.num_blocks


def _scripted(engine: EngineLoop) -> None:
    """Prefix hit, fork + copy-on-write, preemption under pressure, finish; checked each step."""
    def step():
        engine.check_invariants()
        engine.check_attention(seed=len(engine.tokens))

    a = engine.add_request([1, 2, 3, 0, 1, 2])  # blocks: full + partial (block_size 4)
    step()
    b = engine.add_request([1, 2, 3, 0, 3])  # first block from the prefix cache
    step()
    assert a is not None and b is not None
    assert engine.num_cached_tokens == (4 if engine.config.prefix_caching else 0)
    c = engine.fork(a)
    step()
    assert engine.append(c, [3]) and engine.num_copies == 1  # copy-on-write of a's partial block
    step()
    assert engine.append(a, [0, 0, 0])
    step()
    while engine.append(b, [2, 2, 2, 2]) and len(engine.tokens[b]) < engine.config.max_seq_len - 4:
        step()
    assert engine.preempted, "the pool never ran out"
    step()
    for seq in list(engine.tokens):
        engine.finish(seq)
        step()
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_scripted_loop_exercises_cow_prefix_hits_and_preemption(prefix_caching):
    config = EngineConfig(num_blocks=8, block_size=4, prefix_caching=prefix_caching, max_seq_len=40)
    _scripted(EngineLoop(NumpyBackend(), config))


class _NoCopyBackend(NumpyBackend):
    """A broken backend: copy_blocks does nothing."""

    def _copy_blocks(self, key_cache, value_cache, pairs):
        return None


class _OffByOneBackend(NumpyBackend):
    """A broken backend: attention skips the last key of every sequence."""

    def _run(self, plan, query, key_cache, value_cache):
        from dataclasses import replace

        lens = np.maximum(plan.problem.seq_lens - 1, 0)
        shorter = replace(plan, problem=replace(plan.problem, seq_lens=lens))
        return super()._run(shorter, query, key_cache, value_cache)


@pytest.mark.parametrize("broken", [_NoCopyBackend, _OffByOneBackend])
def test_engine_loop_catches_a_broken_backend(broken):
    config = EngineConfig(num_blocks=8, block_size=4, max_seq_len=40)
    with pytest.raises(AssertionError):
        _scripted(EngineLoop(broken(), config))


def test_backend_without_write_kv_is_reported_unsupported():
    from pagedattn.backends.capabilities import ALL_FEATURES, Capabilities

    class NoWrite(NumpyBackend):
        name = "nowrite"

        def capabilities(self):
            return Capabilities(features=frozenset(ALL_FEATURES) - {"write_kv"})

    assert unsupported_reason(NoWrite()) == "backend 'nowrite' does not declare write_kv"


class _Restricted(NumpyBackend):
    """A backend declaring only block_size 16, head_dim 64, float16 and HND."""

    name = "restricted"

    def capabilities(self):
        from pagedattn.backends.capabilities import Capabilities

        return Capabilities(dtypes=("float16",), cache_dtypes=("float16",), block_sizes=(16,),
                            head_dims=(64,), kv_layouts=("HND",))


def test_engine_config_fits_the_declared_capabilities():
    config = fit_config(_Restricted())
    assert (config.block_size, config.head_dim, config.dtype, config.kv_layout) == (16, 64, "float16", "HND")
    assert config.num_blocks * config.block_size >= EngineConfig().num_blocks * EngineConfig().block_size
    assert config.max_seq_len >= 2 * config.block_size


def test_engine_loop_runs_within_restricted_capabilities():
    machine = make_engine_machine(_Restricted())
    run_state_machine_as_test(machine, settings=settings(max_examples=5, stateful_step_count=10, deadline=None))
