"""Print a table to the terminal: rich when it is installed and the output is a terminal,
aligned plain text (wrapped to the terminal's width, else 120 columns) otherwise."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

PLAIN_WIDTH = 120  # columns of plain output when the width of the destination is unknown (a pipe, a file)
MIN_COLUMN = 40  # only columns wider than this wrap (long reasons and capability lists), never names or figures
_BREAK_AFTER = re.compile(r"(?<=[ ,/])")  # cells break after a space, a comma or a slash


def wrap_cell(text: str, width: int) -> list[str]:
    """Split ``text`` into lines of at most ``width`` characters, after spaces and commas where possible."""
    lines: list[str] = []
    line = ""
    for piece in _BREAK_AFTER.split(text):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(piece) > width:
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    if line.strip() or not lines:
        lines.append(line.rstrip())
    return lines


def format_plain(headers: Sequence[str], rows: Sequence[Sequence[object]], *, width: int | None = None) -> str:
    """Return the table as aligned plain-text columns; with ``width``, the widest columns wrap to fit."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if width is not None:
        while sum(widths) + 2 * (len(widths) - 1) > width and max(widths) > MIN_COLUMN:
            widest = widths.index(max(widths))
            widths[widest] -= 1
    lines = []
    for n, row in enumerate(cells):
        wrapped = [wrap_cell(c, w) for c, w in zip(row, widths, strict=True)]
        for k in range(max(len(w) for w in wrapped)):
            parts = [w[k] if k < len(w) else "" for w in wrapped]
            lines.append("  ".join(p.ljust(w) for p, w in zip(parts, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str = "", file: TextIO | None = None
) -> None:
    """Print ``rows`` under ``headers``; uses rich if importable and writing to a terminal.

    Cells are text, never rich markup: ``pip install 'pagedattn[cupy]'`` prints as written.
    """
    stream = file or sys.stdout
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None and stream.isatty():
        table = Table(*(escape(str(h)) for h in headers), title=escape(title) if title else None)
        for row in rows:
            table.add_row(*(escape(str(c)) for c in row))
        Console(file=stream).print(table)
        return
    if title:
        print(title, file=stream)
    print(format_plain(headers, rows, width=shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns), file=stream)
