"""resolution-transfer: paper 002 Table 1 (right) and paper 003 Tables 1-2 on images as patch sequences.

Each model is trained at a base resolution and tested, unchanged, on the same test images at 1x, 2x
(and 4x) that resolution: with 4x4 patches in raster order a 2x image is a 4x longer sequence. The
papers train on CIFAR at 64x64 and test at 128x128; ViT falls furthest (CIFAR-10 93.75 -> 73.18),
TLB and BLRP keep more, and TLB without top-down conditioning (its fast stream does not read the
state) loses most of TLB's advantage (paper 003 Table 2, CIFAR-100 only).

Models (rows), every one with two self-attention layers of one shared width over the same patch
embedding (``chronomem.encoders.PatchEncoder``: 2-D positions that follow the image across
resolutions), mean-pooled into the classifier's MLP (TLB and BLRP: their own readouts):

* ``vit``: ViT's encoder (the registry's ``vit``: the Transformer without 1-D positions);
* ``tlb``: ViT + TLB, two groups of [1 self-attention, 1 cross-attention to the state] (the authors'
  CIFAR setting R=1, N=5 state vectors), chunks of ``chunk`` patches;
* ``tlb-no-top-down``: the same without the cross-attention to the state (``top_down=False``);
* ``blrp``: BLRP, two Theta_SELF layers, segments of ``chunk`` patches, a latent block of as many
  vectors (paper 002 Fig. 4: latent size = segment size did best on ListOps; Table 2 gives no CIFAR
  latent size).

Scales (fixed step counts):

* ``quick``: Fashion-MNIST (real photographs, 28x28 grey; different data from the papers' CIFAR) at
  28x28 -> 56x56 -> 112x112 (patch 4: 49 -> 196 -> 784 patches), width 64, 4 heads, FFN 128, chunk 7
  (one row of patches at 1x), batch 64, paper 002's optimiser (AdamW, betas (0.9, 0.98), eps 1e-9,
  linear decay) at lr 1e-3, 3 seeds, ``QUICK_STEPS`` steps each (measured below), 1,000 test images.
* ``paper``: CIFAR-10 and CIFAR-100 at 64x64 -> 128x128, paper 002 Table 2's CIFAR sizes for every
  model (emb 368, hidden 736, 6 heads, segment 10; batch 128 for CIFAR-10, 64 for CIFAR-100), AdamW
  lr 4e-4, betas (0.9, 0.98), eps 1e-9, linear decay; TLB chunk 32 and N=5 (the authors' CIFAR
  setting); 39,000 steps (about 100 epochs of CIFAR-10 at batch 128: our choice, the papers give no
  count); the whole test set. Needs the CIFAR binary files (``--data-dir``).
* ``smoke``: Fashion-MNIST, seconds, for the tests.

``resolution-transfer-learned`` runs the same models, scales and seeds with ViT's own position
scheme in the patch encoder (``patch_positions="learned"``: a learned table of one vector per patch
of the training grid, resized bilinearly to the grid of a larger image, ViT Sec. 3.2) in place of
the fixed 2-D sinusoids. It is the decisive test of the guess that our sinusoids, which give a 2x
image the positions of the same places in training, hand ViT a resolution invariance the papers' ViT
did not have (ours keeps 84% of its 1x accuracy at 2x, TLB and BLRP 44% and 42%; the papers' ViT
keeps less than TLB and BLRP): if the guess is right, the papers' ordering comes back.

Our table shows the papers' CIFAR-100 numbers beside ours at quick scale (the only dataset with the
top-down ablation; CIFAR-10's are in ``extra.paper_cifar10``): different data, so compare the share
of 1x accuracy kept at 2x (the ``2x kept (%)`` column: the mean over the seeds of each seed's share),
not the accuracies.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from chronomem.experiments.base import Experiment, Scale, select_models, train_and_evaluate
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.tasks.images import DATASETS, ImageTask

# paper 003 Table 1 (ViT, ViT + TLB), Table 2 (w/o top-down, CIFAR-100 only); paper 002 Table 1 (BLRP).
# "1x": trained and tested at 64x64; "2x": the same models tested at 128x128.
PAPER_CIFAR10 = {
    "vit": {"1x": 93.75, "2x": 73.18},
    "tlb": {"1x": 94.79, "2x": 84.38},
    "blrp": {"1x": 95.04, "2x": 86.85},
}
PAPER_CIFAR100 = {
    "vit": {"1x": 69.53, "2x": 47.4},
    "tlb": {"1x": 79.17, "2x": 59.19},
    "tlb-no-top-down": {"1x": 76.04, "2x": 49.22},
    "blrp": {"1x": 83.85, "2x": 61.06},
}
KEPT = "2x kept (%)"  # 100 * accuracy at 2x / accuracy at 1x: the papers' claim is about this share
MODELS = ("vit", "tlb", "tlb-no-top-down", "blrp")
# The claims' settings: the accuracy at 2x and the share kept, under every scale's names (``_setting``).
AT_2X = tuple(f"{prefix}{name}" for prefix in ("", "cifar10 ", "cifar100 ") for name in ("2x", KEPT))
CLAIMS = (  # paper 003 Tables 1-2 and paper 002 Table 1, at 2x (CIFAR-100 / CIFAR-10)
    Claim("TLB transfers to 2x the resolution better than ViT (59.19 vs 47.4 / 84.38 vs 73.18)", "tlb", "vit",
          settings=AT_2X),
    Claim("BLRP transfers to 2x the resolution better than ViT (61.06 vs 47.4 / 86.85 vs 73.18)", "blrp", "vit",
          settings=AT_2X),
    Claim("TLB's top-down conditioning helps at 2x (59.19 vs 49.22, CIFAR-100)", "tlb", "tlb-no-top-down",
          settings=AT_2X),
)


def with_kept(table: dict) -> dict:
    """``table`` with the share of 1x accuracy kept at 2x added to each row."""
    return {m: {**row, KEPT: round(100.0 * row["2x"] / row["1x"], 1)} for m, row in table.items()}


@dataclass(frozen=True, kw_only=True)
class ImageScale(Scale):
    datasets: tuple[tuple[str, int], ...]  # (dataset, batch size) pairs, trained one after the other
    resolution: int  # the base (training) resolution
    factors: tuple[int, ...] = (1, 2)  # test resolutions: resolution * factor
    patch_size: int = 4
    dim: int = 64
    num_heads: int = 4
    ff_mult: float = 2.0
    chunk: int = 7  # BLRP segment (and latent) size
    tlb_chunk: int = 7  # TLB chunk size K
    num_state: int = 5  # TLB state vectors N (the authors' CIFAR setting)
    # paper 002 Sec. 4: AdamW, betas (0.9, 0.98), eps 1e-9, linear decay
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    schedule: str = "linear"
    seeds: int = 1
    eval_batch_size: int = 50

    def train_config(self, seed: int, time_budget: float | None = None, progress: bool = False, **options):
        return super().train_config(seed, time_budget, progress, **{"betas": self.betas, "eps": self.eps,
                                                           "eval_batch_size": self.eval_batch_size, **options})


# Sized by measuring 15 steps of each model at batch 64 on a 2-core machine under load (another run
# on it, one torch thread): ViT 75 ms/step, TLB 201, TLB w/o top-down 163, BLRP 369 (0.81 s for the
# four, 2.4 s with 3 seeds); testing 1,000 images at 1x + 2x + 4x took ~110 s per seed for the four
# (4x: 16-29 s per model). 2,000 steps: ~81 min of training + ~6 min of testing, within ~90 min.
QUICK_STEPS = 2_000

SCALES = {
    "smoke": ImageScale(datasets=(("fashion-mnist", 8),), resolution=8, factors=(1, 2), dim=16, num_heads=2,
                        chunk=4, tlb_chunk=4, num_state=2, steps=2, batch_size=8, lr=1e-3, eval_examples=16),
    "quick": ImageScale(datasets=(("fashion-mnist", 64),), resolution=28, factors=(1, 2, 4), steps=QUICK_STEPS,
                        batch_size=64, lr=1e-3, eval_examples=1_000, seeds=3),
    "paper": ImageScale(datasets=(("cifar10", 128), ("cifar100", 64)), resolution=64, factors=(1, 2), dim=368,
                        num_heads=6, ff_mult=2.0, chunk=10, tlb_chunk=32, num_state=5, steps=39_000,
                        batch_size=128, lr=4e-4, eval_examples=10_000, seeds=3),
}


def model_options(row: str, s: ImageScale, patch_positions: str = "sinusoid") -> tuple[str, dict]:
    """The registry model and its options of a table row at scale ``s`` (module docstring), with the
    patch encoder's position scheme ``patch_positions`` (``chronomem.heads.build_model``), the same for
    every row."""
    width = dict(dim=s.dim, num_heads=s.num_heads, ff_mult=s.ff_mult)
    if patch_positions != "sinusoid":  # the default is left out: the options resolution-transfer recorded
        width["patch_positions"] = patch_positions
    if row == "vit":
        return "vit", {**width, "depth": 2}
    if row in ("tlb", "tlb-no-top-down"):
        return "tlb", {**width, "depth": 2, "self_per_cross": 1, "chunk_size": s.tlb_chunk, "num_state": s.num_state,
                       "top_down": row == "tlb"}
    if row == "blrp":
        return "blrp", {**width, "depth": 2, "segment_size": s.chunk, "latent_size": s.chunk}
    raise ValueError(f"no settings for row {row!r}; valid rows: {', '.join(MODELS)}")


def _setting(dataset: str, name: str, several: bool) -> str:
    """A column of the table: ``name`` ("1x", "2x kept (%)", ...), prefixed by the dataset if several."""
    return f"{dataset} {name}" if several else name


def paper_table(s: ImageScale) -> dict:
    """The papers' numbers under our setting names: per CIFAR dataset at paper scale; CIFAR-100's
    (which has every row) beside another dataset."""
    datasets = [d for d, _ in s.datasets]
    several = len(datasets) > 1
    table: dict = {}
    for dataset in datasets:
        source = with_kept(PAPER_CIFAR10 if dataset == "cifar10" else PAPER_CIFAR100)
        for model, row in source.items():
            for key, value in row.items():
                table.setdefault(model, {})[f"{dataset} {key}" if several else key] = value
    return table


def chance_levels(results: dict) -> dict[str, float]:
    """A guess's accuracy in each accuracy column of a run's results: one of its dataset's classes."""
    datasets = list(results.get("config", {}).get("tasks", {}))
    return {_setting(d, f"{k}x", len(datasets) > 1): 100 / DATASETS[d].classes
            for d in datasets if d in DATASETS for k in (1, 2, 4)}


@dataclass(frozen=True)
class ImageRun:
    """One training run (a dataset, a row, a seed), the job of ``Jobs.map``: the task is read from the
    data files where the run happens, not sent to it (tens of MB per run)."""

    dataset: str
    data_dir: str | None
    resolution: int
    patch_size: int
    factors: tuple[int, ...]
    model: str
    options: dict
    train_config: Any  # chronomem.train.TrainConfig
    out: str
    resume: bool = False  # continue the run ``out`` holds (chronomem run --resume)


def _train_image_run(run: ImageRun) -> dict:
    """Train ``run`` at its resolution and test it at each factor's."""
    task = ImageTask(dataset=run.dataset, resolution=run.resolution, patch_size=run.patch_size, data_dir=run.data_dir)
    others = {f"{k}x": task.with_resolution(run.resolution * k) for k in run.factors if k != 1}
    return train_and_evaluate(run.model, task, run.options, run.train_config, eval_tasks=others, out=run.out,
                              resume=run.resume)


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, data_dir: str | None = None, progress: bool = True,
         jobs: Jobs = SEQUENTIAL, resume: bool = False, patch_positions: str = "sinusoid",
         name: str = "resolution-transfer") -> dict:
    """Train every row at ``scale`` and test it at each factor; ``patch_positions`` chooses the patch
    encoder's position scheme for every row (``resolution-transfer``: the sinusoids; ``-learned``: ViT's),
    ``name`` is the experiment's."""
    s = SCALES[scale]
    rows = select_models(MODELS, models, name)
    several = len(s.datasets) > 1
    results: dict = {m: {} for m in rows}
    per_seed: dict = {m: {} for m in rows}
    extra: dict = {"per_seed": {}, "runs": {}, "paper_cifar10": with_kept(PAPER_CIFAR10)}
    tasks = {}
    runs = []
    for dataset, batch in s.datasets:
        # Read here first: a missing file stops the experiment before anything trains.
        task = ImageTask(dataset=dataset, resolution=s.resolution, patch_size=s.patch_size, data_dir=data_dir)
        tasks[dataset] = task.describe()
        for row in rows:
            model, options = model_options(row, s, patch_positions)
            runs += [ImageRun(dataset, data_dir, s.resolution, s.patch_size, s.factors, model, options,
                              s.train_config(seed + k, time_budget, progress, batch_size=batch),
                              str(Path(out) / dataset / row / f"seed{seed + k}"), resume)
                     for k in range(s.seeds)]
    trained = iter(jobs.map(_train_image_run, runs))
    for dataset, _ in s.datasets:
        for row in rows:
            accuracies: dict[str, list[float]] = {f"{k}x": [] for k in s.factors}
            for k in range(s.seeds):
                got = next(trained)
                accuracies["1x"].append(got["accuracy"])
                for name, value in got.get("eval", {}).items():
                    accuracies[name].append(value)
                extra["runs"][f"{dataset}/{row}/seed{seed + k}"] = {
                    key: got[key] for key in ("seconds", "steps", "stopped_early", "parameters")}
            for name, values in accuracies.items():
                results[row][_setting(dataset, name, several)] = statistics.fmean(values)
                per_seed[row][_setting(dataset, name, several)] = values
            if "2x" in accuracies:  # each seed's share of its own 1x accuracy, and their mean
                # a seed at 0% at 1x (a smoke run) has no share to keep: 0, not a division by ~0
                kept = [round(100.0 * a2 / a1, 2) if a1 > 0 else 0.0
                        for a1, a2 in zip(accuracies["1x"], accuracies["2x"], strict=True)]
                results[row][_setting(dataset, KEPT, several)] = round(statistics.fmean(kept), 1)
                per_seed[row][_setting(dataset, KEPT, several)] = kept
            extra["per_seed"][f"{dataset}/{row}"] = accuracies
    config = {"scale": asdict(s), "tasks": tasks, "models": {r: model_options(r, s, patch_positions) for r in rows},
              "test_resolutions": [s.resolution * k for k in s.factors]}
    if patch_positions != "sinusoid":  # resolution-transfer's config stays as its shipped results recorded it
        config["patch_positions"] = patch_positions
    paper = {m: row for m, row in paper_table(s).items() if m in rows}
    return {"results": results, "per_seed": per_seed, "paper": paper, "config": config, "extra": extra}


DESCRIPTION = ("ViT, ViT + TLB (with and without top-down conditioning) and BLRP trained on images as "
               "4x4-patch sequences at one resolution, tested at 1x, 2x (and 4x) without retraining")
NOTES = ("Different data at quick and smoke scale: ours is Fashion-MNIST (28x28 -> 56x56 -> 112x112), the "
         "papers' CIFAR-100 (64x64 -> 128x128); compare the share of accuracy kept at 2x, not the accuracies. "
         f"Datasets: {', '.join(DATASETS)}; docs/images.md.")


def _experiment(name: str, patch_positions: str, description: str, notes: str) -> Experiment:
    """resolution-transfer with the patch encoder's ``patch_positions``: the same rows, scales, seeds,
    paper numbers and claims."""
    return Experiment(
        name=name,
        description=description,
        run=partial(_run, patch_positions=patch_positions, name=name),
        paper=with_kept(PAPER_CIFAR100),
        metric="test accuracy (%) at k x the training resolution, mean over seeds",
        chance=chance_levels,
        claims=CLAIMS,
        paper_source="CIFAR-100 at 64x64 (1x) and 128x128 (2x): paper 003 Tables 1-2 (ViT, TLB, w/o top-down), "
        "paper 002 Table 1 (BLRP); at paper scale CIFAR-10 too",
        notes=notes,
    )


RESOLUTION_TRANSFER = register_experiment(_experiment(
    "resolution-transfer", "sinusoid", f"{DESCRIPTION}.", NOTES))

RESOLUTION_TRANSFER_LEARNED = register_experiment(_experiment(
    "resolution-transfer-learned", "learned",
    f"{DESCRIPTION}, with ViT's learned position table (resized bilinearly) in place of the fixed 2-D sinusoids.",
    "The decisive test of the guess that our 2-D sinusoids, which give a 2x image the positions of the same "
    "places, make ViT resolution-invariant and so reverse the papers' ordering at quick scale: every model's "
    "patch encoder gets ViT's own scheme (a learned table, one vector per patch of the training grid, resized by "
    "2-D bilinear interpolation to a larger image's grid: Dosovitskiy et al. 2020, Sec. 3.2), same models, "
    "scales and seeds as resolution-transfer. " + NOTES))
