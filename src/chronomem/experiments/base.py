"""An experiment reproduces one paper table: configs per scale, the paper's numbers, and a runner.

``Experiment.run(scale, out, seed, models=None)`` trains and evaluates the scale's models (or only the
ones named in ``models``, checked with ``select_models``), and returns::

    {"results": {model: {setting: value}}, "config": {...}, "extra": {...optional...}}

where a value is a number (accuracy in %, or what ``metric`` says) or a string such as ``"OOM"``.
``run_experiment`` adds the paper's numbers and the wall time, and writes ``OUT/results.json``
(schema of DESIGN.md section 5), ``OUT/report.md`` (ours beside the paper's, cell by cell) and
``OUT/results.png``. ``config["models"]`` names the models that ran.

``Experiment.tour(out, seed)`` (optional) is the experiment's entry in ``chronomem run tour``: the
same return value at a budget of about three minutes per model on a 2-core CPU.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES = ("smoke", "quick", "paper")
Table = dict[str, dict[str, Any]]


@dataclass
class Experiment:
    name: str
    description: str
    run: Callable[..., dict]  # run(scale, out, seed, models=None) -> dict
    paper: Table = field(default_factory=dict)
    metric: str = "test accuracy (%)"
    paper_source: str = ""
    notes: str = ""
    tour: Callable[[Path, int], dict] | None = None


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(obj):
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
                   progress: bool = True) -> dict:
    """Run ``experiment`` at ``scale`` (only ``models``, names, if given) and write its outputs.

    ``progress``: every training run (each model and seed) shows its progress on stderr and ends with a
    summary line (``chronomem.train.progress``), whatever its own ``TrainConfig.progress``."""
    from chronomem.train.progress import reporting

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with reporting(progress, label=experiment.name):
            produced = experiment.run(scale, out, seed, models=None if models is None else tuple(models))
    except Exception:
        if created and not any(out.iterdir()):  # e.g. an unknown --models name: leave no empty directory
            out.rmdir()
        raise
    if models is not None and "paper" not in produced:  # compare with the paper's rows of these models only
        produced["paper"] = {m: row for m, row in experiment.paper.items() if m in produced["results"]}
    return finish(experiment, scale, out, produced, time.perf_counter() - start, seed)


def finish(experiment: Experiment, scale: str, out: Path, produced: dict, seconds: float, seed: int) -> dict:
    """Write results.json, report.md and results.png for what ``run`` (or ``tour``) produced."""
    results = {
        "experiment": experiment.name,
        "scale": scale,
        "seed": seed,
        "results": produced["results"],
        "paper": produced.get("paper", experiment.paper),
        "config": produced.get("config", {}),
        "seconds": round(seconds, 1),
    }
    if "extra" in produced:
        results["extra"] = produced["extra"]
    write_json_atomic(out / "results.json", results)
    (out / "report.md").write_text(report_markdown(experiment, results))
    plot_results(results, out / "results.png", experiment.metric)
    return results


def format_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.1f}"
    return str(value)


def comparison_table(ours: Table, paper: Table) -> str:
    """Markdown table, one row per model, each cell ``ours (paper)``."""
    models = list(ours) + [m for m in paper if m not in ours]
    settings: list[str] = []
    for table in (ours, paper):
        for row in table.values():
            settings += [s for s in row if s not in settings]
    lines = ["| model | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    for m in models:
        cells = []
        for s in settings:
            o, p = ours.get(m, {}).get(s), paper.get(m, {}).get(s)
            cells.append(f"{format_value(o)} ({format_value(p)})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_markdown(experiment: Experiment, results: dict) -> str:
    parts = [
        f"# {experiment.name} — scale `{results['scale']}`",
        "",
        experiment.description,
        "",
        f"Each cell: **ours** (paper). Metric: {experiment.metric}. "
        + (f"Paper numbers: {experiment.paper_source}." if experiment.paper_source else ""),
        "",
        comparison_table(results["results"], results["paper"]),
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


def plot_results(results: dict, path: Path, metric: str) -> None:
    """Grouped bars: ours (solid) and the paper's (hatched) per model and setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, paper = results["results"], results["paper"]
    keys = [(m, s) for m, row in ours.items() for s in row]
    if not keys:
        return
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(keys) + 2), 3.5))
    xs = range(len(keys))
    num = lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0
    ax.bar([x - 0.2 for x in xs], [num(ours[m][s]) for m, s in keys], 0.4, label="ours")
    ax.bar([x + 0.2 for x in xs], [num(paper.get(m, {}).get(s)) for m, s in keys], 0.4, label="paper", hatch="//",
           fill=False)
    ax.set_xticks(list(xs), [f"{m}\n{s}" for m, s in keys], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(metric)
    ax.set_title(f"{results['experiment']} ({results['scale']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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
