"""Command-line plumbing shared by every subcommand: parsers whose help shows each default,
and bad arguments or files reported in one line on stderr with exit status 2.

A subcommand's ``main`` raises :class:`UsageError` for input it cannot use and is wrapped
with :func:`reports_usage_errors`; its parser (:func:`make_parser`) reports argparse's own
errors (unknown option, bad number, a choice not offered) the same way.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


class UsageError(Exception):
    """A command-line argument or file that cannot be used; printed as ``PROG: error: MESSAGE``."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already states its default.

    Flags read ``(default: off)``; an option whose default is None must say in its help what
    happens without it (a test checks that every option's help mentions its default).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if action.nargs == 0 and action.default is False:
            return f"{text} (default: off)"
        if action.default is None:
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, reporting a bad argument in one line (and where the help is) with exit status 2."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, f"{message} (see {self.prog} --help)")
        sys.exit(2)


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An :class:`ArgumentParser` for ``prog`` that formats its help with :class:`HelpFormatter`."""
    return ArgumentParser(prog=prog, description=description.replace("``", ""), formatter_class=HelpFormatter)


def usage_error(prog: str, message: str) -> int:
    """Print ``PROG: error: MESSAGE`` (one line) on stderr and return exit status 2."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def reports_usage_errors(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a subcommand's ``main`` so that a :class:`UsageError` becomes :func:`usage_error`."""

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapper(*args: Any, **kwargs: Any) -> int:
            try:
                return main(*args, **kwargs)
            except UsageError as error:
                return usage_error(prog, str(error))

        return wrapper

    return decorate


def make_folder(path: Path, option: str) -> None:
    """Create the output folder ``path`` (and its parents) now; raise :class:`UsageError` if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{option} {path}: cannot create this folder ({error.strerror or error})") from None


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, received {text!r}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, received {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, received {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, received {text!r}")
    return value
