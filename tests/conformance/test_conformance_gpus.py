"""``--gpus``: xdist workers pinned to GPUs, one merged matrix, failures that name their GPU.

On a CPU machine the integration tests run two workers "pinned" to GPU 0 (``--gpus 0,0``):
what they check (each worker's CUDA_VISIBLE_DEVICES, the merge, the failure's GPU, the
replay elsewhere) does not need a device.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
from execnet import XSpec

from pagedattn.conformance import cli, gpus, replay
from pagedattn.conformance.cases import load_case
from pagedattn.conformance.mutants.run import run_pytest_in_process
from pagedattn.conformance.report import RecordCollector
from pagedattn.errors import PagedAttentionError

PLUGIN = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=quick"]
LSE_CELL = "test_attention_matches_spec and bs16 and float32 and NHD and (lse- or decode-)"


def test_visible_devices_are_read_as_cuda_reads_them():
    assert gpus.parse_visible("0,1") == ["0", "1"]
    assert gpus.parse_visible(" GPU-4f1e, 2 ") == ["GPU-4f1e", "2"]
    assert gpus.parse_visible("0,-1,2") == ["0"]  # CUDA stops at an invalid index
    assert gpus.parse_visible("") == []


def test_all_is_the_parents_visible_devices_else_nvidia_smi(monkeypatch):
    assert gpus.resolve_gpus("all", {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpus.resolve_gpus("3,3,2", {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["3", "3", "2"]
    monkeypatch.setattr(gpus, "nvidia_smi_gpus", lambda: ["0", "1"])
    assert gpus.resolve_gpus("all", {}) == ["0", "1"]
    assert gpus.resolve_gpus("1,0", {}) == ["1", "0"]
    monkeypatch.setattr(gpus, "nvidia_smi_gpus", lambda: None)
    assert gpus.resolve_gpus("0,0", {}) == ["0", "0"]  # nothing lists GPUs here: taken as given


@pytest.mark.parametrize(("spec", "environ", "listed", "words"), [
    ("0", {"CUDA_VISIBLE_DEVICES": "2,3"}, None, "GPU 0 is not among the GPUs here (CUDA_VISIBLE_DEVICES=2,3"),
    ("all", {"CUDA_VISIBLE_DEVICES": ""}, None, "'all' found no GPU"),
    ("all", {}, None, "nvidia-smi cannot run"),
    ("2", {}, ["0", "1"], "GPU 2 is not among the GPUs here (nvidia-smi -L: 0, 1)"),
    ("0,,1", {}, None, "comma-separated GPU ids"),
    ("", {}, None, "comma-separated GPU ids"),
])
def test_bad_gpus_raise_naming_the_option(monkeypatch, spec, environ, listed, words):
    monkeypatch.setattr(gpus, "nvidia_smi_gpus", lambda: listed)
    with pytest.raises(PagedAttentionError, match="--gpus") as raised:
        gpus.resolve_gpus(spec, environ)
    assert raised.value.argument == "--gpus" and words in str(raised.value)


def test_nvidia_smi_listing_is_parsed(monkeypatch):
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n  MIG 1g.18gb Device 0: (UUID: MIG-bbbb)\n"
               "GPU 1: NVIDIA H200 (UUID: GPU-cccc)\n")
    monkeypatch.setattr(gpus.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpus.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=listing))
    assert gpus.nvidia_smi_gpus() == ["0", "1"]

    def broken(*args, **kwargs):
        raise subprocess.CalledProcessError(9, "nvidia-smi")

    monkeypatch.setattr(gpus.subprocess, "run", broken)
    assert gpus.nvidia_smi_gpus() is None
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.nvidia_smi_gpus() is None


def test_one_tx_spec_per_worker_round_robin_over_the_gpus():
    specs = gpus.tx_specs(["0", "1"], 2, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert specs == ["popen//env:CUDA_VISIBLE_DEVICES=0", "popen//env:CUDA_VISIBLE_DEVICES=1",
                     "popen//env:CUDA_VISIBLE_DEVICES=0", "popen//env:CUDA_VISIBLE_DEVICES=1"]
    parsed = XSpec(specs[1])
    assert parsed.popen and parsed.env == {"CUDA_VISIBLE_DEVICES": "1"}
    # ids numbered by nvidia-smi (PCI bus order): the workers number them the same way
    (spec,) = gpus.tx_specs(["GPU-aaaa"], 1, {})
    assert XSpec(spec).env == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.tx_specs(["0"], 1, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == ["popen//env:CUDA_VISIBLE_DEVICES=0"]
    with pytest.raises(PagedAttentionError, match="--workers-per-gpu"):
        gpus.tx_specs(["0"], 0, {})


@pytest.mark.parametrize("extra", [["-n", "2"], ["--tx", "popen"], ["--workers-per-gpu", "0"], []])
def test_gpus_with_n_tx_or_bad_values_is_a_usage_error(monkeypatch, extra):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    gpu = "0" if extra else "1"  # the last case: GPU 1 is not visible
    code = run_pytest_in_process([*PLUGIN, "--backend", "numpy", "--gpus", gpu, *extra,
                                  "--pyargs", "pagedattn.conformance.test_operations"])
    assert code == pytest.ExitCode.USAGE_ERROR


def test_conform_checks_gpus_before_running(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for argv in (["--gpus", "0", "-n", "2"], ["--gpus", "1"], ["--gpus", "0", "--workers-per-gpu", "0"]):
        assert cli.main(["--backend", "numpy", "--out", str(tmp_path / "never"), *argv]) == 2
    assert not (tmp_path / "never").exists()
    err = capsys.readouterr().err
    assert "leave out -n" in err and "GPU 1 is not among" in err and "--workers-per-gpu: must be at least 1" in err


def _cells(report: dict) -> dict[str, tuple]:
    """Each cell's (status, examples, worst error as a fraction of the tolerance), by test id."""
    return {r["nodeid"]: (r["status"], r["examples"], r["worst_fraction"]) for r in report["records"]}


def _statuses(report: dict) -> dict[str, tuple]:
    return {nodeid: cell[:2] for nodeid, cell in _cells(report).items()}


def _conform(tmp_path, name: str, *argv: str) -> dict:
    """Run ``pagedattn conform`` (recording a ledger), return its report.json."""
    assert cli.main([*argv, "--out", str(tmp_path / name), "--resume", str(tmp_path / f"{name}.jsonl")]) == 0
    return json.loads((tmp_path / name / "report.json").read_text())


# Hypothesis also draws constants found in the source of the non-test modules a process has
# loaded, so a cell's draws can differ between the in-process run (which loaded the CLI's
# modules too) and a worker; two workers against one worker of the same make-up must agree
# exactly, and against the in-process run in every cell's status and example count.


@pytest.mark.parametrize(("backend", "keyword"), [("numpy", "bs16 and float32"),
                                                  ("torch", "bs16 and float32 and NHD and (write_kv or copy_blocks"
                                                            " or merge_states or decode- or varlen-)")],
                         ids=["numpy", "torch"])
def test_two_workers_pinned_to_one_gpu_give_the_single_process_matrix(monkeypatch, tmp_path, backend, keyword):
    if backend == "torch":
        pytest.importorskip("torch")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # whatever a worker sees, --gpus set it
    common = ["--backend", backend, "--profile", "quick", "-k", keyword]
    one = _conform(tmp_path, "one", *common)
    solo = _conform(tmp_path, "solo", *common, "--gpus", "0")
    two = _conform(tmp_path, "two", *common, "--gpus", "0,0")
    assert len(one["records"]) >= 6 and {r["status"] for r in one["records"]} == {"pass"}
    assert _cells(two) == _cells(solo)
    assert two["matrix"] == solo["matrix"]
    assert _statuses(two) == _statuses(one)
    assert {r["gpu"] for r in two["records"]} == {"0"}
    assert {r["worker"] for r in two["records"]} == {"gw0", "gw1"}  # both workers took cells
    assert not any("gpu" in r for r in one["records"])
    settled = [json.loads(line)["nodeid"] for line in (tmp_path / "two.jsonl").read_text().splitlines()[1:]]
    assert sorted(settled) == sorted(_cells(one))  # one ledger, every worker's cells in it once


def test_same_seed_and_profile_give_the_same_cells_under_gpus(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the thorough profile's example database lands here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    common = ["--backend", "numpy", "--profile", "thorough", "--seed", "20",
              "-k", "(merge_states and not far_rows and not stream and not many_tokens and not another_gpu)"
              " or (copy_blocks and bs16 and float32)"]
    one, solo, two = (_conform(tmp_path, name, *common, *extra)
                      for name, extra in (("one", []), ("solo", ["--gpus", "0"]), ("two", ["--gpus", "0,0"])))
    assert len(one["records"]) >= 4 and _cells(two) == _cells(solo) and _statuses(two) == _statuses(one)
    assert min(r["examples"] for r in one["records"]) > 15  # thorough's draws, not quick's


def test_failure_names_its_gpu_and_replays_on_another(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    collector = RecordCollector()
    code = run_pytest_in_process([*PLUGIN, "-rf", "--conformance-cases", str(tmp_path), "--backend",
                                  "mutant:LseInLog2", "--gpus", "0,0", "-k", LSE_CELL,
                                  "--pyargs", "pagedattn.conformance.test_meaning"], [collector])
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.TESTS_FAILED
    (failed,) = [r for r in collector.records if r["status"] == "fail"]
    assert failed["gpu"] == "0" and failed["worker"] in ("gw0", "gw1")
    assert f"ran on GPU 0 (CUDA_VISIBLE_DEVICES=0, pytest-xdist worker {failed['worker']})" in out  # the message
    assert "pagedattn: failures by GPU" in out
    assert f"GPU 0 ({failed['worker']}): {failed['nodeid']}" in out  # the summary
    (case,) = sorted(tmp_path.glob("*.npz"))
    _, _, context = load_case(case)
    assert not {"gpu", "worker", "CUDA_VISIBLE_DEVICES"} & set(context)
    assert "CUDA_VISIBLE_DEVICES" not in case.read_bytes().decode("latin-1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another GPU than the one it failed on
    assert replay.main([str(case), "--backend", "mutant:LseInLog2"]) == 1
    assert replay.main([str(case), "--backend", "numpy"]) == 0


def test_a_seed_draws_other_examples_under_a_derandomized_profile_and_the_same_again(monkeypatch, tmp_path):
    """Hypothesis ignores --hypothesis-seed under derandomize; the runner joins it to each cell's digest."""
    monkeypatch.chdir(tmp_path)
    common = ["--backend", "numpy", "--profile", "quick", "-k", "test_attention_matches_spec and bs16 and float32"]
    fixed, first, again, other = (_conform(tmp_path, name, *common, *extra) for name, extra in (
        ("fixed", []), ("first", ["--seed", "1"]), ("again", ["--seed", "1"]), ("other", ["--seed", "2"])))
    assert len(first["records"]) >= 4
    assert _cells(again) == _cells(first)  # repeatable with its seed
    assert _statuses(other) == _statuses(first) == _statuses(fixed)  # every cell passes, as many examples
    worst = [{n: c[2] for n, c in _cells(report).items()} for report in (fixed, first, other)]
    assert worst[0] != worst[1] and worst[1] != worst[2]  # other draws: other worst errors
