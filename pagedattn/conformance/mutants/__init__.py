"""A catalog of mutant backends: each is the stepped NumPy kernel with one small, realistic bug.

They are not registered as entry points; run one with ``--backend mutant:NAME`` (pytest) or
``pagedattn conform --backend mutant:NAME``. ``tests/test_mutants.py`` shows the ``quick``
profile kills every one. :data:`MUTANTS` maps each name to its class; each class says its
bug (``bug``) and the kind of public report it models (``models``).
"""

from __future__ import annotations

from pagedattn.conformance.mutants import attention, operations, plans, scale
from pagedattn.conformance.mutants.kernel import SteppedKernelBackend


def _catalog() -> dict[str, type[SteppedKernelBackend]]:
    found: dict[str, type[SteppedKernelBackend]] = {}
    for module in (attention, operations, plans, scale):
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, SteppedKernelBackend) and value.bug \
                    and value.__module__ == module.__name__:
                value.name = f"mutant:{name}"
                found[name] = value
    return found


#: name -> mutant class
MUTANTS: dict[str, type[SteppedKernelBackend]] = _catalog()

__all__ = ["MUTANTS", "SteppedKernelBackend"]
