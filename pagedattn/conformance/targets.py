"""Which backends a conformance run tests: registry names, ``all``, ``module:Class`` or ``mutant:NAME``.

``all`` means every backend available on this machine
(:func:`pagedattn.backends.available_backends`). ``module:Class`` imports a Backend subclass
that is not registered (a third party's work in progress); ``mutant:NAME`` is one of the
deliberately broken backends of :mod:`pagedattn.conformance.mutants`.
"""

from __future__ import annotations

import importlib

from pagedattn.backends.interface import Backend
from pagedattn.backends.registry import available_backends, backend_names, load_backend
from pagedattn.errors import BackendNotFoundError


def expand(specs: list[str]) -> list[str]:
    """Replace ``all`` by the available backends' names; drop repeats, keep order."""
    names: list[str] = []
    for spec in specs:
        for name in available_backends() if spec == "all" else [spec]:
            if name not in names:
                names.append(name)
    return names


def check_names(specs: list[str]) -> None:
    """Raise BackendNotFoundError (one line, naming what is registered) for a name no backend or mutant has.

    Checks names only, importing nothing: ``module:Class`` is checked when it is resolved.
    """
    registered = backend_names()
    for spec in specs:
        if spec.startswith("mutant:"):
            from pagedattn.conformance.mutants import MUTANTS

            if spec.partition(":")[2] not in MUTANTS:
                raise BackendNotFoundError(f"no mutant named {spec.partition(':')[2]!r};"
                                           f" mutants: {', '.join(sorted(MUTANTS))}")
        elif spec != "all" and ":" not in spec and spec not in registered:
            raise BackendNotFoundError(f"no backend named {spec!r}; registered backends:"
                                       f" {', '.join(registered) or 'none'} (or 'all', module:Class, mutant:NAME)")


def resolve(spec: str) -> Backend:
    """Return the backend instance ``spec`` names (see the module docstring)."""
    if spec.startswith("mutant:"):
        from pagedattn.conformance.mutants import MUTANTS

        name = spec.partition(":")[2]
        if name not in MUTANTS:
            raise BackendNotFoundError(f"no mutant named {name!r}; mutants: {', '.join(sorted(MUTANTS))}")
        return MUTANTS[name]()
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as error:
            raise BackendNotFoundError(f"{spec}: {type(error).__name__}: {error}") from error
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise BackendNotFoundError(f"{spec} is not a pagedattn Backend subclass")
        return cls()
    return load_backend(spec)
