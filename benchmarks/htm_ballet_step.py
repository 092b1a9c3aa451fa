"""Training-step time of the quick Ballet HTM model: three ways to mix the selected chunks.

The model and batch are those of ``chronomem run ballet --scale quick`` on one level (default
``8_delay48``: B=32 episodes of 505 steps plus the 7 other questions; ``BALLET_MODELS["quick"]["htm"]``).
All variants compute the same function (tested in ``tests/test_htm.py``):

* ``dense``: the read as shipped. A call whose queries read at most ``DENSE_CHUNKS_PER_K * top_k``
  chunks in all scores every query against all of them, one matrix product per episode
  (``htm.mix_chunks_dense``); otherwise it gathers, as below;
* ``gather``: ``htm.mix_selected_chunks`` always (each query gathers its k chunks; blocks of queries,
  a backward that gathers again);
* ``autograd``: ``htm._mix_selected_chunks_autograd`` (one gather kept for backward).

Times are interleaved (median of ``--repeats``, forward + backward + Adam step) and the ratios are printed.

    python benchmarks/htm_ballet_step.py                 # torch's threads
    OMP_NUM_THREADS=1 python benchmarks/htm_ballet_step.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import chronomem.htm as htm
from chronomem.experiments.htm import BALLET_MODELS
from chronomem.heads import build_model
from chronomem.registry import get_task

DENSE = htm.DENSE_CHUNKS_PER_K
GATHER = htm.mix_selected_chunks
VARIANTS = {  # (DENSE_CHUNKS_PER_K, mix_selected_chunks)
    "dense": (DENSE, GATHER),
    "gather": (0, GATHER),
    "autograd": (0, htm._mix_selected_chunks_autograd),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--level", default="8_delay48")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    task = get_task("ballet")(level=args.level, questions="every_dancer")
    batch = task.sample(args.batch, torch.Generator().manual_seed(0))
    model = build_model("htm", task, **BALLET_MODELS["quick"]["htm"], pooling="last")
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)

    def step() -> float:
        start = time.perf_counter()
        logits, _ = model(batch.inputs)
        optimizer.zero_grad()
        F.cross_entropy(logits[batch.loss_mask], batch.targets[batch.loss_mask]).backward()
        optimizer.step()
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            for name, (ratio, mix) in VARIANTS.items():
                htm.DENSE_CHUNKS_PER_K, htm.mix_selected_chunks = ratio, mix
                t = step()
                if repeat:
                    seconds[name].append(t)
    finally:
        htm.DENSE_CHUNKS_PER_K, htm.mix_selected_chunks = DENSE, GATHER
    median = {name: statistics.median(v) for name, v in seconds.items()}
    print(f"{args.level}, batch {args.batch} x {batch.inputs.shape[1]} steps, {torch.get_num_threads()} threads, "
          f"training step (median of {args.repeats})")
    for name in VARIANTS:
        print(f"  {name:10s} {median[name]:7.3f} s")
    print(f"ratio gather / dense = {median['gather'] / median['dense']:.2f}, "
          f"autograd / gather = {median['autograd'] / median['gather']:.2f}")


if __name__ == "__main__":
    main()
