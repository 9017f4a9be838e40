"""Assertion helpers of the conformance suite: each failure names the worst element in contract terms.

A message reads: what differs and the tolerance (from :mod:`pagedattn.spec.error_model`
only), the number of elements beyond it, the worst one as (sequence s, query j at position
p_q, head h, dim d) with actual, expected, absolute error and the bound, up to five more,
and on its last line the call (backend, dtype, layout, block_size, options). NaN/inf
placement is checked before values. Every helper hides its own frame from pytest's traceback
and returns the worst error as a fraction of the tolerance (0 = exact, 1 = at the bound).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.case import listed
from pagedattn.spec.error_model import Tolerance
from pagedattn.spec.exact import ExactResult

MAX_LISTED = 5


class ConformanceFailure(AssertionError):
    """A backend broke the contract; the message says where and by how much.

    ``fraction`` is the worst error as a fraction of the tolerance (inf where bits or
    NaN/inf placement differ).
    """

    def __init__(self, message: str, fraction: float = float("inf")) -> None:
        super().__init__(message)
        self.fraction = fraction


def describe_call(backend: str, problem: AttentionProblem, options: dict[str, object] | None = None) -> str:
    """The last line of every message: backend, dtypes, layout, block_size and the options used."""
    shown = {k: v for k, v in (options or {}).items() if k != "kv_layout" and not isinstance(v, np.ndarray)}
    if options and isinstance(options.get("alibi_slopes"), np.ndarray):
        shown["alibi_slopes"] = "[...]"
    return (f"[call: backend={backend} dtype={problem.dtype} cache_dtype={problem.cache_dtype}"
            f" kv_layout={problem.kv_layout} block_size={problem.block_size} seq_lens={listed(problem.seq_lens)}"
            f" options={shown}]")


def token_label(problem: AttentionProblem, t: int) -> str:
    """'sequence s, query j (p_q=...)' of query token ``t``."""
    seq_of_token, p_q = problem.token_positions()
    s = int(seq_of_token[t])
    j = t - int(problem.query_start_loc[s])
    return f"sequence {s}, query {j} (token {t}, p_q={int(p_q[t])}, L={int(problem.seq_lens[s])})"


def _where(problem: AttentionProblem, index: tuple[int, ...]) -> str:
    text = token_label(problem, int(index[0])) + f", head {int(index[1])}"
    return text + (f", dim {int(index[2])}" if len(index) > 2 else "")


def _fail(lines: Sequence[str], call: str, fraction: float = float("inf")) -> None:
    __tracebackhide__ = True
    raise ConformanceFailure("\n".join([*lines, call]), fraction)


def assert_array_form(name: str, actual: np.ndarray, shape: tuple[int, ...], dtype: str, call: str) -> None:
    """Assert ``actual.shape == shape`` and its dtype name is ``dtype`` (the contract's array table)."""
    __tracebackhide__ = True
    from pagedattn.spec.dtypes import dtype_name

    if tuple(actual.shape) != tuple(shape) or dtype_name(actual.dtype) != dtype:
        _fail([f"{name} is {dtype_name(actual.dtype)}{list(actual.shape)}, expected {dtype}{list(shape)}"], call)


def assert_close_to_spec(
    name: str, actual: np.ndarray, expected: np.ndarray, bound: np.ndarray, problem: AttentionProblem, call: str,
    *, tolerance: Tolerance | None = None, inf_may_be_nan: bool = False,
) -> float:
    """Assert ``|actual - expected| <= bound`` elementwise, NaN/inf placement first; return the worst fraction.

    ``expected`` is the spec's float64 answer. Where it is NaN ``actual`` must be NaN; where
    it is ±inf (lse = -inf of a query that sees no key) ``actual`` must hold the same value,
    or NaN when ``inf_may_be_nan`` (an out element ``w * inf`` whose weight ``w`` a float32
    kernel rounds to 0 is NaN). Where it is finite ``actual`` must be finite and within
    ``bound``: ``assert np.all(np.abs(actual - expected) <= bound)`` with a message in
    contract terms.
    """
    __tracebackhide__ = True
    got = np.asarray(actual).astype(np.float64)
    header = f"{name}: tolerance from pagedattn.spec.error_model" + (f" ({tolerance})" if tolerance else "")
    special = ~np.isfinite(expected)
    matched = (got == expected) | (np.isnan(expected) & np.isnan(got))
    if inf_may_be_nan:
        matched |= np.isinf(expected) & np.isnan(got)
    wrong_special = special & ~matched
    nonfinite = ~np.isfinite(got) & ~special
    if nonfinite.any() or wrong_special.any():
        bad = np.argwhere(nonfinite | wrong_special)
        lines = [f"{name}: {len(bad)} element(s) with NaN/inf where the spec has finite values,"
                 f" or finite/other values where the spec has NaN/inf"]
        for index in bad[:MAX_LISTED]:
            i = tuple(int(n) for n in index)
            lines.append(f"  at {_where(problem, i)}: actual {got[i]!r}, expected {expected[i]!r}")
        _fail(lines, call)
    error = np.where(special, 0.0, np.abs(got - np.where(special, 0.0, expected)))
    safe_bound = np.where(bound > 0, bound, np.inf)
    fraction = np.where(bound > 0, error / safe_bound, np.where(error > 0, np.inf, 0.0))
    worst = float(fraction.max(initial=0.0))
    if worst > 1.0:
        order = np.argsort(fraction, axis=None)[::-1]
        count = int((fraction > 1.0).sum())
        lines = [header, f"{name}: {count} of {fraction.size} element(s) beyond the bound; worst first:"]
        for flat in order[: min(count, MAX_LISTED + 1)]:
            i = tuple(int(n) for n in np.unravel_index(flat, fraction.shape))
            lines.append(
                f"  at {_where(problem, i)}: actual {got[i]:.8g}, expected {expected[i]:.8g},"
                f" |error| {error[i]:.3g} > bound {bound[i]:.3g} ({fraction[i]:.3g} x tolerance)"
            )
        _fail(lines, call, worst)
    return worst


def assert_attention_matches(
    actual_out: np.ndarray, actual_lse: np.ndarray | None, exact: ExactResult, tolerance: Tolerance,
    problem: AttentionProblem, call: str,
) -> float:
    """Assert out (and lse) are within the error model of the spec's answer; return the worst fraction.

    Queries that see no key must give out = 0 and lse = -inf exactly. Where the spec is NaN
    (non-finite data the row sees) the backend must be NaN; where its out is ±inf, the same
    inf or NaN; every finite element of the spec is compared with the error model.
    """
    __tracebackhide__ = True
    shape = (problem.num_tokens, problem.num_q_heads, problem.head_dim)
    assert_array_form("out", actual_out, shape, problem.dtype, call)
    out_bound = tolerance.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
    empty = exact.num_visible == 0
    out_bound = np.where(empty[..., None], 0.0, out_bound)
    worst = assert_close_to_spec("out", actual_out, exact.out, out_bound, problem, call, tolerance=tolerance,
                                 inf_may_be_nan=True)
    if actual_lse is not None:
        assert_array_form("lse", actual_lse, shape[:2], "float32", call)
        lse_bound = tolerance.lse_bound(exact.score_scale, exact.num_visible)
        worst = max(worst, assert_close_to_spec("lse", actual_lse, exact.lse, lse_bound, problem, call,
                                                tolerance=tolerance))
    return worst


#: Elements compared at a time by :func:`first_difference`: a pool of 2**31 elements then needs
#: a 16 MiB mask, not a 2 GiB one.
COMPARE_CHUNK_ELEMENTS = 2**24


def first_difference(a: np.ndarray, b: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first element whose bits differ (NaN payloads included), or None."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return ()
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    a_bits, b_bits = a.view(bits), b.view(bits)
    if a.ndim == 0:
        return None if a_bits == b_bits else ()
    row_elements = int(np.prod(a.shape[1:], dtype=np.int64))
    rows = max(1, COMPARE_CHUNK_ELEMENTS // max(1, row_elements))  # a chunk of the first axis at a time
    for start in range(0, a.shape[0], rows):
        differ = a_bits[start:start + rows] != b_bits[start:start + rows]
        if differ.any():
            index = np.argwhere(differ)[0]
            return (start + int(index[0]), *(int(n) for n in index[1:]))
    return None


def assert_bit_identical(name: str, actual: np.ndarray, expected: np.ndarray, what: str, call: str,
                         problem: AttentionProblem | None = None, *, coordinates: str = "") -> None:
    """Assert two arrays have the same shape, dtype and bits; name the first element that differs.

    ``what`` says why they must be equal ("garbage in unused slots changed the output").
    Equivalent to ``assert actual.tobytes() == expected.tobytes()``.
    """
    __tracebackhide__ = True
    index = first_difference(actual, expected)
    if index is None:
        return
    if index == ():
        _fail([f"{name}: {what}: {actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"],
              call)
    if problem is not None and name in ("out", "lse"):
        where = _where(problem, index)
    else:
        where = f"{coordinates or 'index'} {index}"
    a_bytes = np.ascontiguousarray(actual).reshape(-1).view(np.uint8)
    b_bytes = np.ascontiguousarray(expected).reshape(-1).view(np.uint8)
    count = sum(int(np.count_nonzero(a_bytes[i:i + COMPARE_CHUNK_ELEMENTS] != b_bytes[i:i + COMPARE_CHUNK_ELEMENTS]))
                for i in range(0, a_bytes.size, COMPARE_CHUNK_ELEMENTS))
    _fail([f"{name}: {what} (bit-identical required; {count} byte(s) differ)",
           f"  first at {where}: {actual[index]!r} vs {expected[index]!r}"], call)
