"""The error model: how far a correct backend may be from the exact (float64) answer.

One model, derived from unit roundoff, used by every comparison in the project. For a
query row (token ``t``, head ``h``) with visible keys ``n``, value scale ``V = max |v|``
and score scale ``S = |scale| * max sum_d |q_d k_d|`` (+ |ALiBi bias|) over visible keys:

- score error (natural-log units): ``e_s = (2 u_op + sqrt(D) u_acc) S + 8 u_acc``: the
  operands of ``q . k`` may be rounded to ``u_op`` (TF32, or fp8 caches converted to the
  query's dtype), the dot product is accumulated in float32 (``u_acc = 2**-24``), and
  exp/log approximations add a few ``u_acc``;
- weight error (relative): ``e_w = 2 e_s + u_p + sqrt(n) u_acc``: a score error ``e``
  changes a weight by a factor ``exp(e) ~ 1 + e``, and also the normalizer; ``P`` may be
  rounded to the input dtype before the ``P V`` product (``u_p``), sums of ``n`` terms
  in float32 add ``sqrt(n) u_acc`` (a probabilistic bound, as blocked sums behave);
- output: ``|out - exact| <= SAFETY * (u_out |exact| + 2 e_w V)`` with ``u_out`` the
  output dtype's roundoff; lse: ``|lse - exact| <= SAFETY * (e_s + sqrt(n) u_acc)``.

``SAFETY = 2`` covers the constants dropped from these first-order bounds. Positions
where the exact output is 0 because nothing is visible must be exactly 0 (lse -inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedattn.spec.dtypes import FP8_DTYPES, unit_roundoff

SAFETY = 2.0
U_ACC = 2.0**-24  # float32 accumulation, assumed of every backend
U_TF32 = 2.0**-11  # TF32 keeps 10 mantissa bits


@dataclass(frozen=True)
class Tolerance:
    """Roundoff terms of one configuration; :meth:`out_bound` and :meth:`lse_bound` apply them."""

    u_out: float  # roundoff of the output dtype
    u_op: float  # roundoff of q . k operands beyond the inputs' own rounding
    u_p: float  # roundoff of P before the P V product
    u_acc: float  # float32 accumulation
    head_dim: int

    def score_error(self, score_scale: np.ndarray) -> np.ndarray:
        return (2 * self.u_op + math.sqrt(self.head_dim) * self.u_acc) * score_scale + 8 * self.u_acc

    def out_bound(
        self, expected: np.ndarray, value_scale: np.ndarray, score_scale: np.ndarray, num_visible: np.ndarray
    ) -> np.ndarray:
        """Allowed ``|out - exact|`` ``[T, H, D]`` from the exact result's magnitudes ``[T, H]``."""
        e_w = 2 * self.score_error(score_scale) + self.u_p + np.sqrt(num_visible) * self.u_acc
        return SAFETY * (self.u_out * np.abs(expected) + (2 * e_w * value_scale)[..., None])

    def lse_bound(self, score_scale: np.ndarray, num_visible: np.ndarray) -> np.ndarray:
        """Allowed ``|lse - exact|`` ``[T, H]``."""
        return SAFETY * (self.score_error(score_scale) + np.sqrt(num_visible) * self.u_acc)


def tolerance(dtype: str, head_dim: int, *, cache_dtype: str | None = None, tf32: bool = False) -> Tolerance:
    """Return the :class:`Tolerance` for a query ``dtype``, ``head_dim`` and cache dtype.

    ``tf32=True`` when the backend multiplies float32 inputs on TF32 matrix units (it says
    so in its capabilities). The sequence length enters through ``num_visible`` per row.
    """
    cache_dtype = cache_dtype or dtype
    u_in = unit_roundoff(dtype)
    low_precision = dtype != "float32"
    if tf32 and not low_precision:
        u_op = U_TF32
    elif cache_dtype in FP8_DTYPES and low_precision:
        u_op = u_in  # K/V * scale rounded to the query dtype for the matrix units
    elif low_precision:
        u_op = 0.0  # products of float16/bfloat16 inputs are exact in float32
    else:
        u_op = U_ACC
    u_p = u_in if low_precision else (U_TF32 if tf32 else U_ACC)
    return Tolerance(u_out=u_in, u_op=u_op, u_p=u_p, u_acc=U_ACC, head_dim=head_dim)


def merge_tolerance(dtype: str) -> Tolerance:
    """Return the :class:`Tolerance` of ``merge_states`` on outputs of ``dtype``: rounding only."""
    u = unit_roundoff(dtype)
    return Tolerance(u_out=u, u_op=0.0, u_p=u if dtype != "float32" else U_ACC, u_acc=U_ACC, head_dim=1)


U_FLOAT64 = 2.0**-53


def float64_tolerance(head_dim: int) -> Tolerance:
    """Return the model with every roundoff at float64's: two float64 algorithms' agreement."""
    return Tolerance(u_out=U_FLOAT64, u_op=U_FLOAT64, u_p=U_FLOAT64, u_acc=U_FLOAT64, head_dim=head_dim)
