"""Launching a plan's kernels again without Triton's per-call argument binding.

``kernel[grid](*args)`` binds and specializes every argument on every call: each tensor's
dtype and 16-byte alignment, each integer's value class (1, divisible by 16), then a cache
lookup, and its launcher asks the driver about every pointer (tens of microseconds of host
time for the attention kernel's ~50 arguments). A :class:`Relauncher` belongs to one plan.
Its :meth:`~Relauncher.launch` goes through the JIT and keeps the compiled kernel it
returned, under a key the caller builds from everything that can differ between runs of
that plan (strides and alignment of the arrays passed to ``run``, the device); when the
key comes again, :meth:`~Relauncher.ready` gives a :class:`ReadyLaunch` that calls the
binary's launcher directly with integer pointers. The caller has checked that those
pointers are on the plan's device, which the launcher then no longer asks. In the
interpreter, or with a launch hook installed, every launch goes through the JIT.

This module imports triton inside its methods only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReadyLaunch:
    """One compiled kernel and everything its launcher takes besides the stream and the
    run-time arguments: ``launch(*grid, stream, *middle, *args, *constexpr_values)``."""

    launch: Callable[..., Any]
    grid: tuple[int, int, int]
    middle: tuple[Any, ...]
    constexpr_values: tuple[Any, ...]

    def __call__(self, stream: int, args: tuple[Any, ...]) -> None:
        """Launch on ``stream`` (a CUDA stream handle) with the kernel's non-constexpr
        arguments ``args``, pointers as integers."""
        self.launch(*self.grid, stream, *self.middle, *args, *self.constexpr_values)

    def bind(self, fixed: tuple[Any, ...]) -> ReadyLaunch:
        """This launch with ``fixed``, the last run-time arguments, bound in before the
        constexpr values: ``launch(*grid, stream, *middle, *args, *constexpr_values)`` then
        takes only the arguments before them as ``args``."""
        return ReadyLaunch(self.launch, self.grid, self.middle, (*fixed, *self.constexpr_values))

    @classmethod
    def of(cls, compiled: Any, grid: tuple[int, int, int], constexpr_values: tuple[Any, ...]) -> ReadyLaunch | None:
        """The ready launch of a kernel the JIT compiled and launched, or None when this
        triton's compiled kernel does not have the parts it needs."""
        if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            return None
        launcher = compiled.run
        direct = all(hasattr(launcher, name) for name in ("launch", "launch_cooperative_grid", "launch_pdl"))
        scratch = getattr(launcher, "global_scratch_size", 0) or getattr(launcher, "profile_scratch_size", 0)
        if direct and not scratch:  # the C launcher itself: no Python frame, no scratch allocation
            middle = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                      compiled.packed_metadata, None, None, None)
            return cls(launcher.launch, grid, middle, constexpr_values)
        return cls(launcher, grid, (compiled.function, compiled.packed_metadata, None, None, None), constexpr_values)


class Relauncher:
    """Compiled kernels of one plan, by kernel and launch key."""

    def __init__(self) -> None:
        self._ready: dict[tuple[Any, ...], ReadyLaunch] = {}

    def ready(self, kernel: Any, key: tuple[Any, ...]) -> ReadyLaunch | None:
        """The ready launch of ``kernel`` found for ``key``; None if there is none yet or a
        launch hook is installed (then the caller goes through :meth:`launch`)."""
        found = self._ready.get((id(kernel), key))
        if found is None or launch_hooked():
            return None
        return found

    def launch(self, kernel: Any, grid: tuple[int, int, int], key: tuple[Any, ...] | None, args: list[Any],
               constexprs: dict[str, Any], options: dict[str, Any], interpret: bool) -> None:
        """Run ``kernel[grid](*args, **constexprs, **options)`` through the JIT and keep the
        binary it found for ``key`` (not when ``key`` is None, in the interpreter or under a
        launch hook)."""
        compiled = kernel[grid](*args, **constexprs, **options)
        if interpret or key is None or launch_hooked():
            return
        names = kernel.arg_names[len(args):]
        ready = ReadyLaunch.of(compiled, grid, tuple(constexprs[name] for name in names))
        if ready is not None:
            self._ready[(id(kernel), key)] = ready


@functools.cache
def _runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


def launch_hooked() -> bool:
    """Whether a launch enter or exit hook is installed (a profiler must see every launch): a
    callable, or a hook chain (triton 3.6) with members. Asked before every direct launch, so
    written out in one frame."""
    runtime = _runtime_knobs()
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None:
            calls = getattr(hook, "calls", None)
            if calls is None or len(calls) > 0:
                return True
    return False
