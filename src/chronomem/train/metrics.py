"""Metrics: per-batch loss/accuracy for both task kinds, and a CSV (+ TensorBoard) logger."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor


def loss_and_accuracy(logits: Tensor, batch, kind: str) -> tuple[Tensor, Tensor, Tensor]:
    """Mean cross-entropy, number of correct predictions and number of scored predictions.

    ``tag``: the loss counts positions in ``loss_mask`` (else ``mask``, else all) and accuracy positions in
    ``score_mask`` (else the loss positions). ``classify``: one prediction per sequence.
    """
    if kind == "classify":
        loss = F.cross_entropy(logits.float(), batch.targets)
        correct = (logits.argmax(-1) == batch.targets).sum()
        return loss, correct, torch.tensor(batch.targets.numel(), device=logits.device)
    loss_mask = batch.loss_mask if batch.loss_mask is not None else batch.mask
    score_mask = batch.score_mask if batch.score_mask is not None else loss_mask
    flat = logits.flatten(0, 1).float()
    per_step = F.cross_entropy(flat, batch.targets.flatten(), reduction="none")
    if loss_mask is None:
        loss = per_step.mean()
    else:
        weights = loss_mask.flatten().to(per_step.dtype)
        loss = (per_step * weights).sum() / weights.sum().clamp_min(1.0)
    hits = logits.argmax(-1) == batch.targets
    if score_mask is None:
        return loss, hits.sum(), torch.tensor(hits.numel(), device=logits.device)
    return loss, (hits & score_mask).sum(), score_mask.sum()


class MetricsLogger:
    """Appends rows to ``metrics.csv`` (columns fixed by the first row) and to TensorBoard if installed."""

    def __init__(self, run_dir: Path | None, enabled: bool = True):
        self.path = None if run_dir is None or not enabled else Path(run_dir) / "metrics.csv"
        self.fields: list[str] | None = None
        self.tb = None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with open(self.path) as f:
                header = f.readline().strip()
            self.fields = header.split(",") if header else None
        try:  # optional: only when the tensorboard package is installed
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        except Exception:
            self.tb = None

    def rewind(self, step: int) -> None:
        """Continue the log of a run resumed at ``step``: drop the rows written after that checkpoint by the
        interrupted run (they are logged again) and its final test row at ``step``, so the file reads as
        one uninterrupted run: no step logged twice. The file is replaced atomically."""
        if self.path is None or not self.path.exists():
            return
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header, body = rows[0], rows[1:]
        at, split = header.index("step"), header.index("split")
        kept = [r for r in body if int(r[at]) < step or (int(r[at]) == step and r[split] != "test")]
        if len(kept) == len(body):
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([header, *kept])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def log(self, row: dict) -> None:
        if self.path is None:
            return
        if self.fields is None:
            self.fields = ["step", "split", "loss", "accuracy", "lr", "tokens_per_second", "seconds"]
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(self.fields)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields, extrasaction="ignore").writerow(row)
        if self.tb is not None:
            for key in ("loss", "accuracy", "lr", "tokens_per_second"):
                if row.get(key) is not None:
                    self.tb.add_scalar(f"{row['split']}/{key}", row[key], row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
