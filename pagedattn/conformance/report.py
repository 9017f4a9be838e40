"""The conformance matrix: cell records gathered from pytest reports, aggregated, printed and saved.

A record (see :mod:`pagedattn.conformance.runner`) is one test: backend, feature, dtype,
block_size, kv_layout, status (pass / fail / unsupported / error), examples tried and the
worst error as a fraction of the tolerance. The matrix has one row per feature and one
column per (dtype, block size); a cell aggregates its layouts and checks: FAIL if any failed,
else pass if any passed, else unsupported.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from pagedattn.conformance.plugin import conformance_record, unsupported_reason
from pagedattn.console import print_table


class RecordCollector:
    """A pytest plugin object that keeps every conformance record (works under pytest-xdist)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and not (report.failed and report.when == "setup"):
            return
        record = conformance_record(report)
        if record is None:
            return
        if unsupported_reason(report) is not None:
            record["status"] = "unsupported"
        elif report.failed:
            record["status"] = "fail"
            record.setdefault("message", failure_message(report))
        record["nodeid"] = report.nodeid
        self.records.append(record)


def failure_message(report: Any) -> str:
    """The text of a failed report's exception (pytest's crash line), not the traceback's last location."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)
    lines = str(report.longrepr).strip().splitlines()
    return lines[-1] if lines else ""


def _column(record: dict[str, Any]) -> str:
    bs = record.get("block_size", "-")
    return f"{record.get('dtype', '-')}/bs{bs}" if bs != "-" else str(record.get("dtype", "-"))


def build_matrix(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """backend -> feature -> column -> {status, examples, worst_fraction, cells, failed}."""
    matrix: dict[str, dict[str, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for record in records:
        cell = matrix[record["backend"]][record["feature"]].setdefault(
            _column(record), {"status": "unsupported", "examples": 0, "worst_fraction": 0.0, "cells": 0,
                              "failed": []})
        cell["cells"] += 1
        cell["examples"] += int(record.get("examples", 0))
        cell["worst_fraction"] = max(cell["worst_fraction"], float(record.get("worst_fraction", 0.0)))
        status = record["status"]
        if status in ("fail", "error"):
            cell["status"] = "FAIL"
            cell["failed"].append(record.get("nodeid", ""))
        elif status == "pass" and cell["status"] != "FAIL":
            cell["status"] = "pass"
    return {b: {f: dict(cols) for f, cols in features.items()} for b, features in matrix.items()}


def _cell_text(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return ""
    if cell["status"] == "unsupported":
        return "unsupported"
    return f"{cell['status']} {cell['examples']}/{cell['worst_fraction']:.2g}"


def print_matrix(matrix: dict[str, Any]) -> None:
    """One table per backend: features down, dtype/block size across."""
    for backend, features in matrix.items():
        columns = sorted({c for cols in features.values() for c in cols}, key=_column_order)
        rows = [[feature, *(_cell_text(cols.get(c)) for c in columns)] for feature, cols in features.items()]
        print_table(["feature", *columns], rows,
                    title=f"conformance of {backend} (cell: status examples/worst error as a fraction of tolerance)")
        print()


def _column_order(column: str) -> tuple[int, str, int]:
    dtype, _, bs = column.partition("/bs")
    order = {"float32": 0, "float16": 1, "bfloat16": 2}
    return (order.get(dtype, 3), dtype, int(bs) if bs.isdigit() else 0)


def write_json(path: Path, records: list[dict[str, Any]], matrix: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write the matrix and every record as JSON; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "matrix": matrix, "records": records}, indent=1, default=str))
    return path
