"""Compiling (NVRTC through ``cupy.RawModule``, cached per specialization) and launching kernels.

Kernels launch on torch's current stream when torch is imported and has initialised CUDA,
otherwise on cupy's current stream. A failed launch raises :class:`KernelLaunchError` naming
the kernel; ``sync=True`` (the backend's ``sync`` option) also synchronises after the launch,
to surface asynchronous faults at the launch that caused them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.backends.cupy.specializations import COMPILE_OPTIONS, Specialization, source
from pagedattn.backends.torch_streams import current_device_getter, current_stream_getter


class KernelLaunchError(RuntimeError):
    """A kernel failed to compile, launch or run; the message names it."""


@functools.cache
def kernel(spec: Specialization) -> Any:
    """Compile ``spec`` with NVRTC (once per process) and return its ``cupy.RawKernel``.

    A specialization with an ``arch`` (sm_90a for wgmma) is compiled to a cubin for that
    architecture here (cupy would add the device's own ``-arch``) and loaded from a file."""
    import cupy

    if spec.arch is not None:
        return _kernel_for_arch(spec)
    try:
        module = cupy.RawModule(
            code=source(spec.module),
            options=COMPILE_OPTIONS,
            name_expressions=[spec.name_expression],
        )
        return module.get_function(spec.name_expression)
    except Exception as error:  # CompileException, CUDADriverError
        raise KernelLaunchError(f"compiling {spec.name_expression}: {error}") from error


def compile_cubin(module: str, name_expressions: list[str], arch: str,
                  extra_options: tuple[str, ...] = (),
                  text: str | None = None, *, ptx: bool = False) -> tuple[bytes, dict[str, str], str]:
    """NVRTC-compile ``module`` (``text``: this source in place of its file) for ``arch``:
    (cubin, lowered name of each name expression, log). ``ptx``: stop before ptxas, with the
    PTX of ``arch``'s virtual architecture in place of the cubin (every template instantiated
    and checked, in about half the time). Raises KernelLaunchError with NVRTC's log on a
    compile error."""
    from cupy.cuda import nvrtc

    program = nvrtc.createProgram(source(module) if text is None else text, f"{module}.cu", [], [])
    target = arch.replace("sm_", "compute_") if ptx else arch
    try:
        for name in name_expressions:
            nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, [f"-arch={target}", *COMPILE_OPTIONS, *extra_options])
        except nvrtc.NVRTCError as error:
            raise KernelLaunchError(
                f"compiling {module}.cu for {arch}: {error}\n{nvrtc.getProgramLog(program)}"
            ) from None
        log = nvrtc.getProgramLog(program)
        lowered = {name: nvrtc.getLoweredName(program, name) for name in name_expressions}
        cubin = nvrtc.getPTX(program) if ptx else nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
    if not cubin:
        raise KernelLaunchError(f"compiling {module}.cu: NVRTC produced no {'PTX' if ptx else 'cubin'} for {arch}")
    return cubin, lowered, log


def _kernel_for_arch(spec: Specialization) -> Any:
    import cupy

    assert spec.arch is not None
    cubin, lowered, _ = compile_cubin(spec.module, [spec.name_expression], spec.arch)
    digest = hashlib.sha256(cubin).hexdigest()[:24]
    path = os.path.join(tempfile.gettempdir(), f"pagedattn-cupy-{digest}.cubin")
    if not os.path.exists(path):
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
            f.write(cubin)
        os.replace(f.name, path)
    try:
        return cupy.RawModule(path=path).get_function(lowered[spec.name_expression])
    except Exception as error:  # CUDADriverError (e.g. sm_90a code on another device)
        raise KernelLaunchError(f"loading {spec.name_expression} ({spec.arch}): {error}") from error


@functools.cache
def _device_arch(device: int) -> str:
    import cupy

    return str(cupy.cuda.Device(device).compute_capability)


def device_arch() -> str:
    """The current device's compute capability as cupy spells it ("90" for H100/H200)."""
    import cupy

    return _device_arch(cupy.cuda.Device().id)


#: cupy views of torch streams, by (device, stream handle): made once, not on every launch
_EXTERNAL_STREAMS: dict[tuple[int, int], Any] = {}
#: dynamic shared memory each kernel has been allowed so far (cuFuncSetAttribute once)
_SMEM_ALLOWED: dict[Specialization, int] = {}


class _StreamHandle:
    """A CUDA stream handle under the CUDA stream protocol (what ``Stream.from_external`` takes)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def _torch_stream(torch: Any) -> tuple[int, int]:
    """(device index, stream handle) of torch's current stream (:mod:`..torch_streams`)."""
    device = current_device_getter(torch)()
    return device, current_stream_getter(torch)(device)


def current_stream() -> Any:
    """torch's current CUDA stream as a cupy stream if torch is in use, else cupy's current one."""
    import cupy

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        key = _torch_stream(torch)
        external = _EXTERNAL_STREAMS.get(key)
        if external is None:
            external = cupy.cuda.Stream.from_external(_StreamHandle(key[1]))
            _EXTERNAL_STREAMS[key] = external
        return external
    return cupy.cuda.get_current_stream()


def prepared(spec: Specialization, shared_mem: int = 0) -> Any:
    """The compiled kernel of ``spec``, allowed ``shared_mem`` bytes of dynamic shared memory."""
    function = kernel(spec)
    if shared_mem > _SMEM_ALLOWED.get(spec, 48 * 1024):
        if function.max_dynamic_shared_size_bytes < shared_mem:
            function.max_dynamic_shared_size_bytes = shared_mem
        _SMEM_ALLOWED[spec] = shared_mem
    return function


#: torch's getter of a device's current stream handle, once torch has initialised CUDA (it
#: never goes back): from then on every ``run`` launches on torch's stream and asks only this
_torch_raw_stream: Callable[[int], int] | None = None


def stream_handle(device: int) -> int:
    """The handle of the stream :func:`current_stream` names, on ``device`` for torch's: what
    every ``run`` launches on, read without making a cupy stream object."""
    global _torch_raw_stream
    if _torch_raw_stream is not None:
        return _torch_raw_stream(device)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        _torch_raw_stream = current_stream_getter(torch)
        return int(_torch_raw_stream(device))
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


_SLOT_MASK = (1 << 64) - 1


def argument_bits(value: Any) -> int:
    """The bits a kernel parameter slot holds for ``value``: an int (a pointer) as it is, a
    cupy array's data pointer, a NumPy scalar's bytes (a 4-byte one in the low half)."""
    if isinstance(value, int):
        return value & _SLOT_MASK
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):  # cupy.ndarray
        return int(data.ptr)
    if isinstance(value, np.generic) and value.nbytes in (4, 8):
        return int.from_bytes(value.tobytes(), sys.byteorder)
    raise TypeError(f"a kernel argument must be an int, a cupy array or a 4- or 8-byte NumPy scalar,"
                    f" received {type(value).__name__}")


class KernelArguments:
    """A kernel's parameter block, made once per plan: one 8-byte slot per argument holding its
    bits (a 4-byte value in the low half, which is where the kernel reads it on a
    little-endian host) and the array of slot addresses that ``cuLaunchKernel`` takes.
    A run rewrites only the slots that change (pointers, strides); the driver copies the
    values at launch, so a CUDA graph keeps those of its capture."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        if sys.byteorder != "little":
            raise KernelLaunchError("kernel parameter slots assume a little-endian host")
        count = len(values)
        #: the slots (ctypes ``c_uint64`` array): a run assigns its pointers, integers in
        #: ``[0, 2**64)``, to a slice of them in one statement
        self.slots = (ctypes.c_uint64 * count)(*(argument_bits(v) for v in values))
        base = ctypes.addressof(self.slots)
        self._addresses = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
        self.address = ctypes.addressof(self._addresses)

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index: int) -> int:
        return int(self.slots[index])

    def __setitem__(self, index: int, value: int) -> None:
        """Set slot ``index`` to an integer (a pointer or a 64-bit stride)."""
        self.slots[index] = value & _SLOT_MASK


def kernel_handle(function: Any) -> int:
    """The ``CUfunction`` handle of a :func:`prepared` kernel (a ``cupy.RawKernel``) on the
    current device."""
    return int(function.kernel.ptr)


def launch_config(
    handle: int, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int
) -> tuple[int, ...] | None:
    """What ``cuLaunchKernel`` takes before the stream, made once per plan:
    ``(handle, grid x, y, z, block x, y, z, shared_mem)``; None for an empty grid (nothing to
    launch)."""
    if grid[0] == 0:
        return None
    return (handle, *(*grid, 1, 1)[:3], *(*block, 1, 1)[:3], shared_mem)


def launch_direct(
    config: tuple[int, ...],
    arguments: KernelArguments,
    stream: int,
    sync: bool = False,
    name: str = "kernel",
) -> None:
    """Launch a kernel by its :func:`launch_config` with a prepared parameter block on
    ``stream`` (a handle), in one driver call; raise KernelLaunchError naming it. What every
    ``run`` launches with."""
    launch_kernel, synchronize = _driver_calls()
    try:
        launch_kernel(*config, stream, arguments.address, 0)
        if sync:
            synchronize(stream)
    except Exception as error:
        raise KernelLaunchError(
            f"launching {name} grid={config[1:4]} block={config[4:7]}: {error}"
        ) from error


@functools.cache
def _driver_calls() -> tuple[Callable[..., None], Callable[[int], None]]:
    """cupy's ``cuLaunchKernel`` and ``cudaStreamSynchronize`` wrappers, looked up once (an
    import statement in every launch costs a microsecond)."""
    from cupy_backends.cuda.api import driver, runtime

    return driver.launchKernel, runtime.streamSynchronize


def launch(
    spec: Specialization,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    args: tuple[Any, ...],
    *,
    shared_mem: int = 0,
    stream: Any = None,
    sync: bool = False,
) -> None:
    """Launch ``spec`` on ``stream`` (default: :func:`current_stream`); raise KernelLaunchError."""
    if grid[0] == 0:
        return
    function = prepared(spec, shared_mem)
    stream = current_stream() if stream is None else stream
    try:
        with stream:
            function(grid, block, args, shared_mem=shared_mem)
        if sync:
            stream.synchronize()
    except Exception as error:
        raise KernelLaunchError(
            f"launching {spec.name_expression} grid={grid} block={block}: {error}"
        ) from error
