"""The ``chronomem`` command: ``list``, ``train``, ``run`` and ``bench``."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path


def _parse_options(pairs: list[str], flag: str) -> dict:
    """``["chunk_size=16", "causal=True"]`` -> ``{"chunk_size": 16, "causal": True}`` (Python literals)."""
    options = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"{flag} takes KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return options


def cmd_list(args) -> int:
    from chronomem.registry import EXPERIMENTS, names

    listing = names()
    for kind in ("models", "tasks"):
        print(f"{kind}:")
        for name in listing[kind]:
            print(f"  {name}")
    print("experiments:")
    for name in listing["experiments"]:
        print(f"  {name:18s} {EXPERIMENTS[name].description.splitlines()[0][:90]}")
    return 0


def cmd_train(args) -> int:
    from chronomem.train import TrainConfig, train_spec
    from chronomem.train.checkpoint import load_config

    if args.resume:
        saved = load_config(Path(args.resume))
        spec, train_cfg = saved["spec"], saved["train"]
        if args.steps is not None:
            train_cfg["steps"] = args.steps
        train_cfg["out"] = args.out or train_cfg.get("out") or args.resume
        cfg = TrainConfig(**train_cfg)
    else:
        if not args.model or not args.task:
            raise ValueError("chronomem train needs --model NAME and --task NAME (or --resume DIR)")
        from chronomem.registry import get_model, get_task

        get_model(args.model), get_task(args.task)  # unknown names fail here, listing the valid ones
        if args.dim < 1 or args.depth < 1 or args.heads < 1:
            raise ValueError(f"--dim, --depth and --heads must be >= 1, got {args.dim}, {args.depth}, {args.heads}")
        if args.dim % args.heads:
            raise ValueError(f"--heads={args.heads} must divide --dim={args.dim}")
        spec = {
            "model": args.model,
            "model_options": {"dim": args.dim, "depth": args.depth, "num_heads": args.heads,
                              **_parse_options(args.model_opt, "--model-opt")},
            "task": args.task,
            "task_options": _parse_options(args.task_opt, "--task-opt"),
        }
        cfg = TrainConfig(
            steps=1000 if args.steps is None else args.steps, batch_size=args.batch_size, lr=args.lr,
            optimizer=args.optimizer, schedule=args.schedule, warmup=args.warmup, clip=args.clip or None,
            eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
            time_budget=args.time_budget, anneal_by=args.anneal_by,
            out=args.out, device=args.device, progress=not args.no_progress,
        )
    result = train_spec(spec, cfg, resume=args.resume)
    print(json.dumps({"steps": result.steps, "seconds": round(result.seconds, 2), **result.metrics}))
    return 0


def cmd_run(args) -> int:
    from chronomem.experiments import run_experiment
    from chronomem.experiments.base import comparison_table
    from chronomem.registry import get_experiment

    experiment = get_experiment(args.experiment)
    out = Path(args.out or f"runs/{args.experiment}")
    results = run_experiment(experiment, args.scale, out, seed=args.seed, models=args.models)
    print(f"\n{experiment.name} ({args.scale}): ours (paper) — {experiment.metric}\n")
    print(comparison_table(results["results"], results["paper"]))
    print(f"\n{results['seconds']:.0f} s; wrote {out / 'results.json'}, {out / 'report.md'}, {out / 'results.png'}")
    return 0


def cmd_bench(args, rest: list[str]) -> int:
    from chronomem import bench

    return bench.main(rest)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronomem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list models, tasks and experiments")

    t = sub.add_parser("train", help="train one model on one task")
    t.add_argument("--model", help="model name (chronomem list)")
    t.add_argument("--task", help="task name (chronomem list)")
    t.add_argument("--model-opt", action="append", metavar="KEY=VALUE", help="backbone option, repeatable")
    t.add_argument("--task-opt", action="append", metavar="KEY=VALUE", help="task option, repeatable")
    t.add_argument("--dim", type=int, default=64)
    t.add_argument("--depth", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--steps", type=int, default=None,
                   help="training steps (default 1000; with --resume: the new total)")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--optimizer", default="adamw", choices=["adamw", "rmsprop"])
    t.add_argument("--schedule", default="constant", choices=["constant", "linear", "cosine"])
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds of training (counted across --resume)")
    t.add_argument("--anneal-by", default="steps", choices=["steps", "budget"],
                   help="decay the schedule over the steps, or over the time budget when that runs out first")
    t.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip (0 disables)")
    t.add_argument("--eval-every", type=int, default=0)
    t.add_argument("--checkpoint-every", type=int, default=0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", help="run directory (checkpoints, metrics.csv, config.json)")
    t.add_argument("--resume", help="continue the run in this directory exactly")
    t.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    t.add_argument("--no-progress", action="store_true")

    r = sub.add_parser("run", help="reproduce a paper table (chronomem list shows the experiments)")
    r.add_argument("experiment")
    r.add_argument("--scale", default="quick", choices=["smoke", "quick", "paper"])
    r.add_argument("--out", default=None, help="output directory (default runs/EXPERIMENT)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--models", nargs="+", metavar="NAME", default=None,
                   help="run only these of the experiment's models (default: all of the scale's models)")

    sub.add_parser("bench", help="time and memory scaling benchmark (chronomem bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    if argv and argv[0] == "bench":
        return cmd_bench(None, argv[1:])
    args = parser.parse_args(argv)
    from chronomem.train.checkpoint import CheckpointError

    try:
        return {"list": cmd_list, "train": cmd_train, "run": cmd_run}[args.command](args)
    except (ValueError, TypeError, CheckpointError) as err:
        print(f"chronomem {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
