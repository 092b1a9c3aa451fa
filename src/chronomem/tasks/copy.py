"""The Copy task (Hochreiter & Schmidhuber 1997; as in paper 004 and the authors' code).

Input: 10 symbols drawn from 1..8, then T-1 blanks (0), a marker (9), then 10 blanks.
Target: T+10 blanks, then the 10 symbols. Length T+20. Accuracy counts the last 10 outputs;
the loss counts every output (as the authors train).
"""

from __future__ import annotations

import torch
from torch import Tensor

from chronomem.checks import check_positive
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

BLANK, MARKER = 0, 9


class CopyTask(Task):
    name = "copy"
    kind = "tag"
    vocab_size = 10  # 0 blank, 1..8 symbols, 9 marker
    num_classes = 10  # outputs are blanks or symbols (9 never a target, kept for a shared vocabulary)
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
        symbols = torch.randint(1, self.n_symbols + 1, (batch_size, self.copy_len), generator=generator)
        return self.batch(symbols, torch.arange(self.copy_len).expand(batch_size, -1))

    def batch(self, symbols: Tensor, positions: Tensor) -> Batch:
        """The examples whose ``symbols [B, L]`` stand at the input steps ``positions [B, L]`` (among the
        first T+L-1; blanks elsewhere), the marker at step T+L-1: the targets are the symbols in order
        after it. Copy puts them at the first L steps, Denoise (``tasks/denoise.py``) anywhere."""
        T, L = self.seq_len, self.copy_len
        inputs = torch.full((symbols.shape[0], T + 2 * L), BLANK, dtype=torch.long)
        inputs.scatter_(1, positions, symbols)
        inputs[:, T + L - 1] = MARKER  # after the T+L-1 steps that hold the symbols
        targets = torch.full_like(inputs, BLANK)
        targets[:, T + L :] = symbols
        score_mask = torch.zeros_like(inputs, dtype=torch.bool)
        score_mask[:, T + L :] = True
        return Batch(inputs, targets, score_mask=score_mask)

    def describe(self) -> dict:
        return {"name": self.name, "seq_len": self.seq_len, "n_symbols": self.n_symbols, "copy_len": self.copy_len}


register_task("copy")(CopyTask)
