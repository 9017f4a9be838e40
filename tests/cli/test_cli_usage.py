"""The ``pagedattn`` command: usage on stderr, --version, every option's help with its default,
missing packages and bad arguments as one line on stderr with exit status 2, tables that
print what they are given and fit a pipe."""

from __future__ import annotations

import argparse
import importlib
import io
import sys
from pathlib import Path

import pytest

from pagedattn import __version__, cli, console
from pagedattn.conformance import cli as conform_cli
from pagedattn.conformance import replay
from pagedattn.perf import cli as bench_cli
from pagedattn.usage import HelpFormatter

PARSERS = {"conform": conform_cli.build_parser, "replay": replay.build_parser, "bench": bench_cli.build_parser}


def test_no_command_prints_usage_on_stderr_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: pagedattn") and "simulate" in err


def test_help_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: pagedattn")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pagedattn {__version__}"


def test_backends_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["backends", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pagedattn backends") and "registered backends" in out


def test_backends_rejects_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["backends", "--nosuch"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --nosuch" in capsys.readouterr().err


def test_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pagedattn: error: unknown command 'nosuch'")


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_option_has_help_and_its_default(command: str) -> None:
    parser = PARSERS[command]()
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action)
        assert action.help, f"{command} {action.dest}: no help"
        if action.option_strings:
            assert "default" in text, f"{command} {'/'.join(action.option_strings)}: help states no default: {text}"
    assert "%(default)" not in parser.format_help()  # every default was substituted


def test_a_subcommand_whose_package_is_missing_says_which(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis now raises ImportError
    for name in ("pagedattn.conformance.cli", "pagedattn.conformance.plugin", "pagedattn.conformance.profiles"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert cli.main(["conform", "--backend", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the package 'hypothesis'" in err and "pip install" in err


def test_conform_workers_without_xdist(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "xdist", None)
    assert conform_cli.main(["--backend", "numpy", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pytest-xdist, which is not installed" in err and "pip install" in err


@pytest.mark.parametrize("spec", ["nosuch", "mutant:Nosuch", "no.such.module:Backend"])
def test_conform_unknown_backend(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert conform_cli.main(["--backend", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pagedattn conform: error:")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rich_prints_brackets_as_text() -> None:
    pytest.importorskip("rich")
    stream = _Terminal()
    console.print_table(("status",), [("pip install 'pagedattn[cupy]'",)], title="[bold]x", file=stream)
    text = stream.getvalue()
    assert "pip install 'pagedattn[cupy]'" in text and "[bold]x" in text


def test_plain_table_wraps_to_the_width() -> None:
    long = ",".join(f"feature{i}" for i in range(40))  # about 330 characters
    text = console.format_plain(("name", "capabilities"), [("numpy", long)], width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "".join(line[len("numpy  "):] for line in text.splitlines()[2:]).replace(" ", "") == long


def test_piped_backends_listing_fits_120_columns(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and max(len(line) for line in out.splitlines()) <= console.PLAIN_WIDTH


def test_torch_unavailable_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedattn.backends.torch import backend

    real = importlib.util.find_spec
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name))
    assert backend.TorchBackend.availability() == "torch is not installed (pip install 'pagedattn[torch]')"


@pytest.mark.parametrize("command", [["conform", "--backend", "numpy"], ["bench", "--backend", "numpy"]])
def test_an_output_folder_that_cannot_be_made(command: list[str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli.main([*command, "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create this folder" in err


def test_conform_ledger_that_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["conform", "--backend", "numpy", "--resume", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "cannot use this ledger" in err
