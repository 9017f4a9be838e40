"""``pagedattn simulate``: one workload, one KV budget, contiguous preallocation against paging.

Replays a generated workload (or a CSV trace) on contiguous preallocation and on paging at
each block size, with and without prefix caching, and prints KV utilization, internal and
external fragmentation, peak and mean concurrent requests, rejected and preempted
requests (see :mod:`pagedattn.simulate.meter` for the definitions); saves a PNG plot.

The default budget is an H200's free memory for Llama-3.1-8B in bf16 (:func:`kv_budget`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedattn.simulate.beam import DEFAULT_DECAY, BeamModel
from pagedattn.simulate.contiguous import simulate_contiguous
from pagedattn.simulate.meter import Meter, Summary
from pagedattn.simulate.paged import simulate_paged
from pagedattn.simulate.workload import Request, WorkloadSpec, check_spec, generate, read_csv
from pagedattn.usage import ArgumentParser, HelpFormatter, usage_error

MIB = 1 << 20
PROG = "pagedattn simulate"


@dataclass(frozen=True)
class Budget:
    """KV memory budget: ``capacity`` tokens of ``bytes_per_token``, and how it was derived."""

    capacity: int
    bytes_per_token: int
    lines: tuple[str, ...]


def kv_budget(
    *,
    gpu_mib: float = 143_771,
    utilization: float = 0.90,
    params: float = 8.03e9,
    weight_bytes: int = 2,
    reserve_mib: float = 4096,
    num_layers: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    kv_bytes: int = 2,
) -> Budget:
    """The KV budget of a GPU for one model, vLLM's way; defaults: H200, Llama-3.1-8B, bf16.

    ``gpu_mib`` is what nvidia-smi reports (an H200: 143,771 MiB); a server takes
    ``utilization`` of it, minus the weights (``params * weight_bytes``) and ``reserve_mib``
    for activations and CUDA graphs; each token stores K and V for every layer.
    """
    usable = gpu_mib * utilization
    weights = params * weight_bytes / MIB
    kv_mib = usable - weights - reserve_mib
    per_token = 2 * num_layers * num_kv_heads * head_dim * kv_bytes
    capacity = int(kv_mib * MIB // per_token)
    lines = (
        f"GPU memory {gpu_mib:,.0f} MiB x {utilization:.2f} = {usable:,.0f} MiB",
        f"- weights {params / 1e9:.2f}e9 params x {weight_bytes} B = {weights:,.0f} MiB",
        f"- activations and CUDA graphs {reserve_mib:,.0f} MiB",
        f"= KV budget {kv_mib:,.0f} MiB ({kv_mib / 1024:.1f} GiB)",
        f"KV per token: 2 (K, V) x {num_layers} layers x {num_kv_heads} KV heads x {head_dim}"
        f" x {kv_bytes} B = {per_token:,} B",
        f"capacity: {capacity:,} tokens",
    )
    return Budget(capacity, per_token, lines)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, received {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, received {text!r}")
    return values


def _number(kind: type, low: float, high: float | None = None, *, open_low: bool = False) -> Any:
    """An argparse type: a ``kind`` in ``[low, high]`` (``(low, high]`` with ``open_low``)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, received {text!r}"
            ) from None
        too_low = value <= low if open_low else value < low
        if too_low or (high is not None and value > high) or value != value:
            left = "(" if open_low else "["
            right = f"{high:g}]" if high is not None else "inf)"
            raise argparse.ArgumentTypeError(f"must be in {left}{low:g}, {right}, received {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


class _Formatter(HelpFormatter):
    """The shared help formatter, showing lists comma-joined and large numbers grouped."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or not isinstance(default, int | float | tuple) or default is False:
            return super()._get_help_string(action)
        if isinstance(default, tuple):
            shown = ",".join(str(v) for v in default)
        else:
            shown = f"{default:,}" if isinstance(default, int) else f"{default:g}"
        return f"{text} (default: {shown.replace('%', '%%')})"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Replay a workload at a fixed KV memory budget: contiguous preallocation"
        " against paging (block sizes, prefix caching). With --beam-width: what sharing blocks"
        " saves in beam search and parallel sampling, against copying every beam's cache.",
        formatter_class=_Formatter,
    )
    positive_int = _number(int, 1)
    positive = _number(float, 0.0, open_low=True)
    fraction = _number(float, 0.0, 1.0)
    budget = parser.add_argument_group(
        "budget (default: an H200's free memory for Llama-3.1-8B, bf16)"
    )
    budget.add_argument(
        "--capacity-tokens",
        type=positive_int,
        metavar="N",
        help="KV budget in tokens, in place of the model arithmetic below (default: computed)",
    )
    budget.add_argument("--gpu-mib", type=positive, default=143_771,
                        help="GPU memory as nvidia-smi reports it, MiB (an H200)")
    budget.add_argument("--gpu-utilization", type=_number(float, 0.0, 1.0, open_low=True),
                        default=0.90, help="share of GPU memory the server takes, in (0, 1]")
    budget.add_argument("--params", type=_number(float, 0.0), default=8.03e9,
                        help="model parameters (weights in bf16, 2 bytes each)")
    budget.add_argument("--layers", type=positive_int, default=32, help="transformer layers")
    budget.add_argument("--kv-heads", type=positive_int, default=8, help="KV heads per layer")
    budget.add_argument("--head-dim", type=positive_int, default=128, help="head dimension")
    work = parser.add_argument_group(
        "workload (ShareGPT-like by default; time unit: one decode step)"
    )
    work.add_argument(
        "--trace",
        metavar="CSV",
        help="replay a CSV trace: arrival,prompt_len,output_len[,max_tokens,n,prefix_id,"
        "prefix_len,beam_width] (default: generate the workload)",
    )
    work.add_argument("--requests", type=positive_int, metavar="N",
                      help="requests to generate (default: 10,000; 1,000 with --beam-width)")
    work.add_argument("--rate", type=positive, default=20.0, help="arrivals per step (Poisson)")
    work.add_argument("--mean-prompt", type=_number(float, 1.0), default=161.0,
                      help="mean prompt length, tokens (ShareGPT's)")
    work.add_argument("--mean-output", type=_number(float, 1.0), default=338.0,
                      help="mean output length, tokens (ShareGPT's)")
    work.add_argument("--sigma", type=_number(float, 0.0), default=1.0,
                      help="log-normal sigma of the lengths")
    work.add_argument("--max-model-len", type=_number(int, 2), default=2048,
                      help="longest sequence, prompt and output, tokens")
    work.add_argument(
        "--max-tokens",
        type=_ints,
        default=(512, 1024, 2048),
        help="max_tokens values requests ask for (the contiguous reservation)",
    )
    work.add_argument("--prefixes", type=_number(int, 0), default=0,
                      help="number of shared system prompts")
    work.add_argument("--prefix-len", type=_number(int, 0), default=0,
                      help="system prompt length, tokens")
    work.add_argument("--prefix-fraction", type=fraction, default=0.0,
                      help="share of requests starting with a system prompt")
    work.add_argument("--parallel-n", type=positive_int, default=1,
                      help="samples of a parallel-sampling request")
    work.add_argument("--parallel-fraction", type=fraction, default=0.0,
                      help="share of requests asking for --parallel-n samples")
    work.add_argument("--seed", type=int, default=0, help="seed of the generator and beam model")
    beam = parser.add_argument_group(
        "beam search and parallel sampling: sharing against copying"
    )
    beam.add_argument(
        "--beam-width",
        type=_ints,
        metavar="K[,K...]",
        help="for each width K: beam search of K beams and parallel sampling of K samples,"
        " with block sharing + copy-on-write and with copying (default: off; 2,4,6 are the"
        " vLLM paper's widths)",
    )
    beam.add_argument("--beam-fraction", type=fraction, default=1.0,
                      help="share of generated requests that use beam search (or sampling)")
    beam.add_argument(
        "--beam-decay",
        type=_number(float, 0.0, 1.0, open_low=True),
        default=DEFAULT_DECAY,
        help="survivor model: a survivor's parent is the beam of rank r with probability"
        " proportional to decay**r (1: uniform)",
    )
    run = parser.add_argument_group("schemes and output")
    run.add_argument("--block-sizes", type=_ints, default=(16, 32, 64),
                     help="paging block sizes, tokens (--beam-width uses the first)")
    run.add_argument(
        "--no-prefix-caching", action="store_true", help="skip the prefix-caching runs"
    )
    run.add_argument(
        "--oracle", action="store_true", help="also run contiguous reserving the true final length"
    )
    run.add_argument("--plot", metavar="PNG",
                     help="plot path (default: pagedattn-simulate.png, with --beam-width"
                     " pagedattn-simulate-beam.png)")
    run.add_argument("--no-plot", action="store_true", help="save no plot")
    return parser


def run_schemes(
    requests: list[Request],
    capacity: int,
    *,
    block_sizes: Sequence[int],
    prefix_caching: bool = True,
    oracle: bool = False,
    beam_model: BeamModel | None = None,
) -> list[tuple[Summary, Meter]]:
    """Contiguous, then paging at each block size without and (optionally) with prefix caching."""
    results = [simulate_contiguous(requests, capacity)]
    if oracle:
        results.append(simulate_contiguous(requests, capacity, reserve="oracle"))
    for block_size in block_sizes:
        results.append(
            simulate_paged(requests, capacity, block_size=block_size, beam_model=beam_model)
        )
        if prefix_caching:
            results.append(
                simulate_paged(requests, capacity, block_size=block_size, prefix_caching=True,
                               beam_model=beam_model)
            )
    return results


def table_rows(summaries: Sequence[Summary]) -> list[list[str]]:
    """The report's rows: one per scheme."""
    return [
        [
            s.scheme,
            f"{100 * s.utilization:.1f}%",
            f"{100 * s.internal:.1f}%",
            f"{100 * s.external:.1f}%",
            str(s.peak_running),
            f"{s.mean_running:.0f}",
            str(s.completed),
            str(s.rejected),
            str(s.preempted),
            str(s.steps),
            f"{100 * s.cached_fraction:.0f}%",
        ]
        for s in summaries
    ]


HEADERS = (
    "scheme",
    "KV utilization",
    "internal frag",
    "external frag",
    "peak requests",
    "mean requests",
    "completed",
    "rejected",
    "preempted",
    "steps",
    "prompt cached",
)

PREFIX = " +prefix cache"


def _same_as_plain(results: Sequence[tuple[Summary, Meter]], index: int) -> bool:
    """Whether a prefix-caching run's series equal those of its plain run (nothing cached)."""
    summary, meter = results[index]
    plain = summary.scheme.replace(PREFIX, "")
    for other, other_meter in results:
        if other.scheme == plain:
            return other_meter.running == meter.running and other_meter.stored == meter.stored
    return False


def plot_figure(results: Sequence[tuple[Summary, Meter]]) -> Any:
    """KV memory bars (% of the budget, labelled with the token state's share), concurrent
    requests and cumulative preemptions over time; legends sit outside the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (bars, lines, preempts) = plt.subplots(
        1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.1, 1.0, 1.0]}
    )
    names = [s.scheme for s, _ in results]
    x = list(range(len(results)))
    used = [100 * s.used for s, _ in results]
    internal = [100 * s.internal for s, _ in results]
    external = [100 * s.external for s, _ in results]
    bars.bar(x, used, color="tab:green", label="token state (label)")
    bars.bar(x, internal, bottom=used, color="tab:orange", label="internal fragmentation")
    bars.bar(
        x,
        external,
        bottom=[u + i for u, i in zip(used, internal, strict=True)],
        color="tab:red",
        label="external fragmentation",
    )
    for i in x:  # the label sits in the green segment it measures
        bars.text(i, max(used[i] - 1.5, 0.5), f"{used[i]:.0f}%", ha="center", va="top",
                  fontsize=8, color="white", fontweight="bold")
    bars.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    bars.set_ylabel("% of the KV budget (mean over loaded steps)")
    bars.set_ylim(0, 105)
    bars.set_title("KV memory, % of the budget: token state (labelled) and fragmentation",
                   fontsize=10)
    bars.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.08), ncol=3, frameon=False)
    colors: dict[str, str] = {}  # a prefix-caching run takes its plain run's colour, dashed
    for i, (summary, meter) in enumerate(results):
        cached = PREFIX in summary.scheme
        label = summary.scheme
        if cached and _same_as_plain(results, i):
            label += f" (= plain, {100 * summary.cached_fraction:.0f}% cached)"
        style: dict[str, Any] = {"linewidth": 1.0}
        if cached:
            style = {"linestyle": (0, (4, 3)), "linewidth": 1.8}
        color = colors.get(summary.scheme.replace(PREFIX, ""), f"C{len(colors) % 10}")
        colors.setdefault(summary.scheme, color)
        lines.plot(meter.running, label=label, color=color, **style)
        total = list(itertools.accumulate(meter.preempted))
        preempts.plot(total, color=color, label=f"{summary.scheme}: {summary.preempted}", **style)
    lines.set_xlabel("step")
    lines.set_ylabel("running requests")
    lines.set_title("concurrent requests (dashed: prefix caching, in its plain run's colour)",
                    fontsize=10)
    preempts.set_xlabel("step")
    preempts.set_ylabel("requests preempted so far")
    preempts.set_title("preemptions (recomputation)", fontsize=10)
    preempts.yaxis.set_major_locator(MaxNLocator(integer=True))
    most = max((s.preempted for s, _ in results), default=0)
    preempts.set_ylim(0, max(most, 1) * 1.05)
    if not most:
        preempts.text(0.5, 0.5, "no request was preempted", transform=preempts.transAxes,
                      ha="center", va="center", fontsize=10, color="gray")
    for ax in (lines, preempts):
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.12), frameon=False)
    fig.tight_layout()
    return fig


def save_plot(results: Sequence[tuple[Summary, Meter]], path: str) -> str | None:
    """Save :func:`plot_figure` to ``path``; return why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot saved"
    fig = plot_figure(results)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return None


def _fail(message: str) -> int:
    return usage_error(PROG, message)


# The keywords of kv_budget and WorkloadSpec, each with the option (its argparse dest) that sets it.
BUDGET_OPTIONS = {
    "gpu_mib": "gpu_mib",
    "utilization": "gpu_utilization",
    "params": "params",
    "num_layers": "layers",
    "num_kv_heads": "kv_heads",
    "head_dim": "head_dim",
}
WORKLOAD_OPTIONS = {
    "arrival_rate": "rate",
    "mean_prompt": "mean_prompt",
    "mean_output": "mean_output",
    "sigma": "sigma",
    "max_model_len": "max_model_len",
    "max_tokens_choices": "max_tokens",
    "num_prefixes": "prefixes",
    "prefix_len": "prefix_len",
    "shared_prefix_fraction": "prefix_fraction",
    "parallel_n": "parallel_n",
    "parallel_fraction": "parallel_fraction",
    "seed": "seed",
}


def _options(args: argparse.Namespace, keywords: dict[str, str]) -> dict[str, Any]:
    """The values of the options ``keywords`` names, under their keywords."""
    return {keyword: getattr(args, dest) for keyword, dest in keywords.items()}


def _budget(args: argparse.Namespace) -> Budget:
    if args.capacity_tokens is not None:
        return Budget(
            args.capacity_tokens, 0, (f"capacity: {args.capacity_tokens:,} tokens (given)",)
        )
    return kv_budget(**_options(args, BUDGET_OPTIONS))


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    default_requests = 1000 if args.beam_width else 10000
    return WorkloadSpec(
        num_requests=args.requests or default_requests, **_options(args, WORKLOAD_OPTIONS)
    )


def sharing_main(
    args: argparse.Namespace, budget: Budget, spec: WorkloadSpec | None, trace: list[Request]
) -> int:
    """``--beam-width``: beam search and parallel sampling, sharing against copying."""
    from pagedattn.console import print_table
    from pagedattn.simulate import sharing

    block_size = args.block_sizes[0]
    model = BeamModel(decay=args.beam_decay, seed=args.seed)
    print(f"paging, block size {block_size}; beam survivors: parent of rank r with probability"
          f" ~ {args.beam_decay:g}**r")
    started = time.perf_counter()
    results = []
    for width in args.beam_width:
        for mode in sharing.MODES:
            if spec is not None:
                requests = sharing.workload(spec, mode, width, args.beam_fraction)
            else:
                requests = sharing.widen(trace, mode, width)
            results.append(sharing.compare_sharing(
                requests, mode, width, budget.capacity, block_size=block_size, beam_model=model
            ))
    print_table(
        sharing.HEADERS,
        sharing.table_rows(results),
        title=f"sharing against copying at {budget.capacity:,} tokens, block size {block_size}"
        f" ({time.perf_counter() - started:.1f} s); paper: Kwon et al., SOSP 2023, fig. 15"
        " (OPT-13B, Alpaca)",
    )
    if not args.no_plot:
        path = args.plot or "pagedattn-simulate-beam.png"
        reason = sharing.save_plot(results, budget.capacity // block_size, path)
        print(f"plot: {reason}" if reason else f"plot saved to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pagedattn simulate``; returns the exit status."""
    from pagedattn.console import print_table
    from pagedattn.errors import PagedAttentionError

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    budget = _budget(args)
    if budget.capacity < 1:
        return _fail("the model leaves no memory for the KV cache (lower --params, or raise"
                     " --gpu-mib or --gpu-utilization)")
    sizes = args.block_sizes[:1] if args.beam_width else args.block_sizes
    if budget.capacity < max(sizes):
        return _fail(f"a KV budget of {budget.capacity:,} tokens holds no block of {max(sizes)}"
                     f" tokens (--block-sizes {','.join(map(str, sizes))})")
    spec: WorkloadSpec | None = None
    trace: list[Request] = []
    try:
        if args.trace:
            trace = read_csv(args.trace, max_model_len=args.max_model_len)
            source = f"trace {args.trace}"
        else:
            spec = _spec(args)
            trace = [] if args.beam_width else generate(spec)
            if args.beam_width:
                check_spec(spec)
            source = (
                f"generated: {spec.num_requests} requests, {args.rate}/step, prompt mean"
                f" {args.mean_prompt:.0f}, output mean {args.mean_output:.0f}"
            )
    except PagedAttentionError as error:
        return _fail(str(error))
    except OSError as error:
        return _fail(f"cannot read trace: {error}")
    for line in budget.lines:
        print(line)
    print(f"workload: {source}")
    model = BeamModel(decay=args.beam_decay, seed=args.seed)
    try:
        if args.beam_width:
            return sharing_main(args, budget, spec, trace)
        started = time.perf_counter()
        results = run_schemes(
            trace,
            budget.capacity,
            block_sizes=args.block_sizes,
            prefix_caching=not args.no_prefix_caching,
            oracle=args.oracle,
            beam_model=model,
        )
    except PagedAttentionError as error:
        return _fail(str(error))
    print_table(
        HEADERS,
        table_rows([s for s, _ in results]),
        title=f"KV memory at {budget.capacity:,} tokens ({time.perf_counter() - started:.1f} s)",
    )
    if not args.no_plot:
        path = args.plot or "pagedattn-simulate.png"
        reason = save_plot(results, path)
        print(f"plot: {reason}" if reason else f"plot saved to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
