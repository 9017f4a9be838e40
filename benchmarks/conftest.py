"""pytest configuration of the benchmark files (``bench_*.py``; ``tox -e perf``).

Adds the device (GPU name or CPU) to pytest-benchmark's machine info, measures the
ceilings once per session, parametrizes backends, and compares with the device's kept
baseline (see :mod:`pagedattn.perf.baseline`) unless ``--perf-baseline=off``. The
conformance suite's own timings (``bench_conformance.py``, minutes) run only with
``--perf-conformance``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from pagedattn.perf import device
from pagedattn.perf.baseline import DEFAULT_FAIL, baseline_path
from pagedattn.perf.ceilings import Ceilings

KEPT_BASELINES = Path(__file__).parent / "baselines"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pagedattn perf")
    group.addoption("--perf-backends", nargs="+", default=None,
                    help="backends to benchmark (default: every available one for this device)")
    group.addoption("--perf-inputs", choices=("torch", "native"), default="torch",
                    help="what run receives: torch tensors where the backend takes them (default), or its own arrays")
    group.addoption("--perf-baseline", choices=("auto", "off"), default="auto",
                    help="auto: compare with benchmarks/baselines/<device>/baseline.json when it exists")
    group.addoption("--perf-conformance", action="store_true", default=False,
                    help="also time the conformance suite itself (bench_conformance.py: the quick profile on "
                         "numpy and the time to kill each mutant; minutes on a CPU); default: left out")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the conformance suite's own timings (marked ``conformance_timing``) unless asked for."""
    if config.getoption("--perf-conformance"):
        return
    kept = [item for item in items if item.get_closest_marker("conformance_timing") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Point --benchmark-compare at this device's baseline (runs before pytest-benchmark's configure)."""
    config.addinivalue_line("markers", "conformance_timing: times the conformance suite (--perf-conformance)")
    if config.getoption("--perf-baseline", "off") != "auto" or config.getoption("benchmark_compare", None):
        return
    if config.getoption("benchmark_json", None) is not None:
        return  # writing a baseline: compare with nothing
    path = baseline_path(KEPT_BASELINES)
    if not path.is_file():
        return
    from pytest_benchmark.utils import parse_compare_fail

    config.option.benchmark_compare = str(path)
    if not config.getoption("benchmark_compare_fail", None):
        config.option.benchmark_compare_fail = [parse_compare_fail(DEFAULT_FAIL)]


def pytest_report_header(config: pytest.Config) -> str:
    path = baseline_path(KEPT_BASELINES)
    state = f"baseline {path}" if path.is_file() else f"no baseline kept for '{device.device_slug()}'"
    return f"pagedattn perf: device {device.gpu_name() or 'cpu (CPU figures)'}; {state}"


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    machine_info["gpu"] = device.gpu_name()
    machine_info["device"] = device.device_slug()
    machine_info["cpu_name"] = device.cpu_name()


def perf_backends(config: pytest.Config) -> list[str]:
    """Backends to benchmark: the option's, else the available ones that run on this device."""
    from pagedattn.backends.registry import available_backends, load_backend

    names = config.getoption("--perf-backends")
    if names:
        return list(names)
    on_gpu = device.gpu_name() is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        chosen = []
        for name in available_backends():
            runs_on_gpu = load_backend(name).capabilities().device != "cpu"
            if runs_on_gpu == on_gpu:
                chosen.append(name)
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``backend_name`` over :func:`perf_backends`; a module with ``JUDGED_BACKENDS`` (it asserts
    bars) gets only those of them, unless ``--perf-backends`` names the backends."""
    if "backend_name" in metafunc.fixturenames:
        names = perf_backends(metafunc.config)
        judged = getattr(metafunc.module, "JUDGED_BACKENDS", None)
        if judged is not None and not metafunc.config.getoption("--perf-backends"):
            names = [name for name in names if name in judged]
        metafunc.parametrize("backend_name", names)


@pytest.fixture(scope="session")
def ceilings() -> Ceilings:
    """The roofline ceilings of this device, measured once per session."""
    from pagedattn.perf import ceilings as ceilings_mod

    return ceilings_mod.measure_gpu() if device.gpu_name() else ceilings_mod.measure_cpu()


@pytest.fixture(scope="session")
def cpu_ceilings() -> Ceilings:
    """The CPU's ceilings, for benchmarks of CPU backends (also on a GPU machine)."""
    from pagedattn.perf import ceilings as ceilings_mod

    return ceilings_mod.measure_cpu()


@pytest.fixture(scope="session")
def input_kind(request: pytest.FixtureRequest) -> str:
    """What ``run`` receives (``--perf-inputs``): torch tensors where the backend takes them, or native."""
    return str(request.config.getoption("--perf-inputs"))
