"""``pagedattn conform``: run the conformance suite on backends and print the matrix.

    pagedattn conform --backend NAME|all [--backend NAME ...] [--profile quick|ci|thorough]
                      [--out DIR] [-n WORKERS | --gpus all|IDS [--workers-per-gpu N]]
                      [-k EXPR] [--resume LEDGER]

Prints pytest's progress, then per backend a matrix (feature x dtype x block size: pass,
FAIL, unsupported; examples tried and the worst error as a fraction of the tolerance), writes
the same as ``DIR/report.json`` (default ``conformance-report``), saves every failure, shrunk,
as ``DIR/cases/*.npz`` and prints the ``pagedattn replay`` command of each. Exits non-zero on
any failure (and when a backend passes nothing). ``--resume LEDGER`` records each settled
cell in LEDGER as it finishes and skips the cells an earlier run on the same code, profile
and backends already settled (:mod:`pagedattn.conformance.ledger`): a long profile can be
run in pieces under a time limit; the matrix then shows only this piece's cells. ``--gpus``
runs the cells on pytest-xdist workers pinned to those GPUs (:mod:`pagedattn.conformance.gpus`).
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
    parser.add_argument("--gpus", default=None, metavar="all|IDS",
                        help="xdist workers pinned to these GPUs: 'all' or ids such as 0,1 (instead of -n)")
    parser.add_argument("--workers-per-gpu", type=int, default=1, metavar="N", help="workers per GPU (default 1)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select cells")
    parser.add_argument("--resume", type=Path, default=None, metavar="LEDGER",
                        help="record settled cells in LEDGER and skip those it already holds (same code)")
    args = parser.parse_args(list(argv))
    if args.gpus is not None:
        from pagedattn.conformance.gpus import worker_specs
        from pagedattn.errors import PagedAttentionError

        if args.workers:
            parser.error("--gpus starts one worker per GPU times --workers-per-gpu: leave out -n")
        try:
            worker_specs(args.gpus, args.workers_per_gpu)
        except PagedAttentionError as error:
            parser.error(str(error))
    return args


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
        # work stealing: cells differ a lot in time (a GPU backend's compiles), so idle workers take queued ones
        pytest_args += ["-n", str(args.workers), "--dist", "worksteal"]
    if args.gpus:
        pytest_args += ["--gpus", args.gpus, "--workers-per-gpu", str(args.workers_per_gpu)]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    settled: list[str] = []
    if args.resume is not None:
        from pagedattn.conformance import ledger

        settled, note = ledger.open_ledger(args.resume, ledger.header(args.profile, args.backend))
        print(f"pagedattn conform: {note}", flush=True)
        pytest_args += ["--conformance-ledger", str(args.resume)]
        pytest_args += [f"--deselect={nodeid}" for nodeid in settled]
    pytest_args += ["--pyargs", *SUITE_MODULES]
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
    replays = [r["replay"] for r in collector.records if r.get("replay")]
    if replays:
        print("failing cases (shrunk), replay each with:")
        for line in replays:
            print(f"  {line}")
    print(f"report: {path}")
    return code
