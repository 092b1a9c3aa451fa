"""ssl: SiT against SiT + TLB, pretrained without labels and probed linearly (paper 003 Sec. 4.1, Fig. 2).

Both models (``chronomem.sit``) are pretrained with SiT's three objectives: reconstruction of a
corrupted view, rotation prediction, and a contrastive loss between two views. At each of the scale's
``probe_at`` steps the backbone is frozen and a linear probe reads its representation:

* the features are computed once, without augmentation, for ``probe_train`` training images (drawn with
  the run's seed) and the first ``eval_examples`` test images;
* following the authors' linear evaluation, there is one linear classifier per feature vector. SiT has
  two, on its rotation and contrastive tokens; SiT + TLB has one, on the mean of its state vectors. The
  loss is the sum of their cross-entropies, and the prediction is the mean of their logits;
* AdamW (lr ``probe_lr``), ``probe_epochs`` epochs in minibatches of 256, then the test accuracy (%).

The claim (Fig. 2): SiT + TLB probes better than SiT at every evaluated point.

Scales (fixed step counts):

* ``quick``: Fashion-MNIST at 28 x 28, patches of 4 (49 per image). Width 64, depth 2 (SiT: a ViT
  encoder of 2 layers; SiT + TLB: 2 x [1 self-attention, 1 cross-attention], chunks of 20 patches and
  5 state vectors, the paper's chunk and the authors' CIFAR state size). Projection 128, batch 128.
  AdamW at lr 1e-3 (the authors' README) with weight decay 0.05, a cosine schedule after 5% warm-up,
  gradients clipped at 1. 1,500 steps, probed at 250, 750 and 1,500. Probes learn from 10,000
  training images and are tested on 10,000 test images. 3 seeds.
* ``paper``: CIFAR-10 at 32 x 32 from ``--data-dir``, patches of 4, 400 epochs at batch 256, probed at
  epochs 50, 100, 200, 300 and 400. The paper's appendix with its sizes is not in the text we have,
  so the width (384, 6 heads, depth 6) is our choice. Never run.
* ``smoke``: seconds, for the tests.

Deviations: the probe learns from cached features without augmentation; the authors train it with
DeiT's augmentations, drop-path on and the backbone in train mode. The rest is ``chronomem.sit``'s (a
CPU-sized encoder, no EMA). Each run's result is kept in ``OUT/runs`` when it ends; ``chronomem run ssl
--resume OUT`` reads those back and trains the others from their start.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chronomem.experiments.base import Experiment, Scale, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs, Recorded, run_recorded
from chronomem.registry import register_experiment
from chronomem.report import Claim

MODELS = ("sit", "sit-tlb")
BACKBONE = {"sit": "vit", "sit-tlb": "tlb"}


@dataclass(frozen=True)
class SSLScale(Scale):
    dataset: str = "fashion-mnist"
    patch_size: int = 4
    dim: int = 64
    depth: int = 2
    num_heads: int = 4
    ff_mult: float = 2.0
    projection_dim: int = 128
    chunk_size: int = 20  # TLB's chunk (paper 003: 20)
    num_state: int = 5
    weight_decay: float = 0.05
    probe_at: tuple[int, ...] = ()  # pretraining steps after which the probe runs (the last: steps)
    probe_train: int = 10_000  # training images the probe learns from
    probe_epochs: int = 30
    probe_lr: float = 1e-3
    seeds: int = 3

    def __post_init__(self):
        if not self.probe_at or list(self.probe_at) != sorted(set(self.probe_at)) or self.probe_at[-1] != self.steps:
            raise ValueError(f"probe_at must be increasing steps ending at steps={self.steps}, got {self.probe_at}")


SCALES = {
    "smoke": SSLScale(steps=2, batch_size=4, lr=1e-3, eval_examples=16, dim=16, depth=1, num_heads=2,
                      projection_dim=8, patch_size=7, probe_at=(1, 2), probe_train=32, probe_epochs=2, seeds=1),
    "quick": SSLScale(steps=1_500, batch_size=128, lr=1e-3, schedule="cosine", warmup=75, eval_examples=10_000,
                      probe_at=(250, 750, 1_500)),
    # 50,000 images / 256 = 196 steps per epoch (the last batch of an epoch drawn like the others)
    "paper": SSLScale(dataset="cifar10", steps=400 * 196, batch_size=256, lr=1e-3, schedule="cosine",
                      warmup=10 * 196, eval_examples=10_000, dim=384, depth=6, num_heads=6, ff_mult=4.0,
                      projection_dim=512, probe_at=tuple(e * 196 for e in (50, 100, 200, 300, 400)),
                      probe_train=50_000, probe_epochs=100),
}

CLAIMS = (Claim("SiT + TLB probes better than SiT at every evaluated point (paper 003 Fig. 2)", "sit-tlb", "sit"),)


def setting(step: int) -> str:
    return f"step {step}"


@dataclass(frozen=True)
class SSLRun:
    """One pretraining run with its probes: the job of ``Jobs.map`` (the data is read where it runs)."""

    model: str
    scale: SSLScale
    seed: int
    data_dir: str | None
    progress: bool


def _optimizer(model, s: SSLScale):
    """AdamW with weight decay on the weight matrices only (not on biases, norms, the tokens or the loss
    weights, as SiT excludes its tokens), and its schedule: linear warm-up, then constant or cosine to 0."""
    import torch

    decay = [p for name, p in model.named_parameters() if p.dim() >= 2 and name != "tokens"]
    rest = [p for name, p in model.named_parameters() if not (p.dim() >= 2 and name != "tokens")]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=s.lr, foreach=True)

    def factor(step: int) -> float:
        if step < s.warmup:
            return (step + 1) / s.warmup
        if s.schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * (step - s.warmup) / max(1, s.steps - s.warmup)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def features(model, images, batch_size: int = 500):
    """The frozen representation ``[N, K, dim]`` of uint8 ``images [N, C, H, H]`` (no augmentation)."""
    import torch

    from chronomem.tasks.images import resize

    model.eval()
    with torch.no_grad():
        parts = [model(resize(images[i : i + batch_size], images.shape[-1])).features
                 for i in range(0, images.shape[0], batch_size)]
    model.train()
    return torch.cat(parts)


def probe(train_x, train_y, test_x, test_y, num_classes: int, epochs: int, lr: float, seed: int) -> float:
    """Linear probe (module docstring): one linear classifier per feature vector of ``[N, K, dim]``, trained
    on the sum of their cross-entropies; test accuracy (%) of their mean logits."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    k, dim = train_x.shape[1:]
    torch.manual_seed(seed)
    heads = torch.nn.ModuleList(torch.nn.Linear(dim, num_classes) for _ in range(k))
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(epochs):
        order = torch.randperm(train_x.shape[0], generator=generator)
        for start in range(0, len(order), 256):
            rows = order[start : start + 256]
            x, y = train_x[rows], train_y[rows]
            loss = sum(F.cross_entropy(head(x[:, i]), y) for i, head in enumerate(heads))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        logits = torch.stack([head(test_x[:, i]) for i, head in enumerate(heads)]).mean(0)
    return 100.0 * float((logits.argmax(-1) == test_y).float().mean())


def pretrain_and_probe(run: SSLRun) -> dict[str, Any]:
    """Pretrain ``run.model`` for the scale's steps, probing at each of ``probe_at``; the probe accuracies
    by step, the last losses, the seconds and the parameter count."""
    import torch

    from chronomem.progress import Progress
    from chronomem.sit import SiT, pretraining_losses
    from chronomem.tasks.images import load_dataset, resize

    s = run.scale
    data = load_dataset(s.dataset, run.data_dir)
    torch.manual_seed(run.seed)
    model = SiT(data.channels, data.side, s.patch_size, s.dim, s.depth, s.num_heads, backbone=BACKBONE[run.model],
                ff_mult=s.ff_mult, projection_dim=s.projection_dim, chunk_size=s.chunk_size, num_state=s.num_state)
    optimizer, schedule = _optimizer(model, s)
    generator = torch.Generator().manual_seed(run.seed)
    chosen = torch.randperm(data.train_images.shape[0], generator=torch.Generator().manual_seed(run.seed + 1))
    probe_rows = chosen[: s.probe_train]
    test_images, test_labels = data.test_images[: s.eval_examples], data.test_labels[: s.eval_examples]
    reporter = Progress(s.steps, f"{run.model}, seed {run.seed}", run.progress)
    accuracy, last, start = {}, {}, time.perf_counter()
    for step in range(1, s.steps + 1):
        index = torch.randint(data.train_images.shape[0], (s.batch_size,), generator=generator)
        losses = pretraining_losses(model, resize(data.train_images[index], data.side), generator)
        optimizer.zero_grad()
        losses["loss"].backward()
        if s.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        optimizer.step()
        schedule.step()
        last = {name: round(float(value.detach()), 4) for name, value in losses.items()}
        if step in s.probe_at:
            accuracy[setting(step)] = round(probe(features(model, data.train_images[probe_rows]),
                                                  data.train_labels[probe_rows], features(model, test_images),
                                                  test_labels, data.num_classes, s.probe_epochs, s.probe_lr,
                                                  run.seed), 2)
        reporter.update(step, {"loss": f"{last['loss']:.3f}",
                               **({"probe": f"{accuracy[setting(step)]:.1f}%"} if step in s.probe_at else {})})
    seconds = time.perf_counter() - start
    reporter.close()
    return {"accuracy": accuracy, "losses": last, "seconds": round(seconds, 1),
            "parameters": sum(p.numel() for p in model.parameters())}


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None, time_budget: float | None = None,
         data_dir: str | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL, resume: bool = False) -> dict:
    from chronomem.experiments.rl_runs import check_no_time_budget
    from chronomem.tasks.images import load_dataset

    check_no_time_budget("ssl", time_budget)
    s = SCALES[scale]
    chosen = select_models(MODELS, models, "ssl")
    load_dataset(s.dataset, data_dir)  # a missing file stops the experiment before anything trains
    runs = [SSLRun(m, s, seed + k, data_dir, progress) for m in chosen for k in range(s.seeds)]
    # each run's result is kept in OUT/runs as it ends; --resume reads back those of the same runs
    done = iter(jobs.map(run_recorded, [
        Recorded(pretrain_and_probe, run, str(Path(out) / "runs" / run.model / f"seed{run.seed}.json"), resume)
        for run in runs]))
    results, per_seed, extra = {}, {}, {"runs": {}}
    for m in chosen:
        rows = [next(done) for _ in range(s.seeds)]
        per_seed[m] = {setting(p): [r["accuracy"][setting(p)] for r in rows] for p in s.probe_at}
        results[m] = {name: round(statistics.fmean(values), 2) for name, values in per_seed[m].items()}
        for k, r in enumerate(rows):
            extra["runs"][f"{m}/seed{seed + k}"] = {key: r[key] for key in ("losses", "seconds", "parameters")}
    config = {"scale": asdict(s), "models": {m: BACKBONE[m] for m in chosen}}
    return {"results": results, "per_seed": per_seed, "config": config, "extra": extra}


SSL = register_experiment(Experiment(
    name="ssl",
    description="SiT and SiT + TLB pretrained with reconstruction, rotation and contrastive losses, then probed "
                "linearly on frozen features at several points of pretraining",
    run=_run,
    metric="linear-probe test accuracy (%) after the pretraining step, mean over seeds",
    chance=10.0,
    claims=CLAIMS,
    paper_source="paper 003 Fig. 2 (CIFAR-10, 400 epochs; a figure, no numbers in the text)",
    notes="Different data at quick: Fashion-MNIST, not CIFAR-10; docs/images.md (\"Self-supervised: ssl\").",
))
