"""``chronomem bench``: the command line of the scaling sweep and the peer comparison."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from chronomem.bench.peers import compare_peers
from chronomem.bench.report import FIT_RANGE, machine_info, slopes, targets, write_json, write_plots, write_report
from chronomem.bench.sweep import DEFAULT_LENGTHS, DEFAULT_MODELS, QUICK_LENGTHS, resolve_models, sweep
from chronomem.threads import Measured, check_threads, default_threads

# Every file a benchmark run writes into --out; a directory holding one of them holds another run.
OUTPUTS = ("results.json", "report.md", "time.png", "memory.png", "peers.json")


def _model_opt(text: str):
    import ast

    try:
        name, rest = text.split(":", 1)
        key, value = rest.split("=", 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--model-opt takes MODEL:KEY=VALUE, got {text!r}") from None
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pass
    return name, key, value


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chronomem bench", description="Time and memory of every backbone against sequence length."
    )
    p.add_argument(
        "--models",
        nargs="+",
        default=None,
        help=f"registry names or 'all' (default: {' '.join(DEFAULT_MODELS)})",
    )
    p.add_argument(
        "--lengths", nargs="+", type=int, default=None, help="sequence lengths N (default 512 .. 32768)"
    )
    p.add_argument("--mode", default="both", choices=["train", "infer", "both"])
    p.add_argument(
        "--out", default="runs/bench", help="output directory, new or without a benchmark (default runs/bench)"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny width, N in 256..1024, few repeats (~2 minutes)"
    )
    p.add_argument("--dim", type=int, default=None, help="shared width (default 64; quick 32)")
    p.add_argument("--depth", type=int, default=None, help="shared depth (default 2; quick 1)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default 4; quick 2)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 3; quick 2)")
    p.add_argument(
        "--threads", type=int, default=None,
        help=f"torch threads in each worker (default: half the cores, here {default_threads()}: chronomem.threads)",
    )
    p.add_argument(
        "--memory-cap-mb", type=float, default=8192, help="peak memory above the baseline counted as OOM"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per (model, N) process (default 90; quick 30)"
    )
    p.add_argument(
        "--model-opt",
        type=_model_opt,
        action="append",
        default=[],
        metavar="MODEL:KEY=VALUE",
        help="builder option for one model, repeatable (e.g. htm:top_k=4)",
    )
    p.add_argument(
        "--peer",
        choices=["auto", "only", "off"],
        default=None,
        help="HTMAttention peer comparison (about a minute): after the sweep (auto; the default "
        "without --quick), alone (only) or not (off; the default with --quick)",
    )
    p.add_argument(
        "--plugin", default=None, help="a Python file that registers extra models (run in every worker)"
    )
    p.add_argument("--seed", type=int, default=0)
    return p


def check_out(out: Path) -> None:
    """A benchmark never overwrites another run: ``out`` must be new, or a directory without any of
    the files a run writes (``OUTPUTS``). Raises ValueError otherwise."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, expected a directory")
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found:
        raise ValueError(
            f"--out {out} already holds a benchmark ({', '.join(found)}); choose a new --out or remove it"
        )


def prepare(args: argparse.Namespace) -> Path:
    """Fill the defaults that depend on --quick, check every argument (ValueError naming it) and create
    the output directory, before any measurement."""
    quick = args.quick
    args.lengths = sorted(set(args.lengths or (QUICK_LENGTHS if quick else DEFAULT_LENGTHS)))
    args.dim = args.dim or (32 if quick else 64)
    args.depth = args.depth or (1 if quick else 2)
    args.heads = args.heads or (2 if quick else 4)
    args.repeats = args.repeats if args.repeats is not None else (2 if quick else 3)
    args.timeout = args.timeout if args.timeout is not None else (30.0 if quick else 90.0)
    args.peer = args.peer or ("off" if quick else "auto")
    for name, value in (
        ("--dim", args.dim),
        ("--depth", args.depth),
        ("--heads", args.heads),
        ("--batch-size", args.batch_size),
        ("--repeats", args.repeats),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if args.dim % args.heads or min(args.lengths) < 1 or args.timeout <= 0:
        raise ValueError("--heads must divide --dim, lengths must be >= 1, --timeout > 0")
    if args.plugin:
        import runpy

        runpy.run_path(args.plugin)  # so the parent sees the plugin's models as registered
    args.models = resolve_models(args.models)
    for name, _, _ in args.model_opt:
        resolve_models([name], flag="--model-opt")
    out = Path(args.out)
    check_out(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out} cannot be created: {err.strerror or err}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.threads = check_threads(args.threads)  # one per process on 2 cores: timings, not contention
        out = prepare(args)
    except ValueError as err:
        print(f"chronomem bench: error: {err}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    machine = machine_info()
    # The workers and the peer timings run with args.threads; the load is read before and after the
    # whole run, and a load above the cores at either end is flagged in the output and the report.
    measured = Measured(threads=args.threads, log=print).start()
    if args.peer == "only":
        peers = compare_peers(repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed)
        write_json(out / "peers.json", {"machine": machine, "conditions": measured.stop().record(), **peers})
        return 0
    results = sweep(args)
    results["config"]["fit_range"] = list(FIT_RANGE)
    results["machine"] = machine
    results["slopes"] = slopes(results)
    results["targets"] = targets(results)
    results["peers"] = None
    if args.peer == "auto":
        results["peers"] = compare_peers(
            repeats=args.repeats, warmup=args.warmup, threads=args.threads, seed=args.seed
        )
    results["conditions"] = measured.stop().record()
    results["seconds"] = round(time.perf_counter() - start, 1)
    write_json(out / "results.json", results)
    write_report(out, results)
    write_plots(out, results)
    print(
        f"\n{results['seconds']:.0f} s; wrote {out / 'results.json'}, {out / 'report.md'}, "
        f"{out / 'time.png'}, {out / 'memory.png'}"
    )
    return 0
