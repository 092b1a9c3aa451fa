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


# The columns every run has lead metrics.csv, in this order; any other column (a loss term such as the
# heads' ``auxiliary_loss``) follows them in the order it first appeared.
LEADING_COLUMNS = ("step", "split", "loss", "accuracy", "lr", "tokens_per_second", "seconds")


def column_order(columns) -> list[str]:
    """``columns`` (in the order first seen) in metrics.csv's order: ``LEADING_COLUMNS`` first."""
    columns = list(dict.fromkeys(columns))
    return sorted(columns, key=lambda c: (LEADING_COLUMNS.index(c) if c in LEADING_COLUMNS
                                          else len(LEADING_COLUMNS) + columns.index(c)))


class MetricsLogger:
    """Appends rows to ``metrics.csv`` and, if installed, to TensorBoard: every value of every row.

    The columns are the keys the rows have had (``column_order``); a row with a new key widens the
    file (rewritten atomically, earlier rows get an empty cell), so a loss term is never dropped."""

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

    def _rows(self) -> list[list[str]]:
        with open(self.path, newline="") as f:
            return list(csv.reader(f))

    def _replace(self, rows: list[list[str]]) -> None:
        """Write ``rows`` (header first) as the whole file, atomically."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def rewind(self, step: int) -> None:
        """Continue the log of a run resumed at ``step``: drop the rows written after that checkpoint by the
        interrupted run (they are logged again) and its final test row at ``step``, so the file reads as
        one uninterrupted run: no step logged twice. The file is replaced atomically."""
        if self.path is None or not self.path.exists():
            return
        rows = self._rows()
        if not rows:
            return
        header, body = rows[0], rows[1:]
        at, split = header.index("step"), header.index("split")
        kept = [r for r in body if kept_on_resume(int(r[at]), r[split], step)]
        if not kept:  # nothing before ``step`` (a new run): the file starts anew, columns included
            self.path.unlink()
            self.fields = None
        elif len(kept) != len(body):
            self._replace([header, *kept])

    def _widen(self, fields: list[str]) -> None:
        """Make ``fields`` the header; the rows already written keep their values under their columns."""
        if self.fields is not None and self.path.exists():
            rows = self._rows()
            old = rows[0] if rows else self.fields
            body = [dict(zip(old, r, strict=False)) for r in rows[1:]]
            self._replace([fields, *([r.get(c, "") for c in fields] for r in body)])
        else:
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(fields)
        self.fields = fields

    def log(self, row: dict) -> None:
        if self.path is None:
            return
        if self.fields is None or not set(row) <= set(self.fields):
            self._widen(column_order([*(self.fields or []), *row]))
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields, restval="").writerow(row)
        if self.tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(f"{row['split']}/{key}", value, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def kept_on_resume(row_step: int, split: str, step: int) -> bool:
    """Whether a row logged at ``row_step`` belongs to the run resumed at checkpoint ``step``: the rows
    before it, and those at it but its final test (logged again when the run ends)."""
    return row_step < step or (row_step == step and split != "test")


def read_metrics(path: Path) -> list[dict]:
    """The rows of a ``metrics.csv`` as they were logged: an empty cell (a column the row did not have)
    left out, numbers back as the int or float written (``str`` of a float reads back to the same float)."""

    def value(cell: str):
        for kind in (int, float):
            try:
                return kind(cell)
            except ValueError:
                pass
        return cell

    with open(path, newline="") as f:
        return [{key: value(cell) for key, cell in row.items() if cell != ""} for row in csv.DictReader(f)]
