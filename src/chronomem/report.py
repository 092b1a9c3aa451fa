"""Every rendering of measured results: one run's tables and figure, and the results page of many.

* One run: every ``chronomem run`` writes ``OUT/results.json`` (experiment, scale, seed, metric,
  results, paper, config, seconds, code); ``report_markdown`` renders its ``OUT/report.md`` (ours beside
  the paper's, ``comparison_table``) and ``plot_results`` its ``OUT/results.png``. The experiments
  produce numbers only; how they read is decided here.
* The page: ``chronomem report DIR ... > docs/results.md`` gathers the results.json files under the
  given directories and renders one Markdown page (``results_page``), so the numbers in
  ``docs/results.md`` are never typed by hand: they are exactly what the runs wrote.

One section per (experiment, scale). Each row is one (model, setting) pair -- long format, so an
experiment whose models report different settings (the tour) gives no sparse matrix. With several
seeds of the same experiment and scale, each seed gets a column and the mean is added. A model that
only the paper has gets rows too (ours "—"), for the settings the runs measured.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REQUIRED_KEYS = ("experiment", "scale", "results", "paper")
Table = dict[str, dict[str, Any]]


# ----------------------------------------------------------------------------------------------
# One run: its table, report.md and results.png (written by chronomem.experiments.base.finish)
# ----------------------------------------------------------------------------------------------


def json_default(obj):
    """How results.json and report.md write a value JSON does not know: a dataclass as its fields, a
    tensor or numpy scalar as its number, anything else as its string."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


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


def report_markdown(experiment, results: dict) -> str:
    """``OUT/report.md`` of one run: the experiment's description, ours beside the paper's, the notes, the
    extra measurements and the config. ``experiment`` is a ``chronomem.experiments.Experiment``."""
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
        extra = json.dumps(results["extra"], indent=2, default=json_default)
        parts += ["", "## Extra measurements", "", "```json", extra, "```"]
    parts += ["", "## Config", "", "```json", json.dumps(results["config"], indent=2, default=json_default), "```", ""]
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


# ----------------------------------------------------------------------------------------------
# The results page of many runs
# ----------------------------------------------------------------------------------------------


def find_results(paths: Iterable[str | Path]) -> list[Path]:
    """Every ``results.json`` under ``paths`` (a file is taken as it is), sorted by path.

    A run's sub-runs (the tour writes one directory per experiment) are skipped when a parent
    directory holds a results.json of its own: the parent's already contains their rows.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(path.rglob("results.json"))
        else:
            raise ValueError(f"results path {str(path)!r} does not exist")
    found = sorted(set(found))
    dirs = {p.parent for p in found}
    return [p for p in found if not any(parent in dirs for parent in p.parent.parents)]


def load_results(path: Path) -> dict[str, Any]:
    """Read one results.json and check it has the keys a report needs."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path} is not a chronomem results.json: missing {missing}")
    return data


def _wall_time(run: dict[str, Any]) -> str:
    """A run's seconds; a resumed run's are those of the call that finished it, and it says so."""
    seconds = f"{run.get('seconds', float('nan')):.0f} s"
    if run.get("config", {}).get("resumed"):
        return f"{seconds} (of the resumed call; the runs it loaded trained before it)"
    return seconds


def _code(runs: list[dict[str, Any]]) -> str:
    """Which code made the runs: their commits (``code`` in results.json), so a table older than the
    code beside it shows that it is."""
    made = []
    for run in runs:
        code = run.get("code") or {}
        commit = code.get("commit")
        label = "not recorded" if not commit else f"`{commit[:10]}`" + (" with uncommitted changes" if code.get("dirty")
                                                                         else "")
        made += [label] if label not in made else []
    return "code: commit " + ", ".join(made)


def _cell(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return format_value(value)


def _mean(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) != len(values) or not numbers:
        return None
    return sum(numbers) / len(numbers)


def _column(run: dict[str, Any]) -> str:
    """A run's column: its seed, or the seeds it averaged over itself (a scale with ``seeds`` > 1)."""
    seed = run.get("seed", 0)
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    scale = config.get("scale")  # the scale's settings, or its name beside them (the RL experiments)
    count = scale.get("seeds", 1) if isinstance(scale, dict) else config.get("seeds", 1)
    return f"seed {seed}" if not isinstance(count, int) or count <= 1 else f"seeds {seed}-{seed + count - 1}, mean"


def section(runs_and_sources: list[tuple[dict[str, Any], str]]) -> str:
    """The Markdown section of one (experiment, scale): one column per seed, the mean, the paper."""
    runs_and_sources = sorted(runs_and_sources, key=lambda pair: (pair[0].get("seed", 0), pair[1]))
    runs = [run for run, _ in runs_and_sources]
    sources = [source for _, source in runs_and_sources]
    first = runs[0]
    rows: list[tuple[str, str]] = []
    for run in runs:
        for model, settings in run["results"].items():
            rows += [(model, s) for s in settings if (model, s) not in rows]
    # A model only the paper has (POPGym's GRU beside our cores): its rows for the settings we ran.
    ours, settings_run = {model for model, _ in rows}, {s for _, s in rows}
    rows += [(model, s) for model, row in first["paper"].items() if model not in ours
             for s in row if s in settings_run]
    several = len(runs) > 1
    head = ["model", "setting"] + [_column(r) for r in runs] + (["mean"] if several else []) + ["paper"]
    lines = [
        f"## {first['experiment']} — `{first['scale']}`",
        "",
        f"Source: {', '.join(f'`{s}`' for s in sources)}; "
        f"{'wall time' if not several else 'wall times'} "
        + ", ".join(_wall_time(r) for r in runs) + f"; {_code(runs)}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for model, setting in rows:
        values = [r["results"].get(model, {}).get(setting) for r in runs]
        cells = [_cell(v) for v in values]
        if several:
            cells.append(_cell(_mean(values)))
        cells.append(_cell(first["paper"].get(model, {}).get(setting)))
        lines.append(f"| {model} | {setting} | " + " | ".join(cells) + " |")
    if first.get("metric"):
        lines += ["", f"Metric: {first['metric']}."]
    return "\n".join(lines)


def results_page(paths: Iterable[str | Path], title: str = "Measured results") -> str:
    """Render every results.json under ``paths`` as one Markdown page."""
    files = find_results(paths)
    if not files:
        raise ValueError("no results.json found under the given paths")
    groups: dict[tuple[str, str], list[tuple[dict, str]]] = {}
    for path in files:
        data = load_results(path)
        groups.setdefault((data["experiment"], data["scale"]), []).append((data, path.parent.as_posix()))
    parts = [
        f"# {title}",
        "",
        "Generated by `chronomem report` from the runs' `results.json`; do not edit by hand. "
        "Each cell is a number the run wrote (accuracy in % unless the section says otherwise); "
        "`paper` is the paper's number for the same cell where it has one.",
    ]
    for key in sorted(groups):
        parts += ["", section(groups[key])]
    return "\n".join(parts) + "\n"
