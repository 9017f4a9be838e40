"""The conformance plugin: harmless without --backend, UNSUPPORTED status, zero-pass rule, xdist."""

from __future__ import annotations

import pytest

from pagedattn.conformance.mutants.run import run_pytest_in_process
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
