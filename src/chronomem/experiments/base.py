"""An experiment reproduces one paper table: typed scales, the paper's numbers, and a runner.

``Experiment.run(scale, out, seed, models=None, time_budget=None)`` trains and evaluates the scale's
models (or only the ones named in ``models``, checked with ``select_models``), and returns::

    {"results": {model: {setting: value}}, "config": {...}, "extra": {...optional...}}

where a value is a number (accuracy in %, or what ``metric`` says) or a string such as ``"OOM"``.
``run_experiment`` adds the paper's numbers and the wall time, and writes ``OUT/results.json``
(keys ``experiment``, ``scale``, ``seed``, ``metric``, ``results``, ``paper``, ``config``, ``seconds``,
``code``: the version and git commit that made it, ``extra``), ``OUT/report.md`` (ours beside the paper's)
and ``OUT/results.png``. ``config["models"]`` names the models that ran.

A scale (``smoke``, ``tour``, ``quick``, ``paper``) is a frozen dataclass, a subclass of ``Scale``,
that fixes step counts, never a wall-clock time: the same seed gives the same table on an idle
machine and on a busy one. ``run_experiment(..., time_budget=seconds)`` is the explicit equal-time
comparison: each model trains until that many seconds or its step count, whichever ends first, and
the report says so. An experiment whose ``scales`` include ``"tour"`` contributes that scale's
models to ``chronomem run tour`` (about a minute per model on a 2-core CPU).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES = ("smoke", "tour", "quick", "paper")
Table = dict[str, dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Scale:
    """What every scale of every experiment fixes: how long and how each model trains.

    Experiments subclass it with their sizes; ``dataclasses.asdict`` of a scale is what results.json
    records under ``config["scale"]``."""

    steps: int  # optimiser steps per model: a count, not a time, so a seed gives one table everywhere
    batch_size: int
    lr: float
    optimizer: str = "adamw"
    schedule: str = "constant"  # a decay ("linear", "cosine") reaches 0 at ``steps`` (or at a time budget)
    warmup: int = 0  # linear warm-up steps
    clip: float | None = 1.0  # gradient-norm clipping (None: none)
    eval_examples: int  # test examples per evaluated setting

    def train_config(self, seed: int, time_budget: float | None = None, **options):
        """The trainer's settings of one run at this scale; ``options`` override them (a model's own
        optimiser). With ``time_budget`` (seconds) the run also stops at that time, and a decaying
        schedule anneals over whichever of the steps and the budget ends first, so a run the clock
        cuts short still ends at lr 0 (Li et al. 2020, "Budgeted training")."""
        from chronomem.train import TrainConfig

        settings = dict(steps=self.steps, batch_size=self.batch_size, lr=self.lr, optimizer=self.optimizer,
                        schedule=self.schedule, warmup=self.warmup, clip=self.clip,
                        eval_examples=self.eval_examples, seed=seed, progress=False)
        settings.update(options)
        annealed = time_budget is not None and settings["schedule"] != "constant"
        return TrainConfig(**settings, time_budget=time_budget, anneal_by="budget" if annealed else "steps")


@dataclass
class Experiment:
    name: str
    description: str
    run: Callable[..., dict]  # run(scale, out, seed, models=None, time_budget=None) -> dict
    paper: Table = field(default_factory=dict)
    metric: str = "test accuracy (%)"
    paper_source: str = ""
    notes: str = ""
    scales: tuple[str, ...] = ("smoke", "quick", "paper")  # with "tour": part of ``chronomem run tour``
    # A uniform guess's score in the metric's units, one for every setting or per setting; results.png
    # marks it on each row (None: no chance level, e.g. one that must be measured).
    chance: dict[str, float] | float | None = None


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(obj):
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def select_models(available, models=None, experiment: str = "this experiment") -> tuple[str, ...]:
    """The models an experiment runs: all of ``available`` if ``models`` is None, else the named ones
    (in the order of ``available``). A name not in ``available`` raises ValueError listing the valid ones.
    Every ``Experiment.run`` calls this before it trains anything."""
    available = tuple(available)
    if models is None:
        return available
    if isinstance(models, str):
        models = (models,)
    unknown = ", ".join(repr(m) for m in models if m not in available)
    if unknown or not models:
        raise ValueError(f"unknown model(s) {unknown or '(none given)'} for {experiment}; "
                         f"valid models: {', '.join(available)}")
    return tuple(m for m in available if m in models)


def run_experiment(experiment: Experiment, scale: str, out: Path, seed: int = 0, models=None,
                   progress: bool = True, time_budget: float | None = None, data_dir: str | None = None,
                   resume: bool = False) -> dict:
    """Run ``experiment`` at ``scale`` (only ``models``, names, if given) and write its outputs.

    ``progress``: every training run (each model and seed) shows its progress on stderr and ends with a
    summary line (``chronomem.train.progress``), whatever its own ``TrainConfig.progress``.
    ``time_budget``: seconds of training per model (an equal wall-clock comparison); each model stops at
    the budget or at its scale's step count, whichever comes first. None (the default): step counts
    only, so the same seed gives the same metrics on any machine. ``data_dir``: where an experiment
    that reads data files (``lm``: enwik8) finds them; an experiment whose ``run`` takes no
    ``data_dir`` rejects it. ``resume``: continue an interrupted run of the same experiment, scale and
    seed in ``out``, reusing the runs (model and seed) it finished; only experiments whose ``run`` takes
    ``resume`` (the RL ones, whose runs take hours) offer it."""
    from chronomem.train.progress import reporting

    if scale not in experiment.scales:
        raise ValueError(f"scale of {experiment.name} must be one of {experiment.scales}, got {scale!r}")
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(time_budget, (int, float))
                                    or not (time_budget > 0 and math.isfinite(time_budget))):
        raise ValueError(f"time_budget must be a positive number of seconds or None, got {time_budget!r}")
    options = {}
    if data_dir is not None:
        if "data_dir" not in inspect.signature(experiment.run).parameters:
            raise ValueError(f"data_dir (--data-dir): {experiment.name} reads no data files, got {str(data_dir)!r}")
        options["data_dir"] = str(data_dir)
    if resume:
        if "resume" not in inspect.signature(experiment.run).parameters:
            raise ValueError(f"--resume: {experiment.name} cannot reuse the runs of an interrupted run; "
                             "run it again into a new directory")
        if not Path(out).is_dir():
            raise ValueError(f"--resume {out}: no such directory (the --out of the interrupted run)")
        options["resume"] = True
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with reporting(progress, label=experiment.name):
            produced = experiment.run(scale, out, seed, models=None if models is None else tuple(models),
                                      time_budget=time_budget, **options)
    except Exception:
        if created and not any(out.iterdir()):  # e.g. an unknown --models name: leave no empty directory
            out.rmdir()
        raise
    if "paper" not in produced:  # the paper's rows of the models that ran (a scale or --models may pick some)
        produced["paper"] = {m: row for m, row in experiment.paper.items() if m in produced["results"]}
    produced["config"] = {**produced.get("config", {}), "time_budget": time_budget}
    if resume:  # its seconds are this call's: the runs it loaded took theirs in the interrupted call
        produced["config"]["resumed"] = True
    return finish(experiment, produced.get("scale", scale), out, produced, time.perf_counter() - start, seed)


def code_version() -> dict[str, Any]:
    """The code a run is made by: the package version and, in a git checkout, the commit and whether the
    package's files differed from it (``dirty``). Recorded in results.json, so that a table made by
    older code shows it (``docs/results.md`` prints the commit of every section)."""
    import subprocess

    from chronomem import __version__

    package = Path(__file__).resolve().parent.parent
    code: dict[str, Any] = {"version": __version__, "commit": None, "dirty": None}
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, check=True,
                                  timeout=10).stdout.strip()

        code["commit"] = git("rev-parse", "HEAD")
        code["dirty"] = bool(git("status", "--porcelain", "--untracked-files=no", "--", "."))
    except (OSError, subprocess.SubprocessError):  # no git, or an installed copy outside a checkout
        pass
    return code


def finish(experiment: Experiment, scale: str, out: Path, produced: dict, seconds: float, seed: int) -> dict:
    """Write results.json, report.md and results.png for what ``run`` produced."""
    results = {
        "experiment": experiment.name,
        "scale": scale,
        "seed": seed,
        "metric": experiment.metric,
        "results": produced["results"],
        "paper": produced.get("paper", experiment.paper),
        "config": produced.get("config", {}),
        "seconds": round(seconds, 1),
        "code": code_version(),
    }
    if "extra" in produced:
        results["extra"] = produced["extra"]
    write_json_atomic(out / "results.json", results)
    (out / "report.md").write_text(report_markdown(experiment, results))
    plot_results(results, out / "results.png", experiment.metric)
    return results


def format_value(value: Any) -> str:
    """A table cell: accuracies in % with one decimal; values below 10 in magnitude (returns and MMER
    in [-1, 1], bits per byte) with two, so 0.94 does not read as 0.9 nor 2.15 as 2.2."""
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


TOUR_SEPARATOR = ": "  # the tour names its rows "experiment: model"


def table_rows(ours: Table, paper: Table) -> list[tuple[str, str, Any, Any]]:
    """``(model, setting, ours, paper)`` for every model and setting we report, in our order, then the
    paper's models and settings we have no number for."""
    rows = [(m, s, v, paper.get(m, {}).get(s)) for m, row in ours.items() for s, v in row.items()]
    rows += [(m, s, None, p) for m, row in paper.items() for s, p in row.items() if s not in ours.get(m, {})]
    return rows


def several_experiments(ours: Table) -> bool:
    """Whether the rows are named ``experiment: model`` (the tour's table of several experiments)."""
    return bool(ours) and all(TOUR_SEPARATOR in model for model in ours)


def comparison_table(ours: Table, paper: Table, metrics: dict[str, str] | None = None) -> str:
    """Markdown table of our numbers beside the paper's.

    One experiment: one row per model, one column per setting, each cell ``ours (paper)``. Several
    experiments (rows named ``experiment: model``, the tour's), whose settings differ: long format,
    one row per (experiment, model, setting) with the columns experiment, model, setting, ours, paper,
    and ``metric`` when ``metrics`` (``{experiment: metric}``) is given."""
    rows = table_rows(ours, paper)
    if several_experiments(ours):
        head = ["experiment", "model", "setting", "ours", "paper"] + (["metric"] if metrics else [])
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for model, setting, o, p in rows:
            experiment, name = model.split(TOUR_SEPARATOR, 1)
            cells = [experiment, name, setting, format_value(o), format_value(p)]
            cells += [metrics.get(experiment, "")] if metrics else []
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
    models = list(ours) + [m for m in paper if m not in ours]
    settings: list[str] = []
    for table in (ours, paper):
        for row in table.values():
            settings += [s for s in row if s not in settings]
    lines = ["| model | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for m in models:
        cells = [f"{format_value(ours.get(m, {}).get(s))} ({format_value(paper.get(m, {}).get(s))})"
                 for s in settings]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_markdown(experiment: Experiment, results: dict) -> str:
    budget = results["config"].get("time_budget")
    protocol = (f"Each model trained for an equal wall-clock budget of {budget:g} s per model (or its "
                "step count, whichever came first), so a slower model took fewer steps."
                if budget is not None else "Each model trained for its scale's step count (no time budget).")
    metrics = results.get("extra", {}).get("metrics")  # the tour's metric of each experiment
    parts = [
        f"# {experiment.name} — scale `{results['scale']}`",
        "",
        experiment.description,
        "",
        ("" if several_experiments(results["results"]) else "Each cell: **ours** (paper). ")
        + f"Metric: {experiment.metric}. "
        + (f"Paper numbers: {experiment.paper_source}. " if experiment.paper_source else "")
        + protocol,
        "",
        comparison_table(results["results"], results["paper"], metrics),
        "",
        f"Wall time: {results['seconds']:.0f} s, seed {results['seed']}.",
    ]
    if experiment.notes:
        parts += ["", experiment.notes]
    if results.get("extra"):
        extra = json.dumps(results["extra"], indent=2, default=_json_default)
        parts += ["", "## Extra measurements", "", "```json", extra, "```"]
    parts += ["", "## Config", "", "```json", json.dumps(results["config"], indent=2, default=_json_default), "```", ""]
    return "\n".join(parts)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def plot_results(results: dict, path: Path, metric: str) -> None:
    """Horizontal bars, one group per (model, setting) labelled on the y axis: ours (solid) and, where
    the paper has a number, the paper's (hatched) beside it, and a dashed mark at the experiment's
    ``chance`` level where it has one (each row's own experiment's, in the tour). A value that is not a
    number ("OOM") is written in place of its bar. The figure grows with the rows, so no label is clipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from chronomem.registry import get_experiment

    rows = table_rows(results["results"], results["paper"])
    if not rows:
        return
    # The chance level is the experiment's (its task's definition), looked up by name: the tour's rows
    # ("experiment: model") each find their own experiment's.
    tour = several_experiments(results["results"])
    chances: dict[str, Any] = {}

    def chance(model: str, setting: str) -> float | None:
        name = model.split(TOUR_SEPARATOR, 1)[0] if tour else results["experiment"]
        if name not in chances:
            try:
                chances[name] = get_experiment(name).chance
            except ValueError:  # an experiment not in the registry (a test's own): no chance level known
                chances[name] = None
        level = chances[name]
        return _number(level.get(setting) if isinstance(level, dict) else level)

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(rows)))
    ys = list(range(len(rows)))[::-1]  # the first row at the top
    bar = 0.38
    marks = []
    for y, (model, setting, o, p) in zip(ys, rows, strict=True):
        for value, offset, style in ((o, bar / 2, dict(color="C0")), (p, -bar / 2, dict(fill=False, hatch="//"))):
            if _number(value) is not None:
                ax.barh(y + offset, _number(value), bar, **style)
                ax.text(_number(value), y + offset, f" {format_value(value)} ", va="center", fontsize=7,
                        ha="left" if value >= 0 else "right")  # beyond the bar's end
            elif value is not None:  # e.g. "OOM"
                ax.text(0, y + offset, f" {value}", va="center", fontsize=7, color="C3")
        if (level := chance(model, setting)) is not None:
            # Over the bars (zorder), across both of the row's: a bar ending near it scored like a guess.
            ax.plot([level, level], [y - 0.45, y + 0.45], color="black", linestyle="--", linewidth=1, zorder=3)
            marks.append(level)
    handles = [Patch(color="C0", label="ours")]
    if any(p is not None for *_, p in rows):
        handles.append(Patch(fill=False, hatch="//", label="paper"))
    if marks:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1, label="chance"))
    ax.set_yticks(ys, [f"{m} — {s}" for m, s, *_ in rows], fontsize=8)
    ax.set_xlabel(metric)
    values = [_number(v) or 0.0 for *_, o, p in rows for v in (o, p)] + marks
    ax.set_xlim(min(values + [0.0]) * 1.15, max(values + [1.0]) * 1.15)  # returns can be negative
    ax.set_title(f"{results['experiment']} ({results['scale']})")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # the box grows to hold every label
    plt.close(fig)


def train_and_evaluate(model: str, task, model_options: dict, train_config, eval_tasks: dict | None = None,
                       out: Path | None = None) -> dict:
    """Build ``model`` for ``task``, train it, and evaluate on ``task`` (and on each of ``eval_tasks``).

    Returns ``{"accuracy": test accuracy (%), "seconds", "steps", "stopped_early", "eval": {setting: acc}}``.
    ``out`` (optional) keeps the run's checkpoints and metrics.csv.
    """
    import dataclasses

    import torch

    from chronomem.heads import build_model
    from chronomem.train import evaluate, train

    torch.manual_seed(train_config.seed)
    net = build_model(model, task, **model_options)
    if out is not None:
        train_config = dataclasses.replace(train_config, out=str(out))
    spec = {"model": model, "model_options": model_options, "task": task.name, "task_options": task.describe()}
    spec["task_options"].pop("name", None)
    result = train(net, task, train_config, spec=spec)
    row = {
        "accuracy": result.metrics["accuracy"],
        "seconds": round(result.seconds, 1),
        "steps": result.steps,
        "stopped_early": result.stopped_early,
        "parameters": sum(p.numel() for p in net.parameters()),
    }
    if eval_tasks:
        bs = train_config.eval_batch_size or train_config.batch_size
        row["eval"] = {
            name: evaluate(result.model, t, bs, train_config.eval_examples)["accuracy"]
            for name, t in eval_tasks.items()
        }
    return row
