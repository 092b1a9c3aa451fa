"""copy-baselines: the papers' baselines (LSTM, Transformer, Transformer-XL) on Copy at T=100.

The first experiment of the stack (issue "Foundation"). Paper 004 Table 1 reports the LSTM at 99% on
Copy T=100 (its other baselines are recurrent); the Transformers have no paper number here.
Settings follow the authors' Copy setup where they apply (hidden 128, RMSprop lr 1e-3, clip 1.0).
"""

from __future__ import annotations

from pathlib import Path

from chronomem.experiments.base import Experiment, select_models, train_and_evaluate
from chronomem.registry import register_experiment
from chronomem.tasks.copy import CopyTask
from chronomem.train import TrainConfig

MODELS = {
    # name -> backbone options (width shared; depth/heads used by the attention models)
    "lstm": {"dim": 128, "depth": 1},
    "transformer": {"dim": 64, "depth": 2, "num_heads": 4},
    "transformer-xl": {"dim": 64, "depth": 2, "num_heads": 4, "segment_len": 60, "mem_len": 60},
}

SCALES = {
    # steps, batch size, wall-clock budget per model (seconds), evaluation examples
    "smoke": dict(seq_len=10, steps=3, batch_size=4, budget=None, eval_examples=16),
    "tour": dict(seq_len=100, steps=3000, batch_size=32, budget=60, eval_examples=256),
    "quick": dict(seq_len=100, steps=4000, batch_size=32, budget=300, eval_examples=1000),
    "paper": dict(seq_len=100, steps=100_000, batch_size=10, budget=None, eval_examples=10_000),
}


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None) -> dict:
    s = SCALES[scale]
    configs = {m: dict(MODELS[m]) for m in select_models(MODELS, models, "copy-baselines")}
    if "transformer-xl" in configs and scale == "smoke":
        configs["transformer-xl"].update(segment_len=8, mem_len=8)
    task = CopyTask(seq_len=s["seq_len"])
    results, extra = {}, {}
    for model, options in configs.items():
        cfg = TrainConfig(
            steps=s["steps"], batch_size=s["batch_size"], lr=1e-3, optimizer="adamw" if model != "lstm" else "rmsprop",
            clip=1.0, seed=seed, eval_examples=s["eval_examples"], time_budget=s["budget"], progress=False,
        )
        row = train_and_evaluate(model, task, options, cfg)
        results[model] = {f"T={s['seq_len']}": row["accuracy"]}
        extra[model] = {k: row[k] for k in ("seconds", "steps", "stopped_early", "parameters")}
    return {"results": results, "config": {"scale": s, "models": configs}, "extra": extra}


COPY_BASELINES = register_experiment(
    Experiment(
        name="copy-baselines",
        description="Baselines (LSTM, Transformer, Transformer-XL) on the Copy task at T=100.",
        run=_run,
        paper={"lstm": {"T=100": 99.0}},
        metric="accuracy on the 10 copied symbols (%)",
        paper_source="paper 004 Table 1 (LSTM); the Transformers are not reported there",
        tour=lambda out, seed: _run("tour", out, seed),
    )
)
