"""Triton's CPU interpreter with its language scan done once instead of on every helper call.

Under ``TRITON_INTERPRET=1``, every call of a ``@triton.jit`` helper inside a kernel (once per
program instance and call site) makes the interpreter look again for the builtins of
``triton.language``, its ``tensor`` class and ``math`` module to patch:
``inspect.getmembers`` on each, which lists, looks up and sorts every member. That scan,
not the kernels' arithmetic, was most of the interpreter's time in the conformance suite.
:func:`install` keeps the names of each namespace's builtins from its first scan (taken
while nothing is patched: a kernel launch patches before any helper runs) and thereafter
checks only those names, patching the ones that are still builtins, as the scan would.
What runs and what it computes are unchanged.

It also gives the interpreter's tensors an ``__index__`` that reads their one element with
``.item()``: the interpreter's own ``int(array)`` on a one-element array raises NumPy's
DeprecationWarning ("Conversion of an array with ndim > 0 to a scalar"), one per use of a
tensor as an index, which flooded the suite's output with about a hundred thousand copies.
This module imports triton inside :func:`install` only.
"""

from __future__ import annotations

import inspect
from typing import Any

_installed = False
#: The interpreter's own scan, kept by :func:`install` (the tests compare the two).
original_patch_builtin: Any = None


def install() -> None:
    """Replace the interpreter's builtin scan by the cached one and its ``__index__`` (idempotent)."""
    global _installed, original_patch_builtin
    if _installed:
        return
    from triton.language import core
    from triton.runtime import interpreter

    builtin_names: dict[int, tuple[str, ...]] = {}
    patch_attr = interpreter._patch_attr

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        names = builtin_names.get(id(pkg))
        if names is None:
            names = tuple(name for name, member in inspect.getmembers(pkg) if core.is_builtin(member))
            builtin_names[id(pkg)] = names  # modules and classes: they live as long as the process
        for name in names:
            member = getattr(pkg, name)
            if core.is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    original_patch_builtin = interpreter._patch_builtin
    patch_lang_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor_index(tensor: Any, scope: Any) -> None:
        patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang_tensor = patch_lang_tensor_index
    _installed = True
