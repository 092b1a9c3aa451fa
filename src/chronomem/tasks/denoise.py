"""The Denoise task (Jing et al. 2019; as in paper 004 Table 2 and the authors' code).

Input: 10 symbols drawn from 1..8 placed at sorted, distinct random positions among the first
T+9 steps (blanks, 0, elsewhere), then a marker (9) at step T+9, then 10 blanks. Length T+20.
Target: T+10 blanks, then the 10 symbols in order. Accuracy counts the last 10 outputs; the loss
counts every output (as the authors train). Same vocabulary as Copy (``tasks/copy.py``).
"""

from __future__ import annotations

import torch

from chronomem.registry import register_task
from chronomem.tasks.base import Batch
from chronomem.tasks.copy import CopyTask


class DenoiseTask(CopyTask):
    """Copy's vocabulary, lengths and targets (``CopyTask``), the symbols scattered."""

    name = "denoise"

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        span = self.seq_len + self.copy_len - 1  # the symbols lie among the first T+9 steps
        symbols = torch.randint(1, self.n_symbols + 1, (batch_size, self.copy_len), generator=generator)
        # L distinct positions per row: the first L of a random permutation, sorted.
        positions = torch.rand(batch_size, span, generator=generator).argsort(1)[:, : self.copy_len].sort(1).values
        return self.batch(symbols, positions)


register_task("denoise")(DenoiseTask)
