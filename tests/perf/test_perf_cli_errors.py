"""``pagedattn bench``: bad arguments are one line on stderr with exit status 2; figures keep
three significant figures; reasons sit under the table; a missing matplotlib is said, not raised."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pagedattn.perf import cli, device, report
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result
from pagedattn.perf.plot import save_plot

CPU_ONLY = pytest.mark.skipif(device.gpu_name() is not None, reason="the CPU path of the bench")
CASE = "llama3-70b-tp8/decode/b8/ctx1024/bs16"


def one_error_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("pagedattn bench: error:") and err.count("\n") == 1, err
    assert all(word in err for word in words), err


@pytest.mark.parametrize(("args", "words"), [
    (["--dtype", "int8"], ("--dtype", "invalid choice: 'int8'")),
    (["--budget", "-1"], ("--budget", "expected a number > 0")),
    (["--budget", "nan"], ("--budget",)),
    (["--batch-ms", "0"], ("--batch-ms",)),
    (["--flex-budget", "-2"], ("--flex-budget",)),
    (["--peers", "nosuch"], ("--peers",)),
])
def test_bad_option_values(args: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(args)
    assert exit_info.value.code == 2
    one_error_line(capsys, *words)


def test_unknown_backend_times_nothing_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--backend", "nosuch", "--out", str(tmp_path)]) == 2
    one_error_line(capsys, "--backend nosuch", "no backend named 'nosuch'")
    assert not (tmp_path / "bench.json").exists()


def test_unavailable_backend(tmp_path: Path, numpy_unavailable: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--backend", "numpy", "--out", str(tmp_path)]) == 2
    one_error_line(capsys, "--backend numpy", "no such device in this test")
    assert not (tmp_path / "bench.json").exists()


@CPU_ONLY
def test_cpu_run_without_matplotlib_and_with_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    rc = cli.main(["--backend", "numpy", "--shapes", CASE, "--peers", "sdpa", "--out", str(tmp_path),
                   "--budget", "0.05"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "--peers sdpa: ignored, peers are timed on a GPU only" in err
    assert "matplotlib is not installed" in err and "no plot saved" in err
    assert "matrix 0.0 TFLOP/s" not in err
    assert not (tmp_path / "bench.png").exists()
    (row,) = json.loads((tmp_path / "bench.json").read_text())["results"]
    cells = next(line for line in out.splitlines() if line.startswith("numpy")).split()
    gbps_cell = report.format_rate(row["gbps"])
    assert gbps_cell in cells and float(gbps_cell) == pytest.approx(row["gbps"], rel=5e-3)


@pytest.mark.parametrize(("value", "text"), [
    (0.028, "0.0280"), (0.5, "0.500"), (1.234, "1.23"), (12.345, "12.3"), (4812.7, "4813"), (0.0, "0"),
])
def test_rates_keep_three_significant_figures(value: float, text: str) -> None:
    assert report.format_rate(value) == text


def _row(runner: str, block_size: int, context: int, status: str = "ok", reason: str = "") -> Result:
    ok = status == "ok"
    return Result(runner, f"m/decode/b1/ctx{context}/bs{block_size}", "m", "decode", 1, context, block_size,
                  "bfloat16", status, reason, seconds=1e-5 if ok else None, gbps=100.0 * block_size if ok else None,
                  tflops=0.5 if ok else None, pct_of_ceiling=10.0 if ok else None)


def test_reasons_go_under_the_table_not_into_the_time_column() -> None:
    reason = "head_dim 512 (supported: <= 256) " * 3
    rows = [_row("torch", 16, 8), _row("triton", 16, 8, "unsupported", reason),
            _row("triton", 64, 8, "unsupported", reason)]
    table = report.table_rows(rows)
    assert [r[3] for r in table[1:]] == ["unsupported [1]", "unsupported [1]"]
    assert max(len(r[3]) for r in table) <= len("unsupported [1]")
    assert report.reason_notes(rows) == [f"[1] triton unsupported: {reason}"]


def test_plot_draws_every_block_size(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pagedattn.perf.plot import panels

    rows = [_row(r, bs, ctx) for r in ("numpy", "torch") for bs in (16, 32, 64) for ctx in (256, 1024)]
    rows += [replace(_row("numpy", bs, 512), batch=4) for bs in (16, 64)]  # one context: bars
    data = panels(rows)
    assert set(data["m decode b1"]) == {(r, bs) for r in ("numpy", "torch") for bs in (16, 32, 64)}
    assert set(data["m decode b4"]) == {("numpy", 16), ("numpy", 64)}
    ceilings = Ceilings("cpu", 2e10, 1e11, "test")
    assert save_plot(rows, ceilings, tmp_path / "bench.png", title="test") is None
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
