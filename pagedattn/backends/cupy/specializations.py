"""The template instantiations the cupy backend declares, and how their source is compiled.

One source (``kernels/*.cu`` plus ``kernels/common.cuh``) per module; a specialization is a
name expression such as ``paged_attention<bfloat16_t, 128, 16, 4>``. The same list is what
:mod:`pagedattn.backends.cupy.compile_check` compiles for sm_90 in CI, so whatever the backend
can launch has been compiled without a GPU first. The wgmma kernel is compiled for sm_90a
(its Specialization's ``arch``), the rest for the device's own architecture.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).with_name("kernels")

#: Contract dtype name -> the kernels' storage type (16-bit types are raw bit patterns).
CUDA_TYPES: dict[str, str] = {"float32": "float", "float16": "half_t", "bfloat16": "bfloat16_t"}
#: fp8 cache dtype name -> the kernels' byte storage type (kernels/fp8.cuh).
FP8_TYPES: dict[str, str] = {"float8_e4m3fn": "fp8_e4m3_t", "float8_e5m2": "fp8_e5m2_t"}
#: Any cache dtype name -> its storage type in the kernels.
CACHE_TYPES: dict[str, str] = {**CUDA_TYPES, **FP8_TYPES}
HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
BLOCK_SIZES: tuple[int, ...] = (16, 32, 64)
#: Query rows (tokens x query heads of one KV head) per CTA of the CUDA-core attention kernel.
ROWS: tuple[int, ...] = (4, 8)
#: The tensor-core prefill kernel (kernels/paged_attention_mma.cu): 64 rows, 64-key tiles in
#: 3 stages, 16-bit dtypes.
MMA_ROWS = 64
MMA_STAGES = 3
MMA_TILE_N = 64
#: The Hopper prefill kernel (kernels/paged_attention_wgmma.cu, sm_90a): work items of
#: WGMMA_ROWS rows and MMA_TILE_N-key tiles, 2 warpgroups, WGMMA_STAGES K/V stages, 16-bit
#: caches at these head dims; taken as the backend's ``prefill`` option says (planning), on
#: compute capability 9.0 only
WGMMA_ROWS = 128
WGMMA_THREADS = 256
WGMMA_STAGES = 4
#: CTAs per SM the wgmma kernel's launch bounds ask for (the backend's ``wgmma_ctas`` option,
#: default WGMMA_CTAS_DEFAULT): 2 caps registers at 128 a thread and takes fewer K/V stages
#: (:func:`wgmma_stages`); it ran causal prefill 8 x 4,096 in 2.54-2.65 ms on an H200, 1 CTA
#: in 3.49-3.52 ms (docs/backends/cupy.md)
WGMMA_CTAS_CHOICES: tuple[int, ...] = (1, 2)
WGMMA_CTAS_DEFAULT = 2
WGMMA_HEAD_DIMS: tuple[int, ...] = (64, 128)
WGMMA_OVERLAP_HEAD_DIMS: tuple[int, ...] = (128,)
WGMMA_ARCH = "sm_90a"
WGMMA_MODULE = "paged_attention_wgmma"
MMA_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
MMA_HEAD_DIMS: tuple[int, ...] = (64, 128)
#: The tensor-core decode kernel (kernels/paged_attention_decode.cu): 16 rows, 4 warps in
#: streams splitting the keys in 16-key sub-tiles, 3 stages per stream, 2 CTAs per SM; the
#: prefill kernel's dtypes, and head_dim 256 too (16-bit caches only there: fp8 caches are
#: refused at 256, where the prefill kernel has no instantiation).
DECODE_ROWS = 16
DECODE_WARPS = 4
DECODE_STAGES = 3
#: K/V stages per stream (a warp) of the decode kernel for fp8 caches (half the bytes per sub-tile:
#: four load while a step attends two), and the CTAs per SM its launch bounds ask for (2 x 101 KB
#: of shared memory at head_dim 128)
DECODE_FP8_STAGES = 6
DECODE_FP8_CTAS_PER_SM = 2
#: Sub-tiles the fp8 decode kernel attends in one step of its loop (one online-softmax update and
#: one O rescale per step)
DECODE_FP8_STEP_SUBS = 2
#: Query rows the decode kernel computes for fp8 caches (the n side of its m16n8k16 products:
#: keys on the M side, S^T = K Q^T), so fp8 decode items hold at most this many rows
DECODE_FP8_ROWS = 8
DECODE_SUB_N = 16
DECODE_HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
DECODE_THREADS = 32 * DECODE_WARPS
NUM_THREADS = 128  # threads per CTA of the attention kernel (kernels/paged_attention.cu)
ITEM_FIELDS = 11  # ints per work item
MERGE_FIELDS = 7  # ints per split-KV merge

#: ``-std=c++17`` for constexpr helpers; ``-I`` the kernel folder for common.cuh.
COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17", f"-I{KERNEL_DIR}")


@dataclass(frozen=True)
class Specialization:
    """One kernel instantiation: which module (``.cu`` file stem), its name expression, and
    the architecture it must be compiled for (``None``: the device's own, through cupy)."""

    module: str
    name_expression: str
    arch: str | None = None


def wgmma_supports(dtype: str, head_dim: int, cache_dtype: str | None = None) -> bool:
    """Whether paged_attention_wgmma has an instantiation for these dtypes and head_dim (16-bit
    queries and the same 16-bit cache; fp8 caches stay on the mma.sync kernels)."""
    return (
        dtype in MMA_DTYPES and head_dim in WGMMA_HEAD_DIMS and (cache_dtype or dtype) == dtype
    )


def wgmma_stages(head_dim: int, ctas: int = 1) -> int:
    """K/V stages of the wgmma kernel (``wgmma_stages`` in the .cu): WGMMA_STAGES at one CTA per
    SM; at two, what fits two CTAs' shared memory: 2 at head_dim 128, 3 at 64."""
    if ctas == 1:
        return WGMMA_STAGES
    return 2 if head_dim == 128 else 3


def wgmma_attention(
    dtype: str,
    head_dim: int,
    block_size: int,
    overlap: bool | None = None,
    ctas: int = WGMMA_CTAS_DEFAULT,
) -> Specialization:
    """``paged_attention_wgmma<T, head_dim, block_size, OVERLAP[, CTAS]>`` compiled for
    ``WGMMA_ARCH`` (``overlap`` None: the overlap schedule wherever it exists,
    :func:`wgmma_overlap_possible`). CTAS is named only when it is 2 (1 is the template's
    default)."""
    if overlap is None:
        overlap = wgmma_overlap_possible(head_dim, ctas)
    if overlap and not wgmma_overlap_possible(head_dim, ctas):
        raise ValueError(f"wgmma kernel: no overlap schedule at head_dim {head_dim}, {ctas} CTAs/SM")
    suffix = "" if ctas == 1 else f", {ctas}"
    return Specialization(
        WGMMA_MODULE,
        f"paged_attention_wgmma<{CUDA_TYPES[dtype]}, {head_dim}, {block_size},"
        f" {'true' if overlap else 'false'}{suffix}>",
        WGMMA_ARCH,
    )


def wgmma_overlap_possible(head_dim: int, ctas: int) -> bool:
    """Whether the overlap schedule exists at this head_dim and CTAs per SM."""
    return head_dim in WGMMA_OVERLAP_HEAD_DIMS and wgmma_stages(head_dim, ctas) >= 3


def wgmma_spec_ctas(spec: Specialization) -> int:
    """CTAs per SM of a ``paged_attention_wgmma`` specialization (from its name expression)."""
    return 2 if spec.name_expression.endswith(", 2>") else 1


def wgmma_layout_check(dtype: str, head_dim: int) -> Specialization:
    """``wgmma_layout_check<T, head_dim>``: one warpgroup's S = Q K^T and O = P V (the gpu tests)."""
    return Specialization(
        WGMMA_MODULE, f"wgmma_layout_check<{CUDA_TYPES[dtype]}, {head_dim}>", WGMMA_ARCH
    )


def wgmma_smem_bytes(head_dim: int, ctas: int = 1) -> int:
    """Dynamic shared memory of ``paged_attention_wgmma`` (as ``wgmma_smem_bytes`` in the .cu):
    1,024 for aligning the swizzle atoms, the K/V stages, the Q tile, three ints/floats per row."""
    return (
        1024
        + wgmma_stages(head_dim, ctas) * 2 * MMA_TILE_N * head_dim * 2
        + WGMMA_ROWS * head_dim * 2
        + 3 * WGMMA_ROWS * 4
    )


def tile_n(dtype: str, rows: int = ROWS[0]) -> int:
    """Keys per K/V tile: ``Tile<T>::TILE_N`` (CUDA cores) or ``MMA_TILE_N`` (tensor-core
    prefill: the mma.sync and the wgmma kernels)."""
    if rows in (MMA_ROWS, WGMMA_ROWS):
        return MMA_TILE_N
    return {DECODE_ROWS: DECODE_WARPS * DECODE_SUB_N}.get(rows, 32)


def threads(rows: int, spec: Specialization | None = None) -> int:
    """Threads per CTA of the attention kernel used for ``rows`` (``spec``: that kernel)."""
    if spec is not None and spec.module == WGMMA_MODULE:
        return WGMMA_THREADS
    return DECODE_THREADS if rows == DECODE_ROWS else NUM_THREADS


def stages(dtype: str) -> int:
    """K/V tiles held in shared memory (``Tile<T>::STAGES``)."""
    return 2 if dtype == "float32" else 4


def itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def attention_smem_bytes(dtype: str, head_dim: int, rows: int) -> int:
    """Dynamic shared memory of ``paged_attention`` (as ``attention_smem_bytes`` in the .cu)."""
    size = itemsize(dtype)
    chunks_per_row = head_dim * size // 16
    tiles = 2 * stages(dtype) * tile_n(dtype) * head_dim * size
    reduction = (NUM_THREADS // chunks_per_row) * rows * head_dim * 4
    return max(tiles, reduction) + rows * tile_n(dtype) * 4 + 5 * rows * 4


def cache_bytes(cache_dtype: str) -> int:
    """Bytes of one cache element (fp8: 1)."""
    return 1 if cache_dtype in FP8_TYPES else itemsize(cache_dtype)


def mma_smem_bytes(head_dim: int, cache_dtype: str = "bfloat16") -> int:
    """Dynamic shared memory of ``paged_attention_mma`` (as ``mma_smem_bytes`` in the .cu)."""
    fp8 = cache_dtype in FP8_TYPES
    return (
        MMA_ROWS * head_dim * 2
        + MMA_STAGES * 2 * MMA_TILE_N * head_dim * cache_bytes(cache_dtype)
        + (2 * MMA_TILE_N * head_dim * 2 if fp8 else 0)
        + 3 * MMA_ROWS * 4
    )


def decode_split(head_dim: int) -> int:
    """Warps of one stream of ``paged_attention_decode`` (``dec_split`` in the .cu): 2 at
    head_dim 256, each accumulating half of O's columns of the sub-tiles both load; else 1."""
    return 2 if head_dim > 128 else 1


def decode_smem_bytes(head_dim: int, cache_dtype: str = "bfloat16") -> int:
    """Dynamic shared memory of ``paged_attention_decode`` (as ``decode_smem_bytes`` in the .cu):
    Q, each stream's K/V stages (DECODE_STAGES; fp8: DECODE_FP8_STAGES), the row state, the
    streams' m and l."""
    streams = DECODE_WARPS // decode_split(head_dim)
    stages = DECODE_FP8_STAGES if cache_dtype in FP8_TYPES else DECODE_STAGES
    stream_bytes = stages * 2 * DECODE_SUB_N * head_dim * cache_bytes(cache_dtype)
    return (
        DECODE_ROWS * head_dim * 2
        + streams * stream_bytes
        + 3 * DECODE_ROWS * 4
        + 2 * streams * DECODE_ROWS * 4
    )


def smem_bytes(
    dtype: str,
    head_dim: int,
    rows: int,
    cache_dtype: str | None = None,
    spec: Specialization | None = None,
) -> int:
    """Dynamic shared memory of the attention kernel used for ``rows`` (``spec``: that kernel)."""
    cache_dtype = cache_dtype or dtype
    if spec is not None and spec.module == WGMMA_MODULE:
        return wgmma_smem_bytes(head_dim, wgmma_spec_ctas(spec))
    if rows == DECODE_ROWS:
        return decode_smem_bytes(head_dim, cache_dtype)
    if rows == MMA_ROWS:
        return mma_smem_bytes(head_dim, cache_dtype)
    return attention_smem_bytes(dtype, head_dim, rows)


def attention(
    dtype: str, head_dim: int, block_size: int, rows: int, cache_dtype: str | None = None
) -> Specialization:
    """The attention kernel for ``rows`` rows per CTA (``DECODE_ROWS``: tensor-core decode;
    ``MMA_ROWS``: mma.sync prefill; ``ROWS``: the CUDA-core kernel). ``WGMMA_ROWS`` items go to
    the Hopper kernel, :func:`wgmma_attention`.

    The tensor-core kernels take the cache's storage type too (``cache_dtype``, default the
    query's ``dtype``; fp8 only there); the CUDA-core kernel reads caches of ``dtype`` only.
    """
    cache = CACHE_TYPES[cache_dtype or dtype]
    if rows == DECODE_ROWS:
        return Specialization(
            "paged_attention_decode",
            f"paged_attention_decode<{CUDA_TYPES[dtype]}, {head_dim}, {block_size}, {cache}>",
        )
    if rows == MMA_ROWS:
        return Specialization(
            "paged_attention_mma",
            f"paged_attention_mma<{CUDA_TYPES[dtype]}, {head_dim}, {block_size}, {cache}>",
        )
    if rows not in ROWS:
        raise ValueError(f"attention(): no kernel here takes {rows} rows ({WGMMA_ROWS}: wgmma_attention)")
    if cache_dtype not in (None, dtype):
        raise ValueError(f"the CUDA-core kernel has no {cache_dtype} caches")
    return Specialization(
        "paged_attention", f"paged_attention<{CUDA_TYPES[dtype]}, {head_dim}, {block_size}, {rows}>"
    )


def merge_partials(dtype: str, head_dim: int, rows: int) -> Specialization:
    return Specialization(
        "paged_attention", f"merge_partials<{CUDA_TYPES[dtype]}, {head_dim}, {rows}>"
    )


def kv_op(kernel: str, dtype: str) -> Specialization:
    """``write_kv``, ``copy_blocks_gather``, ``copy_blocks_scatter`` or ``merge_states``
    (copy_blocks also for fp8 caches)."""
    return Specialization("kv_ops", f"{kernel}<{CACHE_TYPES[dtype]}>")


def write_kv_fp8(dtype: str, cache_dtype: str) -> Specialization:
    """``write_kv_fp8``: ``dtype`` keys and values into ``cache_dtype`` (fp8) caches."""
    return Specialization(
        "kv_ops", f"write_kv_fp8<{CUDA_TYPES[dtype]}, {FP8_TYPES[cache_dtype]}>"
    )


KV_OP_KERNELS: tuple[str, ...] = (
    "write_kv",
    "copy_blocks_gather",
    "copy_blocks_scatter",
    "merge_states",
)
#: The kv ops also instantiated for fp8 caches (byte copies).
FP8_KV_OP_KERNELS: tuple[str, ...] = ("copy_blocks_gather", "copy_blocks_scatter")


def all_specializations() -> list[Specialization]:
    """Every instantiation the backend may launch (its capabilities promise no more)."""
    specs: list[Specialization] = []
    for dtype in CUDA_TYPES:
        for head_dim in HEAD_DIMS:
            for rows in ROWS:
                specs.extend(attention(dtype, head_dim, bs, rows) for bs in BLOCK_SIZES)
                specs.append(merge_partials(dtype, head_dim, rows))
            if dtype in MMA_DTYPES and head_dim in MMA_HEAD_DIMS:
                for rows in (MMA_ROWS, DECODE_ROWS):
                    for cache in (dtype, *FP8_TYPES):
                        specs.extend(
                            attention(dtype, head_dim, bs, rows, cache) for bs in BLOCK_SIZES
                        )
                    specs.append(merge_partials(dtype, head_dim, rows))
            elif dtype in MMA_DTYPES and head_dim in DECODE_HEAD_DIMS:  # decode only, 16-bit caches
                specs.extend(attention(dtype, head_dim, bs, DECODE_ROWS) for bs in BLOCK_SIZES)
                specs.append(merge_partials(dtype, head_dim, DECODE_ROWS))
            if wgmma_supports(dtype, head_dim):
                for ctas in WGMMA_CTAS_CHOICES:
                    for overlap in {False, wgmma_overlap_possible(head_dim, ctas)}:
                        specs.extend(
                            wgmma_attention(dtype, head_dim, bs, overlap, ctas)
                            for bs in BLOCK_SIZES
                        )
                # its split-KV partials hold WGMMA_ROWS rows per part
                specs.append(merge_partials(dtype, head_dim, WGMMA_ROWS))
                specs.append(wgmma_layout_check(dtype, head_dim))
        specs.extend(kv_op(kernel, dtype) for kernel in KV_OP_KERNELS)
        specs.extend(write_kv_fp8(dtype, cache) for cache in FP8_TYPES)
    for cache in FP8_TYPES:
        specs.extend(kv_op(kernel, cache) for kernel in FP8_KV_OP_KERNELS)
    return specs


def source(module: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """The CUDA C++ source of ``module`` (``kernel_dir/<module>.cu``), ending in a comment with a
    digest of every header in ``kernel_dir``: cupy caches compiled modules on disk by their
    source text, which names its headers but does not hold them, so an edited header must
    change the text."""
    headers = hashlib.sha256()
    for header in sorted(kernel_dir.glob("*.cuh")):
        headers.update(header.name.encode() + b"\0" + header.read_bytes())
    text = (kernel_dir / f"{module}.cu").read_text()
    return f"{text}\n// headers: {headers.hexdigest()}\n"
