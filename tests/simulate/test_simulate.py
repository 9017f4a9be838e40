"""pagedattn simulate: the flat address space, workloads, both schemes and the command."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.errors import PagedAttentionError
from pagedattn.simulate import cli
from pagedattn.simulate.contiguous import FlatSpace, simulate_contiguous
from pagedattn.simulate.paged import simulate_paged
from pagedattn.simulate.workload import (
    Request,
    TokenIds,
    WorkloadSpec,
    generate,
    read_csv,
    write_csv,
)

SMALL = WorkloadSpec(num_requests=120, arrival_rate=5.0, mean_prompt=60, mean_output=80,
                     max_model_len=512, max_tokens_choices=(128, 256, 512), seed=1)


# -- the flat address space ----------------------------------------------------------


def test_first_fit_takes_the_lowest_range_that_fits_and_merges_on_release():
    space = FlatSpace(100)
    a, b, c = space.allocate(30), space.allocate(30), space.allocate(30)
    assert (a, b, c) == (0, 30, 60)
    space.release(b, 30)
    assert space.allocate(40) is None  # 40 free (30 + 10) but no range of 40
    assert space.free - space.largest == 10  # external fragmentation
    assert space.allocate(20) == 30  # first fit: the hole left by b
    space.release(30, 20)
    space.release(a, 30)
    space.release(c, 30)
    assert space.ranges() == [(0, 100)]


def test_releasing_a_free_range_raises():
    space = FlatSpace(10)
    start = space.allocate(4)
    space.release(start, 4)
    with pytest.raises(PagedAttentionError, match="overlaps"):
        space.release(start, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=40))
def test_flat_space_ranges_stay_disjoint_merged_and_accounted(ops):
    space = FlatSpace(100)
    held: list[tuple[int, int]] = []
    for allocate, size in ops:
        if allocate or not held:
            start = space.allocate(size)
            if start is None:
                assert space.largest < size
            else:
                held.append((start, size))
        else:
            space.release(*held.pop(size % len(held)))
        ranges = space.ranges()
        assert space.free == sum(s for _, s in ranges) == 100 - sum(s for _, s in held)
        spans = sorted(ranges + held)
        for (s0, n0), (s1, _) in itertools.pairwise(spans):
            assert s0 + n0 <= s1, f"overlap in {spans}"
        for (s0, n0), (s1, _) in itertools.pairwise(ranges):
            assert s0 + n0 < s1, f"adjacent free ranges not merged: {ranges}"


# -- workloads ----------------------------------------------------------------------------


def test_generator_is_deterministic_and_respects_limits():
    requests = generate(SMALL)
    assert requests == generate(SMALL)
    assert len(requests) == 120
    for r in requests:
        assert 1 <= r.prompt_len < 512 and r.prompt_len + r.max_tokens <= 512
        assert all(1 <= out <= r.max_tokens for out in r.output_lens)
    arrivals = [r.arrival for r in requests]
    assert arrivals == sorted(arrivals)
    assert 120 / 5.0 * 0.6 < arrivals[-1] < 120 / 5.0 * 1.5


def test_generator_lengths_follow_the_requested_means():
    spec = WorkloadSpec(num_requests=4000, mean_prompt=161, mean_output=338, max_model_len=100_000,
                        max_tokens_choices=(50_000,), sigma=0.5)
    requests = generate(spec)
    prompts = np.mean([r.prompt_len for r in requests])
    outputs = np.mean([r.output_lens[0] for r in requests])
    assert abs(prompts - 161) < 0.05 * 161 and abs(outputs - 338) < 0.05 * 338, (prompts, outputs)


def test_generator_shared_prefixes_and_parallel_sampling():
    spec = WorkloadSpec(num_requests=200, num_prefixes=3, prefix_len=64, shared_prefix_fraction=0.5,
                        parallel_n=4, parallel_fraction=0.25, seed=3)
    requests = generate(spec)
    shared = [r for r in requests if r.prefix_id >= 0]
    assert 60 < len(shared) < 140 and {r.prefix_id for r in shared} <= {0, 1, 2}
    assert all(r.prefix_len == 64 and r.prompt_len > 64 for r in shared)
    assert 20 < sum(r.n == 4 for r in requests) < 80
    ids = TokenIds()
    a, b = ids.prompt(shared[0]), ids.prompt(shared[1])
    same = shared[0].prefix_id == shared[1].prefix_id
    assert (a[:64] == b[:64]) == same and a[64:] != b[64:]


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_requests", 0), ("arrival_rate", 0.0), ("sigma", -1.0), ("max_tokens_choices", ()),
     ("prefix_len", 4096), ("shared_prefix_fraction", 1.5), ("parallel_n", 0)],
)
def test_generator_rejects_parameters_out_of_range(field, value):
    from dataclasses import replace

    with pytest.raises(PagedAttentionError) as info:
        generate(replace(SMALL, **{field: value}))
    assert info.value.argument == field


def test_csv_trace_round_trip(tmp_path):
    requests = [
        Request(0.0, 10, (5,), 20),
        Request(1.5, 30, (7, 7), 100, prefix_id=2, prefix_len=16),
    ]
    path = tmp_path / "trace.csv"
    write_csv(requests, path)
    assert read_csv(path) == requests


def test_csv_trace_errors_name_the_problem(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("arrival,prompt_len\n0,5\n")
    with pytest.raises(PagedAttentionError, match="missing columns"):
        read_csv(path)
    path.write_text("arrival,prompt_len,output_len,max_tokens\n0,5,10,4\n")
    with pytest.raises(PagedAttentionError, match=r"bad\.csv:2"):
        read_csv(path)


# -- the two schemes -----------------------------------------------------------------------


def test_paging_beats_contiguous_on_utilization_and_concurrency():
    requests = generate(SMALL)
    contiguous, _c_meter = simulate_contiguous(requests, 8000)
    paged, _p_meter = simulate_paged(requests, 8000, block_size=16, check_invariants=True)
    for summary in (contiguous, paged):
        assert 0.0 < summary.utilization <= 1.0
        assert summary.completed + summary.rejected == len(requests)
    assert paged.utilization > 0.85, paged  # short sequences: B=16 wastes ~8 of ~100 tokens
    assert contiguous.utilization < 0.6, contiguous
    assert paged.utilization > contiguous.utilization
    assert paged.mean_running >= 1.5 * contiguous.mean_running, (paged, contiguous)
    assert paged.external == 0.0 and contiguous.external > 0.0
    assert paged.steps <= contiguous.steps


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_paging_wastes_less_than_one_block_per_sequence(block_size):
    requests = generate(SMALL)  # n = 1: one sequence per running request
    _, meter = simulate_paged(requests, 8000, block_size=block_size)
    for stored, reserved, running in zip(meter.stored, meter.reserved, meter.running, strict=True):
        assert reserved - stored <= running * (block_size - 1), (stored, reserved, running)


def test_oracle_reservation_has_no_never_used_slots_but_still_fragments():
    requests = generate(SMALL)
    maximum, _ = simulate_contiguous(requests, 8000)
    oracle, _ = simulate_contiguous(requests, 8000, reserve="oracle")
    assert oracle.utilization > maximum.utilization
    assert oracle.external > 0.0


def test_prefix_caching_shares_system_prompts():
    spec = WorkloadSpec(num_requests=80, arrival_rate=4.0, mean_prompt=40, mean_output=40,
                        max_model_len=512, max_tokens_choices=(128,), num_prefixes=2,
                        prefix_len=128, shared_prefix_fraction=1.0, parallel_n=3,
                        parallel_fraction=0.3, seed=2)
    requests = generate(spec)
    plain, _ = simulate_paged(requests, 4000, block_size=16, check_invariants=True)
    cached, _c_meter = simulate_paged(requests, 4000, block_size=16, prefix_caching=True,
                                     check_invariants=True)
    assert plain.cached_fraction == 0.0
    assert cached.cached_fraction > 0.5, cached
    assert cached.completed == plain.completed == len(requests)
    assert cached.copies > 0 and plain.copies > 0  # parallel samples copy the shared partial block
    assert cached.mean_running >= plain.mean_running


def test_a_request_larger_than_the_budget_is_rejected():
    requests = [Request(0.0, 900, (10,), 200), Request(0.0, 10, (5,), 20)]
    contiguous, _ = simulate_contiguous(requests, 1000)
    paged, _ = simulate_paged(requests, 1000, block_size=16)
    assert (contiguous.rejected, contiguous.completed) == (1, 1)
    assert (paged.rejected, paged.completed) == (1, 1)


def test_memory_pressure_preempts_and_every_request_still_finishes():
    requests = [Request(0.0, 16, (200,), 200) for _ in range(6)]
    paged, _ = simulate_paged(requests, 640, block_size=16, check_invariants=True)
    assert paged.preempted > 0 and paged.completed == 6


# -- the command --------------------------------------------------------------------------


def test_kv_budget_arithmetic_for_an_h200_and_an_8b_model():
    budget = cli.kv_budget()
    assert budget.bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    kv_mib = 143_771 * 0.9 - 8.03e9 * 2 / 2**20 - 4096
    assert budget.capacity == int(kv_mib * 2**20 // 131_072)
    assert 850_000 < budget.capacity < 900_000


def test_main_prints_the_table_and_saves_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sim.png"
    args = ["--capacity-tokens", "6000", "--requests", "60", "--rate", "3", "--mean-prompt", "50",
            "--mean-output", "60", "--max-model-len", "512", "--max-tokens", "128,256",
            "--block-sizes", "16,64", "--prefixes", "1", "--prefix-len", "32",
            "--prefix-fraction", "0.5", "--oracle", "--plot", str(plot)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    for name in ("contiguous", "contiguous (oracle)", "paged B=16", "paged B=64 +prefix cache"):
        assert name in out
    assert "KV utilization" in out and "external frag" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_replays_a_csv_trace(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    write_csv(generate(SMALL)[:30], path)
    assert cli.main(["--trace", str(path), "--capacity-tokens", "5000", "--no-plot",
                     "--no-prefix-caching"]) == 0
    out = capsys.readouterr().out
    assert "trace" in out and "paged B=32" in out and "+prefix cache" not in out


def test_main_rejects_bad_input(tmp_path, capsys):
    assert cli.main(["--trace", str(tmp_path / "missing.csv"), "--no-plot"]) == 2
    assert "cannot read trace" in capsys.readouterr().err
    for argv in (["--capacity-tokens", "0"], ["--rate", "-1"], ["--block-sizes", "16,x"]):
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, "--no-plot"])
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--rate: must be in (0, inf), received -1" in err
    assert "Traceback" not in err


def test_plot_is_skipped_with_a_message_without_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    summary, meter = simulate_contiguous([Request(0.0, 4, (2,), 4)], 100)
    reason = cli.save_plot([(summary, meter)], str(tmp_path / "x.png"))
    assert reason is not None and "matplotlib is not installed" in reason
    assert not (tmp_path / "x.png").exists()


# -- the command's edges: help, errors, ranges -------------------------------------------


def test_every_option_has_help_and_states_its_default():
    parser = cli.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{action.option_strings} has no help"
        text = formatter._get_help_string(action) % {"default": action.default}
        assert "default" in text, f"{action.option_strings}: {text!r} states no default"
    rendered = parser.format_help()
    for option in ("--gpu-utilization", "--params", "--layers", "--requests", "--seed",
                   "--block-sizes", "--beam-width"):
        assert option in rendered
    assert "(default: 16,32,64)" in rendered and "(default: 0.9)" in rendered


@pytest.mark.parametrize(
    "argv",
    [["--capacity-tokens", "10"], ["--capacity-tokens", "40", "--block-sizes", "16,64"],
     ["--capacity-tokens", "8", "--beam-width", "2"]],
)
def test_a_budget_below_one_block_is_a_one_line_error(argv, capsys):
    assert cli.main([*argv, "--no-plot"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "holds no block" in err[0], captured.err
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize(
    ("option", "value"),
    [("--gpu-utilization", "2"), ("--gpu-utilization", "-1"), ("--gpu-utilization", "0"),
     ("--gpu-utilization", "nan"), ("--gpu-mib", "-5"), ("--layers", "0"), ("--rate", "0"),
     ("--prefix-fraction", "1.5"), ("--beam-decay", "0"), ("--requests", "-3")],
)
def test_options_out_of_range_exit_2_with_one_line(option, value, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([option, value, "--no-plot"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and "must be in" in err[0], err


def test_gpu_utilization_range_is_stated():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--gpu-utilization", "2"])
    assert cli.build_parser().parse_args(["--gpu-utilization", "1"]).gpu_utilization == 1.0


# -- the plot ---------------------------------------------------------------------------------


def _figure(**kwargs):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    requests = generate(SMALL)
    results = cli.run_schemes(requests, 3000, block_sizes=(16, 64), oracle=True, **kwargs)
    figure = cli.plot_figure(results)
    figure.canvas.draw()
    return results, figure


def test_plot_legends_cover_no_bar_or_label():
    import matplotlib.pyplot as plt

    _, figure = _figure()
    renderer = figure.canvas.get_renderer()
    bars = figure.axes[0]
    boxes = [p.get_window_extent(renderer) for p in bars.patches]
    boxes += [t.get_window_extent(renderer) for t in bars.texts]
    for ax in figure.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        frame = legend.get_window_extent(renderer)
        for box in boxes:
            assert not frame.overlaps(box), f"legend {frame} covers {box}"
        for other in figure.axes:  # no legend sits on a plotting area
            assert not frame.overlaps(other.get_window_extent(renderer)), (ax.get_title(), other.get_title())
    plt.close(figure)


def test_plot_bar_labels_use_the_bar_heights_denominator():
    import matplotlib.pyplot as plt

    results, figure = _figure()
    bars = figure.axes[0]
    green = bars.containers[0]  # the token-state segments, one per scheme
    labels = [t.get_text() for t in bars.texts]
    heights = [patch.get_height() for patch in green]
    assert labels == [f"{h:.0f}%" for h in heights]
    assert heights == pytest.approx([100 * s.used for s, _ in results])
    plt.close(figure)


def test_plot_says_why_prefix_cache_lines_sit_on_the_plain_ones():
    import matplotlib.pyplot as plt

    results, figure = _figure()  # SMALL shares no prefix: nothing is cached
    lines = figure.axes[1].get_lines()
    by_label = {line.get_label().split(" (")[0]: line for line in lines}
    for summary, _ in results:
        if cli.PREFIX not in summary.scheme:
            continue
        line = by_label[summary.scheme]
        plain = by_label[summary.scheme.replace(cli.PREFIX, "")]
        assert line.get_linestyle() != plain.get_linestyle()
        assert line.get_color() == plain.get_color()
        assert "= plain, 0% cached" in line.get_label()
    plt.close(figure)


def test_plot_shows_preemptions():
    import matplotlib.pyplot as plt

    results, figure = _figure()
    preempts = figure.axes[2]
    assert "preempt" in preempts.get_title()
    finals = [line.get_ydata()[-1] for line in preempts.get_lines()]
    assert finals == [s.preempted for s, _ in results]
    assert max(finals) > 0, "the workload preempts nothing: the test shows nothing"
    plt.close(figure)


# -- beam search: the survivor model, the paging run, the sharing study -------------------------


def test_beam_model_is_seeded_sorted_and_skewed():
    from pagedattn.simulate.beam import BeamModel

    model = BeamModel(decay=0.5, seed=3)
    rows = model.parents(index=7, width=4, steps=400)
    assert rows.shape == (400, 4) and (rows[0] == 0).all()
    assert (np.diff(rows, axis=1) >= 0).all(), "survivors are ranked by their parent's rank"
    assert (rows == model.parents(7, 4, 400)).all() and not (rows == model.parents(8, 4, 400)).all()
    share = np.bincount(rows[1:].ravel(), minlength=4) / rows[1:].size
    assert share == pytest.approx(model.weights(4), abs=0.03)  # 8/15, 4/15, 2/15, 1/15
    uniform = BeamModel(decay=1.0).parents(0, 4, 400)[1:]
    distinct = lambda r: np.mean([len(set(row)) for row in r])  # noqa: E731
    assert distinct(rows[1:]) < distinct(uniform), "a skew concentrates the parents"
    for decay in (0.0, 1.5, float("nan")):
        with pytest.raises(PagedAttentionError, match="decay"):
            BeamModel(decay=decay)


def test_beam_requests_from_the_generator_and_a_trace(tmp_path):
    from dataclasses import replace

    spec = replace(SMALL, beam_width=4, beam_fraction=0.5, parallel_n=3, parallel_fraction=0.5)
    requests = generate(spec)
    beams = [r for r in requests if r.beam_width == 4]
    assert 30 < len(beams) < 90 and all(r.n == 1 and r.num_seqs == 4 for r in beams)
    assert all(r.beam_width == 1 for r in requests if r.n == 3)
    plain = generate(replace(spec, beam_fraction=0.0))
    assert [r.prompt_len for r in plain] == [r.prompt_len for r in requests]
    path = tmp_path / "beams.csv"
    write_csv(requests, path)
    assert [r.beam_width for r in read_csv(path)] == [r.beam_width for r in requests]
    path.write_text("arrival,prompt_len,output_len,n,beam_width\n0,5,10,2,4\n")
    with pytest.raises(PagedAttentionError, match="beam_width"):
        read_csv(path)


def _copies_expected(prompt: int, steps: int, rows: np.ndarray, block_size: int) -> int:
    """Copy-on-write copies of one beam request: at step t each parent of c children copies its
    partial last block c - 1 times; a full last block is never copied."""
    from pagedattn.simulate.beam import children_per_parent

    total, beams = 0, 1
    for t in range(steps):
        counts = children_per_parent(rows[t], beams)
        if (prompt + t) % block_size:
            total += sum(c - 1 for c in counts if c)
        beams = rows.shape[1]
    return total


@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("width", [2, 4, 6])
def test_one_beam_request_copies_exactly_the_partial_blocks_it_must(width, prefix_caching):
    from pagedattn.simulate.beam import BeamModel

    request = Request(0.0, 21, (40,), 40, beam_width=width)
    model = BeamModel(decay=0.5, seed=1)
    summary, meter = simulate_paged([request], 4096, block_size=8, beam_model=model,
                                    prefix_caching=prefix_caching, check_invariants=True)
    assert summary.completed == 1 and summary.preempted == 0
    assert sum(meter.copies) == _copies_expected(21, 40, model.parents(0, width, 40), 8)
    assert max(meter.references) > max(meter.blocks), "beams share their full blocks"
    # every beam ends with 61 tokens: 8 blocks each if copied
    assert meter.references[-2] == 8 * width


def test_beam_search_shares_more_than_parallel_sampling_and_copying_shares_nothing():
    from dataclasses import replace

    from pagedattn.simulate import sharing

    spec = replace(SMALL, num_requests=60)
    results = {}
    for mode in sharing.MODES:
        requests = sharing.workload(spec, mode, 4, 1.0)
        shared = simulate_paged(requests, 40_000, block_size=16, check_invariants=True)
        copied = simulate_paged(requests, 40_000, block_size=16, sharing=False,
                                check_invariants=True)
        # a budget nothing waits for: both runs make the same steps, and the copying run
        # holds, step by step, exactly what the sharing run's tables name
        assert max(copied[1].waiting) == 0 and copied[0].preempted == 0
        assert shared[1].running == copied[1].running
        assert copied[1].blocks == shared[1].references == copied[1].references
        results[mode] = sharing.run_stats(*shared)
        assert sharing.run_stats(*copied).saving == 0.0
        assert sum(copied[1].copies) > sum(shared[1].copies)
    assert results["beam"].saving > results["parallel"].saving > 0.0


def test_less_memory_from_sharing_means_more_requests_and_fewer_steps_under_pressure():
    from pagedattn.simulate import sharing

    spec = WorkloadSpec(num_requests=150, arrival_rate=3.0, mean_prompt=19, mean_output=58,
                        max_model_len=512, max_tokens_choices=(128,), seed=4)
    result = sharing.compare_sharing(sharing.workload(spec, "beam", 4, 1.0), "beam", 4, 4000,
                                     block_size=16)
    shared, copied = result.shared, result.copied
    assert shared.summary.completed == copied.summary.completed == 150
    assert shared.saving > 0.3 and shared.copies_per_step < copied.copies_per_step
    assert shared.mean_running > copied.mean_running and shared.steps < copied.steps
    assert shared.preempted < copied.preempted


def test_contiguous_reserves_one_range_per_beam():
    request = Request(0.0, 10, (5,), 20, beam_width=3)
    _, meter = simulate_contiguous([request], 1000)
    assert meter.reserved[0] == 3 * (10 + 20)


def test_main_beam_width_reports_savings_beside_the_paper_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "beam.png"
    args = ["--capacity-tokens", "3000", "--requests", "40", "--rate", "2", "--mean-prompt", "19",
            "--mean-output", "40", "--beam-width", "2,4", "--plot", str(plot)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    for name in ("beam K=2", "parallel n=2", "beam K=4", "parallel n=4", "37.6%", "8.5%"):
        assert name in out, name
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_beam_width_on_a_trace(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    write_csv(generate(SMALL)[:20], path)
    assert cli.main(["--trace", str(path), "--capacity-tokens", "4000", "--beam-width", "3",
                     "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "beam K=3" in out and "parallel n=3" in out


def test_main_replays_a_trace_with_beam_requests(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    path.write_text("arrival,prompt_len,output_len,beam_width\n0,20,30,4\n1,40,10,1\n2,8,50,2\n")
    assert cli.main(["--trace", str(path), "--capacity-tokens", "2000", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "paged B=16" in out


def test_sharing_study_rejects_an_unknown_mode_or_width():
    from pagedattn.simulate import sharing

    with pytest.raises(PagedAttentionError, match="mode"):
        sharing.widen([Request(0.0, 4, (2,), 4)], "greedy", 2)
    with pytest.raises(PagedAttentionError, match="width"):
        sharing.workload(SMALL, "beam", 0, 1.0)


def test_sharing_plot_has_a_column_per_width_with_its_savings():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pagedattn.simulate import sharing

    spec = WorkloadSpec(num_requests=20, arrival_rate=2.0, mean_prompt=19, mean_output=30,
                        max_model_len=256, max_tokens_choices=(64,), seed=5)
    results = [sharing.compare_sharing(sharing.workload(spec, mode, width, 1.0), mode, width,
                                       3000, block_size=16)
               for width in (2, 4) for mode in sharing.MODES]
    figure = sharing.plot_figure(results, 3000 // 16)
    assert len(figure.axes) == 3 * 2
    for column, width in enumerate((2, 4)):
        title = figure.axes[column].get_title()
        assert f"width {width}" in title
        for r in results:
            if r.width == width:
                assert f"{r.mode} saves {100 * r.shared.saving:.0f}%" in title
    plt.close(figure)
