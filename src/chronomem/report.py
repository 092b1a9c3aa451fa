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
seeds of the same experiment and scale, each seed gets a column and the mean is added; a run of other
models with the same seeds (``--models``, run later) shares its column. A model that only the paper
has gets rows too (ours "—"), for the settings the runs measured.

Spread and claims (``Claim``, ``judge``). A run that averages several seeds lists them in results.json's
``per_seed`` (``{model: {setting: [value per seed, in seed order]}}``, the values its ``results`` cell
averages); the table then shows them and the 95% interval of their mean (Student t), and a ``chance``
column where the experiment has a chance level (``Experiment.chance``). Under the table, each claim
the experiment declares beside its paper numbers (``Experiment.claims``) is judged per setting from
these numbers: "holds" (the means in the claimed order, the intervals apart), "holds in the mean
(within the noise)" (order right, intervals overlapping), "holds in the mean (one seed)" (order
right, no interval to compare), "does not hold" (order wrong or equal; "reversed beyond the noise"
when the intervals are apart). A string such as "OOM" is the worst score. results.json records the
claims, the chance level and its label it was judged against (the experiments record them,
``chronomem.experiments.base.finish``), so the report reads nothing but results.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
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


def comparison_table(ours: Table, paper: Table, metrics: dict[str, str] | None = None,
                     run: dict[str, Any] | None = None, label: str | None = None) -> str:
    """Markdown table of our numbers beside the paper's.

    One experiment: one row per model, one column per setting, each cell ``ours (paper)``. Several
    experiments (rows named ``experiment: model``, the tour's), whose settings differ: long format,
    one row per (experiment, model, setting) with the columns experiment, model, setting, ours, paper,
    and ``metric`` when ``metrics`` (``{experiment: metric}``) is given. With ``run`` (the results.json
    the numbers come from): a cell whose run lists several seeds (``per_seed``) is ``ours [95% interval]
    (paper)``, and the chance level is a last row named ``label`` (default: the experiment's
    ``chance_label``; the tour's: a column)."""
    rows = table_rows(ours, paper)
    chance = (lambda m, s: chance_of(run, m, s)) if run is not None else (lambda m, s: None)
    if several_experiments(ours):
        levels = [chance(model, setting) for model, setting, *_ in rows]
        with_chance = any(level is not None for level in levels)
        head = ["experiment", "model", "setting", "ours", "paper"] + (["chance"] if with_chance else []) + (
            ["metric"] if metrics else [])
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (model, setting, o, p), level in zip(rows, levels, strict=True):
            experiment, name = model.split(TOUR_SEPARATOR, 1)
            cells = [experiment, name, setting, format_value(o), format_value(p)]
            cells += [_cell(level)] if with_chance else []
            cells += [metrics.get(experiment, "")] if metrics else []
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
    models = list(ours) + [m for m in paper if m not in ours]
    settings: list[str] = []
    for table in (ours, paper):
        for row in table.values():
            settings += [s for s in row if s not in settings]

    def cell(m: str, s: str) -> str:
        value = ours.get(m, {}).get(s)
        interval = None if run is None or value is None else score(value, run_seeds([run], m, s)).interval
        spread = "" if interval is None else f" {_interval_text(interval, _number(value) or interval[0])}"
        return f"{format_value(value)}{spread} ({format_value(paper.get(m, {}).get(s))})"

    lines = ["| model | " + " | ".join(settings) + " |", "|---" * (len(settings) + 1) + "|"]
    lines += [f"| {m} | " + " | ".join(cell(m, s) for s in settings) + " |" for m in models]
    levels = [chance(models[0], s) for s in settings] if models else []
    if any(level is not None for level in levels):
        lines.append(f"| {label or chance_label(run)} | " + " | ".join(_cell(level) for level in levels) + " |")
    return "\n".join(lines)


def seeds_markdown(run: dict[str, Any]) -> list[str]:
    """Each cell's per-seed values of a run that lists several (``per_seed``), in seed order."""
    listed = [(m, s, values) for m, row in (run.get("per_seed") or {}).items() for s, values in row.items()
              if len(values) > 1]
    if not listed:
        return []
    return ["Per seed, in seed order:", "", *(f"- {m}, {s}: {_seeds_text(values)}" for m, s, values in listed)]


def control_warning(run: dict[str, Any]) -> list[str]:
    """The line that heads the report of an RL run whose control (``run["control"]``) some seed did not
    learn: that model's cells cannot be read as a memory result. Empty otherwise."""
    learned = (run.get("control") or {}).get("learned", {})  # {model: [bool per seed]}
    failed = [f"`{m}` (learned by {sum(seeds)}/{len(seeds)} seeds)" for m, seeds in learned.items() if not all(seeds)]
    if not failed:
        return []
    whose = "that model's" if len(failed) == 1 else "those models'"
    return [f"**The control was not learned** by {', '.join(failed)}: with these settings the table below cannot "
            f"tell memory from learning in {whose} cells, so they cannot be read as a memory result.", ""]


def control_markdown(run: dict[str, Any]) -> list[str]:
    """The lines on an RL run's control (docs/rl.md "Controls and the memoryless agent"): the task with
    its memory demand removed, trained with the run's settings, each model's number per seed, and how
    many seeds learned it. Empty for a run without a control."""
    control = run.get("control")
    if not control:
        return []
    learned = control["learned"]
    every = all(all(seeds) for seeds in learned.values())
    lines = [f"Control (no memory needed): {control['task']}, trained with the same settings for "
             f"{control['frames']:,} frames; learned: {control['threshold']}."
             + (" Every seed of every model learned it." if every else ""), "",
             f"| model | {control['metric']} per seed | learned |", "|---|---|---|"]
    for model, values in control["per_seed"].items():
        shown = ", ".join(format_value(v) for v in values)
        lines.append(f"| {model} | {shown} | {sum(learned[model])}/{len(learned[model])} |")
    return lines


def pooled_controls(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The controls of runs pooled in one section, one per distinct task: runs of other models on the
    same control (task, frames, metric and threshold alike) share one table, their models' rows joined, and
    a model's other seeds (its run made again with ``--seed``) extend its row."""
    pooled: dict[tuple, dict[str, Any]] = {}
    for run in runs:
        if not (control := run.get("control")):
            continue
        key = (control["task"], control["frames"], control["metric"], control["threshold"])
        joined = pooled.setdefault(key, {**control, "per_seed": {}, "learned": {}})
        for model, values in control["per_seed"].items():  # runs in seed order (section): other seeds follow
            joined["per_seed"][model] = joined["per_seed"].get(model, []) + list(values)
            joined["learned"][model] = joined["learned"].get(model, []) + list(control["learned"][model])
    return list(pooled.values())


LISTED = 12  # the longest list the report writes out in full; a longer one (a learning curve) is counted


def _brief(value: Any) -> Any:
    """``value`` with every list longer than ``LISTED`` replaced by a line that counts it: a run's learning
    curves (thousands of points) are its figure and results.json's, not lines for a reader of report.md."""
    if isinstance(value, dict):
        return {key: _brief(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > LISTED:
            return f"{len(value)} entries (in results.json)"
        return [_brief(item) for item in value]
    return value


def report_markdown(experiment, results: dict) -> str:
    """``OUT/report.md`` of one run: the experiment's description, ours beside the paper's (with the 95%
    interval of each mean over seeds, the chance level), the seeds, the paper's claims judged, the notes,
    the extra measurements and the config. ``experiment`` is a ``chronomem.experiments.Experiment``."""
    budget = results["config"].get("time_budget")
    protocol = (f"Each model trained for an equal wall-clock budget of {budget:g} s per model (its step "
                "count only a far ceiling), so a slower model took fewer steps."
                if budget is not None else "Each model trained for its scale's step count (no time budget).")
    metrics = results.get("extra", {}).get("metrics")  # the tour's metric of each experiment
    several = any(len(values) > 1 for row in (results.get("per_seed") or {}).values() for values in row.values())
    control = [*control_markdown(results), ""] if results.get("control") else []  # above the memory table
    parts = [
        f"# {experiment.name} — scale `{results['scale']}`",
        "",
        *control_warning(results),
        experiment.description,
        "",
        ("" if several_experiments(results["results"]) else
         "Each cell: **ours** [95% interval of the mean over the seeds] (paper). " if several else
         "Each cell: **ours** (paper). ")
        + f"Metric: {experiment.metric}. "
        + (f"Paper numbers: {experiment.paper_source}. " if experiment.paper_source else "")
        + protocol,
        "",
        *control,
        comparison_table(results["results"], results["paper"], metrics, run=results,
                         label=getattr(experiment, "chance_label", None)),
        "",
        f"Wall time: {results['seconds']:.0f} s, seed {results['seed']}.",
    ]
    if seeds := seeds_markdown(results):
        parts += ["", *seeds]
    if claims := claims_markdown([results]):
        parts += ["", *claims]
    if experiment.notes:
        parts += ["", experiment.notes]
    if results.get("extra"):
        extra = json.dumps(_brief(results["extra"]), indent=2, default=json_default)
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
    number ("OOM") is written in place of its bar. A setting no run of ours measured (the paper's longer
    Denoise lengths at quick) has no row: the table lists it, the figure shows what was run. The figure
    grows with the rows, so no label is clipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    measured = {setting for row in results["results"].values() for setting in row}
    rows = [row for row in table_rows(results["results"], results["paper"]) if row[1] in measured]
    if not rows:
        return
    # The chance level is the experiment's (``chance_of``): the tour's rows ("experiment: model") each
    # find their own experiment's.

    def chance(model: str, setting: str) -> float | None:
        return chance_of(results, model, setting)

    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(rows)))
    ys = list(range(len(rows)))[::-1]  # the first row at the top
    bar = 0.38
    marks, labels = [], []
    for y, (model, setting, o, p) in zip(ys, rows, strict=True):
        for value, offset, style in ((o, bar / 2, dict(color="C0")), (p, -bar / 2, dict(fill=False, hatch="//"))):
            if _number(value) is not None:
                ax.barh(y + offset, _number(value), bar, **style)
                labels.append((_number(value), y + offset, format_value(value)))
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
    # Each number sits beyond its bar's end on a white ground as tall as the bar, drawn over the chance
    # mark: a bar ending near chance would otherwise have its number crossed out by the dashed line. The
    # ground's pad is in points, so it is sized once the axes' limits are final.
    ax.get_ylim()  # settles the autoscaled limits, which the transform below reads
    fontsize = 7
    bar_points = abs(ax.transData.transform((0, bar))[1] - ax.transData.transform((0, 0))[1]) * 72 / fig.dpi
    pad = max(0.0, bar_points - 1.2 * fontsize) / 2  # a line of text is about 1.2 font sizes tall
    for value, y, text in labels:
        ax.annotate(text, (value, y), xytext=(pad + 1 if value >= 0 else -pad - 1, 0), textcoords="offset points",
                    va="center", ha="left" if value >= 0 else "right", fontsize=fontsize, zorder=4,
                    bbox=dict(boxstyle=f"square,pad={pad / fontsize}", facecolor="white", edgecolor="none"))
    ax.set_title(f"{results['experiment']} ({results['scale']})")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # the box grows to hold every label
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Spread and claims: the seeds of a cell, the 95% interval of their mean, chance, the claims judged
# ----------------------------------------------------------------------------------------------

# Student t's 0.975 quantile for n - 1 = 1..30 degrees of freedom (two-sided 95%).
T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile(df: int) -> float:
    """Student t's 0.975 quantile with ``df`` degrees of freedom: the table to 30, then the Cornish-Fisher
    expansion around the normal's 1.96 (within 1e-4 of the exact value beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` (two or more) and its 95% interval, mean +- t s / sqrt(n)."""
    if len(values) < 2:
        raise ValueError(f"an interval needs two values or more, got {len(values)}")
    mean = statistics.fmean(values)
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper's claim about two models, declared beside its numbers (``Experiment.claims``): ``better``
    scores above ``worse`` (below, with ``lower_is_better``; at or above, with ``at_least``) at each of
    ``settings``, or at every setting both have (None). Model and setting names are those of the
    experiment's ``results``. ``judge`` evaluates it on a run's numbers."""

    text: str
    better: str
    worse: str
    settings: tuple[str, ...] | None = None
    lower_is_better: bool = False
    at_least: bool = False

    def relation(self) -> str:
        """The claimed order in words: "`tlb` below `transformer-xl`"."""
        word = "below" if self.lower_is_better else "above"
        return f"`{self.better}` {'at or ' if self.at_least else ''}{word} `{self.worse}`"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Claim:
        settings = data.get("settings")
        return cls(**{**data, "settings": None if settings is None else tuple(settings)})


HOLDS = "holds"
WITHIN_NOISE = "holds in the mean (within the noise)"
ONE_SEED = "holds in the mean (one seed)"
FAILS = "does not hold"
REVERSED = "does not hold (reversed beyond the noise)"
VERDICTS = (HOLDS, WITHIN_NOISE, ONE_SEED, FAILS, REVERSED)
NOT_MEASURED = "not measured"


def _not_run(value: str) -> bool:
    """A string that says a model did not run there ("n/a", "not run: ...", "not available"), unlike
    one that says it failed to ("OOM")."""
    text = value.strip().lower()
    return text in ("", "n/a", "—") or text.startswith("not ")


@dataclasses.dataclass(frozen=True)
class Score:
    """One model at one setting as a claim reads it: the mean and the seeds it averages, or the string
    of a run that failed there (``failed``, e.g. "OOM": the worst score), or nothing (not measured)."""

    mean: float | None = None
    seeds: tuple[float, ...] = ()
    failed: str | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        return mean_interval(list(self.seeds))[1:] if len(self.seeds) >= 2 else None

    def show(self) -> str:
        if self.failed is not None:
            return self.failed
        if self.mean is None:
            return "—"
        text = _like(self.mean, self.mean)
        if self.interval is not None:
            text += f" {_interval_text(self.interval, self.mean)}"
        return text


def score(cell: Any, seeds: list[Any] | None = None) -> Score:
    """The ``Score`` of a table cell and its per-seed values (None: none listed). A seed without a value
    (None: e.g. a run in which no episode ended) is left out; a string other than one saying the model
    did not run ("OOM") in the cell or in a seed is a failure."""
    values = [v for v in (seeds or []) if v is not None]
    for value in (cell, *values):
        if isinstance(value, str) and not _not_run(value):
            return Score(failed=value)
    numbers = [float(v) for v in values if _number(v) is not None]
    if numbers:
        return Score(mean=statistics.fmean(numbers), seeds=tuple(numbers))
    if _number(cell) is not None:
        return Score(mean=float(cell))
    return Score()


def verdict(better: Score, worse: Score, lower_is_better: bool = False, at_least: bool = False) -> str:
    """Whether ``better`` scores above ``worse`` (module docstring): with both intervals, "holds" needs
    them apart; a failure is the worst score."""
    if (better.failed is None and better.mean is None) or (worse.failed is None and worse.mean is None):
        return NOT_MEASURED
    if better.failed is not None or worse.failed is not None:
        return HOLDS if better.failed is None else FAILS  # runs where the other does not; both failing tie
    gap = (worse.mean - better.mean) if lower_is_better else (better.mean - worse.mean)
    tie = math.isclose(better.mean, worse.mean, rel_tol=1e-9, abs_tol=1e-12)
    right = (tie and at_least) or (gap > 0 and not tie)
    a, b = better.interval, worse.interval
    if a is None or b is None:
        return ONE_SEED if right else FAILS
    apart = a[1] < b[0] or b[1] < a[0]
    if right:
        return HOLDS if apart and not tie else WITHIN_NOISE
    return REVERSED if apart else FAILS


def judge(claim: Claim, cells) -> list[tuple[str, Score, Score, str]]:
    """``(setting, better's score, worse's score, verdict)`` for each setting the claim names that the
    run has (either model), or every setting both models have. ``cells``: ``{model: {setting: Score}}``."""
    better, worse = cells.get(claim.better, {}), cells.get(claim.worse, {})
    if claim.settings is None:
        settings = [s for s in better if s in worse]
    else:
        settings = [s for s in claim.settings if s in better or s in worse]
    return [(s, better.get(s, Score()), worse.get(s, Score()),
             verdict(better.get(s, Score()), worse.get(s, Score()), claim.lower_is_better, claim.at_least))
            for s in settings]


def declared_claims(run: dict[str, Any]) -> tuple[Claim, ...]:
    """The claims a results.json records (what its run was judged against)."""
    return tuple(Claim.from_json(c) for c in run.get("claims") or ())


def merged_claims(runs: list[dict[str, Any]]) -> tuple[Claim, ...]:
    """The claims of runs joined in one table, each once, in the order the runs first declare them: a run
    made after a claim was added declares it, an older one beside it does not."""
    return tuple(dict.fromkeys(claim for run in runs for claim in declared_claims(run)))


def resolve_chance(experiment, results: dict[str, Any]):
    """``experiment.chance`` for ``results``: a number, ``{setting: number}``, or what a callable (a level
    measured by the run, e.g. a random policy's return in ``extra``) returns for them; None if none."""
    level = getattr(experiment, "chance", None)
    return level(results) if callable(level) else level


def chance_label(run: dict[str, Any]) -> str:
    """The chance column's name, as the run records it ("random policy" where measured)."""
    return run.get("chance_label") or "chance"


def chance_of(run: dict[str, Any], model: str, setting: str) -> float | None:
    """The chance level of a row, as the run records it: a number, ``{setting: number}``, or for the
    tour's rows (each its own experiment's) ``{model: either}``."""
    level = run.get("chance")
    if several_experiments(run["results"]):
        level = (level or {}).get(model)
    return _number(level.get(setting) if isinstance(level, dict) else level)


def _seed_count(run: dict[str, Any]) -> int | None:
    """The seeds a run averaged itself (its scale's ``seeds``; 1 when it records none)."""
    config = run.get("config") if isinstance(run.get("config"), dict) else {}
    scale = config.get("scale")  # the scale's settings, or its name beside them (the RL experiments)
    count = scale.get("seeds", 1) if isinstance(scale, dict) else config.get("seeds", 1)
    return count if isinstance(count, int) else None


def run_seeds(runs: list[dict[str, Any]], model: str, setting: str) -> list[Any] | None:
    """The per-seed values of a row over ``runs``: each run's ``per_seed``, or its cell when it ran one
    seed; None when a run averaged seeds it does not list (a results.json without ``per_seed``)."""
    values: list[Any] = []
    for run in runs:
        row = run["results"].get(model, {})
        if setting not in row:
            continue
        listed = (run.get("per_seed") or {}).get(model, {}).get(setting)
        if listed is not None:
            values += list(listed)
        elif _seed_count(run) == 1:
            values.append(row[setting])
        else:
            return None
    return values


def _row_value(runs: list[dict[str, Any]], model: str, setting: str) -> Any:
    """A row's value over ``runs``: the one run's cell, or the mean of the runs' (a string if one has one)."""
    values = [r["results"][model][setting] for r in runs if setting in r["results"].get(model, {})]
    if len(values) <= 1:
        return values[0] if values else None
    strings = [v for v in values if isinstance(v, str)]
    return strings[0] if strings else _mean(values)


def _like(value: float, reference: float) -> str:
    """``value`` with the decimals ``format_value`` gives ``reference`` (an interval's ends as its mean)."""
    return f"{value:.2f}" if abs(reference) < 10 else f"{value:.1f}"


def _interval_text(interval: tuple[float, float], mean: float) -> str:
    return f"[{_like(interval[0], mean)}, {_like(interval[1], mean)}]"


def _seeds_text(values: list[Any]) -> str:
    numbers = [abs(v) for v in values if _number(v) is not None]
    reference = statistics.fmean(numbers) if numbers else 0.0
    return " / ".join("—" if v is None else _like(v, reference) if _number(v) is not None else str(v)
                      for v in values)


def claim_cells(runs: list[dict[str, Any]], claims: tuple[Claim, ...]) -> dict[str, dict[str, Score]]:
    """``{model: {setting: Score}}`` over ``runs`` for the models the claims compare (``judge``'s input)."""
    models = {m for c in claims for m in (c.better, c.worse)}
    return {m: {s: score(_row_value(runs, m, s), run_seeds(runs, m, s))
                for r in runs for s in r["results"].get(m, {})} for m in models}


def claims_markdown(runs: list[dict[str, Any]]) -> list[str]:
    """The "Claims" list under a table: each claim of the runs' experiment, per setting the two means
    (with their 95% intervals where there are seeds) and the verdict."""
    claims = merged_claims(runs)
    if not claims:
        return []
    cells = claim_cells(runs, claims)
    lines = ["**Claims**, judged from the numbers above (mean [95% interval] where there are several seeds):", ""]
    for claim in claims:
        judged = judge(claim, cells)
        lines.append(f"- {claim.text} ({claim.relation()})" + (":" if judged else ": not measured at this scale."))
        lines += [f"  - {setting}: {claim.better} {b.show()} vs {claim.worse} {w.show()}: **{result}**"
                  for setting, b, w, result in judged]
    return lines


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
    count = _seed_count(run)
    return f"seed {seed}" if count is None or count <= 1 else f"seeds {seed}-{seed + count - 1}, mean"


def row_keys(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The ``(model, setting)`` rows of ``runs``: ours in their order, then a model only the paper has
    (POPGym's GRU beside our cores) for the settings we ran."""
    rows: list[tuple[str, str]] = []
    for run in runs:
        for model, settings in run["results"].items():
            rows += [(model, s) for s in settings if (model, s) not in rows]
    ours, settings_run = {model for model, _ in rows}, {s for _, s in rows}
    rows += [(model, s) for model, row in runs[0]["paper"].items() if model not in ours
             for s in row if s in settings_run]
    return rows


def columns_of(runs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The table's columns: one per run, except that runs of the same seeds whose rows do not overlap
    (another model run later with ``--models``) share one, so the table is not a sparse matrix."""
    columns: list[list[dict[str, Any]]] = []
    for run in runs:
        keys = {(m, s) for m, row in run["results"].items() for s in row}
        for column in columns:
            taken = {(m, s) for r in column for m, row in r["results"].items() for s in row}
            if _column(column[0]) == _column(run) and not keys & taken:
                column.append(run)
                break
        else:
            columns.append([run])
    return columns


def spread_table(runs: list[dict[str, Any]]) -> list[str]:
    """The long table of ``runs`` (one experiment and scale): per (model, setting) each column's value
    (``columns_of``), their mean, the per-seed values and the 95% interval of their mean where a run
    lists its seeds (``per_seed``), the paper's number, and the chance level where the experiment has one."""
    first = runs[0]
    rows = row_keys(runs)
    columns = columns_of(runs)
    several = len(columns) > 1
    seeds = {key: run_seeds(runs, *key) for key in rows}
    # The seeds a run lists (per_seed); several runs of one seed each have a column apiece already.
    listed = any(len((r.get("per_seed") or {}).get(m, {}).get(s) or ()) > 1 for r in runs for m, s in rows)
    intervals = {key: score(_row_value(runs, *key), values).interval
                 for key, values in seeds.items() if listed and values and len(values) > 1}
    chances = {key: chance_of(first, *key) for key in rows}
    show_chance = any(level is not None for level in chances.values())
    head = ["model", "setting"] + [_column(column[0]) for column in columns] + (["mean"] if several else []) + (
        ["per seed"] if listed else []) + (
        ["95% interval"] if intervals else []) + ["paper"] + ([chance_label(first)] if show_chance else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, setting in rows:
        values = [next((r["results"][model][setting] for r in column if setting in r["results"].get(model, {})),
                       None) for column in columns]
        cells = [_cell(v) for v in values]
        mean = _row_value(runs, model, setting)
        if several:  # over every seed the runs list, as the claims take it, not the mean of the runs' rounded means
            over_seeds = score(mean, seeds[model, setting]).mean if seeds[model, setting] else None
            cells.append(_cell(over_seeds if over_seeds is not None and None not in values else _mean(values)))
        if listed:
            cells.append(_seeds_text(seeds[model, setting]) if seeds[model, setting] else "—")
        if intervals:
            interval = intervals.get((model, setting))
            cells.append("—" if interval is None else _interval_text(interval, _number(mean) or interval[0]))
        cells.append(_cell(first["paper"].get(model, {}).get(setting)))
        if show_chance:
            cells.append(_cell(chances[model, setting]))
        lines.append(f"| {model} | {setting} | " + " | ".join(cells) + " |")
    return lines


def _budget_heading(results: dict) -> str:
    budget = results.get("config", {}).get("time_budget")
    return "" if budget is None else f", equal time budget of {budget:g} s per model"


def verdict_counts(runs: list[dict[str, Any]]) -> list[tuple[Claim, dict[str, int]]]:
    """Each claim of the runs' experiment with how many of its settings got each verdict (as
    ``claims_markdown`` judges them), in the order the verdicts are listed (``VERDICTS``)."""
    claims = merged_claims(runs)
    cells = claim_cells(runs, claims)
    counts = []
    for claim in claims:
        judged = [result for *_, result in judge(claim, cells)]
        counts.append((claim, {v: judged.count(v) for v in VERDICTS if v in judged}))
    return counts


def glance_rows(runs: list[dict[str, Any]]) -> list[str]:
    """The rows of one section in the page's summary: per claim, its verdicts counted over the settings;
    a claim about a model whose RL control some seed did not learn names it before the verdicts."""
    first = runs[0]
    name = f"[{first['experiment']}](#{anchor(first)})"
    unlearned = list(dict.fromkeys(m for run in runs for m, seeds in ((run.get("control") or {}).get("learned")
                                                                     or {}).items() if not all(seeds)))

    def warning(models) -> str:
        named = [m for m in unlearned if m in models]
        return f"control not learned by {', '.join(f'`{m}`' for m in named)}" if named else ""

    counted = verdict_counts(runs)
    if not counted:
        return [f"| {name} | `{first['scale']}` | no claim judged | {warning(unlearned) or '—'} |"]
    rows = []
    for claim, counts in counted:
        shown = "; ".join(f"{v} ({n} of {sum(counts.values())})" for v, n in counts.items()) or "not measured"
        flag = warning((claim.better, claim.worse))
        rows.append(f"| {name} | `{first['scale']}` | {claim.text} | {flag + ': ' if flag else ''}{shown} |")
    return rows


def anchor(run: dict[str, Any]) -> str:
    """The Markdown anchor of a section's heading (GitHub's: lower case, punctuation dropped, spaces to -)."""
    heading = f"{run['experiment']} — {run['scale']}" + _budget_heading(run)
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def section(runs_and_sources: list[tuple[dict[str, Any], str]]) -> str:
    """The Markdown section of one (experiment, scale, time budget): one column per run, the mean, the per-seed values
    and 95% interval, the paper, the chance level; under it the claims judged (``spread_table``,
    ``claims_markdown``)."""
    runs_and_sources = sorted(runs_and_sources, key=lambda pair: (pair[0].get("seed", 0), pair[1]))
    runs = [run for run, _ in runs_and_sources]
    sources = [source for _, source in runs_and_sources]
    first = runs[0]
    several = len(runs) > 1  # of the wall times; the table's columns may be fewer (columns_of)
    lines = [
        f"## {first['experiment']} — `{first['scale']}`" + _budget_heading(first),
        "",
        f"Source: {', '.join(f'`{s}`' for s in sources)}; "
        f"{'wall time' if not several else 'wall times'} "
        + ", ".join(_wall_time(r) for r in runs) + f"; {_code(runs)}.",
        "",
        *[line for control in pooled_controls(runs)
          for line in [*control_warning({"control": control}), *control_markdown({"control": control}), ""]],
        *spread_table(runs),
    ]
    if first.get("metric"):
        lines += ["", f"Metric: {first['metric']}."]
    if claims := claims_markdown(runs):
        lines += ["", *claims]
    return "\n".join(lines)


def join_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of one experiment and scale (each of the same seed count and settings) as one
    results.json's contents. Other models join model by model: ``results``, ``per_seed`` and every
    model-keyed dict of ``extra`` (its ``runs``, ``control``...), ``config["models"]`` the union. Other seeds of
    a model (its run made again with ``--seed``) pool with the first (``_pool``): its per-seed lists and the
    lists of ``extra`` (a row per seed) follow one another in seed order, its ``results`` become the means over
    every seed (not of the runs' rounded means) and the numbers of ``extra`` (the mean apples) the means over
    its runs. A seed of a model in two runs, or runs that
    differ in seed count or settings, is a ValueError (their figure would mix two protocols)."""
    if not runs:
        raise ValueError("join_runs needs at least one run")
    runs = sorted(runs, key=lambda run: run.get("seed", 0))
    first = runs[0]
    joined = {**first, "results": {}, "per_seed": {}, "extra": {}, "config": {**first.get("config", {}), "models": []}}
    same = ("experiment", "scale")
    seeds: dict[str, set[int]] = {}  # the seeds joined so far, per model
    for run in runs:
        if any(run.get(k) != first.get(k) for k in same) or _protocol(run) != _protocol(first):
            raise ValueError(f"join_runs: runs of {first['experiment']} ({first['scale']}) must share the seeds and "
                             f"settings; {_protocol(run)} differs from {_protocol(first)}")
        own = set(range(run.get("seed", 0), run.get("seed", 0) + (_seed_count(run) or 1)))
        for model in run["results"]:
            if overlap := seeds.get(model, set()) & own:
                raise ValueError(f"join_runs: seed(s) {sorted(overlap)} of model {model!r} in more than one run")
            before = len(seeds.get(model, ())) // len(own)  # its runs joined so far, each of len(own) seeds
            seeds.setdefault(model, set()).update(own)
            if not before:
                joined["config"]["models"].append(model)
            parts = [(joined["results"], run["results"]), (joined["per_seed"], run.get("per_seed", {}))]
            parts += [(joined["extra"].setdefault(key, {}), value) for key, value in run.get("extra", {}).items()
                      if isinstance(value, dict)]  # {model: ...}: its runs, its control, its apples
            for where, values in parts:
                if model in values:
                    where[model] = _pool(where[model], values[model], before) if model in where else values[model]
            if before:  # the mean over every seed listed, as the table and the claims take it
                for setting, listed in joined["per_seed"].get(model, {}).items():
                    if setting in joined["results"][model] and (mean := score(None, listed).mean) is not None:
                        joined["results"][model][setting] = mean
    return joined


def _pool(joined: Any, more: Any, runs_before: int) -> Any:
    """A model's value from one more run pooled with its value from ``runs_before`` earlier runs of as many
    seeds (``join_runs``): lists follow one another (a value per seed), numbers become their mean over the
    runs, dicts pool key by key."""
    if isinstance(joined, list) and isinstance(more, list):
        return joined + more
    if isinstance(joined, dict) and isinstance(more, dict) and joined.keys() == more.keys():
        return {key: _pool(joined[key], more[key], runs_before) for key in joined}
    if _number(joined) is not None and _number(more) is not None:
        return (joined * runs_before + more) / (runs_before + 1)
    raise ValueError(f"join_runs cannot pool {joined!r} with {more!r} (neither lists, numbers nor dicts alike)")


def _protocol(run: dict[str, Any]) -> tuple:
    """What must agree for runs to share a figure: their seeds and their settings."""
    config = run.get("config", {})
    return (config.get("seeds"), tuple(sorted({s for cells in run["results"].values() for s in cells})))


def write_figures(paths: Iterable[str | Path], out: str | Path) -> list[Path]:
    """For each (experiment, scale) under ``paths`` whose experiment draws figures
    (``Experiment.figures``), its runs joined (``join_runs``) and drawn in ``out/<experiment>-<scale>/``:
    one figure of every model, where each run's own shows its models only. Returns the files written."""
    from chronomem.registry import get_experiment

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in find_results(paths):
        data = load_results(path)
        groups.setdefault((data["experiment"], data["scale"]), []).append(data)
    written = []
    for (name, scale), runs in sorted(groups.items()):
        draw = get_experiment(name).figures
        if draw is None:
            continue
        folder = Path(out) / f"{name}-{scale}"
        folder.mkdir(parents=True, exist_ok=True)
        runs.sort(key=lambda run: -len(run["results"]))  # the main run's models first (their colours), then add-ons
        written += draw(join_runs(runs), folder)
    return written


def results_page(paths: Iterable[str | Path], title: str = "Measured results") -> str:
    """Render every results.json under ``paths`` as one Markdown page."""
    files = find_results(paths)
    if not files:
        raise ValueError("no results.json found under the given paths")
    # One section per experiment, scale and protocol: an equal-time run (config.time_budget) is never
    # pooled with the step-count runs of the same experiment and scale.
    groups: dict[tuple[str, str, float], list[tuple[dict, str]]] = {}
    for path in files:
        data = load_results(path)
        budget = data.get("config", {}).get("time_budget")
        key = (data["experiment"], data["scale"], -1.0 if budget is None else float(budget))  # step counts first
        groups.setdefault(key, []).append((data, path.parent.as_posix()))
    parts = [
        f"# {title}",
        "",
        "Generated by `chronomem report` from the runs' `results.json`; do not edit by hand. "
        "Each cell is a number the run wrote (accuracy in % unless the section says otherwise); "
        "`paper` is the paper's number for the same cell where it has one. Where a run averaged several seeds, "
        "`per seed` lists them (in seed order) and `95% interval` gives the interval of their mean (Student t); "
        "`chance` is a guess's score (`random policy`: a random policy's, measured by the run). Under a table, "
        "each claim of the papers is judged from these numbers, per setting: **holds** (means in the claimed "
        "order, intervals apart), "
        "**holds in the mean (within the noise)** (order right, intervals overlapping), **holds in the mean "
        "(one seed)** (no interval to compare), **does not hold** (order wrong or equal; *reversed beyond the "
        "noise* when the intervals are apart). A model that ran out of memory (OOM) scores below any number.",
    ]
    ordered = [sorted(groups[key], key=lambda pair: (pair[0].get("seed", 0), pair[1])) for key in sorted(groups)]
    parts += ["", "## At a glance", "",
              "Each experiment's claims, with how many of their settings got each verdict (the sections below "
              "give the numbers).", "", "| experiment | scale | claim | verdict (settings) |", "|---|---|---|---|"]
    for group in ordered:
        parts += glance_rows([run for run, _ in group])
    for group in ordered:
        parts += ["", section(group)]
    return "\n".join(parts) + "\n"
