"""``pagedattn conform``: run the conformance suite on backends and print the matrix.

    pagedattn conform --backend NAME|all [--backend NAME ...] [--profile quick|ci|thorough]
                      [--out DIR] [-n WORKERS | --gpus all|IDS [--workers-per-gpu N]]
                      [-k EXPR] [--seed N] [--resume LEDGER]

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

from pagedattn.conformance.profiles import DEFAULT_PROFILE, PROFILES
from pagedattn.usage import UsageError, make_folder, make_parser, reports_usage_errors


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("pagedattn conform", __doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", required=True, metavar="NAME",
                        help="backend to test (repeatable, required, no default): a registered name, 'all', "
                             "module:Class or mutant:NAME")
    parser.add_argument("--profile", default=os.environ.get("PAGEDATTN_PROFILE", DEFAULT_PROFILE),
                        choices=sorted(PROFILES),
                        help=f"hypothesis profile (default: $PAGEDATTN_PROFILE, else {DEFAULT_PROFILE})")
    parser.add_argument("--out", default="conformance-report", type=Path,
                        help="report directory (default: ./conformance-report)")
    parser.add_argument("-n", "--workers", default=None,
                        help="pytest-xdist workers, e.g. 2 or auto; needs pytest-xdist installed (default: none, "
                             "one process)")
    parser.add_argument("--gpus", default=None, metavar="all|IDS",
                        help="pytest-xdist workers pinned to these GPUs, instead of -n: 'all' or ids such as 0,1 "
                             "(default: none, no pinning)")
    parser.add_argument("--workers-per-gpu", type=int, default=1, metavar="N", help="workers per GPU with --gpus")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="hypothesis seed (pytest's --hypothesis-seed): each cell draws the same examples "
                             "whenever the command is repeated with it, with or without --gpus, and another N "
                             "draws others, under every profile (default: none; quick and ci then draw their "
                             "fixed examples, thorough draws anew)")
    parser.add_argument("-k", dest="keyword", default=None,
                        help="pytest -k expression to select cells (default: every cell)")
    parser.add_argument("--resume", type=Path, default=None, metavar="LEDGER",
                        help="record settled cells in LEDGER and skip those it already holds (same code); "
                             "default: no ledger")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def check_backends(specs: Sequence[str]) -> None:
    """Raise :class:`UsageError` for a backend that is unknown or cannot run here (``all`` is always fine)."""
    from pagedattn.conformance.targets import resolve
    from pagedattn.errors import BackendNotFoundError, BackendUnavailableError

    for spec in specs:
        if spec == "all":
            continue
        try:
            resolve(spec)
        except (BackendNotFoundError, BackendUnavailableError) as error:
            raise UsageError(str(error)) from None


def check_gpus(gpus: str, workers_per_gpu: int, workers: str | None) -> None:
    """Raise :class:`UsageError` unless ``--gpus`` and ``--workers-per-gpu`` can start their workers."""
    from pagedattn.conformance.gpus import worker_specs
    from pagedattn.errors import PagedAttentionError

    if workers:
        raise UsageError("--gpus starts one worker per GPU times --workers-per-gpu: leave out -n")
    if not xdist_installed():
        raise UsageError("--gpus runs cells on pytest-xdist workers, which is not installed (pip install pytest-xdist)")
    try:
        worker_specs(gpus, workers_per_gpu)
    except PagedAttentionError as error:
        raise UsageError(str(error)) from None


def xdist_installed() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


@reports_usage_errors("pagedattn conform")
def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, print and save the matrix; return pytest's exit code."""
    from pagedattn.conformance.mutants.run import run_pytest_in_process, suite_location
    from pagedattn.conformance.report import RecordCollector, build_matrix, print_matrix, write_json

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.workers and not xdist_installed():
        raise UsageError(f"-n {args.workers} runs cells in parallel with pytest-xdist, which is not installed "
                         "(pip install pytest-xdist, or pip install 'pagedattn[dev]'); without -n it runs in "
                         "one process")
    if args.gpus is not None:
        check_gpus(args.gpus, args.workers_per_gpu, args.workers)
    check_backends(args.backend)
    make_folder(args.out, "--out")
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
    if args.seed is not None:
        pytest_args.append(f"--hypothesis-seed={args.seed}")
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    settled: list[str] = []
    if args.resume is not None:
        from pagedattn.conformance import ledger

        try:
            settled, note = ledger.open_ledger(args.resume, ledger.header(args.profile, args.backend))
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"--resume {args.resume}: cannot use this ledger ({error})") from None
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
