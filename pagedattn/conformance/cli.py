"""``pagedattn conform``: run the conformance suite on backends and print the matrix.

    pagedattn conform --backend NAME|all [--backend NAME ...] [--profile quick|ci|thorough]
                      [--out DIR] [-n WORKERS] [-k EXPR] [--resume LEDGER]

Prints pytest's progress, then per backend a matrix (feature x dtype x block size: pass,
FAIL, unsupported; examples tried and the worst error as a fraction of the tolerance), writes
the same as ``DIR/report.json`` (default ``conformance-report``), saves every failure, shrunk,
as ``DIR/cases/*.npz`` and prints the ``pagedattn replay`` command of each. Exits non-zero on
any failure (and when a backend passes nothing). ``--resume LEDGER`` records each settled
cell in LEDGER as it finishes and skips the cells an earlier run on the same code, profile
and backends already settled (:mod:`pagedattn.conformance.ledger`): a long profile can be
run in pieces under a time limit; the matrix then shows only this piece's cells.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pagedattn.conformance.profiles import DEFAULT_PROFILE, PROFILES


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedattn conform", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", required=True, metavar="NAME",
                        help="backend to test (repeatable): a registered name, 'all', module:Class or mutant:NAME")
    parser.add_argument("--profile", default=os.environ.get("PAGEDATTN_PROFILE", DEFAULT_PROFILE),
                        choices=sorted(PROFILES), help=f"hypothesis profile (default {DEFAULT_PROFILE})")
    parser.add_argument("--out", default="conformance-report", type=Path, help="report directory")
    parser.add_argument("-n", "--workers", default=None, help="pytest-xdist workers (e.g. auto)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select cells")
    parser.add_argument("--resume", type=Path, default=None, metavar="LEDGER",
                        help="record settled cells in LEDGER and skip those it already holds (same code)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, print and save the matrix; return pytest's exit code."""
    from pagedattn.backends.registry import backend_status
    from pagedattn.conformance.mutants.run import run_pytest_in_process, suite_location
    from pagedattn.conformance.report import RecordCollector, build_matrix, print_matrix, write_json
    from pagedattn.conformance.targets import check_names
    from pagedattn.errors import BackendNotFoundError

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_names(args.backend)
    except BackendNotFoundError as error:
        print(f"pagedattn conform: {error}", file=sys.stderr)
        return 2
    for name in args.backend:
        if name != "all" and ":" not in name and not (status := backend_status(name)).available:
            print(f"pagedattn conform: backend {name!r} cannot run here: {status.reason}", file=sys.stderr)
            return 2
    cases = args.out / "cases"
    pytest_args = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-rfE",
                   f"--hypothesis-profile={args.profile}", "--conformance-cases", str(cases)]
    for name in args.backend:
        pytest_args += ["--backend", name]
    if args.workers:
        # work stealing: cells differ a lot in time (a GPU backend's compiles), so idle workers take queued ones
        pytest_args += ["-n", str(args.workers), "--dist", "worksteal"]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    settled: list[str] = []
    if args.resume is not None:
        from pagedattn.conformance import ledger

        settled, note = ledger.open_ledger(args.resume, ledger.header(args.profile, args.backend))
        print(f"pagedattn conform: {note}", flush=True)
        pytest_args += ["--conformance-ledger", str(args.resume)]
        pytest_args += [f"--deselect={nodeid}" for nodeid in settled]
    pytest_args += suite_location()
    collector = RecordCollector()
    code = run_pytest_in_process(pytest_args, [collector])
    if settled and code == 5 and not collector.records:  # pytest: no tests left to run
        print(f"pagedattn conform: every selected cell is already settled in {args.resume}")
        return 0
    matrix = build_matrix(collector.records)
    print()
    print_matrix(matrix)
    path = write_json(args.out / "report.json", collector.records, matrix,
                      {"backends": args.backend, "profile": args.profile, "exit_code": code})
    failures = [(r.get("nodeid", "?"), f) for r in collector.records for f in r.get("failures", ())]
    if failures:
        print("failing cases (shrunk), one per distinct failure; replay each with:")
        for nodeid, failure in failures:
            print(f"  {nodeid} ({failure['label']}): {failure['message'].splitlines()[0][:160]}")
            print(f"    {failure.get('replay', '(no case saved: the failure did not reproduce)')}")
    print(f"report: {path}")
    return code
