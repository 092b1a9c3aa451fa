"""The ``chronomem`` command: ``list``, ``train``, ``eval``, ``run``, ``report``, ``bench``, ``rl`` and ``lm``."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import shutil
import sys
import textwrap
from pathlib import Path

from chronomem.config import add_config_flags, config_flag, given_config, resumable_fields


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
    width = max(80, shutil.get_terminal_size().columns)
    for name in listing["experiments"]:  # the whole description, wrapped at words
        print(textwrap.fill(" ".join(EXPERIMENTS[name].description.split()), width,
                            initial_indent=f"  {name:19s} ", subsequent_indent=" " * 22))
    return 0


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


def fresh_run_dir(base: Path) -> Path:
    """``base`` if it does not exist yet, else the first of ``base-2``, ``base-3``, ... that does not: the
    default output of ``chronomem run`` never lands on an earlier run."""
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


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


def new_run_dir(out: str) -> Path:
    """``--out`` of a new run: a directory the command can write, holding no run yet."""
    from chronomem.train.resume import check_new_run

    path = check_out_dir(out)
    check_new_run(path, flag="--out")
    return path


def _kept_spec(args, size: dict, spec: dict) -> dict[str, tuple]:
    """What ``chronomem train --resume`` keeps besides the trainer's settings: ``flag -> (given, saved)``
    of the model, task, size (``size``: the ``ModelSize`` fields given) and options given."""
    from chronomem.train import ModelSize
    from chronomem.train.resume import NOT_SET

    model_options, task_options = spec.get("model_options", {}), spec.get("task_options", {})
    kept = {}
    if args.model is not None:
        kept["--model"] = (args.model, spec.get("model"))
    if args.task is not None:
        kept["--task"] = (args.task, spec.get("task"))
    flags = {f.name: config_flag(f) for f in dataclasses.fields(ModelSize)}
    kept.update({flags[name]: (value, model_options.get(name)) for name, value in size.items()})
    for flag, pairs, saved in (("--model-opt", args.model_opt, model_options),
                               ("--task-opt", args.task_opt, task_options)):
        for key, value in _parse_options(pairs, flag).items():
            kept[f"{flag} {key}"] = (value, saved.get(key, NOT_SET))
    return kept


def cmd_train(args) -> int:
    from chronomem.train import ModelSize, TrainConfig, train_spec
    from chronomem.train.resume import find_run, resumed_settings

    values, size = given_config(args, TrainConfig), given_config(args, ModelSize)
    if args.resume:
        run = find_run(args.resume)
        spec = run.config["spec"]
        cfg = resumed_settings(run, TrainConfig, run.config["train"], values, _kept_spec(args, size, spec))
        check_device(cfg.device)
        result = train_spec(spec, cfg, resume=run)  # killed before its first checkpoint: restarts
    else:
        if not args.model or not args.task:
            raise ValueError("chronomem train needs --model NAME and --task NAME (or --resume DIR)")
        from chronomem.registry import get_model, get_task

        get_model(args.model), get_task(args.task)  # unknown names fail here, listing the valid ones
        size = ModelSize(**size)
        task_options = _parse_options(args.task_opt, "--task-opt")
        check_task_options(args.task, task_options)
        spec = {
            "model": args.model,
            "model_options": {**dataclasses.asdict(size), **_parse_options(args.model_opt, "--model-opt")},
            "task": args.task,
            "task_options": task_options,
        }
        cfg = TrainConfig(**values)
        check_device(cfg.device)
        if args.out is not None:
            new_run_dir(args.out)
        result = train_spec(spec, cfg)
    print(json.dumps({"steps": result.steps, "seconds": round(result.seconds, 2), **result.metrics}))
    return 0


def cmd_eval(args) -> int:
    from chronomem.train import TrainConfig, evaluate, load_run
    from chronomem.train.checkpoint import checkpoint_step, load_config, locate_run

    for flag, value in (("--examples", args.examples), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    check_device(args.device)
    model, task, _ = load_run(args.run, device=args.device)
    run_dir, checkpoint = locate_run(Path(args.run))
    # By default the run's own evaluation settings: the result is then the run's final test row.
    saved = TrainConfig(**load_config(run_dir)["train"])
    examples = args.examples or saved.eval_examples
    metrics = evaluate(model, task, args.batch_size or saved.eval_batch_size or saved.batch_size, examples,
                       progress=not args.quiet)
    print(json.dumps({"run": str(run_dir), "step": checkpoint_step(checkpoint), "split": "test",
                      "examples": examples, **metrics}))
    return 0


def cmd_rl_train(args) -> int:
    from chronomem.envs.make import check_env_id
    from chronomem.rl.ppo import Args, train
    from chronomem.train.resume import NOT_SET, find_run, resumed_settings

    values = given_config(args, Args)
    core_options = _parse_options(args.core_opt, "--core-opt")
    if args.resume:  # as chronomem train: the run continues where its directory now is, with its saved settings
        run = find_run(args.resume, kind="ppo")
        saved_options = run.config.get("core_options", {})
        kept = {f"--core-opt {key}": (value, saved_options.get(key, NOT_SET)) for key, value in core_options.items()}
        ppo_args = resumed_settings(run, Args, run.config["args"], values, kept)
        check_device(ppo_args.device)
        result = train(ppo_args, saved_options, resume=run)
    else:
        from chronomem.registry import get_model

        ppo_args = Args(**values)
        check_env_id(ppo_args.env)
        get_model(ppo_args.core)  # an unknown name fails here, listing the valid ones
        check_device(ppo_args.device)
        if ppo_args.out is not None:
            new_run_dir(ppo_args.out)
        result = train(ppo_args, core_options)
    last = result.history[-1] if result.history else {}
    print(json.dumps({"frames": result.frames, "seconds": round(result.seconds, 2),
                      **{k: last[k] for k in ("return_mean", "length_mean", "sps") if k in last}}))
    return 0


def cmd_rl_eval(args) -> int:
    from chronomem.rl.evaluate import evaluate, load_agent, record_gif

    for flag, value in (("--episodes", args.episodes), ("--num-envs", args.num_envs)):
        if value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    check_device(args.device)
    agent, saved, checkpoint = load_agent(args.run, args.env, args.device)
    env = args.env or saved.env
    result = {"run": str(checkpoint.parent.parent), "checkpoint": checkpoint.name,
              **evaluate(agent, env, args.episodes, args.seed, args.num_envs, args.greedy, progress=not args.quiet,
                         action_seed=args.seed)}
    if args.gif:
        check_out_dir(Path(args.gif).parent, "--gif").mkdir(parents=True, exist_ok=True)
        result["gif_episode"] = record_gif(agent, env, args.gif, args.seed, args.greedy, progress=not args.quiet,
                                           action_seed=args.seed)
    print(json.dumps(result))
    return 0


def write_output(path: str | Path, text: str, flag: str = "--out") -> Path:
    """Write ``text`` to the file ``path`` atomically (a reader never sees half of it), creating its directory."""
    from chronomem.train.checkpoint import write_text_atomic

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory, expected a file")
    check_out_dir(path.parent, flag).mkdir(parents=True, exist_ok=True)
    try:
        write_text_atomic(path, text)
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot write ({err.strerror or err})") from None
    return path


def cmd_report(args) -> int:
    from chronomem.report import results_page, write_figures

    try:
        page = results_page(args.paths, **({} if args.title is None else {"title": args.title}))
    except OSError as err:  # e.g. an unreadable results.json
        raise ValueError(f"cannot read {err.filename}: {err.strerror or err}") from None
    if args.out is None:
        sys.stdout.write(page)
    else:
        print(f"wrote {write_output(args.out, page)}", file=sys.stderr)
    if args.figures is not None:
        for path in write_figures(args.paths, args.figures):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def check_results_kept(out: Path, args, experiment: str) -> None:
    """A run never overwrites another run's files: refuse an ``out`` that holds results.json, except where
    ``--resume`` adds rows to that very experiment (its name, scale and seed) and keeps every model it
    measured among ``--models``. Its new results.json then holds those rows again, made from the same
    finished runs (each reloaded from its last checkpoint, its evaluation drawn from the random state
    saved there), beside the rows added."""
    path = out / "results.json"
    if not path.exists():
        return
    if args.resume is None:
        raise ValueError(f"--out {out} already holds an experiment's results (results.json): choose another "
                         "directory, or leave --out out to get a new one under runs/ (to add models to it: "
                         f"--resume {out} --models, naming the ones it has too)")
    from chronomem.report import load_results

    saved = load_results(path)  # a ValueError naming the file if it is not a results.json
    ran = {"experiment": saved.get("experiment"), "scale": saved.get("scale"), "seed": saved.get("seed")}
    asked = {"experiment": experiment, "scale": args.scale, "seed": args.seed}
    if ran != asked:
        shown = ", ".join(f"{key} {ran[key]!r}" for key in ran if ran[key] != asked[key])
        raise ValueError(f"--resume {out}: its results.json is of another run ({shown}); resume it with the same "
                         "experiment, --scale and --seed, or choose another directory")
    dropped = [] if args.models is None else [model for model in saved["results"] if model not in args.models]
    if dropped:
        raise ValueError(f"--resume {out}: its results.json holds {', '.join(dropped)}, which --models leaves "
                         "out; name every model it holds (and the ones to add), so that no row is lost")


def cmd_run(args) -> int:
    from chronomem.experiments import run_experiment
    from chronomem.experiments.jobs import Jobs
    from chronomem.registry import get_experiment
    from chronomem.report import comparison_table

    if args.time_budget is not None and not (args.time_budget > 0 and math.isfinite(args.time_budget)):
        raise ValueError(f"--time-budget must be a positive number of seconds, got {args.time_budget}")
    # Each of --jobs K processes computes with --threads torch threads (default 1); with K = 1 the runs
    # go one after the other in this process, at its --threads.
    jobs = Jobs(args.jobs, 1 if args.threads is None else args.threads)
    experiment = get_experiment(args.experiment)
    if args.resume is not None:
        from chronomem.train.resume import check_own_directory

        check_own_directory(args.out, args.resume)
        out = check_out_dir(args.resume, "--resume")
    else:
        out = check_out_dir(args.out) if args.out else check_out_dir(fresh_run_dir(Path("runs") / args.experiment))
    check_results_kept(out, args, experiment.name)
    data = {} if args.data_dir is None else {"data_dir": args.data_dir}  # for the experiments that read data files
    results = run_experiment(experiment, args.scale, out, seed=args.seed, models=args.models,
                             progress=not args.quiet, time_budget=args.time_budget,
                             resume=args.resume is not None, jobs=jobs, **data)
    equal_time = "" if args.time_budget is None else f", equal time budget of {args.time_budget:g} s per model"
    print(f"\n{experiment.name} ({results['scale']}{equal_time}): ours beside the paper's — {experiment.metric}\n")
    print(comparison_table(results["results"], results["paper"]))
    print(f"\n{results['seconds']:.0f} s; wrote {out / 'results.json'}, {out / 'report.md'}, {out / 'results.png'}")
    return 0


def cmd_lm_sample(args) -> int:
    """Continue ``--prompt`` with a trained language model (``CausalLM.generate``, the state carried)."""
    import torch

    from chronomem.heads import CausalLM
    from chronomem.train import load_run

    for flag, value, low in (("--bytes", args.bytes, 0), ("--top-k", args.top_k, 1)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be an integer >= {low}, got {value}")
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        raise ValueError(f"--temperature must be a number >= 0 (0: greedy), got {args.temperature}")
    check_device(args.device)
    model, task, spec = load_run(args.run, device=args.device)
    if not isinstance(model, CausalLM):
        raise ValueError(f"RUN {args.run} is a {spec['model']} trained on task {spec['task']!r}, not a language "
                         "model (e.g. chronomem train --task text, or chronomem run lm)")
    device = model.embed.weight.device
    generator = None if args.seed is None else torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(args.prompt.encode("utf-8"), args.bytes, temperature=args.temperature, top_k=args.top_k,
                         generator=generator)
    sys.stdout.write(args.prompt + printable(bytes(out.tolist())) + "\n")
    return 0


def printable(data: bytes) -> str:
    """``data`` as UTF-8 text a terminal can show: bytes that do not decode, and control characters
    other than newline and tab (a sampled ESC or BEL would drive the terminal), written as escapes."""
    text = data.decode("utf-8", errors="backslashreplace")
    return "".join(c if c.isprintable() or c in "\n\t" or c == "\\" else repr(c)[1:-1] for c in text)


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


class LazyChoices:
    """argparse ``choices`` read from ``load()`` only when a value is checked or the help is shown: the
    list stays where it is defined (the experiments' scales), and building the parser imports nothing
    heavy (``chronomem train`` never imports the experiments). Give the argument a ``metavar``:
    argparse formats one at ``add_argument``, from the choices when there is none."""

    def __init__(self, load):
        self.load = load

    def __iter__(self):
        return iter(tuple(self.load()))

    def __contains__(self, value) -> bool:
        return value in tuple(self.load())


def _scales():
    from chronomem.experiments.base import SCALES

    return SCALES


RESUME_HELP = "continue the run in DIR (a run directory or DIR/checkpoints/step_N), writing only into it"


def add_threads_flag(parser: argparse.ArgumentParser) -> None:
    from chronomem.threads import default_threads

    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help=f"torch threads (default: half the cores, here {default_threads()}; all of them "
                        "slow a run several times over when another process shares the machine)")


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``chronomem`` parser. Only ``command``'s flags are built (every command's when None): they
    come from the trainer's and PPO's config dataclasses, whose modules import torch, which ``chronomem
    --help`` and ``chronomem list`` do not need."""
    from chronomem import __version__

    parser = argparse.ArgumentParser(prog="chronomem", description=__doc__)
    parser.add_argument("--version", action="version", version=f"chronomem {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list models, tasks and experiments")

    def wanted(name: str) -> bool:
        return command is None or command == name

    t = sub.add_parser("train", help="train one model on one task")
    if wanted("train"):
        _train_flags(t)

    e = sub.add_parser(
        "eval", help="evaluate a trained run on its task's test set, printed as JSON",
        description="Load a trained run (a run directory: its newest checkpoint; or RUN/checkpoints/step_N) "
        "and evaluate it on its task's test set. With the run's own --examples and --batch-size (the "
        "default) the numbers are the run's final test metrics.",
    )
    e.add_argument("run", metavar="RUN", help="a run directory or one of its checkpoints")
    e.add_argument("--examples", type=int, help="test examples (default: the run's eval_examples)")
    e.add_argument("--batch-size", type=int, help="default: the run's evaluation batch size")
    e.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    e.add_argument("--quiet", "--no-progress", action="store_true",
                   help="no progress (by default shown once the evaluation has run ~10 s)")
    add_threads_flag(e)

    r = sub.add_parser("run", help="reproduce a paper table (chronomem list shows the experiments)")
    _run_flags(r)

    p = sub.add_parser(
        "report", help="the results page (Markdown) of runs' results.json",
        description="Render every results.json under the given paths (files or directories) as one Markdown "
        "page: chronomem report runs/ > docs/results.md",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="a results.json or a directory searched for them")
    p.add_argument("--title", default=None, help="the page's title (default: Measured results)")
    p.add_argument("--out", default=None, metavar="FILE", help="write the page to FILE (atomically), not stdout")
    p.add_argument("--figures", default=None, metavar="DIR", help="also draw each experiment's figures of all its "
                   "runs joined (one figure of every model), in DIR/<experiment>-<scale>/")

    sub.add_parser("bench", help="time and memory scaling benchmark (chronomem bench --help)", add_help=False)

    lm = sub.add_parser("lm", help="language models: sample a continuation from a trained run")
    lm_sub = lm.add_subparsers(dest="lm_command", required=True)
    ls = lm_sub.add_parser(
        "sample", help="continue a prompt with a trained byte-level language model",
        description="Load a run trained on the text task (chronomem run lm writes RUN = OUT/MODEL/seedN) and "
        "print the prompt and its continuation; each new byte is one step of the model with its state. "
        "Bytes that do not decode, and control characters other than newlines and tabs, are printed "
        "escaped (\\x07), so the terminal never receives raw control bytes.",
    )
    ls.add_argument("run", metavar="RUN", help="a run directory or one of its checkpoints")
    ls.add_argument("--prompt", required=True, help="the text to continue (UTF-8)")
    ls.add_argument("--bytes", type=int, default=200, help="bytes to generate (default %(default)s)")
    ls.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default %(default)s)")
    ls.add_argument("--top-k", type=int, default=None, help="sample among the k most likely bytes (default: all)")
    ls.add_argument("--seed", type=int, default=None, help="seed of the sampling (default: unseeded)")
    ls.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_threads_flag(ls)

    agents = sub.add_parser("rl", help="agents: train with recurrent PPO (any causal core as memory), evaluate")
    if wanted("rl"):
        _rl_flags(agents)
    return parser


def _train_flags(t: argparse.ArgumentParser) -> None:
    from chronomem.train import ModelSize, TrainConfig

    resumable = ", ".join(config_flag(f) for f in resumable_fields(TrainConfig))
    t.description = ("Train one model on one task. With --resume DIR the run continues in DIR (a run directory "
                     f"or one of its checkpoints/step_N) with its saved settings; only {resumable} and --threads "
                     "may be given, any other flag must match the saved value.")
    t.add_argument("--model", help="model name (chronomem list)")
    t.add_argument("--task", help="task name (chronomem list)")
    t.add_argument("--model-opt", action="append", metavar="KEY=VALUE", help="backbone option, repeatable")
    t.add_argument("--task-opt", action="append", metavar="KEY=VALUE", help="task option, repeatable")
    add_config_flags(t, ModelSize)
    add_config_flags(t, TrainConfig)
    t.add_argument("--resume", metavar="DIR", help=RESUME_HELP)
    add_threads_flag(t)


def _run_flags(r: argparse.ArgumentParser) -> None:
    r.add_argument("experiment")
    r.add_argument("--scale", default="quick", choices=LazyChoices(_scales), metavar="SCALE",
                   help="%(choices)s: the runs' fixed step counts (default %(default)s)")
    r.add_argument("--out", default=None, help="output directory, which must not hold results yet (default: "
                   "runs/EXPERIMENT, or runs/EXPERIMENT-2, -3, ... when that exists)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the interrupted run in DIR (same experiment, --scale, --seed, --models): "
                   "the runs it finished are loaded, not trained again; a supervised run cut short continues from its "
                   "checkpoint (every experiment but tour)")
    r.add_argument("--models", nargs="+", metavar="NAME", default=None,
                   help="run only these of the experiment's models (default: all of the scale's models)")
    r.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="give every model the same wall-clock training budget instead of the scale's fixed "
                   "step counts (an equal-time comparison; its numbers depend on the machine and its load)")
    r.add_argument("--quiet", action="store_true",
                   help="no progress (by default: a bar per model and seed on a terminal, else a line every ~10 s)")
    r.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where the experiment's data files are (resolution-transfer: CIFAR binary files or "
                   "Fashion-MNIST IDX; lm: the folder holding enwik8); refused by experiments that read none")
    r.add_argument("--jobs", type=int, default=1, metavar="K",
                   help="run the experiment's independent runs (models x seeds; RL: also environments) K at a "
                   "time, each in its own process with one torch thread (--threads N: N each); the same "
                   "numbers as one at a time (default %(default)s: one after the other in this process)")
    add_threads_flag(r)


def _rl_flags(agents: argparse.ArgumentParser) -> None:
    from chronomem.rl.settings import Args

    rl_sub = agents.add_subparsers(dest="rl_command", required=True)
    rl_resumable = ", ".join(config_flag(f) for f in resumable_fields(Args))
    rt = rl_sub.add_parser(
        "train", help="train an agent with PPO on a Gymnasium environment",
        description="Train an agent (an encoder, a causal core as memory, policy and value heads) with "
        "recurrent PPO (docs/rl.md). With --resume DIR the run continues in DIR with its saved settings; only "
        f"{rl_resumable} may be given, any other flag must match the saved value. The environments restart "
        "with new seeds and the agent's memory starts empty.",
    )
    add_config_flags(rt, Args)
    rt.add_argument("--core-opt", action="append", metavar="KEY=VALUE", help="core option, repeatable")
    rt.add_argument("--resume", metavar="DIR", help=RESUME_HELP)
    rv = rl_sub.add_parser(
        "eval", help="mean return of a trained agent over N episodes, printed as JSON",
        description="Load a PPO run (its newest checkpoint, or RUN/checkpoints/step_N) and measure the mean "
        "return over --episodes episodes of --env (default: the run's env; e.g. the large grid of a MiniGrid "
        "pair); --gif writes one episode as an animated GIF.",
    )
    rv.add_argument("run", metavar="RUN", help="a run directory or one of its checkpoints")
    rv.add_argument("--env", default=None, help="Gymnasium id (default: the run's env)")
    rv.add_argument("--episodes", type=int, default=100, help="episodes (default %(default)s)")
    rv.add_argument("--num-envs", type=int, default=16, help="environments stepped together (default %(default)s)")
    rv.add_argument("--seed", type=int, default=0, help="seed of the environments and actions (default %(default)s)")
    rv.add_argument("--greedy", action="store_true", help="take the most likely action (default: sample)")
    rv.add_argument("--gif", metavar="FILE", default=None,
                    help="write one more episode as an animated GIF (frame by frame; small frames enlarged)")
    rv.add_argument("--quiet", "--no-progress", action="store_true",
                    help="no progress (by default: a bar on a terminal, else a line every ~10 s)")
    rv.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_threads_flag(rv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else None
    parser = make_parser(command or "")
    try:
        if command == "bench":
            return cmd_bench(None, argv[1:])
        args = parser.parse_args(argv)
        if hasattr(args, "threads"):  # every command that computes (rl train: its --torch-threads)
            from chronomem.threads import use_threads

            use_threads(args.threads)
        commands = {"list": cmd_list, "train": cmd_train, "eval": cmd_eval, "run": cmd_run, "report": cmd_report,
                    "rl": lambda a: {"train": cmd_rl_train, "eval": cmd_rl_eval}[a.rl_command](a),
                    "lm": lambda a: {"sample": cmd_lm_sample}[a.lm_command](a)}
        return commands[args.command](args)
    except (ValueError, TypeError) as err:  # CheckpointError is a ValueError
        message = " ".join(str(err).split()) or type(err).__name__  # one line, as argparse's errors
        print(f"chronomem {command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
