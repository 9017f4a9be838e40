"""The ``pagedattn`` command: ``backends``, ``conform``, ``replay``, ``bench``, ``simulate``.

Each subcommand lives in the subpackage that owns it and is imported only when run; it
exposes ``main(argv) -> int``.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence

#: subcommand -> (module with ``main(argv)``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "backends": ("pagedattn.cli", "list registered backends, their availability and capabilities"),
    "conform": ("pagedattn.conformance.cli", "fuzz backends against the spec and print the matrix"),
    "replay": ("pagedattn.conformance.replay", "replay a saved failing case on a backend"),
    "bench": ("pagedattn.perf.cli", "benchmark backends against the roofline and peers"),
    "simulate": ("pagedattn.simulate.cli", "replay a workload against paged and contiguous KV memory"),
}


def backends_main(argv: Sequence[str]) -> int:
    """Print a table of every registered backend: name, version, availability, capabilities."""
    from pagedattn.backends.registry import backend_status, list_backends
    from pagedattn.console import print_table
    from pagedattn.usage import make_parser

    make_parser("pagedattn backends", COMMANDS["backends"][1]).parse_args(list(argv))
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for entry in list_backends():
            status = backend_status(entry.name)
            cls = status.backend_class
            version = getattr(cls, "version", "?") if cls else "?"
            caps = ""
            if cls is not None:
                try:
                    caps = cls().capabilities().summary() if status.available else ""
                except Exception as error:  # a broken plug-in is reported, never fatal
                    caps = f"capabilities failed: {type(error).__name__}: {error}"
            availability = "available" if status.available else f"unavailable: {status.reason}"
            rows.append((entry.name, version, entry.distribution, availability, caps))
    print_table(("backend", "version", "package", "status", "capabilities"), rows, title="pagedattn backends")
    return 0


def usage() -> str:
    """The top-level usage: the commands and one line on each."""
    lines = ["usage: pagedattn [--version] COMMAND [ARGS]  (pagedattn COMMAND --help for a command's options)",
             "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``pagedattn COMMAND ...`` to the owning module's ``main``."""
    from pagedattn import __version__
    from pagedattn.usage import usage_error

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"pagedattn {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        return usage_error("pagedattn", f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    if command == "backends":
        return backends_main(rest)
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == "pagedattn":
            raise
        return usage_error(f"pagedattn {command}", f"needs the package {error.name!r}, which is not installed here"
                           f" (pip install pagedattn installs it, or pip install {error.name.split('.')[0]})")
    return int(module.main(rest))
