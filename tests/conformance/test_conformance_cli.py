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


def test_failure_is_saved_and_replayed(tmp_path, capsys):
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
