"""The measured-results page: ``chronomem report DIR ... > docs/results.md``.

Every ``chronomem run`` writes ``OUT/results.json`` (experiment, scale, seed, metric, results, paper,
config, seconds, code). This module gathers those files from the directories it is given and renders one
Markdown page, so the numbers in ``docs/results.md`` are never typed by hand: they are exactly what
the runs wrote.

One section per (experiment, scale). Each row is one (model, setting) pair -- long format, so an
experiment whose models report different settings (the tour) gives no sparse matrix. With several
seeds of the same experiment and scale, each seed gets a column and the mean is added. A model that
only the paper has gets rows too (ours "—"), for the settings the runs measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chronomem.experiments.base import format_value

REQUIRED_KEYS = ("experiment", "scale", "results", "paper")


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
