"""The conformance plugin: harmless without --backend, UNSUPPORTED status, zero-pass rule, xdist."""

from __future__ import annotations

import pytest

from pagedattn.conformance.mutants.run import run_pytest_in_process, suite_location
from pagedattn.conformance.plugin import COSTLY_TESTS
from pagedattn.conformance.report import RecordCollector

PLUGIN = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=quick"]


def test_plugin_does_nothing_without_backend(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    assert run_pytest_in_process([*PLUGIN, str(tmp_path)]) == 0


def test_suite_without_backend_is_a_usage_error():
    code = run_pytest_in_process([*PLUGIN, "--pyargs", "pagedattn.conformance.test_bad_input"])
    assert code in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)


def _run(backend: str, *extra: str, tmp_path) -> tuple[int, RecordCollector]:
    collector = RecordCollector()
    code = run_pytest_in_process([*PLUGIN, "--conformance-cases", str(tmp_path), "--backend", backend,
                                  *extra], [collector])
    return code, collector


def test_outside_capabilities_is_unsupported_not_pass_or_skip(tmp_path):
    code, collector = _run("conformance_backends:NarrowBackend", "-k", "decode or softcap", "--pyargs",
                           "pagedattn.conformance.test_meaning", tmp_path=tmp_path)
    assert code == 0
    status = {(r["feature"], r["dtype"], r["block_size"], r["kv_layout"]): r["status"] for r in collector.records}
    assert status[("decode", "float32", 16, "NHD")] == "pass"
    assert status[("softcap", "float32", 16, "NHD")] == "unsupported"
    assert status[("decode", "float16", 16, "NHD")] == "unsupported"
    assert status[("decode", "float32", 32, "NHD")] == "unsupported"
    assert status[("decode", "float32", 16, "HND")] == "unsupported"
    assert set(status.values()) == {"pass", "unsupported"}


def test_unsupported_status_is_its_own_category(pytester_free_report=None):
    from types import SimpleNamespace

    from pagedattn.conformance.plugin import UNSUPPORTED_KEY, pytest_report_teststatus

    report = SimpleNamespace(when="call", user_properties=[(UNSUPPORTED_KEY, "no softcap")])
    assert pytest_report_teststatus(report, None)[0] == "unsupported"
    assert pytest_report_teststatus(SimpleNamespace(when="call", user_properties=[]), None) is None


def test_backend_passing_zero_cases_fails_the_run(tmp_path):
    code, collector = _run("conformance_backends:NothingBackend", "--pyargs", "pagedattn.conformance.test_bad_input",
                           "pagedattn.conformance.test_operations", tmp_path=tmp_path)
    assert collector.records and all(r["status"] == "unsupported" for r in collector.records)
    assert code == pytest.ExitCode.TESTS_FAILED


def test_runs_under_xdist(tmp_path):
    code, collector = _run("numpy", "-n", "2", "--pyargs", "pagedattn.conformance.test_operations",
                           tmp_path=tmp_path)
    assert code == 0
    assert any(r["status"] == "pass" and r["examples"] > 0 for r in collector.records)


def test_a_cell_whose_worker_dies_fails_and_the_summary_names_it(tmp_path, capsys):
    (tmp_path / "test_dies.py").write_text("import os\nimport signal\n\n\ndef test_dies():\n"
                                           "    os.kill(os.getpid(), signal.SIGKILL)\n")
    code = run_pytest_in_process([*PLUGIN, "--conformance-cases", str(tmp_path / "cases"), "--backend", "numpy",
                                  "-n", "1", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.TESTS_FAILED
    died = out.split("cells whose worker process died", 1)[1]
    assert "test_dies.py::test_dies" in died and "out-of-memory killer" in died


def test_profile_from_environment_and_header(monkeypatch, capsys, tmp_path):
    from hypothesis import settings

    assert {"quick", "ci", "thorough"} <= set(settings._profiles)
    assert settings.get_profile("thorough").database is not None
    assert settings.get_profile("thorough").max_examples > settings.get_profile("ci").max_examples
    monkeypatch.setenv("PAGEDATTN_PROFILE", "thorough")
    code = run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider",
                                  "--conformance-cases", str(tmp_path), "--backend", "numpy",
                                  "--collect-only", "--pyargs", "pagedattn.conformance.test_bad_input"])
    out = capsys.readouterr().out
    assert code == 0
    assert "hypothesis profile thorough" in out and "backend numpy" in out


class _Collected:
    def __init__(self) -> None:
        self.nodeids: list[str] = []

    def pytest_collection_finish(self, session) -> None:
        self.nodeids = [item.nodeid for item in session.items]


def test_each_operation_and_feature_runs_early_the_costly_cells_last_and_no_cell_is_lost(tmp_path):
    collected = _Collected()
    code = run_pytest_in_process([*PLUGIN, "--conformance-cases", str(tmp_path), "--backend", "numpy",
                                  "--collect-only", "--pyargs", "pagedattn.conformance"], [collected])
    assert code == 0
    order = collected.nodeids
    assert len(order) == len(set(order)) > 300
    first = {}
    for index, nodeid in enumerate(order):
        first.setdefault(nodeid.split("::")[-1].split("[")[0], index)
    for operation in ("test_write_kv_writes_only_its_slots", "test_copy_blocks_reads_all_sources_first",
                      "test_merge_states_matches_exact_merge"):
        assert first[operation] < 10, f"{operation} first runs as cell {first[operation]}"
    # the first tier (one cell of each test, feature and cache) ends where the cheap tests' other
    # cells begin: at the second bad-input cell
    bad_input = [i for i, n in enumerate(order) if "test_bad_input_raises_naming_the_argument" in n]
    first_tier = order[:bad_input[1]]
    assert len(first_tier) < len(order) // 4
    features = {n.split("[")[1].split("-")[2] for n in order if "test_attention_matches_spec" in n}
    early = {n.split("[")[1].split("-")[2] for n in first_tier if "test_attention_matches_spec" in n}
    assert early == features
    # the costly cells last, the cheapest test's first
    costly = [n for n in order if n.split("::")[-1].split("[")[0] in COSTLY_TESTS]
    assert order[len(order) - len(costly):] == costly
    assert sorted(COSTLY_TESTS, key=first.__getitem__) == list(COSTLY_TESTS)


def test_progress_counts_cells_per_backend_and_estimates_the_rest():
    from pagedattn.conformance.plugin import Progress, backend_of

    names = ["numpy", "mutant:X", "mutant:X-slow"]
    assert backend_of("m.py::test_a[mutant:X-slow-bs16-float32]", names) == "mutant:X-slow"
    assert backend_of("m.py::test_a[numpy]", names) == "numpy"
    assert backend_of("m.py::test_plain", names) is None
    now = [100.0]
    progress = Progress(clock=lambda: now[0])
    progress.collected([f"m.py::test_a[numpy-{i}]" for i in range(4)] + ["m.py::test_a[mutant:X-0]"], names)
    progress.finished("numpy")
    now[0] += 30.0
    progress.finished("numpy")
    assert progress.line("numpy") == "pagedattn progress: numpy 2/4 cells, 30s, about 30s left"
    progress.finished("numpy")
    progress.finished("numpy")
    assert progress.line("numpy").endswith("4/4 cells, 30s, done")


def test_an_interpreted_backend_gets_fewer_examples_only_in_the_standard_profile():
    from pagedattn.backends.capabilities import Capabilities
    from pagedattn.backends.numpy.backend import NumpyBackend
    from pagedattn.conformance.profiles import INTERPRETED_EXAMPLES, PROFILES, examples_per_cell

    class Interpreted(NumpyBackend):
        def capabilities(self) -> Capabilities:
            return Capabilities(device="cpu (Triton interpreter)")

    slow, native = Interpreted(), NumpyBackend()
    full = PROFILES["standard"]["max_examples"]
    assert examples_per_cell(slow, "standard") == INTERPRETED_EXAMPLES["standard"] < full
    assert examples_per_cell(native, "standard") == full == PROFILES["ci"]["max_examples"]
    for deep in ("ci", "thorough"):
        assert examples_per_cell(slow, deep) == examples_per_cell(native, deep) == PROFILES[deep]["max_examples"]


def test_first_failure_stops_a_cell_at_its_first_failing_example_unshrunk_and_unsaved(tmp_path):
    """--conformance-first-failure: the same cell fails on the same draws, in fewer examples, with no case saved."""
    # node ids as the mutant runs give them (they seed the draws): the cell that kills SoftcapCancels
    cell = ["-x", "-k", "test_attention_matches_spec and softcap and float32 and bs16 and NHD",
            *suite_location(["pagedattn.conformance.test_meaning"])]
    full_dir, first_dir = tmp_path / "full", tmp_path / "first"
    full_code, full = _run("mutant:SoftcapCancels", *cell, tmp_path=full_dir)
    first_code, first = _run("mutant:SoftcapCancels", "--conformance-first-failure", *cell, tmp_path=first_dir)
    assert full_code == first_code == pytest.ExitCode.TESTS_FAILED
    [full_record] = [r for r in full.records if r["status"] == "fail"]
    [first_record] = [r for r in first.records if r["status"] == "fail"]
    assert first_record["examples"] < full_record["examples"]  # the full run shrinks
    assert list(full_dir.rglob("*.npz")) and not list(first_dir.rglob("*.npz"))
    assert full_record["replays"] and not first_record["replays"] and first_record["failures"][0]["message"]
