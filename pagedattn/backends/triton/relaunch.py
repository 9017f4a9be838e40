"""Launching a plan's kernels again without Triton's per-call argument binding.

``kernel[grid](*args)`` binds and specializes every argument on every call: each tensor's
dtype and 16-byte alignment, each integer's value class (1, divisible by 16), then a cache
lookup (tens of microseconds of host time for the attention kernel's ~50 arguments). A
:class:`Relauncher` belongs to one plan. It keeps the compiled kernel a first JIT launch
returned, under a key the caller builds from everything that can differ between runs of
that plan (strides and alignment of the arrays passed to ``run``, the device, the grid),
and launches that binary directly when the key comes again. Every other argument is
fixed by the plan. Any new key goes through the JIT, which compiles or finds its binary.
In the interpreter, or with a launch hook installed, every call goes through the JIT.

This module imports triton inside its methods only.
"""

from __future__ import annotations

from typing import Any


class Relauncher:
    """Compiled kernels of one plan, by launch key."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[Any, ...], Any] = {}

    def launch(self, kernel: Any, grid: tuple[int, int, int], key: tuple[Any, ...], args: list[Any],
               constexprs: dict[str, Any], options: dict[str, Any], interpret: bool) -> None:
        """Run ``kernel[grid](*args, **constexprs, **options)``, reusing the binary found for ``key``."""
        if interpret:
            kernel[grid](*args, **constexprs, **options)
            return
        from triton import knobs
        from triton.runtime.driver import driver

        device = driver.active.get_current_device()
        full_key = (id(kernel), device, grid, key)
        found = self._compiled.get(full_key)
        hooks = _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)
        if found is None or hooks:
            compiled = kernel[grid](*args, **constexprs, **options)
            if not hooks and all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
                names = kernel.arg_names[len(args):]
                self._compiled[full_key] = (compiled, [constexprs[name] for name in names])
            return
        compiled, constexpr_values = found
        stream = driver.active.get_current_stream(device)
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *constexpr_values)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is installed: a callable, or a hook chain (triton 3.6) with members."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0
