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

    if argv:
        print("usage: pagedattn backends", file=sys.stderr)
        return 2
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


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``pagedattn COMMAND ...`` to the owning module's ``main``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: pagedattn COMMAND [ARGS]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<10} {text}")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"pagedattn: unknown command {command!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command == "backends":
        return backends_main(rest)
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest))
