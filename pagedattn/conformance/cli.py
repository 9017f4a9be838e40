"""``pagedattn conform``: run the conformance suite on backends and print the matrix.

    pagedattn conform --backend NAME|all [--backend NAME ...] [--profile quick|ci|thorough]
                      [--out DIR] [-n WORKERS] [-k EXPR]

Prints pytest's progress, then per backend a matrix (feature x dtype x block size: pass,
FAIL, unsupported; examples tried and the worst error as a fraction of the tolerance), writes
the same as ``DIR/report.json`` (default ``conformance-report``), saves every failure, shrunk,
as ``DIR/cases/*.npz`` and prints the ``pagedattn replay`` command of each. Exits non-zero on
any failure (and when a backend passes nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pagedattn.conformance.plugin import DEFAULT_PROFILE, PROFILES


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedattn conform", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", required=True, metavar="NAME",
                        help="backend to test (repeatable): a registered name, 'all', module:Class or mutant:NAME")
    parser.add_argument("--profile", default=os.environ.get("PAGEDATTN_PROFILE", DEFAULT_PROFILE),
                        choices=sorted(PROFILES), help=f"hypothesis profile (default {DEFAULT_PROFILE})")
    parser.add_argument("--out", default="conformance-report", type=Path, help="report directory")
    parser.add_argument("-n", "--workers", default=None, help="pytest-xdist workers (e.g. auto)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select cells")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, print and save the matrix; return pytest's exit code."""
    from pagedattn.conformance.mutants.run import SUITE_MODULES, run_pytest_in_process
    from pagedattn.conformance.report import RecordCollector, build_matrix, print_matrix, write_json

    args = parse_args(sys.argv[1:] if argv is None else argv)
    cases = args.out / "cases"
    pytest_args = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-rfE",
                   f"--hypothesis-profile={args.profile}", "--conformance-cases", str(cases)]
    for name in args.backend:
        pytest_args += ["--backend", name]
    if args.workers:
        pytest_args += ["-n", str(args.workers)]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    pytest_args += ["--pyargs", *SUITE_MODULES]
    collector = RecordCollector()
    code = run_pytest_in_process(pytest_args, [collector])
    matrix = build_matrix(collector.records)
    print()
    print_matrix(matrix)
    path = write_json(args.out / "report.json", collector.records, matrix,
                      {"backends": args.backend, "profile": args.profile, "exit_code": code})
    replays = [r["replay"] for r in collector.records if r.get("replay")]
    if replays:
        print("failing cases (shrunk), replay each with:")
        for line in replays:
            print(f"  {line}")
    print(f"report: {path}")
    return code
