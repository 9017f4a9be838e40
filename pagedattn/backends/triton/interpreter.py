"""Triton's CPU interpreter with its language scan done once instead of on every helper call.

Under ``TRITON_INTERPRET=1``, every call of a ``@triton.jit`` helper inside a kernel (once per
program instance and call site) makes the interpreter look again for the builtins of
``triton.language``, its ``tensor`` class and ``math`` module to patch:
``inspect.getmembers`` on each, which lists, looks up and sorts every member. That scan,
not the kernels' arithmetic, was most of the interpreter's time in the conformance suite.
:func:`install` scans the namespaces the interpreter patches once, outside any kernel launch,
and thereafter checks only those names, patching the ones that are still builtins, as the
scan would; a namespace it did not scan gets the interpreter's own scan. What runs and what
it computes are unchanged.

The names come from :func:`install`, not from the first scan during a launch, because a launch
leaves some builtins replaced while it runs: it sets ``reduce`` and ``associative_scan`` of
both ``triton.language`` and ``triton.language.core``, even when the kernel sees only one of
them, and restores them afterwards. A first scan of the other module inside that launch (a
helper such as ``tl.max`` sees ``core``) would miss those names for the rest of the process.
Outside a launch, a builtin that is not there is gone for good: the interpreter never restores
what a helper's patches replace.

It also gives the interpreter's tensors an ``__index__`` that reads their one element with
``.item()``: the interpreter's own ``int(array)`` on a one-element array raises NumPy's
DeprecationWarning ("Conversion of an array with ndim > 0 to a scalar"), one per use of a
tensor as an index, which flooded the suite's output with about a hundred thousand copies.
And it runs each launch under ``numpy.errstate(all="ignore")``: the interpreter computes with
NumPy, so a kernel's IEEE arithmetic on NaN or inf data (which the conformance suite feeds it on
purpose) raised NumPy's RuntimeWarnings ("invalid value encountered in multiply", and "All-NaN
slice encountered" from a row maximum, which NumPy warns of outside errstate); the values are
unchanged. This module imports triton only when :func:`install` runs.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np

_installed = False
#: The interpreter's own scan, kept by :func:`install` (the tests compare the two).
original_patch_builtin: Any = None


def _builtin_names(pkg: Any) -> tuple[str, ...]:
    """The names of ``pkg``'s members that are triton builtins now, in the interpreter's scan order."""
    from triton.language import core

    return tuple(name for name, member in inspect.getmembers(pkg) if core.is_builtin(member))


def install() -> None:
    """Replace the interpreter's builtin scan by the cached one and its ``__index__`` (idempotent).

    Must run outside a kernel launch (the backend installs it before its first launch).
    """
    global _installed, original_patch_builtin
    if _installed:
        return
    import triton.language as language
    from triton.language import core
    from triton.runtime import interpreter

    namespaces = (core, core.tensor, core.tensor_descriptor_base, language, language.math)
    builtin_names = {id(pkg): _builtin_names(pkg) for pkg in namespaces}  # they live as long as the process
    patch_attr = interpreter._patch_attr
    scan = interpreter._patch_builtin

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        names = builtin_names.get(id(pkg))
        if names is None:
            scan(pkg, builder, scope)
            return
        for name in names:
            member = getattr(pkg, name)
            if core.is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    original_patch_builtin = scan
    patch_lang_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor_index(tensor: Any, scope: Any) -> None:
        patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    launch = interpreter.GridExecutor.__call__

    def launch_quietly(self: Any, *args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)  # max of a NaN row
            return launch(self, *args, **kwargs)

    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang_tensor = patch_lang_tensor_index
    interpreter.GridExecutor.__call__ = launch_quietly
    _installed = True
