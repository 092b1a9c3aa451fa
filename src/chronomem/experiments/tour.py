"""tour: every registered experiment's flagship at its ``tour`` scale, in one table (``make demo``).

Each experiment whose scales include ``"tour"`` contributes that scale's models, each sized to train
in about a minute on 2 cores (step counts, so the table is the same on any machine); ``--scale smoke``
runs each contributor's smoke scale instead (seconds; what the tests run). ``quick``, the CLI's
default scale, means the tour scale here. ``--jobs K`` goes to each contributor in turn: its runs go
K at a time (``chronomem.experiments.jobs``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from chronomem.experiments.base import Experiment, jobs_option
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import EXPERIMENTS, register_experiment
from chronomem.report import TOUR_SEPARATOR, Claim, resolve_chance


def contributors() -> list[Experiment]:
    """The experiments with a tour scale, by name."""
    return [EXPERIMENTS[name] for name in sorted(EXPERIMENTS)
            if name != "tour" and "tour" in EXPERIMENTS[name].scales]


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL) -> dict:
    if models is not None:
        raise ValueError("tour runs each experiment's own tour models and takes no model list; "
                         "use `chronomem run EXPERIMENT --scale tour --models ...` to choose models")
    scale = "smoke" if scale == "smoke" else "tour"
    options = {experiment.name: jobs_option(experiment, jobs) for experiment in contributors()}  # before any runs
    results, paper, configs, seconds, metrics, details, chance, claims = {}, {}, {}, {}, {}, {}, {}, []
    for experiment in contributors():
        name = experiment.name
        start = time.perf_counter()
        sub_out = Path(out) / name
        sub_out.mkdir(parents=True, exist_ok=True)
        produced = experiment.run(scale, sub_out, seed, time_budget=time_budget, progress=progress, **options[name])
        for model, row in produced["results"].items():
            key = f"{name}{TOUR_SEPARATOR}{model}"
            results[key] = row
            paper[key] = {setting: experiment.paper.get(model, {}).get(setting) for setting in row}
        configs[name] = produced.get("config", {})
        seconds[name] = round(time.perf_counter() - start, 1)
        metrics[name] = experiment.metric
        details[name] = produced.get("extra", {})
        chance.update(contributed_chance(experiment, produced))
        claims += contributed_claims(experiment, produced["results"])
    extra = {"seconds": seconds, "metrics": metrics, "details": details}
    return {"results": results, "paper": paper, "config": {"experiments": configs}, "extra": extra,
            "scale": scale, "claims": tuple(claims), "chance": chance}


def contributed_claims(experiment: Experiment, rows: dict) -> list[Claim]:
    """A contributor's claims that its tour rows can judge, named as the tour names its rows."""
    name, claims = experiment.name, []
    for claim in experiment.claims:
        if claim.better in rows and claim.worse in rows:  # the tour runs a few of each one's models
            claims.append(dataclasses.replace(claim, text=f"{name}: {claim.text}",
                                              better=f"{name}{TOUR_SEPARATOR}{claim.better}",
                                              worse=f"{name}{TOUR_SEPARATOR}{claim.worse}"))
    return claims


def contributed_chance(experiment: Experiment, produced: dict) -> dict:
    """``{tour row: the contributor's chance level}`` (a number or ``{setting: number}``) for its rows."""
    level = resolve_chance(experiment, produced)
    return {f"{experiment.name}{TOUR_SEPARATOR}{model}": level for model in produced["results"]}


TOUR = register_experiment(
    Experiment(
        name="tour",
        description="Each mechanism's flagship experiment at its tour scale, about a minute per model on "
        "2 cores (the main job, `make demo`).",
        run=_run,
        metric="each experiment's own, an accuracy in % (report.md's metric column)",
        notes="Tour step counts are far below the papers': read the numbers as a check that each model "
        "learns, and `chronomem run EXPERIMENT --scale quick|paper` for the reproductions.",
        scales=("smoke", "tour", "quick"),
    )
)
