"""``pagedattn bench`` on the CPU: table, JSON, PNG, CPU labelling, argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedattn.perf import cli, device, report
from pagedattn.perf.measure import Result

pytestmark = pytest.mark.skipif(device.gpu_name() is not None, reason="the CPU path of the bench")

CASE = "llama3-70b-tp8/decode/b8/ctx1024/bs16"


def test_bench_writes_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    rc = cli.main(["--backend", "numpy", "--shapes", CASE, "--out", str(tmp_path), "--budget", "0.05"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "CPU figures" in err and "CPU figures" in out
    assert "[1/1" in err, "progress lines"
    assert "numpy" in out and "llama3-70b-tp8/decode/b8/ctx1024" in out
    doc = json.loads((tmp_path / "bench.json").read_text())
    (row,) = doc["results"]
    assert row["status"] == "ok" and row["runner"] == "numpy" and row["case"] == CASE
    assert row["gbps"] == pytest.approx(row["bytes"] / row["seconds"] / 1e9)
    assert 0 < row["pct_of_ceiling"] < 100
    assert row["one_call_s"] > 0 and row["inputs"] == "native"
    assert row["graph_s"] is None and row["graph_note"] == "no CUDA device", "no number in the graph column"
    assert doc["ceilings"]["read_bytes_per_s"] > 0 and doc["command"].startswith("pagedattn bench --backend numpy")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_refuses_gpu_sets_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--shapes", "quick"]) == 2
    assert "sized for a GPU" in capsys.readouterr().err


def test_bench_unknown_shape_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--shapes", "llama9"]) == 2
    assert "unknown set or case 'llama9'" in capsys.readouterr().err


def test_list_names_every_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} (" in out for name in ("cpu", "quick", "decode", "prefill", "mixed", "full"))


def _row(runner: str, seconds: float | None, status: str = "ok") -> Result:
    return Result(runner, "m/decode/b1/ctx8/bs16", "m", "decode", 1, 8, 16, "bfloat16", status,
                  seconds=seconds, gbps=1.0 if seconds else None, tflops=1.0, pct_of_ceiling=50.0)


def test_ratio_is_time_over_the_unpaged_reference() -> None:
    rows = [_row("torch", 3e-5), _row("sdpa", 1e-5), _row("triton", None, "unsupported")]
    report.add_reference_ratios(rows)
    assert rows[0].ratio_to_reference == pytest.approx(3.0) and rows[1].ratio_to_reference == pytest.approx(1.0)
    assert rows[2].ratio_to_reference is None
    table = report.table_rows(rows)
    assert table[0][4] == "30.0 us" and table[0][-1] == "3.00" and table[2][3].startswith("unsupported")
    assert table[0][5] == "not timed", "a row without a graph time says so in the graph column, never a number"


def test_bench_in_order_blocks_are_their_own_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["--backend", "numpy", "--shapes", CASE, "--blocks", "in-order", "--out", str(tmp_path),
                   "--budget", "0.05", "--no-plot"])
    assert rc == 0
    out, _ = capsys.readouterr()
    assert "llama3-70b-tp8/decode/b8/ctx1024/" in out and "in-order" in out  # a narrow table wraps the shape
    (row,) = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert row["case"] == CASE + "/in-order" and row["status"] == "ok"
