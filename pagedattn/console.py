"""Print a table to the terminal: rich when it is installed, aligned plain text otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO


def format_plain(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Return the table as aligned plain-text columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str = "", file: TextIO | None = None
) -> None:
    """Print ``rows`` under ``headers``; uses rich if importable and writing to a terminal."""
    stream = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None and stream.isatty():
        table = Table(*headers, title=title or None)
        for row in rows:
            table.add_row(*(str(c) for c in row))
        Console(file=stream).print(table)
        return
    if title:
        print(title, file=stream)
    print(format_plain(headers, rows), file=stream)
