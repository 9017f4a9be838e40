"""Triton's CPU interpreter with its language scan and patches done once a launch, not on every helper call.

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
Two more costs of the interpreter's Python are cut, neither of which changes what a kernel
computes:

- Every call of a helper patches the language modules its function sees again (``_patch_lang``:
  a scan of the function's globals, then the tensor methods and ``range``, ``reduce`` and the
  rest set anew), though nothing inside a launch undoes them: a fifth of a long kernel's time.
  Here a launch patches the modules of each function's globals once, and a helper whose globals
  this launch patched already skips it. A launch restores what it patched when it ends, and the
  next launch patches again.
- CPython (3.11 here) keeps a thread's frames in 16 KiB chunks of a data stack: a call that
  does not fit the current chunk maps a new one (``mmap``), and the return of the call that
  opened it unmaps it. A kernel's helpers, called under pytest, hypothesis and the conformance
  runner, can sit at a chunk boundary and cross it hundreds of times a tile: one long-sequence
  cell made three million ``mmap``/``munmap`` pairs, and their page faults took a third of the
  conformance suite's CPU time. Each launch runs under a frame of :data:`LAUNCH_FRAME_SLOTS`
  value slots (an unused operand stack), too large for 16 KiB, so it opens a chunk of 1 MiB,
  mapped once a launch, that holds every frame of the launch above it.

And it runs each launch under ``numpy.errstate(all="ignore")``: the interpreter computes with
NumPy, so a kernel's IEEE arithmetic on NaN or inf data (which the conformance suite feeds it on
purpose) raised NumPy's RuntimeWarnings ("invalid value encountered in multiply", and "All-NaN
slice encountered" from a row maximum, which NumPy warns of outside errstate); the values are
unchanged. This module imports triton only when :func:`install` runs.
"""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Any

import numpy as np

_installed = False
#: The interpreter's own scan, kept by :func:`install` (the tests compare the two).
original_patch_builtin: Any = None


#: Value slots of the frame a launch runs under: 512 KiB of the 1 MiB data-stack chunk it opens,
#: the rest left for the launch's frames.
LAUNCH_FRAME_SLOTS = 1 << 16


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


#: ``fn(*args, **kwargs)`` from a frame of :data:`LAUNCH_FRAME_SLOTS` slots: its frames in a chunk of their own.
call_in_own_chunk = types.FunctionType(_call.__code__.replace(co_stacksize=LAUNCH_FRAME_SLOTS), globals(),
                                       "call_in_own_chunk")


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

    patch_lang = interpreter._patch_lang
    patched: set[int] = set()  # the jit functions' globals whose language modules this launch patched

    def patch_lang_once_a_launch(fn: Any) -> Any:
        if id(fn.__globals__) in patched:
            return interpreter._LangPatchScope()  # patched already: nothing to restore
        patched.add(id(fn.__globals__))
        return patch_lang(fn)

    launch = interpreter.GridExecutor.__call__

    def launch_quietly(self: Any, *args: Any, **kwargs: Any) -> Any:
        patched.clear()
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)  # max of a NaN row
            return call_in_own_chunk(launch, self, *args, **kwargs)

    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang = patch_lang_once_a_launch
    interpreter._patch_lang_tensor = patch_lang_tensor_index
    interpreter.GridExecutor.__call__ = launch_quietly
    _installed = True
