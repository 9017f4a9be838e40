"""Dtype names of the contract and their NumPy forms (ml_dtypes for bfloat16 and fp8).

Every array type (NumPy, torch, cupy) is described by one canonical name such as
``"bfloat16"``; :func:`dtype_name` maps any of them to it without importing a GPU library.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

QUERY_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")
CACHE_DTYPES: tuple[str, ...] = QUERY_DTYPES + FP8_DTYPES
INDEX_DTYPES: tuple[str, ...] = ("int32",)

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}


def dtype_name(dtype: Any) -> str:
    """Return the canonical name of a NumPy, ml_dtypes, torch or cupy dtype (``"bfloat16"``)."""
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch.") :]
    if text.startswith("<class"):
        text = np.dtype(dtype).name
    try:
        return np.dtype(text).name if text not in _NUMPY_DTYPES else text
    except TypeError:
        return text


def numpy_dtype(name: str) -> np.dtype[Any]:
    """Return the NumPy dtype for a canonical name; bfloat16 and fp8 come from ml_dtypes."""
    try:
        return _NUMPY_DTYPES[name]
    except KeyError:
        raise KeyError(f"unknown dtype name {name!r}; known: {sorted(_NUMPY_DTYPES)}") from None


def unit_roundoff(name: str) -> float:
    """Return the unit roundoff u = 2**-(mantissa bits + 1) of a floating dtype."""
    return float(ml_dtypes.finfo(numpy_dtype(name)).eps) / 2.0


def round_to(x: np.ndarray, name: str) -> np.ndarray:
    """Return ``x`` rounded to the dtype ``name`` (round to nearest even), as that dtype."""
    return np.asarray(x, dtype=np.float64).astype(numpy_dtype(name))
