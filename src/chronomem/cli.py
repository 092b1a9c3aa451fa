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


# The settings of a new run: flag -> (its TrainConfig field or model option, default). With --resume
# they come from the run's config.json; giving one with another value than the saved one is an error.
RUN_SETTINGS = {
    "--dim": ("dim", 64), "--depth": ("depth", 2), "--heads": ("num_heads", 4),
    "--batch-size": ("batch_size", 32), "--lr": ("lr", 1e-3), "--optimizer": ("optimizer", "adamw"),
    "--schedule": ("schedule", "constant"), "--warmup": ("warmup", 0), "--anneal-by": ("anneal_by", "steps"),
    "--clip": ("clip", 1.0), "--seed": ("seed", 0),
}
MODEL_SETTINGS = ("--dim", "--depth", "--heads")
# What --resume lets change: the length and the budget of the run, how often it evaluates and
# checkpoints, where it computes and whether it shows progress. None of them changes a step's maths.
RESUMABLE = ("--steps", "--time-budget", "--eval-every", "--checkpoint-every", "--device", "--no-progress")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a directory the command can create or write into, else ValueError naming ``flag``."""
    import tempfile

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, expected a directory")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ValueError(f"{flag} {path}: {existing} is a file, so no directory can be made under it")
    try:  # the only reliable test of writability (permissions, read-only mounts, /proc, ...)
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot create a directory in {existing} ({err.strerror or err})") from None
    return path


def check_device(name: str | None) -> None:
    """A ValueError naming ``--device`` unless ``name`` is a device this machine can compute on."""
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {name!r} is not a device: expected cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no GPU was found"
            raise ValueError(f"--device {name}: CUDA is not available ({why}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices (0 ..)")
    try:
        torch.empty(1, device=device) + 1
    except Exception as err:  # e.g. mps without Metal: torch raises several types
        raise ValueError(f"--device {name} is not usable here ({str(err).splitlines()[0]})") from None


def check_task_options(task: str, options: dict) -> None:
    """An unknown --task-opt key fails before anything is built, listing the task's valid keys."""
    import inspect

    from chronomem.registry import get_task

    params = inspect.signature(get_task(task)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [key for key in options if key not in params]
    if unknown:
        raise ValueError(f"--task-opt {', '.join(unknown)}: unknown option(s) of task {task!r}; "
                         f"valid keys: {', '.join(params)}")


def _resume_settings(args, saved: dict, run_dir: Path) -> None:
    """Fail on a flag that would change the resumed run's model, task or optimisation (one line each)."""
    spec, train_cfg = saved["spec"], saved["train"]
    model_options, task_options = spec.get("model_options", {}), spec.get("task_options", {})
    given = {"--model": (args.model, spec.get("model")), "--task": (args.task, spec.get("task"))}
    for flag, (key, _) in RUN_SETTINGS.items():
        value = getattr(args, _dest(flag))
        if flag == "--clip" and value == 0:
            value = None  # --clip 0 is saved as clip None
        given[flag] = (value, model_options.get(key) if flag in MODEL_SETTINGS else train_cfg.get(key))
    for flag, saved_options in (("--model-opt", model_options), ("--task-opt", task_options)):
        for key, value in _parse_options(getattr(args, _dest(flag)), flag).items():
            given[f"{flag} {key}"] = (value, saved_options.get(key, "(not set)"))
    for flag, (value, saved_value) in given.items():
        if value is not None and value != saved_value:
            raise ValueError(
                f"{flag} {value} differs from the resumed run's saved value {saved_value} ({run_dir / 'config.json'}); "
                f"with --resume only {', '.join(RESUMABLE)} may change"
            )
    if args.out is not None and Path(args.out).resolve() != run_dir.resolve():
        raise ValueError(f"--out {args.out}: a resumed run writes only into its own directory, {run_dir}; "
                         "leave --out out (copy the run directory to continue a copy elsewhere)")


def cmd_train(args) -> int:
    from chronomem.train import TrainConfig, train_spec
    from chronomem.train.checkpoint import load_config, locate_run

    if args.resume:
        # The run directory is the one given (or the one holding the checkpoint given), never the `out`
        # saved in its config: a moved or copied run continues where it now is, and no other run is touched.
        run_dir, checkpoint = locate_run(Path(args.resume))
        saved = load_config(run_dir)
        _resume_settings(args, saved, run_dir)
        spec, train_cfg = saved["spec"], dict(saved["train"])
        for flag in RESUMABLE[:-1]:
            if getattr(args, _dest(flag)) is not None:
                train_cfg[_dest(flag)] = getattr(args, _dest(flag))
        train_cfg.update(out=str(run_dir), progress=not args.no_progress)
        cfg = TrainConfig(**train_cfg)
        check_device(cfg.device)
        result = train_spec(spec, cfg, resume=checkpoint)  # a run killed before its first checkpoint restarts
    else:
        if not args.model or not args.task:
            raise ValueError("chronomem train needs --model NAME and --task NAME (or --resume DIR)")
        from chronomem.registry import get_model, get_task

        get_model(args.model), get_task(args.task)  # unknown names fail here, listing the valid ones
        settings = {flag: default if getattr(args, _dest(flag)) is None else getattr(args, _dest(flag))
                    for flag, (_, default) in RUN_SETTINGS.items()}
        dim, depth, heads = (settings[flag] for flag in MODEL_SETTINGS)
        if dim < 1 or depth < 1 or heads < 1:
            raise ValueError(f"--dim, --depth and --heads must be >= 1, got {dim}, {depth}, {heads}")
        if dim % heads:
            raise ValueError(f"--heads={heads} must divide --dim={dim}")
        task_options = _parse_options(args.task_opt, "--task-opt")
        check_task_options(args.task, task_options)
        spec = {
            "model": args.model,
            "model_options": {"dim": dim, "depth": depth, "num_heads": heads,
                              **_parse_options(args.model_opt, "--model-opt")},
            "task": args.task,
            "task_options": task_options,
        }
        optimisation = {RUN_SETTINGS[flag][0]: value for flag, value in settings.items() if flag not in MODEL_SETTINGS}
        optimisation["clip"] = optimisation["clip"] or None  # --clip 0 disables clipping
        cfg = TrainConfig(
            steps=1000 if args.steps is None else args.steps, eval_every=args.eval_every or 0,
            checkpoint_every=args.checkpoint_every or 0, time_budget=args.time_budget, out=args.out,
            device=args.device, progress=not args.no_progress, **optimisation,
        )
        check_device(cfg.device)
        if args.out is not None:
            out = check_out_dir(args.out)
            if (out / "config.json").exists():
                raise ValueError(f"--out {out} already holds a run (config.json): continue it with --resume {out}, "
                                 "or choose another --out")
        result = train_spec(spec, cfg)
    print(json.dumps({"steps": result.steps, "seconds": round(result.seconds, 2), **result.metrics}))
    return 0


def cmd_run(args) -> int:
    from chronomem.experiments import run_experiment
    from chronomem.experiments.base import comparison_table
    from chronomem.registry import get_experiment

    experiment = get_experiment(args.experiment)
    out = check_out_dir(args.out or f"runs/{args.experiment}")
    results = run_experiment(experiment, args.scale, out, seed=args.seed, models=args.models,
                             progress=not args.quiet)
    print(f"\n{experiment.name} ({args.scale}): ours (paper) — {experiment.metric}\n")
    print(comparison_table(results["results"], results["paper"]))
    print(f"\n{results['seconds']:.0f} s; wrote {out / 'results.json'}, {out / 'report.md'}, {out / 'results.png'}")
    return 0


def _bench_out(rest: list[str]) -> str:
    """The --out of ``chronomem bench`` arguments (argparse's spellings: --out X, --out=X, a prefix)."""
    out = "runs/bench"
    for i, arg in enumerate(rest):
        name, _, value = arg.partition("=")
        if len(name) > 2 and "--out".startswith(name):
            out = value if value or i + 1 >= len(rest) else rest[i + 1]
    return out


def cmd_bench(args, rest: list[str]) -> int:
    from chronomem import bench

    if not {"-h", "--help", "--worker", "--peer-worker"} & set(rest):
        check_out_dir(_bench_out(rest))
    return bench.main(rest)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronomem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list models, tasks and experiments")

    t = sub.add_parser(
        "train", help="train one model on one task",
        description="Train one model on one task. With --resume DIR the run continues in DIR (a run "
        f"directory or one of its checkpoints/step_N) with its saved settings; only {', '.join(RESUMABLE)} "
        "may be given, any other flag must match the saved value.",
    )
    t.add_argument("--model", help="model name (chronomem list)")
    t.add_argument("--task", help="task name (chronomem list)")
    t.add_argument("--model-opt", action="append", metavar="KEY=VALUE", help="backbone option, repeatable")
    t.add_argument("--task-opt", action="append", metavar="KEY=VALUE", help="task option, repeatable")
    t.add_argument("--dim", type=int, help="width (default 64)")
    t.add_argument("--depth", type=int, help="layers (default 2)")
    t.add_argument("--heads", type=int, help="attention heads (default 4)")
    t.add_argument("--steps", type=int, default=None,
                   help="training steps (default 1000; with --resume: the new total, to extend a run)")
    t.add_argument("--batch-size", type=int, help="default 32")
    t.add_argument("--lr", type=float, help="default 1e-3")
    t.add_argument("--optimizer", choices=["adamw", "rmsprop"], help="default adamw")
    t.add_argument("--schedule", choices=["constant", "linear", "cosine"], help="default constant")
    t.add_argument("--warmup", type=int, help="warmup steps (default 0)")
    t.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds of training (counted across --resume)")
    t.add_argument("--anneal-by", choices=["steps", "budget"],
                   help="decay the schedule over the steps (default), or over the time budget when that runs out first")
    t.add_argument("--clip", type=float, help="gradient-norm clip (default 1.0; 0 disables)")
    t.add_argument("--eval-every", type=int, help="steps between validations (default 0: only the final test)")
    t.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (default 0: only the final one)")
    t.add_argument("--seed", type=int, help="default 0")
    t.add_argument("--out", help="run directory (checkpoints, metrics.csv, config.json)")
    t.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR (a run directory or DIR/checkpoints/step_N), writing only into it")
    t.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    t.add_argument("--no-progress", "--quiet", action="store_true", help="no progress bar or lines")

    r = sub.add_parser("run", help="reproduce a paper table (chronomem list shows the experiments)")
    r.add_argument("experiment")
    r.add_argument("--scale", default="quick", choices=["smoke", "quick", "paper"])
    r.add_argument("--out", default=None, help="output directory (default runs/EXPERIMENT)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--models", nargs="+", metavar="NAME", default=None,
                   help="run only these of the experiment's models (default: all of the scale's models)")
    r.add_argument("--quiet", action="store_true",
                   help="no progress (by default: a bar per model and seed on a terminal, else a line every ~10 s)")

    sub.add_parser("bench", help="time and memory scaling benchmark (chronomem bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = make_parser()
    from chronomem.train.checkpoint import CheckpointError

    command = argv[0] if argv else None
    try:
        if command == "bench":
            return cmd_bench(None, argv[1:])
        args = parser.parse_args(argv)
        return {"list": cmd_list, "train": cmd_train, "run": cmd_run}[args.command](args)
    except (ValueError, TypeError, CheckpointError) as err:
        message = " ".join(str(err).split()) or type(err).__name__  # one line, as argparse's errors
        print(f"chronomem {command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
