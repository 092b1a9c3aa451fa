"""Training-step time of the quick Ballet HTM model: the blockwise read against plain autograd.

The model and batch are those of ``chronomem run ballet --scale quick`` on ``8_delay48`` (B=32 episodes of
505 steps, HTM dim 64, 2 layers, chunk 16, top-k 8, window 64: ``BALLET_MODELS["quick"]``). Both variants
compute the same function (tested in ``tests/test_htm.py``); they differ in how the selected chunks are
gathered and mixed:

* ``blockwise``: ``htm.mix_selected_chunks`` (blocks of queries, a backward that gathers again);
* ``autograd``: ``htm._mix_selected_chunks_autograd`` (one gather kept for backward).

Times are interleaved (median of ``--repeats``, forward + backward + Adam step) and the ratio is printed.

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

VARIANTS = {"blockwise": htm.mix_selected_chunks, "autograd": htm._mix_selected_chunks_autograd}


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
    task = get_task("ballet")(level=args.level)
    batch = task.sample(args.batch, torch.Generator().manual_seed(0))
    model = build_model("htm", task, **BALLET_MODELS["quick"]["htm"], pooling="last")
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)

    def step() -> float:
        start = time.perf_counter()
        logits, _ = model(batch.inputs)
        optimizer.zero_grad()
        F.cross_entropy(logits, batch.targets).backward()
        optimizer.step()
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            for name, mix in VARIANTS.items():
                htm.mix_selected_chunks = mix
                t = step()
                if repeat:
                    seconds[name].append(t)
    finally:
        htm.mix_selected_chunks = VARIANTS["blockwise"]
    median = {name: statistics.median(v) for name, v in seconds.items()}
    print(f"{args.level}, batch {args.batch} x {task.length} steps, {torch.get_num_threads()} threads, "
          f"training step (median of {args.repeats})")
    for name in VARIANTS:
        print(f"  {name:10s} {median[name]:7.3f} s")
    print(f"ratio autograd / blockwise = {median['autograd'] / median['blockwise']:.2f}")


if __name__ == "__main__":
    main()
