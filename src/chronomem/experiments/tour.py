"""tour: every registered experiment's flagship at a small CPU budget, in one table (``make demo``).

Each experiment that sets ``tour`` contributes its rows (about three minutes per model on 2 cores);
``--scale smoke`` runs each contributor's smoke scale instead (seconds; what the tests run).
"""

from __future__ import annotations

import time
from pathlib import Path

from chronomem.experiments.base import Experiment
from chronomem.registry import EXPERIMENTS, register_experiment


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None) -> dict:
    if models is not None:
        raise ValueError("tour runs each experiment's own tour models and takes no model list; "
                         "use `chronomem run EXPERIMENT --models ...` to choose models")
    results, paper, extra = {}, {}, {}
    for name in sorted(EXPERIMENTS):
        experiment = EXPERIMENTS[name]
        if experiment.tour is None:
            continue
        start = time.perf_counter()
        sub_out = Path(out) / name
        sub_out.mkdir(parents=True, exist_ok=True)
        produced = experiment.run("smoke", sub_out, seed) if scale == "smoke" else experiment.tour(sub_out, seed)
        for model, row in produced["results"].items():
            key = f"{name}: {model}"
            results[key] = row
            paper[key] = {setting: experiment.paper.get(model, {}).get(setting) for setting in row}
        extra[name] = {"seconds": round(time.perf_counter() - start, 1), "metric": experiment.metric,
                       "details": produced.get("extra", {})}
    return {"results": results, "paper": paper, "config": {"scale": scale}, "extra": extra}


TOUR = register_experiment(
    Experiment(
        name="tour",
        description="Each mechanism's flagship experiment at a small CPU budget (the main job, `make demo`).",
        run=_run,
        metric="each row's own metric (see extra)",
        notes="Tour budgets are far below the papers': read the numbers as a smoke check of learning, "
        "and `chronomem run EXPERIMENT --scale quick|paper` for the reproductions.",
    )
)
