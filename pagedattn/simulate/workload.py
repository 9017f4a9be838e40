"""Workloads for ``pagedattn simulate``: request streams from generators or a CSV trace.

Time is counted in engine steps: one step decodes one token of every running sequence.
A request arrives at step ``arrival``, has ``prompt_len`` prompt tokens (the first
``prefix_len`` of them a shared system prompt ``prefix_id``, or ``-1`` for none), asks for
``n`` samples (parallel sampling), each generating ``output_lens[i]`` tokens, and allows at
most ``max_tokens`` output tokens (what a contiguous allocator must reserve). A request with
``beam_width`` K > 1 runs beam search instead: its prompt is prefilled once, then K beams
generate ``output_lens[0]`` tokens each (``n`` is then 1; see :mod:`pagedattn.simulate.beam`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagedattn.errors import PagedAttentionError

#: ShareGPT's mean prompt and output lengths in tokens (Kwon et al., SOSP 2023, fig. 11)
SHAREGPT_MEAN_PROMPT = 161
SHAREGPT_MEAN_OUTPUT = 338


@dataclass(frozen=True)
class Request:
    """One request of a workload (see the module docstring for the fields)."""

    arrival: float
    prompt_len: int
    output_lens: tuple[int, ...]
    max_tokens: int
    prefix_id: int = -1
    prefix_len: int = 0
    beam_width: int = 1

    @property
    def n(self) -> int:
        return len(self.output_lens)

    @property
    def num_seqs(self) -> int:
        """Sequences the request holds while decoding: its beams, or its samples."""
        return self.beam_width if self.beam_width > 1 else self.n


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of the built-in generator.

    Prompt and output lengths are log-normal with the given means and ``sigma`` (ShareGPT's
    defaults), clipped to ``[1, max_model_len]`` together; ``max_tokens`` is drawn from
    ``max_tokens_choices`` and caps the output; ``shared_prefix_fraction`` of requests start
    with one of ``num_prefixes`` system prompts of ``prefix_len`` tokens; ``parallel_fraction``
    of requests ask for ``parallel_n`` samples.
    """

    num_requests: int = 2000
    arrival_rate: float = 8.0  # requests per step (Poisson)
    mean_prompt: float = SHAREGPT_MEAN_PROMPT
    mean_output: float = SHAREGPT_MEAN_OUTPUT
    sigma: float = 1.0
    max_model_len: int = 2048
    max_tokens_choices: tuple[int, ...] = (512, 1024, 2048)
    num_prefixes: int = 0
    prefix_len: int = 0
    shared_prefix_fraction: float = 0.0
    parallel_n: int = 1
    parallel_fraction: float = 0.0
    beam_width: int = 1
    beam_fraction: float = 0.0
    seed: int = 0


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    mu = math.log(mean) - sigma**2 / 2  # so that the mean is ``mean``
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size))).astype(np.int64)


def check_spec(spec: WorkloadSpec) -> None:
    """Raise PagedAttentionError naming the first parameter of ``spec`` out of range."""
    checks = [
        ("num_requests", spec.num_requests >= 1, ">= 1"),
        ("arrival_rate", spec.arrival_rate > 0, "> 0"),
        ("mean_prompt", spec.mean_prompt >= 1, ">= 1"),
        ("mean_output", spec.mean_output >= 1, ">= 1"),
        ("sigma", spec.sigma >= 0, ">= 0"),
        ("max_model_len", spec.max_model_len >= 2, ">= 2"),
        ("max_tokens_choices", len(spec.max_tokens_choices) > 0 and min(spec.max_tokens_choices) >= 1,
         "non-empty, each >= 1"),
        ("num_prefixes", spec.num_prefixes >= 0, ">= 0"),
        ("prefix_len", 0 <= spec.prefix_len < spec.max_model_len, f"in [0, max_model_len={spec.max_model_len})"),
        ("shared_prefix_fraction", 0 <= spec.shared_prefix_fraction <= 1, "in [0, 1]"),
        ("parallel_n", spec.parallel_n >= 1, ">= 1"),
        ("parallel_fraction", 0 <= spec.parallel_fraction <= 1, "in [0, 1]"),
        ("beam_width", spec.beam_width >= 1, ">= 1"),
        ("beam_fraction", 0 <= spec.beam_fraction <= 1, "in [0, 1]"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise PagedAttentionError(name, f"must be {expected}, received {getattr(spec, name)!r}")


def generate(spec: WorkloadSpec) -> list[Request]:
    """Return ``spec.num_requests`` requests, arrivals a Poisson process of ``arrival_rate``."""
    check_spec(spec)
    rng = np.random.default_rng(spec.seed)
    count = spec.num_requests
    arrivals = np.cumsum(rng.exponential(1.0 / spec.arrival_rate, count))
    prompts = _lognormal(rng, spec.mean_prompt, spec.sigma, count)
    max_tokens = rng.choice(np.asarray(spec.max_tokens_choices), count)
    shared = (
        rng.random(count) < spec.shared_prefix_fraction
        if spec.num_prefixes
        else np.zeros(count, bool)
    )
    prefix_ids = rng.integers(0, max(spec.num_prefixes, 1), count)
    parallel = rng.random(count) < spec.parallel_fraction
    beam = np.random.default_rng([spec.seed, 1]).random(count) < spec.beam_fraction
    beam &= spec.beam_width > 1
    requests = []
    for i in range(count):
        prefix_len = spec.prefix_len if shared[i] else 0
        prompt = int(min(prompts[i] + prefix_len, spec.max_model_len - 1))
        limit = int(min(max_tokens[i], spec.max_model_len - prompt))
        n = spec.parallel_n if parallel[i] and not beam[i] else 1
        outputs = np.minimum(_lognormal(rng, spec.mean_output, spec.sigma, n), limit)
        requests.append(
            Request(
                arrival=float(arrivals[i]),
                prompt_len=prompt,
                output_lens=tuple(int(o) for o in outputs),
                max_tokens=limit,
                prefix_id=int(prefix_ids[i]) if shared[i] else -1,
                prefix_len=min(prefix_len, prompt),
                beam_width=spec.beam_width if beam[i] else 1,
            )
        )
    return requests


CSV_COLUMNS = ("arrival", "prompt_len", "output_len")
CSV_OPTIONAL = ("max_tokens", "n", "prefix_id", "prefix_len", "beam_width")


def read_csv(path: str | Path, *, max_model_len: int = 2048) -> list[Request]:
    """Read a trace: columns ``arrival`` (step), ``prompt_len``, ``output_len``, and optionally
    ``max_tokens`` (default ``max_model_len - prompt_len``), ``n`` (samples, each of
    ``output_len``), ``prefix_id`` and ``prefix_len`` (a shared system prompt), ``beam_width``
    (beam search with that many beams; 1, the default, for none; needs ``n`` = 1)."""
    requests = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise PagedAttentionError(
                "trace",
                f"{path}: missing columns {missing}; needs {list(CSV_COLUMNS)},"
                f" optional {list(CSV_OPTIONAL)}",
            )
        for line, row in enumerate(reader, start=2):
            try:
                prompt = int(row["prompt_len"])
                output = int(row["output_len"])
                max_tokens = int(row.get("max_tokens") or max_model_len - prompt)
                n = int(row.get("n") or 1)
                prefix_id = int(row.get("prefix_id") or -1)
                prefix_len = int(row.get("prefix_len") or 0)
                beam_width = int(row.get("beam_width") or 1)
                arrival = float(row["arrival"])
            except ValueError as error:
                raise PagedAttentionError("trace", f"{path}:{line}: {error}") from None
            if (
                prompt < 1
                or output < 1
                or n < 1
                or max_tokens < output
                or prefix_len > prompt
                or beam_width < 1
                or (beam_width > 1 and n > 1)
            ):
                raise PagedAttentionError(
                    "trace",
                    f"{path}:{line}: need prompt_len >= 1, 1 <= output_len <= max_tokens,"
                    f" n >= 1, prefix_len <= prompt_len, beam_width >= 1 (and n = 1 when"
                    f" beam_width > 1); received {dict(row)}",
                )
            requests.append(
                Request(
                    arrival, prompt, (output,) * n, max_tokens, prefix_id, prefix_len, beam_width
                )
            )
    if not requests:
        raise PagedAttentionError("trace", f"{path} holds no requests")
    return sorted(requests, key=lambda r: r.arrival)


def write_csv(requests: list[Request], path: str | Path) -> None:
    """Write requests as a trace :func:`read_csv` reads back (one row per request; the first
    sample's output length stands for all when ``n > 1``)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS + CSV_OPTIONAL)
        for r in requests:
            writer.writerow(
                [
                    r.arrival,
                    r.prompt_len,
                    r.output_lens[0],
                    r.max_tokens,
                    r.n,
                    r.prefix_id,
                    r.prefix_len,
                    r.beam_width,
                ]
            )


class TokenIds:
    """Token ids for the prefix cache: a system prompt's tokens are the same in every request
    that uses it; every other token is new (so it never matches by accident)."""

    PREFIX_BASE = 1 << 40

    def __init__(self) -> None:
        self._next = 0

    def fresh(self, count: int) -> list[int]:
        start, self._next = self._next, self._next + count
        return list(range(start, start + count))

    def prompt(self, request: Request) -> list[int]:
        shared = [self.PREFIX_BASE * (request.prefix_id + 1) + i for i in range(request.prefix_len)]
        if request.prefix_id < 0:
            shared = []
        return shared + self.fresh(request.prompt_len - len(shared))
