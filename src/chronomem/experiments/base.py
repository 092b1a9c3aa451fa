"""An experiment reproduces one paper table: typed scales, the paper's numbers, and a runner.

``Experiment.run(scale, out, seed, models=None, time_budget=None, progress=True, jobs=SEQUENTIAL)`` trains
and evaluates the scale's models (or only the ones named in ``models``, checked with ``select_models``),
showing the progress of every run, evaluation and data generator it starts when ``progress`` (passed
down explicitly: ``chronomem.progress``), and returns::

    {"results": {model: {setting: value}}, "per_seed": {model: {setting: [value, ...]}}, "config": {...},
     "extra": {...optional...}}

where a value is a number (accuracy in %, or what ``metric`` says) or a string such as ``"OOM"``. An
experiment that runs several seeds returns ``per_seed``: every seed's value of each cell, in seed
order, exactly the values the cell averages (the report shows them, the 95% interval of their mean,
and judges the claims by them). ``run_experiment`` adds the paper's numbers and the wall time, and
writes ``OUT/results.json`` (keys ``experiment``, ``scale``, ``seed``, ``metric``, ``results``,
``per_seed``, ``paper``, ``chance``, ``claims``, ``config``, ``seconds``, ``code``: the version and git
commit that made it, ``extra``), ``OUT/report.md`` (ours beside the paper's, the seeds, chance and the
claims judged) and ``OUT/results.png``. ``config["models"]`` names the models that ran.

An experiment declares the papers' claims beside their numbers (``Experiment.claims``, each a
``chronomem.report.Claim``: "model A scores above model B at these settings"); results.json records
them with the chance level, and the report judges each from the numbers.

``jobs`` (``chronomem.experiments.jobs.Jobs``; ``chronomem run --jobs K``): the experiment's independent
runs (models x seeds, and environments for the RL experiments) go to ``Jobs.map``, which runs them in
this process or in K processes of one torch thread each, with the same numbers. Every experiment
here takes it (``TrainRun`` and ``train_run`` are the supervised experiments' job, and ``train_seeds``
trains their models x seeds in one map and averages the seeds); one whose ``run`` does not is refused
``jobs`` above 1.

A scale (``smoke``, ``tour``, ``quick``, ``long``, ``paper``) is a frozen dataclass, a subclass of ``Scale``,
that fixes step counts, never a wall-clock time: the same seed gives the same table on an idle
machine and on a busy one. ``run_experiment(..., time_budget=seconds)`` is the explicit equal-time
comparison: each model trains until that many seconds (its step count becomes a far ceiling,
``BUDGET_STEP_CEILING`` times the scale's, so a faster model takes more steps), and the report says
so. An experiment whose ``scales`` include ``"tour"`` contributes that scale's models to ``chronomem
run tour`` (about a minute per model on a 2-core CPU). ``long`` is quick's agents and settings given more
steps, for an experiment whose quick budget leaves a claim undecided (hours per run on a CPU).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronomem.experiments.jobs import Jobs
from chronomem.report import (
    Claim,
    json_default,
    plot_results,
    report_markdown,
    resolve_chance,
    several_experiments,
)

SCALES = ("smoke", "tour", "quick", "long", "paper")
# Under a time budget a run may take this many times its scale's steps: far beyond what a model reaches in
# the budgets the scales were sized for, so the clock, not the step count, ends every run.
BUDGET_STEP_CEILING = 10
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

    def train_config(self, seed: int, time_budget: float | None = None, progress: bool = False, **options):
        """The trainer's settings of one run at this scale; ``options`` override them (a model's own
        optimiser). With ``time_budget`` (seconds) the clock ends the run (the steps become a ceiling of
        ``BUDGET_STEP_CEILING`` times the scale's), and a decaying schedule anneals over the budget (or
        the ceiling, were it reached first), so a run the clock cuts short still ends at lr 0 (Li et al.
        2020, "Budgeted training"). ``progress``: the run shows its progress (``run_experiment(progress=...)``
        passes it down)."""
        from chronomem.train import TrainConfig

        # Under a budget the clock ends the run: the step count becomes a far ceiling, so that a model that
        # trains faster per step takes more steps (--time-budget: "instead of the scale's fixed step counts").
        steps = self.steps if time_budget is None else self.steps * BUDGET_STEP_CEILING
        settings = dict(steps=steps, batch_size=self.batch_size, lr=self.lr, optimizer=self.optimizer,
                        schedule=self.schedule, warmup=self.warmup, clip=self.clip,
                        eval_examples=self.eval_examples, seed=seed, progress=progress)
        settings.update(options)
        annealed = time_budget is not None and settings["schedule"] != "constant"
        return TrainConfig(**settings, time_budget=time_budget, anneal_by="budget" if annealed else "steps")


@dataclass
class Experiment:
    name: str
    description: str
    run: Callable[..., dict]  # run(scale, out, seed, models=None, time_budget=None, progress=True, jobs=...) -> dict
    paper: Table = field(default_factory=dict)
    metric: str = "test accuracy (%)"
    paper_source: str = ""
    notes: str = ""
    scales: tuple[str, ...] = ("smoke", "quick", "paper")  # with "tour": part of ``chronomem run tour``
    # A uniform guess's score in the metric's units, one for every setting or per setting, or a function
    # of the run's results (a level the run measures, e.g. a random policy's return in its extra);
    # results.png marks it on each row and the results table gives it a column (None: no chance level).
    chance: dict[str, float] | float | Callable[[dict], dict | float | None] | None = None
    chance_label: str = "chance"  # the column's name ("random policy" where the run measures one)
    # The papers' claims, judged from the numbers by the report (chronomem.report.Claim, judge).
    claims: tuple[Claim, ...] = ()
    # figures(results, out) -> the paths of the figures it drew in the folder ``out`` from a results.json's
    # contents, or several runs' joined by ``chronomem.report.join_runs`` (``chronomem report --figures``).
    figures: Callable[[dict, Path], list[Path]] | None = None


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=json_default) + "\n")
    os.replace(tmp, path)


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


def jobs_option(experiment: Experiment, jobs: int | Jobs) -> dict[str, Jobs]:
    """``{"jobs": Jobs}`` for ``experiment.run`` if it takes ``jobs``; ``{}`` if it does not and ``jobs``
    is one process; a ValueError naming ``--jobs`` if it does not and more were asked for."""
    jobs = Jobs.of(jobs)
    if "jobs" in inspect.signature(experiment.run).parameters:
        return {"jobs": jobs}
    if jobs.processes > 1:
        raise ValueError(f"--jobs {jobs.processes}: {experiment.name} runs its runs one after the other in one "
                         "process; leave --jobs out")
    return {}


def run_experiment(experiment: Experiment, scale: str, out: Path, seed: int = 0, models=None,
                   progress: bool = True, time_budget: float | None = None, data_dir: str | None = None,
                   resume: bool = False, jobs: int | Jobs = 1) -> dict:
    """Run ``experiment`` at ``scale`` (only ``models``, names, if given) and write its outputs.

    ``progress``: passed to ``experiment.run``, which passes it to every training run (each model and
    seed), evaluation and data generator: each shows its progress on stderr and ends with a summary line
    (``chronomem.progress``), or all stay silent.
    ``time_budget``: seconds of training per model (an equal wall-clock comparison); each model stops at
    the budget (or at ``BUDGET_STEP_CEILING`` times its scale's steps, far beyond it). None (the default): step counts
    only, so the same seed gives the same metrics on any machine. ``data_dir``: where an experiment
    that reads data files (``lm``: enwik8) finds them; an experiment whose ``run`` takes no
    ``data_dir`` rejects it. ``resume``: continue an interrupted run of the same experiment, scale and
    seed in ``out``, reusing the runs (model and seed) it finished (the supervised ones: and continuing
    an unfinished run from its checkpoint); only experiments whose ``run`` takes ``resume`` offer it
    (all but ``tour``). ``jobs``: how many of the experiment's
    independent runs go at once, each in its own process with one torch thread (an int), or a
    ``Jobs`` (its ``threads`` per process); the numbers are those of ``jobs=1``, which runs them one
    after the other here (``chronomem.experiments.jobs``). results.json's ``config["jobs"]`` records it."""
    if scale not in experiment.scales:
        raise ValueError(f"scale of {experiment.name} must be one of {experiment.scales}, got {scale!r}")
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(time_budget, (int, float))
                                    or not (time_budget > 0 and math.isfinite(time_budget))):
        raise ValueError(f"time_budget must be a positive number of seconds or None, got {time_budget!r}")
    jobs = Jobs.of(jobs)
    options = jobs_option(experiment, jobs)
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
        produced = experiment.run(scale, out, seed, models=None if models is None else tuple(models),
                                  time_budget=time_budget, progress=progress, **options)
    except Exception:
        if created and not any(out.iterdir()):  # e.g. an unknown --models name: leave no empty directory
            out.rmdir()
        raise
    if "paper" not in produced:  # the paper's rows of the models that ran (a scale or --models may pick some)
        produced["paper"] = {m: row for m, row in experiment.paper.items() if m in produced["results"]}
    produced["config"] = {**produced.get("config", {}), "time_budget": time_budget, "jobs": jobs.processes}
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
    """Write results.json, report.md and results.png for what ``run`` produced. results.json also records
    what the report judges the run against (the chance level, its label and the claims), so that it
    renders alone (the report looks nothing up). A run that combines experiments (the tour) gives its
    own ``claims`` and ``chance``."""
    rows = produced["results"]
    results = {
        "experiment": experiment.name,
        "scale": scale,
        "seed": seed,
        "metric": experiment.metric,
        "results": rows,
        **({"per_seed": produced["per_seed"]} if "per_seed" in produced else {}),
        "paper": produced.get("paper", experiment.paper),
        "chance": produced.get("chance"),
        "chance_label": experiment.chance_label,
        "claims": [dataclasses.asdict(c) for c in produced.get("claims", experiment.claims)],
        "config": produced.get("config", {}),
        "seconds": round(seconds, 1),
        "code": code_version(),
        **({"extra": produced["extra"]} if "extra" in produced else {}),
        **({"control": produced["control"]} if "control" in produced else {}),
    }
    if not several_experiments(rows):  # the tour's rows each have their own experiment's (given above)
        results["chance"] = resolve_chance(experiment, results)
    write_json_atomic(out / "results.json", results)
    (out / "report.md").write_text(report_markdown(experiment, results))  # chronomem.report renders
    plot_results(results, out / "results.png", experiment.metric)
    return results


@dataclass(frozen=True)
class TrainRun:
    """One training run of a supervised experiment: the arguments of ``train_and_evaluate``, picklable,
    so that ``Jobs.map(train_run, runs)`` can run it in another process."""

    model: str
    task: Any
    model_options: dict
    train_config: Any  # chronomem.train.TrainConfig
    eval_tasks: dict | None = None
    out: str | None = None
    resume: bool = False  # continue the run ``out`` holds (chronomem run --resume)


def train_run(run: TrainRun) -> dict:
    """``train_and_evaluate`` of ``run`` (the job function of ``Jobs.map``)."""
    return train_and_evaluate(run.model, run.task, run.model_options, run.train_config, run.eval_tasks, run.out,
                              run.resume)


# What extra["runs"] keeps of each run besides its accuracy.
RUN_RECORD = ("seconds", "steps", "stopped_early", "parameters")


def train_seeds(runs: list[TrainRun], seeds: int, out: Path, jobs: Jobs, cells: Callable[[dict], dict],
                accuracy_name: str = "accuracy", resume: bool = False) -> dict:
    """Train each of ``runs`` (one per model, its ``train_config.seed`` the first seed) with the seeds
    seed, seed + 1, ..., seed + seeds - 1, each in its own directory ``out/MODEL/seedN``. The models x
    seeds go to ``jobs.map`` as one list, so ``--jobs K`` trains K of them at once. ``resume``: each
    continues the run its directory holds (``train_and_evaluate``).

    ``cells(row)`` is one run's cells of the table (``{setting: value}``) from ``train_and_evaluate``'s
    row, e.g. ``{"T=100": row["accuracy"]}``. Returns ``{"results": {model: {setting: mean over the
    seeds}}, "per_seed": {model: {setting: [value per seed, in seed order]}}, "runs": {"MODEL/seedN":
    {accuracy_name: the run's accuracy on the task it trained on, "seconds", "steps", "stopped_early",
    "parameters"}}}``: what ``Experiment.run`` returns as results and per_seed, and the runs for its extra."""
    seeded = [dataclasses.replace(run, train_config=dataclasses.replace(run.train_config, seed=seed),
                                  out=str(Path(out) / run.model / f"seed{seed}"), resume=resume)
              for run in runs for seed in range(run.train_config.seed, run.train_config.seed + seeds)]
    per_seed: dict[str, dict[str, list]] = {}
    records = {}
    for run, row in zip(seeded, jobs.map(train_run, seeded), strict=True):
        for setting, value in cells(row).items():
            per_seed.setdefault(run.model, {}).setdefault(setting, []).append(value)
        records[f"{run.model}/seed{run.train_config.seed}"] = {accuracy_name: row["accuracy"],
                                                             **{key: row[key] for key in RUN_RECORD}}
    results = {model: {setting: statistics.fmean(values) for setting, values in row.items()}
               for model, row in per_seed.items()}
    return {"results": results, "per_seed": per_seed, "runs": records}


def train_and_evaluate(model: str, task, model_options: dict, train_config, eval_tasks: dict | None = None,
                       out: Path | None = None, resume: bool = False) -> dict:
    """Build ``model`` for ``task``, train it, and evaluate on ``task`` (and on each of ``eval_tasks``).

    Returns ``{"accuracy": test accuracy (%), "seconds", "steps", "stopped_early", "eval": {setting: acc}}``.
    ``out`` (optional) keeps the run's checkpoints and metrics.csv. ``resume`` (``chronomem run
    --resume``): if ``out`` holds this run, continue it (``chronomem.train.resume.rejoin``): a finished
    one is loaded from its final checkpoint and only evaluated, so the row is the uninterrupted one.
    """

    import torch

    from chronomem.heads import build_model
    from chronomem.train import evaluate, train
    from chronomem.train.resume import rejoin

    torch.manual_seed(train_config.seed)
    net = build_model(model, task, **model_options)
    if out is not None:
        train_config = dataclasses.replace(train_config, out=str(out))
    spec = {"model": model, "model_options": model_options, "task": task.name, "task_options": task.describe()}
    spec["task_options"].pop("name", None)
    train_config, run = rejoin(train_config, spec) if resume else (train_config, None)
    result = train(net, task, train_config, spec=spec, resume=run)
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
            name: evaluate(result.model, t, bs, train_config.eval_examples, progress=train_config.progress)["accuracy"]
            for name, t in eval_tasks.items()
        }
    return row
