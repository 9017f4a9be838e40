"""The timer: warm-up over every rotation, synchronized batches, the median."""

from __future__ import annotations

import time

from pagedattn.perf.timing import TimingPolicy, measure


def test_median_of_a_known_delay_and_every_rotation_warmed() -> None:
    seen: list[int] = []
    syncs = [0]

    def run(i: int) -> None:
        seen.append(i % 4)
        time.sleep(0.002)

    def sync() -> None:
        syncs[0] += 1

    # a batch of 40 ms holds two runs or more unless one run of a 2 ms sleep takes 20 times that
    # (a loaded machine took 5.7 ms, once more than a 5 ms batch)
    policy = TimingPolicy(target_batch_s=0.04, budget_s=0.05, min_repeats=3, max_repeats=5)
    result = measure(run, sync, rotations=4, policy=policy)
    assert set(seen[:4]) == {0, 1, 2, 3}, "warm-up touches every input set"
    assert 0.002 <= result.median_s < 0.02
    assert result.runs_per_batch >= 2 and 3 <= len(result.samples_s) <= 5
    assert syncs[0] >= 2 * len(result.samples_s), "each batch is synchronized before and after"
    assert set(seen[4:]) == {0, 1, 2, 3}, "timed runs rotate"


def test_a_slow_run_gets_one_run_per_batch() -> None:
    result = measure(lambda i: time.sleep(0.01), lambda: None,
                     policy=TimingPolicy(target_batch_s=0.001, budget_s=0.0, min_repeats=2))
    assert result.runs_per_batch == 1 and len(result.samples_s) == 2
