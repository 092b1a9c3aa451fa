"""What a task is: a source of batches plus the facts a head and a trainer need about them.

Tasks hold data only; they never import models. The kinds:

* ``kind="tag"``: one target per step (Copy, Denoise). ``targets [B, N]``; the loss counts where
  ``loss_mask`` is True and accuracy where ``score_mask`` is True (e.g. the last 10 outputs of Copy).
* ``kind="classify"``: one target per sequence (ListOps, supervised Ballet). ``targets [B]``.
* ``kind="lm"``: next-token prediction (``chronomem.tasks.text``): one target per step, the next input
  token; trained and scored like ``"tag"``, with the ``CausalLM`` head.

Inputs are tokens (``inputs [B, N]`` long, ``vocab_size`` set) or features (``inputs [B, N, F]``
float, ``input_dim`` set). ``mask [B, N]`` marks valid input positions (``None`` = all valid).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

# Seeds of the fixed evaluation sets of synthetic tasks; training draws from other streams.
SPLIT_SEEDS = {"train": 0, "val": 1_000_003, "test": 2_000_003}


@dataclass
class Batch:
    inputs: Tensor
    targets: Tensor
    mask: Tensor | None = None
    loss_mask: Tensor | None = None
    score_mask: Tensor | None = None

    def to(self, device) -> Batch:
        return Batch(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                        for f in fields(self)})

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum()) if self.mask is not None else self.inputs.shape[0] * self.inputs.shape[1]


class Task:
    """Base class. Subclasses set the attributes below and implement ``sample``."""

    name: str = "task"
    kind: str = "tag"  # "tag" | "classify"
    num_classes: int = 0
    vocab_size: int | None = None  # token inputs
    input_dim: int | None = None  # feature inputs
    causal: bool = True  # whether a model must not see future inputs (streaming tasks)

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        raise NotImplementedError

    def eval_batches(self, batch_size: int, num_examples: int, split: str = "test") -> Iterator[Batch]:
        """A fixed evaluation set: the same examples every call (seeded by the split)."""
        generator = torch.Generator().manual_seed(SPLIT_SEEDS[split])
        done = 0
        while done < num_examples:
            n = min(batch_size, num_examples - done)
            yield self.sample(n, generator, split=split)
            done += n

    def describe(self) -> dict:
        """JSON-able description (name and constructor options) stored with checkpoints."""
        return {"name": self.name}
