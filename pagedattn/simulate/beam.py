"""Which beams survive a beam-search step: a seeded, skewed model.

A beam-search request keeps ``K`` beams, ranked best first. Each step every beam proposes
candidates and the ``K`` best candidates survive; a beam whose candidates win ``c`` places
continues as ``c`` children (it *forks* ``c - 1`` times), a beam that wins none is freed.
Which parents win is what decides how much the beams share, so it is modelled, not guessed
per run:

- each of the ``K`` survivors picks its parent independently, the beam of rank ``r`` (0 is
  the best) with probability proportional to ``decay ** r``. ``decay = 1`` is uniform (the
  most diverse beams); a smaller ``decay`` lets the best beams win most places, as beam
  search does in practice, so the beams descend from few ancestors and share long prefixes;
- the survivors are ranked by their parent's rank (a parent's own continuation first, then
  its children), so a lineage that leads keeps leading;
- the first step has one beam, the prompt: its ``K`` children are the first beams.

All ``K`` beams generate the request's ``output_lens[0]`` tokens (no early stop at an end
token). Draws come from ``numpy.random.default_rng((seed, index))``, ``index`` being the
request's place in the workload, so a request preempted and started again makes the same
choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.errors import PagedAttentionError

#: the default ``decay``: the best beam parents about half the survivors at ``K = 4``
DEFAULT_DECAY = 0.5


@dataclass(frozen=True)
class BeamModel:
    """The survivor model of the module docstring: ``decay`` in (0, 1], and a ``seed``."""

    decay: float = DEFAULT_DECAY
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.decay <= 1:
            raise PagedAttentionError("decay", f"must be in (0, 1], received {self.decay!r}")

    def weights(self, num_beams: int) -> np.ndarray:
        """Probability that a survivor's parent is the beam of each rank (best first)."""
        w = self.decay ** np.arange(num_beams, dtype=np.float64)
        return w / w.sum()

    def parents(self, index: int, width: int, steps: int) -> np.ndarray:
        """int64 ``[steps, width]``: row ``t`` holds the parent rank of each survivor of step
        ``t``, sorted (so row ``t`` is also the survivors' ranking); row 0 is all zeros."""
        if width < 1 or steps < 0:
            raise PagedAttentionError("width", f"need width >= 1 and steps >= 0, received {width}, {steps}")
        rng = np.random.default_rng((self.seed, index))
        rows = np.zeros((steps, width), dtype=np.int64)
        if steps > 1:
            drawn = rng.choice(width, size=(steps - 1, width), p=self.weights(width))
            rows[1:] = np.sort(drawn, axis=1)
        return rows


def children_per_parent(row: np.ndarray, num_beams: int) -> list[int]:
    """How many survivors each of ``num_beams`` current beams parents (0: the beam is freed)."""
    return [int(c) for c in np.bincount(row, minlength=num_beams)[:num_beams]]
