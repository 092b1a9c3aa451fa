"""listops and listops-length: paper 002 Tables 1 and 5 (and paper 003 Table 4) on Long Range Arena ListOps.

``listops`` trains a Transformer, TLB, BLRP and Transformer-XL on generated ListOps and reports test
accuracy (mean over seeds; each seed in ``extra``). ``listops-length`` evaluates
the models that ``listops`` trained (their checkpoints in the sibling run directory ``../listops``,
else it trains them again at the same scale) on the test set made 1x-4x longer by joining copies of
each expression under a MAX (paper 002 Table 5), which keeps every label.

Scales:

* ``paper``: LRA data (500 < length < 2000, 96,000 / 2,000 / 2,000), batch 32, 5,000 steps, and every
  model configured as its source configures it (``PAPER_MODELS``; LRA files are in
  google-research/long-range-arena):

  - TLB: the authors' LRA model and training (``lra_benchmarks/listops/configs/transformer_tlb_base.py``
    on ``base_listops_config.py``, model ``models/transformer_tlb/transformer_tlb.py``): the
    ``authors`` preset (``TLB.Config.authors``), width 512, attention width 512, FFN 1024, 8 heads,
    ``R=2, N=K=100``, dropout 0.1, LRA's ReLU classifier head of width 1024; Adam with decoupled
    weight decay 0.1, betas (0.9, 0.98), eps 1e-9, no clipping, and LRA's schedule
    ``0.05 / 4 * min(1, step / 1000) / sqrt(max(step, 1000))`` (``utils/train_utils.py``), i.e. a
    linear warm-up to 3.95e-4 at step 1,000 then ``rsqrt`` decay.
  - Transformer: LRA's ListOps Transformer (``listops/configs/transformer_base.py`` on
    ``base_listops_config.py``, model ``models/transformer/transformer.py``): width 512, 4 layers,
    8 heads, FFN 1024, dropout 0.1, the ReLU head of width 1024; the same optimiser and schedule with
    base lr 0.05 (peak 1.58e-3).
  - BLRP: paper 002 Table 2: emb 64, FFN hidden 128, 8 heads, segment 100, latent 100, AdamW lr 4e-4,
    betas (0.9, 0.98), eps 1e-9, linear decay, clipping at 1. Paper 002 gives no step count; we use
    LRA's 5,000 (``base_listops_config.py``).
  - Transformer-XL (ours, no paper row): BLRP's sizes and optimiser, segment and memory 100.

  Meant for a GPU.
* ``quick``: a CPU-sized ListOps (50 < length < 150, 20,000 training expressions), one shared width
  for every model (64, as paper 002 Table 2) with each model's own defaults (TLB without the
  ``authors`` preset), chunk/segment 20 with 20 state/latent vectors (sequences span 3-8 segments, as LRA's
  span 5-20 segments of 100), the paper's optimiser with lr 1e-3 decaying linearly to 0, 3 seeds, and
  the same 1,500 steps for every model (equal steps: a slower model takes longer; about an hour for
  the 12 runs on 2 cores). ``run_experiment(..., time_budget=280)`` gives the equal-time comparison
  instead, its decay annealed over the budget so that a model the clock cuts also ends at lr 0.
* ``tour``: TLB and BLRP only, one seed, about a minute each. ``smoke``: seconds, for the tests.

Deviations at ``paper`` scale (docs/listops.md lists them): the LRA Transformer pools a CLS token and
its blocks use bias-free attention, LayerNorm eps 1e-6 and tanh GELU; ours mean-pools with our blocks.
LRA pads every example to 2,000 tokens; we pad a batch to its longest example (and TLB skips
all-padding chunks, which the authors' code does not). LRA's warm-up starts at lr 0 on step 0, ours at
``lr / 1000``. At ``quick`` scale the Transformer has the width and depth of the memories (2 layers)
so that the comparison is like for like.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from chronomem.experiments.base import Experiment, Scale, TrainRun, select_models, train_seeds
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import names, register_experiment
from chronomem.report import Claim
from chronomem.tasks.listops import MAX, MIN, OPERATORS, ListOpsTask

PAPER_ACCURACY = {  # paper 002 Table 1 (BLRP) and paper 003 Table 4 (TLB, Transformer; LRA's Transformer)
    "blrp": {"accuracy": 41.43},
    "tlb": {"accuracy": 38.2},
    "transformer": {"accuracy": 37.6},
}
PAPER_LENGTH = {  # paper 002 Table 5: accuracy on test expressions joined k times under a MAX
    "blrp": {"x1": 41.43, "x2": 36.04, "x3": 35.84, "x4": 35.79},
    "tlb": {"x1": 38.2, "x2": 16.98, "x3": 15.70, "x4": 14.86},
}
FACTORS = (1, 2, 3, 4)


@dataclass(frozen=True, kw_only=True)
class ListOpsData:
    """The generated splits (``ListOpsTask`` arguments); lengths are strict bounds, as LRA's."""

    min_length: int
    max_length: int
    num_train: int
    num_val: int
    num_test: int


CPU_DATA = ListOpsData(min_length=50, max_length=150, num_train=20_000, num_val=500, num_test=1_000)
ALL_MODELS = ("transformer", "tlb", "blrp", "transformer-xl")


@dataclass(frozen=True, kw_only=True)
class ListOpsScale(Scale):
    data: ListOpsData
    # One width shared by every model (paper 002 Table 2: emb 64, FFN 128, 8 heads), like for like.
    dim: int = 64
    num_heads: int = 8
    ff_mult: float = 2.0
    segment: int = 20  # TLB chunk / BLRP segment / TrXL segment and memory: sequences span 3-8 of them
    memory: int = 20  # TLB state / BLRP latent vectors
    # paper 002 Sec. 4 / Table 2: AdamW, betas (0.9, 0.98), eps 1e-9, linear decay, clip 1
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    schedule: str = "linear"
    seeds: int = 1  # seeds seed, seed + 1, ...; the table reports their mean
    models: tuple[str, ...] = ALL_MODELS
    own: tuple[str, ...] = ()  # configured from PAPER_MODELS (their sources); the others from the fields
    max_depth: int = 10  # the expressions' nesting (LRA's 10; listops-length-easy: 3)
    max_args: int = 10  # arguments per operator, 2..max_args (LRA's 10; listops-length-easy: 5)
    operators: tuple[str, ...] = OPERATORS  # LRA's four; listops-length-easy: MIN and MAX

    def train_config(self, seed: int, time_budget: float | None = None, progress: bool = False, **options):
        return super().train_config(seed, time_budget, progress, **{"betas": self.betas, "eps": self.eps, **options})


SCALES = {
    "smoke": ListOpsScale(data=ListOpsData(min_length=10, max_length=40, num_train=64, num_val=16, num_test=32),
                          dim=16, num_heads=2, segment=8, memory=8, lr=1e-3, steps=3, batch_size=8,
                          eval_examples=32),
    # About a minute per model on 2 cores (BLRP, the slower, ~6 steps/s); 10,000 training expressions,
    # as 400 steps of 32 see each about once (generating 20,000 took 45-65 s on a busy machine).
    "tour": ListOpsScale(data=replace(CPU_DATA, num_train=10_000), lr=1e-3, steps=400,
                         batch_size=32, eval_examples=1_000, models=("tlb", "blrp")),
    # 1,500 steps: about the hour the 12 runs took under the 280 s per run this scale was sized for (the
    # Transformer reached ~2,200 steps in 280 s, TLB ~1,700, BLRP ~1,000). CPU scales: lr 1e-3, as they
    # train for only a few thousand steps.
    "quick": ListOpsScale(data=CPU_DATA, lr=1e-3, steps=1_500, batch_size=32, eval_examples=1_000, seeds=3),
    # LRA's data and step count (base_listops_config.py); paper 002 Table 2's lr 4e-4.
    "paper": ListOpsScale(data=ListOpsData(min_length=500, max_length=2000, num_train=96_000, num_val=2_000,
                                           num_test=2_000),
                          segment=100, memory=100, lr=4e-4, steps=5_000, batch_size=32, eval_examples=2_000,
                          seeds=3, own=("transformer", "tlb")),
}

# listops-length-easy: the length test on a ListOps that quick's models learn (docs/listops.md has the
# probes). With all four operators they do not learn SM and MED in a few thousand steps, even 3 deep; with
# up to 10 arguments a MIN or MAX at the root almost fixes the answer. MIN and MAX, at most 3 deep with
# 2-5 arguments, must be computed through the nesting. Such expressions are 21-37 tokens long, so segments
# and memories are 10 (3-4 segments at 1x, 9-15 at 4x; LRA spans 5-20 segments of 100).
EASY_DATA = ListOpsData(min_length=20, max_length=100, num_train=20_000, num_val=500, num_test=1_000)
EASY_EXPRESSIONS = dict(max_depth=3, max_args=5, operators=(MIN, MAX))
EASY_SCALES = {
    "smoke": replace(SCALES["smoke"], **EASY_EXPRESSIONS),
    "quick": replace(SCALES["quick"], data=EASY_DATA, segment=10, memory=10, steps=6_000, **EASY_EXPRESSIONS),
    # No paper row exists for this data: the quick settings with LRA's split sizes.
    "paper": replace(SCALES["quick"], data=replace(EASY_DATA, num_train=96_000, num_val=2_000, num_test=2_000),
                     segment=10, memory=10, steps=6_000, **EASY_EXPRESSIONS),
}

# LRA's optimiser (lra_benchmarks/listops/train.py, create_optimizer; base_listops_config.py) and
# schedule (utils/train_utils.py, create_learning_rate_scheduler: "constant * linear_warmup *
# rsqrt_decay", warm-up 1,000). Our lr is the schedule's peak, base / sqrt(1000), reached at step 1,000.
LRA_WARMUP = 1_000
LRA_TRAIN = dict(optimizer="adamw", betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1, clip=None,
                 schedule="rsqrt", warmup=LRA_WARMUP)
# The LRA ListOps sizes (base_listops_config.py): emb 512, qkv 512, mlp 1024, 8 heads, 4 layers; the
# models' dropout defaults (0.1); classifier_head: Dense(mlp_dim) -> ReLU -> Dense.
LRA_HEAD = dict(readout="relu_mlp", mlp_dim=1_024)
PAPER_MODELS = {
    "tlb": dict(  # transformer_tlb_base.py: learning_rate 0.05 / 4; R=2, N=K=100, one cross layer each way
        model=dict(preset="authors", dim=512, qkv_dim=512, ff_mult=2.0, num_heads=8, depth=1,
                   self_per_cross=2, chunk_size=100, num_state=100, dropout=0.1, **LRA_HEAD),
        train=dict(LRA_TRAIN, lr=0.05 / 4 / math.sqrt(LRA_WARMUP)),
    ),
    "transformer": dict(  # transformer_base.py: base_listops_config.py as is, learning_rate 0.05
        model=dict(dim=512, depth=4, num_heads=8, ff_mult=2.0, dropout=0.1, **LRA_HEAD),
        train=dict(LRA_TRAIN, lr=0.05 / math.sqrt(LRA_WARMUP)),
    ),
}


def model_options(model: str, s: ListOpsScale) -> dict:
    """Model options at a scale. A model the scale configures from its source (``s.own``, the
    ``paper`` scale) takes ``PAPER_MODELS``; otherwise: one shared width, and two self-attention
    layers everywhere (TLB: R=2 self layers then one cross layer per chunk; BLRP: Theta_SELF has two)."""
    if model in s.own:
        return dict(PAPER_MODELS[model]["model"])
    width = dict(dim=s.dim, num_heads=s.num_heads, ff_mult=s.ff_mult)
    if model == "transformer":
        return {**width, "depth": 2}
    if model == "transformer-xl":
        return {**width, "depth": 2, "segment_len": s.segment, "mem_len": s.segment}
    if model == "tlb":
        return {**width, "depth": 1, "self_per_cross": 2, "chunk_size": s.segment, "num_state": s.memory}
    if model == "blrp":
        return {**width, "depth": 2, "segment_size": s.segment, "latent_size": s.memory}
    raise ValueError(f"no ListOps settings for model {model!r}")


def make_task(s: ListOpsScale, seed: int, progress: bool = False) -> ListOpsTask:
    return ListOpsTask(**asdict(s.data), max_depth=s.max_depth, max_args=s.max_args, operators=s.operators,
                       seed=seed, progress=progress)


def train_config(s: ListOpsScale, seed: int, model: str | None = None, time_budget: float | None = None,
                 progress: bool = False):
    """The trainer's settings of ``model`` at scale ``s``: the scale's, or its source's optimiser and
    schedule for a model the scale configures from its source."""
    return s.train_config(seed, time_budget, progress, **(PAPER_MODELS[model]["train"] if model in s.own else {}))


def describe_optimizer(config) -> str:
    clip = "no clipping" if config.clip is None else f"clip {config.clip}"
    warmup = f"warm-up {config.warmup}, " if config.warmup else ""
    return (f"{config.optimizer} lr {config.lr:.4g} betas {config.betas} eps {config.eps:g} weight decay "
            f"{config.weight_decay:g}, {warmup}{config.schedule} schedule, {clip}")


MODEL_SOURCES = {  # where each model's paper-scale configuration comes from
    "tlb": "the authors' LRA code: google-research/long-range-arena, listops/configs/transformer_tlb_base.py "
           "(on base_listops_config.py) and models/transformer_tlb/transformer_tlb.py",
    "transformer": "LRA: google-research/long-range-arena, listops/configs/transformer_base.py (on "
                   "base_listops_config.py) and models/transformer/transformer.py",
    "blrp": "paper 002 Table 2",
    "transformer-xl": "ours (no paper row): BLRP's sizes and optimiser",
}


def _available(model: str) -> bool:
    return model in names()["models"]


def _train_all(s: ListOpsScale, out: Path, seed: int, models: tuple[str, ...] | None = None,
               time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL,
               resume: bool = False) -> dict:
    models = select_models(s.models, models, "listops")
    task = make_task(s, seed, progress)
    task.split("train")  # generated here, once (with the test and val splits): every run gets this data
    trained = [m for m in models if _available(m)]
    runs = [TrainRun(model, task, model_options(model, s), train_config(s, seed, model, time_budget, progress))
            for model in trained]
    over_seeds = train_seeds(runs, s.seeds, out, jobs, cells=lambda row: {"accuracy": row["accuracy"]},
                             resume=resume)
    results = {m: over_seeds["results"].get(m, {"accuracy": "not available"}) for m in models}
    per_seed = over_seeds["per_seed"]
    extra = {"per_seed": {m: row["accuracy"] for m, row in per_seed.items()}, "runs": over_seeds["runs"]}
    if s.seeds > 1:
        extra["std"] = {m: statistics.stdev(row["accuracy"]) for m, row in per_seed.items()}
    extra["data"] = describe_data(task)
    config = {"scale": asdict(s), "task": task.describe(), "models": {m: model_options(m, s) for m in models},
              "optimizer": {m: describe_optimizer(train_config(s, seed, m)) for m in models},
              "sources": {m: MODEL_SOURCES[m] for m in models if m in MODEL_SOURCES}}
    return {"results": results, "per_seed": per_seed, "config": config, "extra": extra}


def describe_data(task: ListOpsTask) -> dict:
    """Length range and label distribution of the splits (labels are not balanced in LRA either)."""
    info = {}
    for split in ("train", "test"):
        lengths = task.lengths(split)
        info[split] = {
            "examples": int(len(lengths)), "min_length": int(lengths.min()), "max_length": int(lengths.max()),
            "mean_length": round(float(lengths.mean()), 1), "labels": task.label_counts(split),
        }
    counts = info["test"]["labels"]
    info["majority_class_accuracy"] = round(100.0 * max(counts.values()) / max(1, sum(counts.values())), 2)
    return info


def _run_listops(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
                 time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL,
                 resume: bool = False) -> dict:
    return _train_all(SCALES[scale], out, seed, models, time_budget, progress, jobs, resume)


# --------------------------------------------------------------------------------------------
# listops-length
# --------------------------------------------------------------------------------------------


def _trained_runs(listops_dir: Path, scale: str, models: tuple[str, ...]) -> dict[str, list[Path]] | None:
    """``{model: [run dirs]}`` of ``models`` in a finished ``listops`` run at ``scale``, or ``None``."""
    results = listops_dir / "results.json"
    if not results.exists():
        return None
    info = json.loads(results.read_text())
    if info.get("scale") != scale:
        return None
    runs: dict[str, list[Path]] = {}
    for model in models:
        dirs = sorted(p for p in (listops_dir / model).glob("seed*")
                      if (p / "checkpoints" / "latest").exists())
        if dirs:
            runs[model] = dirs
    return runs or None


def _evaluate_lengths(run_dir: Path, s: ListOpsScale, device=None) -> dict[str, float | str]:
    """Accuracy of one trained run on the test set at each length factor ("OOM" if it does not fit)."""
    import torch

    from chronomem.train import build, evaluate, load_checkpoint

    spec = json.loads((run_dir / "config.json").read_text())["spec"]
    model, task = build(spec)
    load_checkpoint(run_dir, model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    batch = max(1, s.batch_size // 2)
    row: dict[str, float | str] = {}
    for k in FACTORS:
        try:
            row[f"x{k}"] = evaluate(model, task.with_augment(k), batch, s.eval_examples)["accuracy"]
        except torch.OutOfMemoryError:  # a full-attention model at 4x LRA length may not fit
            row[f"x{k}"] = "OOM"
            if device != "cpu":
                torch.cuda.empty_cache()
    return row


def _evaluate_run(job: tuple[Path, ListOpsScale]) -> dict[str, float | str]:
    """``_evaluate_lengths(run_dir, s)`` of ``job = (run_dir, s)`` (the job of ``Jobs.map``)."""
    return _evaluate_lengths(*job)


def _mean(values: list) -> float | str:
    """Mean over seeds; a string (e.g. "OOM") if any seed has one."""
    strings = [v for v in values if isinstance(v, str)]
    return strings[0] if strings else statistics.fmean(values)


def _run_length(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
                time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL,
                resume: bool = False) -> dict:
    return length_test(SCALES[scale], scale, "listops-length", Path(out).parent / "listops", out, seed, models,
                       time_budget, progress, jobs, resume)


def _run_length_easy(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
                     time_budget: float | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL,
                     resume: bool = False) -> dict:
    return length_test(EASY_SCALES[scale], scale, "listops-length-easy", None, out, seed, models, time_budget,
                       progress, jobs, resume)


def length_test(s: ListOpsScale, scale: str, name: str, listops_dir: Path | None, out: Path, seed: int,
                models: tuple[str, ...] | None, time_budget: float | None, progress: bool, jobs: Jobs,
                resume: bool) -> dict:
    """The models of ``listops_dir`` (a finished listops run at ``scale``; None: none is looked for), or
    trained here with ``s``, evaluated on the test set joined 1-4 times."""
    out = Path(out)
    models = select_models(s.models, models, name)
    runs = None if listops_dir is None else _trained_runs(listops_dir, scale, models)
    source = str(listops_dir)
    data = None
    if runs is None:  # train them here (same settings as the listops experiment)
        trained = _train_all(s, out / "listops", seed, models, time_budget, progress, jobs, resume)
        (out / "listops").mkdir(parents=True, exist_ok=True)
        (out / "listops" / "results.json").write_text(json.dumps({"scale": scale, **trained}, default=str))
        runs = _trained_runs(out / "listops", scale, models) or {}
        data = trained["extra"]["data"]
        source = "trained here" + ("" if listops_dir is None else " (no listops run at this scale in ../listops)")
    results, per_seed, by_run, kept = {}, {}, {}, {}
    evaluated = iter(jobs.map(_evaluate_run, [(d, s) for dirs in runs.values() for d in dirs]))
    for model, dirs in runs.items():
        rows = [next(evaluated) for _ in dirs]  # the run directories seed0, seed1, ... in seed order
        by_run[model] = {d.name: r for d, r in zip(dirs, rows, strict=True)}
        per_seed[model] = {f"x{k}": [r[f"x{k}"] for r in rows] for k in FACTORS}
        results[model] = {f"x{k}": _mean(per_seed[model][f"x{k}"]) for k in FACTORS}
        x1, x4 = results[model]["x1"], results[model]["x4"]
        numbers = not isinstance(x1, str) and not isinstance(x4, str)
        kept[model] = round(x4 / max(x1, 1e-9), 3) if numbers else None
    config = {"scale": asdict(s), "models": list(runs), "checkpoints": source, "factors": FACTORS}
    extra = {"per_seed": by_run, "x4_over_x1": kept, **({"data": data} if data is not None else {})}
    return {"results": results, "per_seed": per_seed, "config": config, "extra": extra}


LISTOPS = register_experiment(
    Experiment(
        name="listops",
        description="Transformer, TLB, BLRP and Transformer-XL on generated ListOps (LRA rules).",
        run=_run_listops,
        paper=PAPER_ACCURACY,
        metric="test accuracy (%), mean over seeds",
        paper_source="paper 002 Table 1 (BLRP) and paper 003 Table 4 (TLB, Transformer), on LRA data",
        chance=10.0,  # the answer is one of 10 digits
        # paper 002 Table 1 (BLRP 41.43) and paper 003 Table 4 (TLB 38.2), both above LRA's Transformer (37.6).
        claims=(Claim("BLRP classifies ListOps better than the Transformer", "blrp", "transformer"),
                Claim("TLB classifies ListOps better than the Transformer", "tlb", "transformer")),
        notes="quick/tour/smoke use shorter expressions than LRA and one shared width (see config); every "
        "model trains the same number of steps; chance "
        "is 10% and the majority class is in extra.data. At paper scale TLB is the authors' LRA model, the "
        "Transformer LRA's (emb 512, 4 layers) and BLRP paper 002 Table 2 (config.sources).",
        scales=("smoke", "tour", "quick", "paper"),
    )
)

LISTOPS_LENGTH = register_experiment(
    Experiment(
        name="listops-length",
        description="The listops models on the test set made 1x-4x longer (k copies joined under a MAX).",
        run=_run_length,
        paper=PAPER_LENGTH,
        metric="test accuracy (%) at k x length, mean over seeds",
        paper_source="paper 002 Table 5",
        chance=10.0,  # the answer is one of 10 digits, at any length
        # Table 5: BLRP keeps 36.0 / 35.8 / 35.8 at 2x-4x where TLB falls to 17.0 / 15.7 / 14.9.
        claims=(Claim("BLRP keeps more of its accuracy than TLB on longer expressions", "blrp", "tlb",
                      settings=("x2", "x3", "x4")),),
        notes="Uses the checkpoints of `chronomem run listops` at the same scale (sibling directory "
        "../listops); extra.x4_over_x1 is the fraction of accuracy kept at 4x length.",
    )
)

LISTOPS_LENGTH_EASY = register_experiment(
    Experiment(
        name="listops-length-easy",
        description="The length test on a ListOps the quick models learn (MIN and MAX, at most 3 deep): the four "
                    "models trained here, then tested on the test set made 1x-4x longer.",
        run=_run_length_easy,
        metric="test accuracy (%) at k x length, mean over seeds",
        paper_source="paper 002 Table 5's claim, on easier data (its numbers are for LRA's depth 10: not comparable)",
        chance=10.0,
        claims=(Claim("BLRP keeps more of its accuracy than TLB on longer expressions", "blrp", "tlb",
                      settings=("x2", "x3", "x4")),
                Claim("BLRP keeps more of its accuracy than the Transformer on longer expressions", "blrp",
                      "transformer", settings=("x2", "x3", "x4"))),
        notes="Trains its own models on expressions of MIN and MAX only, at most 3 deep with 2-5 arguments "
              "(21-37 tokens), segments and memories of 10, 6,000 steps at quick (otherwise the listops "
              "settings), so that they learn the operators before their length is tested; extra.data has the "
              "majority class.",
    )
)
