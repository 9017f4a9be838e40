"""The conformance suite's hypothesis profiles, and how many examples one cell gets under each.

- ``quick``: 6 examples a cell (CI's pass over every backend, the mutant catalog).
- ``standard``: the main job's (``tox -e conformance``): 15 a cell as in ``ci``, but
  :data:`INTERPRETED_EXAMPLES` on a backend that runs in an interpreter (its declared
  device names one, as Triton's CPU interpreter does). There one example costs what
  hundreds cost on the other backends; every cell still runs, so every feature, dtype,
  block size and layout of the kernels' logic is checked, and the same backend on its GPU
  gets the full count.
- ``ci``: 15 a cell on every backend.
- ``thorough``: 200 a cell, with an example database that replays earlier failures first.

Select one with ``--hypothesis-profile`` or ``PAGEDATTN_PROFILE``; without either the
plugin loads :data:`DEFAULT_PROFILE`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"max_examples": 6, "derandomize": True, "database": None},
    "standard": {"max_examples": 15, "derandomize": True, "database": None},
    "ci": {"max_examples": 15, "derandomize": True, "database": None},
    "thorough": {"max_examples": 200, "database": DirectoryBasedExampleDatabase(".hypothesis/pagedattn")},
}
DEFAULT_PROFILE = "standard"

#: Examples a cell for a backend that runs in an interpreter, by profile (other profiles: the profile's count).
INTERPRETED_EXAMPLES: dict[str, int] = {"standard": 4}

for _name, _values in PROFILES.items():
    settings.register_profile(_name, deadline=None, print_blob=True, **_values)


def runs_in_interpreter(device: str) -> bool:
    """Whether a backend declaring ``device`` runs in an interpreter: the name says so."""
    return "interpreter" in device.lower()


def runs_on_cpu(device: str) -> bool:
    """Whether a backend declaring ``device`` computes on the CPU (an interpreter of GPU kernels included)."""
    return device.lower().startswith("cpu") or runs_in_interpreter(device)


def interpreted(backend: Any) -> bool:
    """Whether the backend runs in an interpreter: its declared device names one."""
    return runs_in_interpreter(str(backend.capabilities().device))


def examples_per_cell(backend: Any, profile: str | None = None) -> int:
    """How many examples one cell of ``backend`` gets under ``profile`` (default: the active profile)."""
    name = profile or settings.get_current_profile_name()
    examples = settings.get_profile(name).max_examples if profile else settings().max_examples
    cap = INTERPRETED_EXAMPLES.get(name) if interpreted(backend) else None
    return min(examples, cap) if cap is not None else examples
