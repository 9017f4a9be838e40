"""pytest plugin of the conformance suite (registered through ``pytest11``).

Loaded in every pytest run once pagedattn is installed, it does nothing unless
``--backend NAME`` is given (repeatable; ``all`` = every backend available here;
``module:Class`` and ``mutant:NAME`` also work). Then it:

- parametrizes the suite's tests (marked ``pagedattn_conformance``) by backend and block size;
- prints a header: each backend's version, device, capabilities, and the relevant
  environment variables (PAGEDATTN_*, HYPOTHESIS_*, CUDA_VISIBLE_DEVICES, TRITON_INTERPRET);
- selects the hypothesis profile: ``--hypothesis-profile`` or ``PAGEDATTN_PROFILE``
  (``quick``, ``standard`` (the default), ``ci``, ``thorough``: :mod:`pagedattn.conformance.profiles`);
- reports a cell outside the backend's capabilities as UNSUPPORTED (its own status, neither
  pass nor skip), lists saved failing cases with their replay command, and fails the run
  of a backend that passed zero cases;
- with ``--gpus all|IDS`` (and ``--workers-per-gpu N``), runs on pytest-xdist workers
  pinned one GPU each (:mod:`pagedattn.conformance.gpus`);
- with ``--conformance-ledger FILE``, appends each cell to FILE the moment it passes or is
  unsupported (:mod:`pagedattn.conformance.ledger`), so a run cut short can be resumed.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from pagedattn.conformance.profiles import DEFAULT_PROFILE, examples_per_cell
from pagedattn.conformance.runner import RECORD_KEY, Unsupported

ENV_PREFIXES = ("PAGEDATTN_", "HYPOTHESIS_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "PYTEST_XDIST_WORKER")
KNOWN_PAGEDATTN_ENV = {"PAGEDATTN_PROFILE", "PAGEDATTN_SIZE", "PAGEDATTN_CASES_DIR", "PAGEDATTN_BACKEND"}
UNSUPPORTED_KEY = "pagedattn_unsupported"
#: Seconds between two progress lines of one backend.
PROGRESS_SECONDS = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedattn", "pagedattn conformance suite")
    group.addoption("--backend", action="append", default=[], dest="pagedattn_backends", metavar="NAME",
                    help="backend to test (repeatable): a registered name, 'all', module:Class or mutant:NAME")
    group.addoption("--conformance-cases", default=None, dest="pagedattn_cases", metavar="DIR",
                    help="directory for the .npz cases of failures (default conformance-report/cases)")
    group.addoption("--conformance-ledger", default=None, dest="pagedattn_ledger", metavar="FILE",
                    help="append each passed or unsupported cell to this ledger as it settles"
                    " (pagedattn.conformance.ledger; `pagedattn conform --resume` reads it)")
    group.addoption("--conformance-first-failure", action="store_true", default=False, dest="pagedattn_first_failure",
                    help="stop each cell at its first failing example, neither shrunk nor saved: for runs that ask"
                    " only whether the suite fails (the mutant catalogue's kills)")


def selected_backend_names(config: pytest.Config) -> list[str]:
    """The --backend values (or PAGEDATTN_BACKEND, comma-separated), with 'all' expanded."""
    from pagedattn.conformance.targets import expand

    specs = list(config.getoption("pagedattn_backends", default=[]) or [])
    if not specs and os.environ.get("PAGEDATTN_BACKEND"):
        specs = [s for s in os.environ["PAGEDATTN_BACKEND"].split(",") if s]
    return expand(specs) if specs else []


#: ``--gpus`` and ``--workers-per-gpu``: xdist workers pinned to GPUs.
pytest_plugins = ["pagedattn.conformance.gpus"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pagedattn_conformance: a test of the conformance suite (needs --backend)")
    if not (config.getoption("pagedattn_backends", default=[]) or os.environ.get("PAGEDATTN_BACKEND")):
        return
    if config.getoption("pagedattn_cases", default=None):
        os.environ["PAGEDATTN_CASES_DIR"] = str(config.getoption("pagedattn_cases"))
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(os.environ.get("PAGEDATTN_PROFILE", DEFAULT_PROFILE))
    from pagedattn.conformance.targets import check_names
    from pagedattn.errors import BackendNotFoundError

    try:
        check_names(list(config.getoption("pagedattn_backends", default=[]) or [])
                    or os.environ["PAGEDATTN_BACKEND"].split(","))
    except BackendNotFoundError as error:
        raise pytest.UsageError(str(error)) from None
    state = _State(config)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "pagedattn-conformance-state")




def _backends(config: pytest.Config) -> list[Any]:
    from pagedattn.conformance.targets import resolve

    state = config.stash[_STATE]
    if state.backends is None:
        state.backends = [resolve(name) for name in selected_backend_names(config)]
    return state.backends


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("pagedattn_conformance") is None:
        return
    config = metafunc.config
    if _STATE not in config.stash:
        from pagedattn.backends.registry import available_backends

        raise pytest.UsageError(
            "the pagedattn conformance suite needs a backend: pass --backend NAME (repeatable, or 'all')"
            f" or set PAGEDATTN_BACKEND; available here: {', '.join(available_backends()) or 'none'}"
        )
    backends = _backends(config)
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", backends, ids=[b.name for b in backends])
    if "block_size" in metafunc.fixturenames:
        from pagedattn.conformance.strategies import CONTRACT_BLOCK_SIZES

        sizes = set(CONTRACT_BLOCK_SIZES)
        for backend in backends:
            sizes |= set(backend.capabilities().block_sizes or ())
        metafunc.parametrize("block_size", sorted(sizes), ids=[f"bs{n}" for n in sorted(sizes)])


def _params(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _cheapness(item: pytest.Item) -> tuple[Any, ...]:
    """Sort key of a cell's expected cost: float32 before 16-bit, small blocks, NHD, caches of the query's dtype."""
    params = _params(item)
    block_size = params.get("block_size")
    return (params.get("dtype", "float32") != "float32", block_size if isinstance(block_size, int) else 0,
            params.get("kv_layout", "NHD") != "NHD", params.get("cache", "same") != "same")


#: Tests whose cells are cheap (no attention, or no hypothesis): they run right after the first tier.
CHEAP_TESTS = frozenset({"test_write_kv_writes_only_its_slots", "test_copy_blocks_reads_all_sources_first",
                         "test_merge_states_matches_exact_merge", "test_bad_input_raises_naming_the_argument"})
#: Tests whose cells cost a CPU backend seconds to tens of seconds each (arrays of 2**31 elements built
#: for the call; batches of more than 65,535 sequences or block pairs; hundreds of sequences of
#: thousands of keys each): they run last, so that a bug any other cell shows is not held up behind
#: them, and among themselves in this order, the cheapest first (on a stepped NumPy kernel: a
#: second or two each for the first four, about 11 s a cell of many sequences, 26 s of long batches).
COSTLY_TESTS: tuple[str, ...] = ("test_far_rows_of_write_kv", "test_far_layer_views_match_spec",
                                 "test_far_table_rows_match_spec",
                                 "test_copy_blocks_of_many_pairs", "test_many_sequences_match_spec",
                                 "test_long_batches_match_spec", "test_long_batches_with_fp8_caches_match_spec")


def fail_fast_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The same cells, ordered so that a bug in any operation or feature shows within seconds.

    First the cheapest cell of each (backend, test, feature) group, so every operation
    (write_kv, copy_blocks, merge_states, bad input, then each attention feature and rule)
    runs once early; then the other cells of the cheap tests; then the rest; then the cells of
    :data:`COSTLY_TESTS`, in its order. Each tier otherwise keeps the collection order.
    """
    firsts: dict[tuple[Any, ...], pytest.Item] = {}
    for item in items:
        if item.get_closest_marker("pagedattn_conformance") is None:
            continue
        params = _params(item)
        backend = params.get("backend")
        group = (getattr(backend, "name", backend), getattr(item, "originalname", item.name),
                 params.get("feature"), params.get("cache"))
        if group not in firsts or _cheapness(item) < _cheapness(firsts[group]):
            firsts[group] = item
    first_ids = {id(item) for item in firsts.values()}

    def tier(item: pytest.Item) -> tuple[int, int, int]:
        name = getattr(item, "originalname", item.name)
        if name in COSTLY_TESTS:
            return (3, 0 if id(item) in first_ids else 1, COSTLY_TESTS.index(name))
        cheap = name in CHEAP_TESTS
        if id(item) in first_ids:
            return (0, 0 if cheap else 1, 0)  # the other operations first: their bugs hide behind attention's cells
        return (1, 0, 0) if cheap and item.get_closest_marker("pagedattn_conformance") is not None else (2, 0, 0)

    return sorted(items, key=tier)  # stable: collection order within a tier


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _STATE not in config.stash:
        return
    items[:] = fail_fast_order(items)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if _STATE not in config.stash:
        return []
    lines = [f"pagedattn conformance: hypothesis profile {settings.get_current_profile_name()}"]
    for backend in _backends(config):
        try:
            device = backend.device_name()
        except Exception as error:  # the header must not hide the backend's own test failures
            device = f"? ({type(error).__name__}: {error})"
        lines.append(f"  backend {backend.name} {backend.version} on {device}, {examples_per_cell(backend)} examples"
                     f" a cell: {backend.capabilities().summary()}")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    lines.append("  environment: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none set)"))
    unknown = [k for k in env if k.startswith("PAGEDATTN_") and k not in KNOWN_PAGEDATTN_ENV]
    if unknown:
        lines.append(f"  warning: unknown PAGEDATTN_ variables (typo?): {', '.join(unknown)};"
                     f" known: {', '.join(sorted(KNOWN_PAGEDATTN_ENV))}")
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(Unsupported):
        report.outcome = "passed"  # not a failure; its own status through pytest_report_teststatus
        report.longrepr = None
        report.user_properties.append((UNSUPPORTED_KEY, str(call.excinfo.value)))


def unsupported_reason(report: pytest.TestReport) -> str | None:
    """The reason a report is UNSUPPORTED, or None."""
    for key, value in getattr(report, "user_properties", ()):
        if key == UNSUPPORTED_KEY:
            return str(value)
    return None


def conformance_record(report: pytest.TestReport) -> dict[str, Any] | None:
    """The cell record a conformance test left in its report (see :mod:`runner`), or None."""
    for key, value in getattr(report, "user_properties", ()):
        if key == RECORD_KEY:
            return dict(value)
    return None


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> Any:
    if report.when == "call" and unsupported_reason(report) is not None:
        return "unsupported", "U", ("UNSUPPORTED", {"yellow": True})
    return None


def backend_of(nodeid: str, names: list[str]) -> str | None:
    """The backend a cell's node id names (its first parameter), the longest matching name."""
    params = nodeid.partition("[")[2]
    matches = [name for name in names if params == name + "]" or params.startswith(name + "-")]
    return max(matches, key=len) if matches else None


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    """Cells done per backend and an estimate of the time left, from each backend's own rate so far."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.total: Counter[str] = Counter()
        self.done: Counter[str] = Counter()
        self.started: dict[str, float] = {}

    def collected(self, nodeids: list[str], names: list[str]) -> None:
        self.total = Counter(b for b in (backend_of(n, names) for n in nodeids) if b is not None)
        self.started = dict.fromkeys(self.total, self.clock())  # the cells start once collected

    def finished(self, backend: str) -> None:
        self.started.setdefault(backend, self.clock())
        self.done[backend] += 1

    def line(self, backend: str) -> str:
        done, total = self.done[backend], self.total[backend]
        elapsed = self.clock() - self.started.get(backend, self.clock())
        text = f"pagedattn progress: {backend} {done}/{total} cells, {_duration(elapsed)}"
        if done >= total:
            return text + ", done"
        if done:
            text += f", about {_duration(elapsed / done * (total - done))} left"
        return text


#: What pytest-xdist writes into the report of a cell whose worker process died while running it.
WORKER_CRASH = "crashed while running"


class _State:
    """Registered only when a backend is selected: tallies reports on the controller and reports them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.passes: Counter[str] = Counter()
        self.seen: set[str] = set()
        self.unsupported: Counter[str] = Counter()
        self.cases: list[str] = []
        self.backends: list[Any] | None = None
        self.progress = Progress()
        self.last_progress: dict[str, float] = {}
        self.crashed: list[str] = []

    def _backend_names(self) -> list[str]:
        return [backend.name for backend in _backends(self.config)]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not hasattr(self.config, "workerinput"):
            self.progress.collected([item.nodeid for item in session.items], self._backend_names())

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.progress.total:  # every worker collects the same cells
            self.progress.collected(list(ids), self._backend_names())

    def _show_progress(self, report: pytest.TestReport) -> None:
        """One line per backend every PROGRESS_SECONDS, and when its last cell is done."""
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        backend = backend_of(report.nodeid, list(self.progress.total))
        if backend is None:
            return
        self.progress.finished(backend)
        now = self.progress.clock()
        last = self.last_progress.setdefault(backend, now)
        complete = self.progress.done[backend] >= self.progress.total[backend]
        if not complete and now - last < PROGRESS_SECONDS:
            return
        self.last_progress[backend] = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write(f"\n{self.progress.line(backend)}\n")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not hasattr(self.config, "workerinput"):
            self._show_progress(report)
            if report.failed and WORKER_CRASH in str(report.longrepr):
                self.crashed.append(report.nodeid)
        record = conformance_record(report)
        if record is None or report.when != "call":
            return
        backend = str(record.get("backend", "?"))
        self.seen.add(backend)
        reason = unsupported_reason(report)
        if reason is not None:
            self.unsupported[reason] += 1
        elif report.passed:
            self.passes[backend] += 1
        ledger_path = self.config.getoption("pagedattn_ledger", default=None)
        if ledger_path and report.passed and not hasattr(self.config, "workerinput"):
            from pagedattn.conformance import ledger

            ledger.record(Path(ledger_path), report.nodeid, "passed" if reason is None else "unsupported")
        for failure in record.get("failures", ()):
            if failure.get("replay"):
                self.cases.append(f"{report.nodeid} ({failure['label']}): {failure['replay']}")

    def zero_pass_backends(self) -> list[str]:
        return sorted(name for name in self.seen if self.passes[name] == 0)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return
        if self.zero_pass_backends() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        write = terminalreporter.write_line
        if self.unsupported:
            terminalreporter.section("pagedattn: unsupported (outside the declared capabilities)", sep="-")
            for reason, count in self.unsupported.most_common():
                write(f"{count:5d} x {reason}")
        if self.cases:
            terminalreporter.section("pagedattn: failing cases, shrunk and saved", sep="-")
            for line in self.cases:
                write(line)
        if self.crashed:
            terminalreporter.section("pagedattn: cells whose worker process died", sep="-")
            for nodeid in self.crashed:
                write(nodeid)
            write("Each failed without an answer to check: its process died (a signal, or an exit), which "
                  "says nothing of the backend's results. On a GPU host the kernel's out-of-memory killer is "
                  "the usual cause (dmesg names it): run fewer workers, one per 16 GB of host memory "
                  "(docs/conformance.md, \"On a GPU\"), then these cells again.")
        for name in self.zero_pass_backends():
            write(f"pagedattn: backend {name} passed zero conformance cases: the run fails", red=True)
        if self.seen:
            write("pagedattn: passing cells per backend: "
                  + ", ".join(f"{name}={self.passes[name]}" for name in sorted(self.seen)))


_STATE = pytest.StashKey[_State]()
