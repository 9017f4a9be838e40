"""A ledger of settled cells, so a long run cut short by a time limit can be resumed.

``pagedattn conform --resume FILE`` appends one JSON line per cell as soon as it passes or
is reported unsupported (a run killed by ``timeout`` keeps what it settled), and on the next
run deselects every cell the ledger already holds. The first line is a header: the profile,
the backends and a fingerprint of the package's sources; a ledger whose header differs
(other code, profile or backends) is set aside as ``FILE.stale`` and the run starts afresh,
so a cell is never skipped because it passed on different code. Failures are never recorded:
they run again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pagedattn

SOURCE_SUFFIXES = (".py", ".cu", ".cuh")


def source_fingerprint(root: Path | None = None) -> str:
    """SHA-256 over the package's source files (path and content), in path order."""
    root = root or Path(pagedattn.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def header(profile: str, backends: Iterable[str]) -> dict[str, Any]:
    """The header a ledger of this run must have to be resumed."""
    return {"ledger": 1, "profile": profile, "backends": sorted(backends), "sources": source_fingerprint()}


def open_ledger(path: Path, expected: dict[str, Any]) -> tuple[list[str], str]:
    """Return (settled node ids, message) for resuming ``path``; (re)start it when absent or stale."""
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        try:
            found = json.loads(lines[0]) if lines else None
            entries = [json.loads(line) for line in lines[1:] if line.strip()]
        except json.JSONDecodeError:
            found, entries = None, []
        if found == expected:
            settled = list(dict.fromkeys(str(e["nodeid"]) for e in entries))
            return settled, f"resuming {path}: {len(settled)} cells already settled on this code and profile"
        path.replace(path.with_name(path.name + ".stale"))
        note = f"{path} was for other code, profile or backends: kept as {path.name}.stale; starting afresh"
    else:
        note = f"starting ledger {path}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(expected) + "\n", encoding="utf-8")
    return [], note


def record(path: Path, nodeid: str, outcome: str) -> None:
    """Append one settled cell (``passed`` or ``unsupported``) and flush it to disk."""
    with path.open("a", encoding="utf-8") as stream:
        stream.write(json.dumps({"nodeid": nodeid, "outcome": outcome}) + "\n")
