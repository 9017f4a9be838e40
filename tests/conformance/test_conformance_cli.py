"""``pagedattn conform`` prints and saves the matrix; ``pagedattn replay`` re-runs a saved failure."""

from __future__ import annotations

import json

from pagedattn.conformance import cli, replay


def test_conform_numpy_quick_passes_and_writes_json(tmp_path, capsys):
    code = cli.main(["--backend", "numpy", "--profile", "quick", "--out", str(tmp_path), "-k", "bs16 and float32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "conformance of numpy" in out and "FAIL" not in out
    report = json.loads((tmp_path / "report.json").read_text())
    matrix = report["matrix"]["numpy"]
    assert matrix["decode"]["float32/bs16"]["status"] == "pass"
    assert matrix["decode"]["float32/bs16"]["examples"] > 0


def test_failure_is_saved_and_replayed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # away from the checkout: node ids must still name their module
    code = cli.main(["--backend", "mutant:LseInLog2", "--profile", "quick", "--out", str(tmp_path),
                     "-k", "test_attention_matches_spec and bs16 and lse- and float32 and NHD"])
    out = capsys.readouterr().out
    assert code == 1
    cases = sorted((tmp_path / "cases").glob("*.npz"))
    assert cases and f"pagedattn replay {cases[0]} --backend mutant:LseInLog2" in out
    assert replay.main([str(cases[0]), "--backend", "mutant:LseInLog2"]) == 1
    assert "lse" in capsys.readouterr().out
    assert replay.main([str(cases[0]), "--backend", "numpy"]) == 0
    assert "pass: worst error" in capsys.readouterr().out
    [failed] = [r for r in json.loads((tmp_path / "report.json").read_text())["records"] if r["status"] == "fail"]
    assert failed["nodeid"].startswith("pagedattn/conformance/test_meaning.py::test_attention_matches_spec[")
    assert "lse" in failed["message"] and "runner.py" not in failed["message"]
    assert failed["failures"][0]["replay"] == f"pagedattn replay {cases[0]} --backend mutant:LseInLog2"


def test_every_check_a_cell_runs_can_be_replayed():
    """A saved case names its cell's check; ``replay`` finds every check the suite's cells use."""
    import re
    from pathlib import Path

    import pagedattn.conformance as suite
    from pagedattn.conformance import checks

    used = {name for module in Path(suite.__file__).parent.glob("test_*.py")
            for name in re.findall(r"checks\.([a-z_][a-z0-9_]*)", module.read_text())}
    assert "plan_serves_many_runs" in used and "long_chunks_match_spec" in used
    assert used <= set(checks.CHECKS), sorted(used - set(checks.CHECKS))


def test_a_long_plan_failure_is_saved_and_replayed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--backend", "mutant:SplitPlanBindsFirstRunArrays", "--profile", "quick", "--out", str(tmp_path),
                     "-k", "test_long_plans_serve_many_runs and decode"])
    assert code == 1
    [case] = sorted((tmp_path / "cases").glob("*.npz"))
    capsys.readouterr()
    assert replay.main([str(case), "--backend", "mutant:SplitPlanBindsFirstRunArrays"]) == 1
    assert "check: plan_serves_many_runs" in capsys.readouterr().out
    assert replay.main([str(case), "--backend", "pagedattn.conformance.mutants.scale:AddressedKernelBackend"]) == 0


def test_an_unknown_backend_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["--backend", "nosuch", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).strip().splitlines()
    assert len(lines) == 1 and "nosuch" in lines[0] and "numpy" in lines[0]


def test_a_failure_without_a_runner_record_reports_its_text():
    from types import SimpleNamespace

    from pagedattn.conformance.report import failure_message

    crash = SimpleNamespace(message="PagedAttentionError did not name 'query'", path="runner.py", lineno=99)
    assert failure_message(SimpleNamespace(longrepr=SimpleNamespace(reprcrash=crash))) == crash.message
