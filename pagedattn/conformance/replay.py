"""``pagedattn replay CASE.npz --backend NAME``: re-run a saved failing case and print the comparison.

The case file is standalone (written by the conformance suite when a check failed, after
hypothesis shrank it); it names the check, which is run again on the backend given.
Exits 0 if the backend now passes, 1 if it still fails.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import typing
from collections.abc import Sequence
from pathlib import Path

from pagedattn.errors import BackendNotFoundError, BackendUnavailableError, PagedAttentionError
from pagedattn.usage import UsageError, reports_usage_errors


def build_parser() -> argparse.ArgumentParser:
    from pagedattn.usage import make_parser

    parser = make_parser("pagedattn replay", __doc__.split("\n\n")[0])
    parser.add_argument("case", help="a .npz case saved by the conformance suite")
    parser.add_argument("--backend", required=True,
                        help="registered name, module:Class or mutant:NAME (required, no default)")
    parser.add_argument("--check", default=None,
                        help="run another check than the one saved in the case (default: the saved one)")
    return parser


@reports_usage_errors("pagedattn replay")
def main(argv: Sequence[str] | None = None) -> int:
    """Replay one case; print the case, the check and its outcome."""
    from pagedattn.conformance.cases import load_case
    from pagedattn.conformance.checks import CHECKS
    from pagedattn.conformance.targets import resolve

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if not Path(args.case).is_file():
        raise UsageError(f"no such case file: {args.case}")
    try:
        case, check_name, context = load_case(args.case)
    except PagedAttentionError as error:
        raise UsageError(error.problem) from None
    check_name = args.check or check_name
    if check_name not in CHECKS:
        raise UsageError(f"unknown check {check_name!r}; checks: {', '.join(sorted(CHECKS))}")
    takes = typing.get_type_hints(CHECKS[check_name]).get("case")
    if isinstance(takes, type) and not isinstance(case, takes):
        held = type(case).__name__
        raise UsageError(f"check {check_name!r} replays {takes.__name__} files; {args.case} holds a {held}")
    try:
        backend = resolve(args.backend)
    except (BackendNotFoundError, BackendUnavailableError) as error:
        raise UsageError(str(error)) from None
    print(f"case: {case!r}")
    if context:
        print("saved from: " + ", ".join(f"{k}={v}" for k, v in context.items()))
    print(f"check: {check_name} ({CHECKS[check_name].__doc__})")
    print(f"backend: {backend.name} {backend.version} on {backend.device_name()}")
    try:
        worst = CHECKS[check_name](backend, case)
    except AssertionError as failure:
        print(f"FAIL\n{failure}")
        return 1
    except Exception:  # a crash of the backend is a failure too; show where
        print("FAIL (exception)")
        traceback.print_exc(file=sys.stdout)
        return 1
    print(f"pass: worst error {worst:.3g} x tolerance")
    return 0
