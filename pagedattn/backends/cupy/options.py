"""The cupy backend's options: what ``CupyBackend(...)`` takes, their defaults, and the one
place where the process environment may supply those defaults.

An option given to the constructor wins; an option left out takes its ``PAGEDATTN_CUPY_*``
environment variable if that is set, else the documented default below. Nothing else in the
backend reads the environment, so a backend's behaviour is fixed when it is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from pagedattn.backends.cupy.specializations import WGMMA_CTAS_CHOICES, WGMMA_CTAS_DEFAULT
from pagedattn.errors import PagedAttentionError

PREFILL_CHOICES: tuple[str, ...] = ("auto", "mma", "wgmma")
DECODE_CHOICES: tuple[str, ...] = ("mma", "simt")
WGMMA_SCHEDULE_CHOICES: tuple[str, ...] = ("overlap", "serial")
MERGE_CHOICES: tuple[str, ...] = ("fused", "kernel")

#: option -> the environment variable that may supply its default
ENVIRONMENT: dict[str, str] = {
    "prefill": "PAGEDATTN_CUPY_PREFILL",
    "decode": "PAGEDATTN_CUPY_DECODE",
    "split_kv": "PAGEDATTN_CUPY_SPLIT_KV",
    "num_splits": "PAGEDATTN_CUPY_NUM_SPLITS",
    "wgmma_ctas": "PAGEDATTN_CUPY_WGMMA_CTAS",
    "wgmma_schedule": "PAGEDATTN_CUPY_WGMMA_SCHEDULE",
    "merge": "PAGEDATTN_CUPY_MERGE",
    "sync": "PAGEDATTN_CUPY_SYNC",
}


@dataclass(frozen=True)
class CupyOptions:
    """How the cupy backend picks and launches its kernels.

    - ``prefill``: "auto" (the Hopper wgmma kernel for long prefill on compute capability 9.0,
      else the mma.sync kernel), "wgmma" (the Hopper kernel for every prefill it supports) or
      "mma" (the mma.sync kernel only).
    - ``decode``: "mma" (the tensor-core decode kernel for float16/bfloat16 at head_dim 64/128)
      or "simt" (the CUDA-core kernel for every decode).
    - ``split_kv``: split long key ranges over several CTAs and merge their partials (True) or
      give every work item its whole range (False).
    - ``merge``: who merges a split range's partials: "fused" (the range's part that finishes
      last, inside the attention kernel) or "kernel" (``merge_partials``, launched after it).
      Both give the same bits.
    - ``wgmma_ctas``: CTAs per SM the wgmma kernel is built for, 1 (up to 255 registers a
      thread, 4 K/V stages) or 2 (128 registers, fewer stages; faster on long causal prefill).
    - ``wgmma_schedule``: "overlap" (P V runs into the next tile's copies and S, where the
      kernel has that schedule: head_dim 128 with at least 3 stages) or "serial".
    - ``sync``: synchronise the stream after every launch, so that an asynchronous fault is
      reported at the launch that caused it (debugging; the run cannot be graph-captured).
    """

    prefill: str = "auto"
    decode: str = "mma"
    split_kv: bool = True
    wgmma_ctas: int = WGMMA_CTAS_DEFAULT
    wgmma_schedule: str = "overlap"
    sync: bool = False
    num_splits: int = 0
    merge: str = "fused"

    def __post_init__(self) -> None:
        for name, choices in (
            ("prefill", PREFILL_CHOICES),
            ("decode", DECODE_CHOICES),
            ("wgmma_ctas", WGMMA_CTAS_CHOICES),
            ("wgmma_schedule", WGMMA_SCHEDULE_CHOICES),
            ("merge", MERGE_CHOICES),
        ):
            value = getattr(self, name)
            if value not in choices or isinstance(value, bool):
                raise PagedAttentionError(
                    name, f"expected one of {', '.join(map(repr, choices))}, received {value!r}"
                )
        if isinstance(self.num_splits, bool) or not isinstance(self.num_splits, int) or self.num_splits < 0:
            raise PagedAttentionError(
                "num_splits", f"expected 0 (automatic) or an integer >= 1, received {self.num_splits!r}"
            )
        for name in ("split_kv", "sync"):
            if not isinstance(getattr(self, name), bool):
                raise PagedAttentionError(
                    name, f"expected True or False, received {getattr(self, name)!r}"
                )


def _parse(name: str, text: str) -> Any:
    """An environment variable's text as the option's type; raises naming the variable."""
    if name in ("split_kv", "sync"):
        if text not in ("0", "1"):
            raise PagedAttentionError(ENVIRONMENT[name], f"expected 0 or 1, received {text!r}")
        return text == "1"
    if name == "wgmma_ctas":
        if not text.isdigit():
            raise PagedAttentionError(ENVIRONMENT[name], f"expected 1 or 2, received {text!r}")
        return int(text)
    if name == "num_splits":
        if not text.isdigit():
            raise PagedAttentionError(ENVIRONMENT[name], f"expected an integer >= 0, received {text!r}")
        return int(text)
    return text


def resolve(environ: Mapping[str, str] | None = None, **given: Any) -> CupyOptions:
    """The options of a backend built with ``given`` (None: left out), defaults from ``environ``
    (default ``os.environ``) where set, else :class:`CupyOptions`' own."""
    environ = os.environ if environ is None else environ
    names = {f.name for f in fields(CupyOptions)}
    unknown = set(given) - names
    if unknown:
        raise TypeError(f"unknown cupy backend option(s): {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for name in names:
        if given.get(name) is not None:
            values[name] = given[name]
        elif environ.get(ENVIRONMENT[name], "") != "":
            values[name] = _parse(name, environ[ENVIRONMENT[name]])
    return CupyOptions(**values)
