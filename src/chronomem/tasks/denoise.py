"""The Denoise task (Jing et al. 2019; as in paper 004 Table 2 and the authors' code).

Input: 10 symbols drawn from 1..8 placed at sorted, distinct random positions among the first
T+9 steps (blanks, 0, elsewhere), then a marker (9) at step T+9, then 10 blanks. Length T+20.
Target: T+10 blanks, then the 10 symbols in order. Accuracy counts the last 10 outputs; the loss
counts every output (as the authors train). Same vocabulary as Copy (``tasks/copy.py``).
"""

from __future__ import annotations

import torch

from chronomem.checks import check_positive
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task
from chronomem.tasks.copy import BLANK, MARKER


class DenoiseTask(Task):
    name = "denoise"
    kind = "tag"
    vocab_size = 10  # 0 blank, 1..8 symbols, 9 marker
    num_classes = 10
    causal = True

    def __init__(self, seq_len: int = 100, n_symbols: int = 8, copy_len: int = 10):
        self.seq_len = check_positive(seq_len, "seq_len")
        self.n_symbols = check_positive(n_symbols, "n_symbols")
        self.copy_len = check_positive(copy_len, "copy_len")
        if n_symbols > 8:
            raise ValueError(f"n_symbols must be <= 8 (0 is blank, 9 the marker), got {n_symbols}")

    @property
    def length(self) -> int:
        return self.seq_len + 2 * self.copy_len

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        T, L = self.seq_len, self.copy_len
        span = T + L - 1  # the symbols lie among the first T+9 steps
        symbols = torch.randint(1, self.n_symbols + 1, (batch_size, L), generator=generator)
        # L distinct positions per row: the first L of a random permutation, sorted.
        positions = torch.rand(batch_size, span, generator=generator).argsort(1)[:, :L].sort(1).values
        inputs = torch.full((batch_size, T + 2 * L), BLANK, dtype=torch.long)
        inputs.scatter_(1, positions, symbols)
        inputs[:, span] = MARKER
        targets = torch.full_like(inputs, BLANK)
        targets[:, T + L :] = symbols
        score_mask = torch.zeros_like(inputs, dtype=torch.bool)
        score_mask[:, T + L :] = True
        return Batch(inputs, targets, score_mask=score_mask)

    def describe(self) -> dict:
        return {"name": self.name, "seq_len": self.seq_len, "n_symbols": self.n_symbols,
                "copy_len": self.copy_len}


register_task("denoise")(DenoiseTask)
