"""``pagedattn bench``: time backends and peers on named shapes against measured ceilings.

Prints a table (backend, shape, block size, the three timings of what an engine sees: one
call with the L2 flushed, back to back, CUDA-graph replay; GB/s, TFLOP/s, % of ceiling, ratio
to the unpaged SDPA reference), progress lines on stderr, and writes ``bench.json`` and
``bench.png`` to ``--out``. Backends that take torch tensors get torch CUDA tensors unless
``--inputs native``. Without a GPU it runs the small ``cpu`` set and says the figures are
CPU figures.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedattn.errors import BackendNotFoundError, BackendUnavailableError, PagedAttentionError
from pagedattn.perf import device, inputs, shapes, timing
from pagedattn.perf.engine import INPUT_KINDS
from pagedattn.perf.measure import DevicePool, Result, case_work, measure_backend, measure_peer_group
from pagedattn.perf.peers import PEERS, FlexPeer
from pagedattn.perf.report import (
    HEADERS,
    SLOWED_MARK,
    add_reference_ratios,
    document,
    format_rate,
    format_seconds,
    reason_notes,
    settle_summary,
    slowdown_notes,
    slowed,
    table_rows,
    write_json,
)
from pagedattn.perf.targets import VERDICT_HEADERS, evaluate
from pagedattn.spec.dtypes import FP8_DTYPES, QUERY_DTYPES
from pagedattn.usage import (
    UsageError,
    make_folder,
    make_parser,
    non_negative_float,
    positive_float,
    reports_usage_errors,
)

GPU_FLUSH_BYTES = 256 << 20  # rotated regions hold at least this much: several times a GPU's L2
CPU_FLUSH_BYTES = 64 << 20


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser("pagedattn bench", __doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", metavar="NAME",
                        help="registered backends to time (default: every available one for this device)")
    parser.add_argument("--shapes", nargs="+", metavar="SET_OR_CASE",
                        help=f"named sets ({', '.join(shapes.SETS)}) or case names (default: quick on a GPU, "
                        "cpu without one)")
    parser.add_argument("--peers", nargs="*", metavar="PEER", choices=sorted(PEERS),
                        help="peers to time, on a GPU only (default: sdpa flex); --peers alone for none; flash "
                             "is flash SDPA alone, for bars set against the faster of cuDNN and flash")
    parser.add_argument("--dtype", choices=QUERY_DTYPES,
                        help="override the cases' dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    parser.add_argument("--kv-dtype", choices=(*FP8_DTYPES, shapes.KV_AS_QUERY), default=None,
                        help="override the caches' dtype: an fp8 dtype (the fp8 cases keep their scales, others "
                             f"use 1.0), or {shapes.KV_AS_QUERY} for K/V in the query's dtype (default: each case's)")
    parser.add_argument("--blocks", choices=shapes.BLOCK_ORDERS, default=None,
                        help="order of each sequence's blocks in the pool (default: shuffled); in-order, beside a "
                             "shuffled run, shows what scattered blocks cost a kernel")
    parser.add_argument("--inputs", choices=INPUT_KINDS, default="torch",
                        help="what run receives: torch CUDA tensors where the backend takes them, as an engine "
                             "passes them (default), or each backend's own device arrays (native)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="folder for bench.json and bench.png (default: ./bench-results)")
    parser.add_argument("--budget", type=positive_float, default=None,
                        help="seconds of timing per measurement, > 0 (default: 0.25 on a GPU, 0.5 on the CPU)")
    parser.add_argument("--batch-ms", type=positive_float, default=None,
                        help="milliseconds of runs queued between two synchronizations, > 0 (default: "
                             f"{timing.GPU_POLICY.target_batch_s * 1e3:g} on a GPU; on the CPU every run is "
                             "synchronized)")
    parser.add_argument("--settle", type=non_negative_float, default=None, metavar="SECONDS",
                        help="longest wait before each case for the GPU to report no clock slowdown and draw under "
                             f"half its power limit (default: {timing.GPU_POLICY.settle_max_s:g}; 0: no wait, as a "
                             "GPU running back to back sees it)")
    parser.add_argument("--flex-budget", type=non_negative_float, default=30.0,
                        help="seconds FlexAttention may spend compiling before its remaining cases are skipped")
    parser.add_argument("--list", action="store_true", help="list the named sets and their cases, then exit")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def list_sets() -> int:
    for name, cases in shapes.SETS.items():
        print(f"{name} ({len(cases)} cases)")
        for case in cases:
            cache = "" if case.cache_dtype == case.dtype else f", K/V {case.cache_dtype}"
            print(f"  {case.name}  {case.dtype}{cache}")
    return 0


def choose_backends(names: Sequence[str] | None, on_gpu: bool) -> tuple[list[Any], list[str]]:
    """Load the backends to time; return them and one note per backend left out (and why).

    A backend named on the command line that is unknown or cannot run here is a
    :class:`UsageError`; so is a list that leaves nothing to time.
    """
    from pagedattn.backends.registry import available_backends, load_backend

    notes = []
    if names is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            names = available_backends()
    loaded = []
    for name in names:
        try:
            backend = load_backend(name)
        except (BackendNotFoundError, BackendUnavailableError) as error:
            raise UsageError(f"--backend {name}: {error}") from None
        if on_gpu and backend.capabilities().device == "cpu":
            notes.append(f"{name}: not timed: runs on the CPU, and these shapes are sized for the GPU")
            continue
        loaded.append(backend)
    if not loaded:
        raise UsageError("no backend to time here: " + ("; ".join(notes) or "none is available"))
    return loaded, notes


def group_by_pool(cases: Sequence[shapes.Case]) -> list[list[shapes.Case]]:
    """Cases that share a pool (differ only in block size), in first-seen order."""
    groups: dict[tuple[object, ...], list[shapes.Case]] = {}
    for case in cases:
        groups.setdefault(inputs.pool_key(case), []).append(case)
    return list(groups.values())


@reports_usage_errors("pagedattn bench")
def main(argv: Sequence[str] | None = None) -> int:
    """Time the backends and peers on the cases; print the table, write bench.json and bench.png."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        return list_sets()
    gpu = device.gpu_name()
    on_gpu = gpu is not None
    names = args.shapes or (["quick"] if on_gpu else ["cpu"])
    if not on_gpu and any(n in shapes.SETS and n != "cpu" for n in names):
        raise UsageError(f"no GPU here; the sets other than 'cpu' are sized for a GPU (asked: {names})")
    try:
        cases = shapes.resolve(names, dtype=args.dtype, blocks=args.blocks, kv_dtype=args.kv_dtype)
    except PagedAttentionError as error:
        raise UsageError(str(error)) from None
    backends, notes = choose_backends(args.backend, on_gpu)
    make_folder(args.out, "--out")
    peer_names = (["sdpa", "flex"] if args.peers is None else args.peers) if on_gpu else []
    if not on_gpu and args.peers:
        notes.append(f"--peers {' '.join(args.peers)}: ignored, peers are timed on a GPU only")
    peers = [FlexPeer(args.flex_budget) if n == "flex" else PEERS[n]() for n in peer_names]
    policy = timing.GPU_POLICY if on_gpu else timing.CPU_POLICY
    if args.budget is not None:
        policy = timing.TimingPolicy(**{**policy.__dict__, "budget_s": args.budget})
    if args.batch_ms is not None:
        policy = timing.TimingPolicy(**{**policy.__dict__, "target_batch_s": args.batch_ms / 1e3})
    if args.settle is not None:
        policy = timing.TimingPolicy(**{**policy.__dict__, "settle_max_s": args.settle})
    flush = GPU_FLUSH_BYTES if on_gpu else CPU_FLUSH_BYTES

    started = time.perf_counter()
    from pagedattn.perf import ceilings as ceilings_mod

    ceilings = ceilings_mod.measure_gpu() if on_gpu else ceilings_mod.measure_cpu()
    where = gpu if on_gpu else f"CPU ({device.cpu_name()}): these are CPU figures, not GPU ones"
    print(f"pagedattn bench on {where}", file=sys.stderr)
    print(f"ceilings: read {format_rate(ceilings.read_bytes_per_s / 1e9)} GB/s, matrix "
          f"{format_rate(ceilings.matmul_flops_per_s / 1e12)} TFLOP/s ({ceilings.how})", file=sys.stderr)
    for note in notes:
        print(note, file=sys.stderr)
    runners = len(backends) + len(peers)
    total = len(cases) * runners
    print(f"{len(cases)} cases x {runners} runners = {total} measurements", file=sys.stderr)

    results: list[Result] = []
    done = 0

    def progress(result: Result) -> None:
        nonlocal done
        done += 1
        results.append(result)
        if result.status == "ok" and result.seconds is not None and result.gbps is not None:
            one = "-" if result.one_call_s is None else format_seconds(result.one_call_s)
            graph = format_seconds(result.graph_s) if result.graph_s is not None else result.graph_note[:40]
            figure = (f"one call {one}  back to back {format_seconds(result.seconds)}  graph {graph}  "
                      f"{format_rate(result.gbps)} GB/s  {result.pct_of_ceiling:.0f}%")
            if slowed(result) and result.gpu_state is not None:
                figure += f"  {SLOWED_MARK} {', '.join(result.gpu_state.slowdowns)}"
        else:
            figure = f"{result.status}: {result.reason[:80]}"
        print(f"[{done}/{total} {time.perf_counter() - started:5.0f}s] {result.runner:<8} {result.case}  {figure}",
              file=sys.stderr, flush=True)

    machine = {"gpu": gpu, "cpu": device.cpu_name(), "python": platform.python_version(),
               "backends": {b.name: b.version for b in backends}, **_library_versions()}
    command = "pagedattn bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))

    def save(partial: bool) -> None:
        doc = document(results, ceilings, command=command, machine=machine,
                       elapsed_s=time.perf_counter() - started)
        doc["complete"] = not partial
        doc["targets"] = [{"backend": v.backend, "target": v.target.name, "bars": v.target.bars(), "status": v.status,
                           "worst_pct_of_ceiling": v.worst_pct_of_ceiling,
                           "worst_speed_vs_reference": v.worst_speed_vs_reference, "spread": v.spread,
                           "reason": v.reason} for v in evaluate(results)]
        write_json(args.out / "bench.json", doc)

    for pool_cases in group_by_pool(cases):
        rotations = inputs.rotations_for(pool_cases[0], flush)
        pool = inputs.make_pool(pool_cases[0], rotations)
        works = {case: case_work(case, pool) for case in pool_cases}
        for backend in backends:
            try:
                device_pool = DevicePool(backend, pool, args.inputs)
            except Exception as error:
                for case in pool_cases:
                    progress(Result(backend.name, case.name, case.model.name, case.kind, case.batch, case.context,
                                    case.block_size, case.dtype, "error", f"to_device: {error}"[:300],
                                    cache_dtype=case.cache_dtype))
                continue
            for case in pool_cases:
                progress(measure_backend(backend, case, device_pool, works[case], ceilings, policy, on_gpu))
            del device_pool
        for peer in peers:
            for result in measure_peer_group(peer, pool_cases, rotations, works, ceilings, policy):
                progress(result)
        del pool
        save(partial=True)  # a run cut short still leaves its rows

    add_reference_ratios(results)
    from pagedattn.console import print_table

    title = f"pagedattn bench: {where}; read ceiling {format_rate(ceilings.read_bytes_per_s / 1e9)} GB/s"
    print_table(HEADERS, table_rows(results), title=title)
    settling = settle_summary(results)
    for line in [*reason_notes(results), *slowdown_notes(results), *([settling] if settling else [])]:
        print(line)
    verdicts = evaluate(results)
    if verdicts:
        print()
        print_table(VERDICT_HEADERS, [v.row() for v in verdicts],
                    title="speed targets (pagedattn.perf.targets), judged on one call and on graph replay")
    elapsed = time.perf_counter() - started
    save(partial=False)
    wrote = [str(args.out / "bench.json")]
    if not args.no_plot:
        from pagedattn.perf.plot import save_plot

        why_not = save_plot(results, ceilings, args.out / "bench.png", title=title)
        if why_not is None:
            wrote.append(str(args.out / "bench.png"))
        else:
            print(f"pagedattn bench: {why_not}", file=sys.stderr)
    print(f"wrote {', '.join(wrote)} in {elapsed:.0f} s", file=sys.stderr)
    return 0


def _library_versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("numpy", "torch", "triton", "cupy-cuda13x"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found
