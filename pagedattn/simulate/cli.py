"""``pagedattn simulate``: one workload, one KV budget, contiguous preallocation against paging.

Replays a generated workload (or a CSV trace) on contiguous preallocation and on paging at
each block size, with and without prefix caching, and prints KV utilization, internal and
external fragmentation, peak and mean concurrent requests, rejected and preempted
requests (see :mod:`pagedattn.simulate.meter` for the definitions); saves a PNG plot.

The default budget is an H200's free memory for Llama-3.1-8B in bf16 (:func:`kv_budget`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pagedattn.simulate.contiguous import simulate_contiguous
from pagedattn.simulate.meter import Meter, Summary
from pagedattn.simulate.paged import simulate_paged
from pagedattn.simulate.workload import Request, WorkloadSpec, generate, read_csv

MIB = 1 << 20


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedattn simulate",
        description="Replay a workload at a fixed KV memory budget: contiguous preallocation"
        " against paging (block sizes, prefix caching).",
    )
    budget = parser.add_argument_group(
        "budget (default: an H200's free memory for Llama-3.1-8B, bf16)"
    )
    budget.add_argument(
        "--capacity-tokens", type=int, help="KV budget in tokens (overrides the model arithmetic)"
    )
    budget.add_argument(
        "--gpu-mib", type=float, default=143_771, help="GPU memory, MiB (H200: 143771)"
    )
    budget.add_argument("--gpu-utilization", type=float, default=0.90)
    budget.add_argument("--params", type=float, default=8.03e9, help="model parameters")
    budget.add_argument("--layers", type=int, default=32)
    budget.add_argument("--kv-heads", type=int, default=8)
    budget.add_argument("--head-dim", type=int, default=128)
    work = parser.add_argument_group(
        "workload (ShareGPT-like by default; time unit: one decode step)"
    )
    work.add_argument(
        "--trace",
        help="CSV trace: arrival,prompt_len,output_len[,max_tokens,n,prefix_id,prefix_len]",
    )
    work.add_argument("--requests", type=int, default=10000)
    work.add_argument("--rate", type=float, default=20.0, help="arrivals per step (Poisson)")
    work.add_argument("--mean-prompt", type=float, default=161.0)
    work.add_argument("--mean-output", type=float, default=338.0)
    work.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the lengths")
    work.add_argument("--max-model-len", type=int, default=2048)
    work.add_argument(
        "--max-tokens",
        type=_ints,
        default=(512, 1024, 2048),
        help="max_tokens values requests ask for (the contiguous reservation)",
    )
    work.add_argument("--prefixes", type=int, default=0, help="number of shared system prompts")
    work.add_argument("--prefix-len", type=int, default=0, help="system prompt length, tokens")
    work.add_argument(
        "--prefix-fraction", type=float, default=0.0, help="share of requests using one"
    )
    work.add_argument(
        "--parallel-n", type=int, default=1, help="samples of a parallel-sampling request"
    )
    work.add_argument("--parallel-fraction", type=float, default=0.0)
    work.add_argument("--seed", type=int, default=0)
    run = parser.add_argument_group("schemes and output")
    run.add_argument("--block-sizes", type=_ints, default=(16, 32, 64))
    run.add_argument(
        "--no-prefix-caching", action="store_true", help="skip the prefix-caching runs"
    )
    run.add_argument(
        "--oracle", action="store_true", help="also run contiguous reserving the true final length"
    )
    run.add_argument("--plot", default="pagedattn-simulate.png", help="PNG path")
    run.add_argument("--no-plot", action="store_true")
    return parser


def run_schemes(
    requests: list[Request],
    capacity: int,
    *,
    block_sizes: Sequence[int],
    prefix_caching: bool = True,
    oracle: bool = False,
) -> list[tuple[Summary, Meter]]:
    """Contiguous, then paging at each block size without and (optionally) with prefix caching."""
    results = [simulate_contiguous(requests, capacity)]
    if oracle:
        results.append(simulate_contiguous(requests, capacity, reserve="oracle"))
    for block_size in block_sizes:
        results.append(simulate_paged(requests, capacity, block_size=block_size))
        if prefix_caching:
            results.append(
                simulate_paged(requests, capacity, block_size=block_size, prefix_caching=True)
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


def save_plot(results: Sequence[tuple[Summary, Meter]], path: str) -> str | None:
    """Save utilization bars and concurrency over time to ``path``; return why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot saved"
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = [s.scheme for s, _ in results]
    x = list(range(len(results)))
    used = [100 * s.used for s, _ in results]
    internal = [100 * s.internal for s, _ in results]
    external = [100 * s.external for s, _ in results]
    bars.bar(x, used, color="tab:green", label="token state")
    bars.bar(x, internal, bottom=used, color="tab:orange", label="internal fragmentation")
    bars.bar(
        x,
        external,
        bottom=[u + i for u, i in zip(used, internal, strict=True)],
        color="tab:red",
        label="external fragmentation",
    )
    for i, (summary, _) in enumerate(results):
        top = used[i] + internal[i] + external[i]
        bars.text(i, top + 1, f"{100 * summary.utilization:.0f}%", ha="center", fontsize=8)
    bars.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    bars.set_ylabel("% of the KV budget (mean over loaded steps)")
    bars.set_ylim(0, 110)
    bars.set_title("KV memory (label: utilization = token state / reserved)")
    bars.legend(fontsize=7, loc="lower right")
    for summary, meter in results:
        lines.plot(meter.running, label=summary.scheme, linewidth=1)
    lines.set_xlabel("step")
    lines.set_ylabel("running requests")
    lines.set_title("concurrent requests")
    lines.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pagedattn simulate``; returns the exit status."""
    from pagedattn.console import print_table
    from pagedattn.errors import PagedAttentionError

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.capacity_tokens is not None:
        if args.capacity_tokens < 1:
            print("pagedattn simulate: --capacity-tokens must be >= 1", file=sys.stderr)
            return 2
        budget = Budget(
            args.capacity_tokens, 0, (f"capacity: {args.capacity_tokens:,} tokens (given)",)
        )
    else:
        budget = kv_budget(gpu_mib=args.gpu_mib, utilization=args.gpu_utilization, params=args.params,
                           num_layers=args.layers, num_kv_heads=args.kv_heads, head_dim=args.head_dim)
        if budget.capacity < 1:
            print(
                "pagedattn simulate: the model leaves no memory for the KV cache", file=sys.stderr
            )
            return 2
    try:
        if args.trace:
            requests = read_csv(args.trace, max_model_len=args.max_model_len)
            source = f"trace {args.trace}"
        else:
            spec = WorkloadSpec(
                num_requests=args.requests, arrival_rate=args.rate, mean_prompt=args.mean_prompt,
                mean_output=args.mean_output, sigma=args.sigma, max_model_len=args.max_model_len,
                max_tokens_choices=args.max_tokens, num_prefixes=args.prefixes, prefix_len=args.prefix_len,
                shared_prefix_fraction=args.prefix_fraction, parallel_n=args.parallel_n,
                parallel_fraction=args.parallel_fraction, seed=args.seed,
            )
            requests = generate(spec)
            source = (
                f"generated: {args.requests} requests, {args.rate}/step, prompt mean"
                f" {args.mean_prompt:.0f}, output mean {args.mean_output:.0f}"
            )
    except PagedAttentionError as error:
        print(f"pagedattn simulate: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"pagedattn simulate: cannot read trace: {error}", file=sys.stderr)
        return 2
    for line in budget.lines:
        print(line)
    print(f"workload: {source}")
    started = time.perf_counter()
    results = run_schemes(
        requests,
        budget.capacity,
        block_sizes=args.block_sizes,
        prefix_caching=not args.no_prefix_caching,
        oracle=args.oracle,
    )
    print_table(
        HEADERS,
        table_rows([s for s, _ in results]),
        title=f"KV memory at {budget.capacity:,} tokens ({time.perf_counter() - started:.1f} s)",
    )
    if not args.no_plot:
        reason = save_plot(results, args.plot)
        print(f"plot: {reason}" if reason else f"plot saved to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
