"""Run one check over a hypothesis strategy for one matrix cell, and record what happened.

A cell is (check, feature, dtype, block_size, kv_layout) for one backend. :func:`require`
turns a cell outside the backend's declared capabilities into :class:`Unsupported` (the
plugin reports it as UNSUPPORTED, neither pass nor skip). :func:`run_property` runs the
check on hypothesis examples under the active settings profile; a backend that raises
:class:`~pagedattn.errors.UnsupportedError` on a drawn case rejects that example (and if it
rejects them all the cell is unsupported, with the backend's reason). When it fails, each
distinct failure hypothesis reports is saved as its own labelled ``.npz`` (the example
hypothesis shrank for that failure) and its replay command is added to that failure's notes;
an interrupted example is never saved. The record (examples tried, worst error as a fraction
of the tolerance, the failures' text, cases and replay commands) goes into the test's
``user_properties``, which pytest-xdist carries back to the controller.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument, Unsatisfiable

from pagedattn.backends.interface import Backend
from pagedattn.conformance.cases import save_case
from pagedattn.conformance.device_memory import release_cached_device_memory, with_room_on_its_gpu
from pagedattn.conformance.profiles import examples_per_cell, runs_in_interpreter, runs_on_cpu
from pagedattn.conformance.strategies import sizes_are_large
from pagedattn.errors import UnsupportedError
from pagedattn.spec.dtypes import FP8_DTYPES

if TYPE_CHECKING:
    from pagedattn.conformance.scale import ScaleLimits

RECORD_KEY = "pagedattn_conformance"
DEFAULT_CASES_DIR = "conformance-report/cases"


class Unsupported(Exception):
    """This cell is outside the backend's declared capabilities; the message names the capability."""


def require(backend: Backend, *, dtype: str | None = None, cache_dtype: str | None = None,
            block_size: int | None = None, head_dim: int | None = None, kv_layout: str | None = None,
            features: tuple[str, ...] = (),
            pool_elements: int | None = None, device: str | None = None, launch_limits: bool = False,
            large_arrays: bool = False, many_programs: bool = False) -> None:
    """Raise :class:`Unsupported` if the backend's capabilities exclude this combination
    (``pool_elements``: caches of that many elements, against ``max_pool_elements``; ``device``:
    the device the backend must run on; ``launch_limits``: the cell is about a device's launch
    limits, which a backend run in an interpreter does not have; ``large_arrays``: the cell
    computes arrays of more than 2**31 elements, or millions of keys of a sequence, minutes of work
    on a CPU, which runs it only under ``PAGEDATTN_SIZE=large``; ``many_programs``: the cell
    launches hundreds of thousands of programs, or walks a million keys a tile at a time, which an
    interpreter runs one at a time, also only under ``large``)."""
    caps = backend.capabilities()
    if device is not None and caps.device != device:
        raise Unsupported(f"{backend.name}: runs on {caps.device}, not {device}")
    if launch_limits and runs_in_interpreter(caps.device):
        raise Unsupported(f"{backend.name}: runs in an interpreter ({caps.device}), which has no grid limits "
                          "to check and runs one program at a time")
    if large_arrays and runs_on_cpu(caps.device) and not sizes_are_large():
        raise Unsupported(f"{backend.name}: runs on {caps.device}, where arrays of 2**31 elements (an output, "
                          "partials, a head's scores) or millions of keys of a sequence cost minutes; "
                          "PAGEDATTN_SIZE=large runs it there")
    if many_programs and runs_in_interpreter(caps.device) and not sizes_are_large():
        raise Unsupported(f"{backend.name}: runs in an interpreter ({caps.device}), where hundreds of thousands of "
                          "programs or tiles cost minutes; PAGEDATTN_SIZE=large runs it there")
    if pool_elements is not None and caps.max_pool_elements is not None and pool_elements > caps.max_pool_elements:
        raise Unsupported(f"{backend.name}: caches of {pool_elements:,} elements exceed max_pool_elements"
                          f" {caps.max_pool_elements:,}")
    if dtype is not None and dtype not in caps.dtypes:
        raise Unsupported(f"{backend.name}: dtype {dtype} not declared (dtypes: {', '.join(caps.dtypes)})")
    if cache_dtype is not None and cache_dtype not in caps.cache_dtypes:
        raise Unsupported(f"{backend.name}: cache dtype {cache_dtype} not declared")
    if block_size is not None and caps.block_sizes is not None and block_size not in caps.block_sizes:
        raise Unsupported(f"{backend.name}: block_size {block_size} not declared (block_sizes: "
                          f"{list(caps.block_sizes)})")
    if head_dim is not None and caps.head_dims is not None and head_dim not in caps.head_dims:
        raise Unsupported(f"{backend.name}: head_dim {head_dim} not declared (head_dims: {list(caps.head_dims)})")
    if head_dim is not None and caps.max_head_dim is not None and head_dim > caps.max_head_dim:
        raise Unsupported(f"{backend.name}: head_dim {head_dim} past max_head_dim {caps.max_head_dim}")
    if kv_layout is not None and kv_layout not in caps.kv_layouts:
        raise Unsupported(f"{backend.name}: kv_layout {kv_layout} not declared")
    for feature in features:
        if feature == "fp8":
            if not caps.supports("fp8") or not any(d in caps.cache_dtypes for d in FP8_DTYPES):
                raise Unsupported(f"{backend.name}: feature 'fp8' not declared")
        elif not caps.supports(feature):
            raise Unsupported(f"{backend.name}: feature {feature!r} not declared")


def cases_dir() -> Path:
    """Where failing cases are saved: ``PAGEDATTN_CASES_DIR`` or ``conformance-report/cases``."""
    return Path(os.environ.get("PAGEDATTN_CASES_DIR", DEFAULT_CASES_DIR))


def case_path(nodeid: str, index: int | None = None) -> Path:
    """A readable, unique ``.npz`` file name for a test id (``index``: which of its distinct failures)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::")[-1])[:90].strip("_")
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    suffix = f"-failure{index}" if index is not None else ""
    return cases_dir() / f"{stem}-{digest}{suffix}.npz"


def failure_text(error: BaseException) -> str:
    """The failure's own text (type and message; for a crash the type names it), without hypothesis' notes."""
    message = str(error).strip()
    if isinstance(error, AssertionError) and message:
        return message
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def distinct_failures(error: BaseException) -> list[BaseException]:
    """The failures hypothesis reports: the members of its exception group, or the error itself."""
    if isinstance(error, BaseExceptionGroup):
        found: list[BaseException] = []
        for member in error.exceptions:
            found.extend(distinct_failures(member))
        return found
    return [error]


def _in_final_replay() -> bool:
    """True while hypothesis replays a shrunk failing example to report it (once per distinct failure)."""
    try:
        return bool(current_build_context().is_final)
    except InvalidArgument:  # outside a hypothesis test
        return False


def _replaying_its_failure(check: Callable[[Backend, Any], float]) -> Callable[[Backend, Any], float]:
    """``check`` that, when hypothesis replays the failing example to report it, raises that
    example's failure again rather than running it a second time: for a run that neither shrinks
    nor looks for other failures, where the replayed example is the one that failed last."""
    last_error: list[BaseException] = []

    @functools.wraps(check)
    def checked(backend: Backend, case: Any) -> float:
        if last_error and _in_final_replay():
            raise last_error[-1]
        try:
            return check(backend, case)
        except Exception as error:
            last_error[:] = [error]
            raise

    return checked


def run_property(request: Any, backend: Backend, strategy: Callable[[], st.SearchStrategy[Any]],
                 check: Callable[[Backend, Any], float], *, cell: dict[str, Any],
                 requires: dict[str, Any] | None = None, max_examples: int | None = None,
                 settings_overrides: dict[str, Any] | None = None) -> None:
    """Run ``check(backend, case)`` for hypothesis examples of ``strategy()``; record the cell's result.

    ``requires`` (keywords of :func:`require`) is checked first: outside the capabilities the
    cell raises :class:`Unsupported` and nothing runs. ``request`` is pytest's request fixture
    (or None outside pytest). ``max_examples`` caps the profile's count (for costly cells);
    ``settings_overrides`` are further hypothesis settings of this cell (costly cells stop at
    their first failure with ``report_multiple_bugs=False``).
    On failure each distinct failure's shrunk case is saved as ``.npz``, labelled, and its replay
    command is added to that failure's notes.
    """
    __tracebackhide__ = True
    record: dict[str, Any] = {**cell, "backend": backend.name, "check": check.__name__, "status": "pass",
                              "examples": 0, "worst_fraction": 0.0}
    try:
        require(backend, **(requires or {}))
    except Unsupported as error:
        record.update(status="unsupported", reason=str(error))
        if request is not None:
            request.node.user_properties.append((RECORD_KEY, record))
        raise
    stats: dict[str, Any] = {"examples": 0, "worst": 0.0, "unsupported": None}
    # (exception, case) of each failure hypothesis replays to report it: one per distinct failure, shrunk.
    reported: list[tuple[BaseException, Any]] = []
    last_failing: dict[str, Any] = {}

    examples = examples_per_cell(backend)  # the active profile's count for this backend
    config = getattr(request, "config", None)  # None outside pytest
    first_failure = bool(config is not None and config.getoption("pagedattn_first_failure", default=False))
    if first_failure:  # only whether the cell fails: no shrink, no other failure looked for, nothing saved
        settings_overrides = {**(settings_overrides or {}), **FIRST_FAILURE_UNSHRUNK}
        check = _replaying_its_failure(check)
    check = with_room_on_its_gpu(check, backend.capabilities().device)  # large cases: room on a shared GPU

    # cell_property's source seeds the examples of the derandomized profiles (hypothesis hashes
    # it, with the test id): an edit of it draws other examples in every cell, and the mutants'
    # pinned kills (tests/conformance/test_mutants.py) must be checked again. Work done around
    # each example belongs in `check`.

    @settings(max_examples=min(examples, max_examples) if max_examples else examples,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
              **(settings_overrides or {}))
    @given(case=strategy())
    def cell_property(case: Any) -> None:
        __tracebackhide__ = True
        try:
            fraction = check(backend, case)
        except UnsupportedError as error:
            stats["unsupported"] = str(error)
            reject()
        except Exception as error:  # not KeyboardInterrupt: an interrupted example did not fail
            stats["examples"] += 1
            last_failing["case"] = case
            if _in_final_replay():
                reported.append((error, case))
            raise
        stats["examples"] += 1
        stats["worst"] = max(stats["worst"], float(fraction))

    nodeid = request.node.nodeid if request is not None else f"{backend.name}-{check.__name__}"
    # One database key per test id, so thorough's example database replays the right failures. The
    # derandomized profiles seed a cell's draws from the same digest, so a --hypothesis-seed given
    # joins it there: another seed, other examples (hypothesis itself ignores the seed under them).
    seed = config.getoption("hypothesis_seed", default=None) if config is not None else None
    digest = nodeid if seed is None else f"{nodeid} seed={seed}"
    cell_property.hypothesis.inner_test._hypothesis_internal_add_digest = digest.encode()  # type: ignore[attr-defined]
    try:
        cell_property()
    except Unsatisfiable:
        if stats["unsupported"] and stats["examples"] == 0:
            record.update(status="unsupported", reason=stats["unsupported"])
            raise Unsupported(stats["unsupported"]) from None
        record["status"] = "error"
        raise
    except Exception as error:
        record["status"] = "fail"
        failures = distinct_failures(error)
        stats["worst"] = max(stats["worst"], *(float(getattr(f, "fraction", float("inf"))) for f in failures))
        record["failures"] = _save_failures(failures, reported, last_failing.get("case"), backend=backend,
                                            check=check, cell=cell, nodeid=nodeid, save=not first_failure)
        record["message"] = "\n\n".join(f["message"] for f in record["failures"])
        record["replays"] = [f["replay"] for f in record["failures"] if f.get("replay")]
        raise
    except BaseException:
        record["status"] = "interrupted"  # KeyboardInterrupt and the like: nothing failed, nothing saved
        raise
    finally:
        record["examples"] = stats["examples"]
        record["worst_fraction"] = stats["worst"]
        if request is not None:
            request.node.user_properties.append((RECORD_KEY, record))


#: Settings of the scale cells, whose cases cost a second or more each: shrink the first failure
#: found, look for no other, and skip hypothesis' explain phase (it re-runs the failure under a
#: line tracer).
FIRST_FAILURE: dict[str, Any] = {"report_multiple_bugs": False,
                                 "phases": tuple(phase for phase in Phase if phase is not Phase.explain)}
#: The same, unshrunk: for a cell whose every case is as large as its first (what it is about is
#: the size), where each shrink step would rebuild a case of that size to no gain.
FIRST_FAILURE_UNSHRUNK: dict[str, Any] = {**FIRST_FAILURE, "phases": tuple(
    phase for phase in Phase if phase not in (Phase.explain, Phase.shrink))}


def run_scale_cell(request: Any, backend: Backend, cases: Callable[..., Any],
                   check: Callable[[Backend, Any], float], limits: ScaleLimits, *, dtype: str, feature: str,
                   max_examples: int, cell: dict[str, Any] | None = None,
                   requires: dict[str, Any] | None = None, shrink: bool = True, batch: str | None = None) -> None:
    """A scale cell: ``check`` on ``cases(capabilities, dtype=, limits=)`` (a strategy of
    :mod:`pagedattn.conformance.scale`), stopping at the first failure (shrunk unless ``shrink``
    is false); ``cell`` and ``requires`` add to the cell's record and to what it requires beyond
    ``dtype``. With ``batch`` (one of :data:`~pagedattn.conformance.scale.BATCH_KINDS`), the cases
    are of that kind only (``cases(..., decode=)``), the cell's record names it, and a few queries
    a sequence require varlen batches. The device memory the cell's large arrays leave cached goes
    back to the driver at the end."""
    if batch is not None:
        cases = functools.partial(cases, decode=batch == "decode")
        cell = {**(cell or {}), "batch": batch}
        if batch != "decode":
            requires = {**(requires or {}), "features": (*(requires or {}).get("features", ()), "varlen")}
    try:
        run_property(
            request, backend, lambda: cases(backend.capabilities(), dtype=dtype, limits=limits), check,
            cell={"feature": feature, "dtype": dtype, "block_size": "-", "kv_layout": "-", **(cell or {})},
            requires={"dtype": dtype, **(requires or {})}, max_examples=max_examples,
            settings_overrides=FIRST_FAILURE if shrink else FIRST_FAILURE_UNSHRUNK,
        )
    finally:
        release_cached_device_memory()


def _save_failures(failures: list[BaseException], reported: list[tuple[BaseException, Any]], fallback: Any, *,
                   backend: Backend, check: Callable[[Backend, Any], float], cell: dict[str, Any],
                   nodeid: str, save: bool = True) -> list[dict[str, Any]]:
    """Save one case per distinct failure, labelled, and add its replay command to that failure's notes
    (``save`` false: each failure's label and message only).

    Each failure is paired with the example hypothesis replayed to raise it; when there was no
    such replay (a flaky failure), the last failing example stands in for the only failure.
    """
    by_identity = {id(error): case for error, case in reported}
    in_order = [case for _, case in reported]
    saved: list[dict[str, Any]] = []
    for index, failure in enumerate(failures):
        case = by_identity.get(id(failure))
        if case is None and len(in_order) == len(failures):
            case = in_order[index]
        if case is None and len(failures) == 1:
            case = fallback
        label = f"failure {index + 1} of {len(failures)}" if len(failures) > 1 else "failure"
        entry: dict[str, Any] = {"label": label, "message": failure_text(failure)}
        if save and case is not None:
            path = save_case(case_path(nodeid, index + 1 if len(failures) > 1 else None), case, check=check.__name__,
                             context={**cell, "backend": backend.name, "nodeid": nodeid, "failure": label,
                                      "message": entry["message"].splitlines()[0][:200]})
            entry.update(case=str(path), replay=f"pagedattn replay {path} --backend {backend.name}")
            failure.add_note(f"{label}: saved case: {path}\nreplay it: {entry['replay']}")
        saved.append(entry)
    return saved
