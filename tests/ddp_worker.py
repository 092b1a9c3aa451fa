"""Launched by test_train.py under torchrun: data-parallel steps for a 3 s budget, then each rank saves its weights."""

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from chronomem.heads import Tagger
from chronomem.layers import FeedForward
from chronomem.tasks.copy import CopyTask
from chronomem.train import TrainConfig, train


class Backbone(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ff = FeedForward(dim)
        self.out_dim = dim

    def forward(self, x, state=None, mask=None):
        return x + self.ff(x), None


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = Tagger(Backbone(16), 16, 10, vocab_size=10)
    if rank == 0:
        save_file({k: v.clone() for k, v in model.state_dict().items()}, out / "rank0_init.safetensors")
    # A wall-clock budget with the decay annealed over it: the ranks' clocks differ, so only the
    # trainer's per-step average of them keeps their learning rates equal and their last step the same.
    cfg = TrainConfig(steps=100_000, batch_size=4, lr=1e-2, schedule="linear", time_budget=3.0, anneal_by="budget",
                      progress=False, out=str(out / "run"), eval_examples=8, device="cpu")  # gloo ranks, GPU or not
    result = train(model, CopyTask(seq_len=4, copy_len=2), cfg)
    weights = {k: v.detach().contiguous() for k, v in result.model.state_dict().items()}
    save_file(weights, out / f"rank{rank}.safetensors")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
