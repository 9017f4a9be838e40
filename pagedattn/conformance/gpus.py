"""Run the conformance suite across several GPUs: pytest-xdist workers, each pinned to one GPU.

``--gpus all`` or ``--gpus 0,1`` (with ``--workers-per-gpu N``, default 1) turns into one
pytest-xdist ``--tx popen//env:CUDA_VISIBLE_DEVICES=<gpu>`` spec per worker. execnet sets
that variable in the worker process as its first act, before the worker imports pytest,
so before any CUDA library initialises; the worker's device 0 is then its GPU. xdist's
scheduler hands out the cells (``worksteal`` unless ``--dist`` says otherwise), and its
reports come back to the controller, which builds the one matrix and ledger. Nothing
here schedules anything.

GPU ids are what ``CUDA_VISIBLE_DEVICES`` takes: indices or ``GPU-``/``MIG-`` UUIDs. ``all``
is the parent's ``CUDA_VISIBLE_DEVICES`` when set, else the GPUs ``nvidia-smi -L`` lists
(then numbered in PCI bus order, so workers get ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` too); no
GPU library is imported. An id may repeat (``0,0``: two workers on GPU 0). Where no GPU
can be listed at all the ids are taken as given, so the CPU backends run under it too.

A pinned worker notes its GPU in every failure's message (``ran on GPU ...``), in each
cell record (``gpu``, ``worker``: ``report.json``) and in the report's user properties;
the controller's summary lists the failures by GPU and the cells each GPU ran. Saved cases
hold no device id: their replay runs on whichever GPU the replaying process sees.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Generator, Sequence
from typing import Any

import pytest

from pagedattn.errors import PagedAttentionError

#: The user property (and record keys) a pinned worker adds to each of its reports.
GPU_KEY = "pagedattn_gpu"
VISIBLE = "CUDA_VISIBLE_DEVICES"


def parse_visible(value: str) -> list[str]:
    """The GPU ids of a ``CUDA_VISIBLE_DEVICES`` value, in order (CUDA stops at a negative index)."""
    ids: list[str] = []
    for entry in (part.strip() for part in value.split(",")):
        if re.fullmatch(r"-\d+", entry):
            break
        if entry:
            ids.append(entry)
    return ids


def nvidia_smi_gpus() -> list[str] | None:
    """The indices ``nvidia-smi -L`` lists (PCI bus order), or None where it cannot run."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [str(i) for i, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]


def visible_gpus(environ: dict[str, str] | None = None) -> tuple[list[str] | None, str]:
    """(the GPU ids this process may use, where they came from); ids None where nothing lists them."""
    environ = dict(os.environ) if environ is None else environ
    if VISIBLE in environ:
        return parse_visible(environ[VISIBLE]), f"{VISIBLE}={environ[VISIBLE]}"
    return nvidia_smi_gpus(), "nvidia-smi -L"


def resolve_gpus(spec: str, environ: dict[str, str] | None = None) -> list[str]:
    """The GPU of each worker slot that ``--gpus spec`` names: ``all`` or comma-separated ids.

    Raises :class:`~pagedattn.errors.PagedAttentionError` naming ``--gpus`` when the value is
    empty, ``all`` finds no GPU, or an id is not among the GPUs this process may use.
    """
    known, source = visible_gpus(environ)
    if spec.strip() == "all":
        if not known:
            raise PagedAttentionError("--gpus", f"'all' found no GPU ({source} lists none)"
                                      if known is not None else
                                      f"'all' found no GPU ({VISIBLE} is unset and nvidia-smi cannot run)")
        return known
    ids = [part.strip() for part in spec.split(",")]
    if not ids or any(not part for part in ids):
        raise PagedAttentionError("--gpus", f"expected 'all' or comma-separated GPU ids such as 0,1; got {spec!r}")
    if known is not None:
        unknown = [gpu for gpu in ids if gpu not in known]
        if unknown:
            raise PagedAttentionError("--gpus", f"GPU {', '.join(unknown)} is not among the GPUs here "
                                      f"({source}: {', '.join(known) or 'none'})")
    return ids


def tx_specs(gpus: Sequence[str], workers_per_gpu: int = 1, environ: dict[str, str] | None = None) -> list[str]:
    """One pytest-xdist ``--tx`` spec per worker, round-robin over ``gpus`` (gw0 on the first GPU, ...)."""
    if workers_per_gpu < 1:
        raise PagedAttentionError("--workers-per-gpu", f"must be at least 1, got {workers_per_gpu}")
    environ = dict(os.environ) if environ is None else environ
    # ids from nvidia-smi are in PCI bus order; CUDA's own default order may differ on mixed hosts
    order = "" if VISIBLE in environ or "CUDA_DEVICE_ORDER" in environ else "//env:CUDA_DEVICE_ORDER=PCI_BUS_ID"
    return [f"popen//env:{VISIBLE}={gpu}{order}" for _ in range(workers_per_gpu) for gpu in gpus]


def worker_specs(spec: str, workers_per_gpu: int = 1) -> list[str]:
    """The ``--tx`` specs of ``--gpus spec --workers-per-gpu N`` (raises naming the bad option)."""
    return tx_specs(resolve_gpus(spec), workers_per_gpu)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedattn", "pagedattn conformance suite")
    group.addoption("--gpus", default=None, dest="pagedattn_gpus", metavar="all|IDS",
                    help="run on pytest-xdist workers pinned to these GPUs through CUDA_VISIBLE_DEVICES:"
                    " 'all' or comma-separated ids (e.g. 0,1); replaces -n")
    group.addoption("--workers-per-gpu", default=1, type=int, dest="pagedattn_workers_per_gpu", metavar="N",
                    help="xdist workers per GPU with --gpus (default 1)")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """On the controller, turn ``--gpus`` into xdist's ``--tx`` specs before xdist reads them."""
    spec = config.getoption("pagedattn_gpus", default=None)
    if not spec or hasattr(config, "workerinput"):
        return
    if not config.pluginmanager.hasplugin("xdist"):
        raise pytest.UsageError("--gpus runs pytest-xdist workers: install pytest-xdist (and do not pass -p no:xdist)")
    if config.getoption("numprocesses", default=None) or config.getoption("tx", default=None):
        raise pytest.UsageError("--gpus starts the workers itself (one per GPU times --workers-per-gpu):"
                                " leave out -n and --tx")
    try:
        specs = worker_specs(spec, config.getoption("pagedattn_workers_per_gpu"))
    except PagedAttentionError as error:
        raise pytest.UsageError(str(error)) from None
    config.option.tx = specs
    if config.getoption("dist", default="no") == "no":
        # cells differ a lot in time (a GPU backend's compiles): idle workers take queued cells from busy ones
        config.option.dist = "worksteal"


def pytest_report_header(config: pytest.Config) -> list[str]:
    spec = config.getoption("pagedattn_gpus", default=None)
    if not spec or hasattr(config, "workerinput"):
        return []
    pinned = [re.search(rf"env:{VISIBLE}=([^/]*)", tx) for tx in config.getoption("tx", default=None) or []]
    return [f"pagedattn --gpus {spec}: {len(pinned)} pytest-xdist workers, "
            + ", ".join(f"gw{i} on GPU {match.group(1) if match else '?'}" for i, match in enumerate(pinned))]


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("pagedattn_gpus", default=None):
        return
    if hasattr(config, "workerinput"):
        gpu = os.environ.get(VISIBLE, "")
        config.pluginmanager.register(PinnedWorker(gpu, str(config.workerinput.get("workerid", "?"))),
                                      "pagedattn-pinned-worker")
    else:
        config.pluginmanager.register(GpuSummary(), "pagedattn-gpu-summary")


def gpu_of(report: Any) -> str | None:
    """The GPU a report's test ran on (a pinned worker's user property), or None."""
    for key, value in getattr(report, "user_properties", ()):
        if key == GPU_KEY:
            return str(value["gpu"])
    return None


def worker_of(report: Any) -> str | None:
    """The xdist worker a report's test ran on, or None."""
    for key, value in getattr(report, "user_properties", ()):
        if key == GPU_KEY:
            return str(value["worker"])
    return None


class PinnedWorker:
    """On a pinned xdist worker: tag each test's reports, records and failures with its GPU."""

    def __init__(self, gpu: str, worker: str) -> None:
        self.gpu = gpu
        self.worker = worker

    def where(self) -> str:
        return f"ran on GPU {self.gpu} ({VISIBLE}={self.gpu}, pytest-xdist worker {self.worker})"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        item.user_properties.append((GPU_KEY, {"gpu": self.gpu, "worker": self.worker}))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        from pagedattn.conformance.runner import RECORD_KEY, Unsupported

        try:
            return (yield)
        except BaseException as error:
            failed = isinstance(error, (Exception, pytest.fail.Exception))
            if failed and not isinstance(error, (Unsupported, pytest.xfail.Exception)):
                error.add_note(self.where())
            raise
        finally:
            for key, value in item.user_properties:
                if key == RECORD_KEY and isinstance(value, dict):
                    value.update(gpu=self.gpu, worker=self.worker)


class GpuSummary:
    """On the controller: which GPU ran how many tests, and each failure's GPU, after the run."""

    def __init__(self) -> None:
        self.tests: Counter[str] = Counter()
        self.workers: dict[str, set[str]] = defaultdict(set)
        self.failures: list[tuple[str, str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        gpu, worker = gpu_of(report), worker_of(report)
        if gpu is None or worker is None:
            return
        if report.when == "call":
            self.tests[gpu] += 1
            self.workers[gpu].add(worker)
        if report.failed:
            self.failures.append((report.nodeid, gpu, worker))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        if self.failures:
            terminalreporter.section("pagedattn: failures by GPU", sep="-")
            for nodeid, gpu, worker in self.failures:
                write(f"GPU {gpu} ({worker}): {nodeid}")
        if self.tests:
            write("pagedattn: tests per GPU: " + ", ".join(
                f"GPU {gpu}={count} ({' '.join(sorted(self.workers[gpu], key=_worker_order))})"
                for gpu, count in sorted(self.tests.items())))


def _worker_order(worker: str) -> tuple[int, str]:
    digits = worker.removeprefix("gw")
    return (int(digits) if digits.isdigit() else -1, worker)
