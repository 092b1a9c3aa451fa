"""Training-step time of the quick Ballet HTM model, for each way to mix the selected chunks.

The model and batch are those of ``chronomem run ballet --scale quick`` on one level (default
``8_delay48``: B=32 episodes of 505 steps plus the 7 other questions; ``BALLET_CPU["htm"]``).
Each ``read_impl`` of ``chronomem.ops.htm_mix`` computes the same function (tested in
``tests/test_ops_htm_mix.py``), chosen by name on the model:

* ``auto``: the read as shipped. A call whose queries read at most ``DENSE_CHUNKS_PER_K * top_k``
  chunks in all runs ``dense``; otherwise ``grouped`` where its tiles would be full enough
  (``ops.htm_mix.grouped_pays``), else ``gather``;
* ``grouped``: the (query, chunk) pairs sorted by chunk, each chunk read once per tile of pairs
  (``mix_chunks_grouped``);
* ``dense``: every query scored against every chunk it may read, one matrix product per episode
  (``mix_chunks_dense``);
* ``gather``: each query gathers its k chunks, in blocks of queries, with a backward that gathers
  again (``mix_selected_chunks``);
* ``reference``: the naive gather and einsums in plain autograd (``mix_chunks_reference``).

One model per ``read_impl``, all from the same seed; steps are interleaved (median of ``--repeats``,
forward + backward + Adam step) and the ratios are printed.

    python benchmarks/htm_ballet_step.py                 # torch's threads
    OMP_NUM_THREADS=1 python benchmarks/htm_ballet_step.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from chronomem.experiments.htm import BALLET_CPU
from chronomem.heads import build_model
from chronomem.ops.htm_mix import READ_IMPLS
from chronomem.registry import get_task
from chronomem.threads import Measured


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--level", default="8_delay48")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--impls", nargs="+", choices=READ_IMPLS, default=list(READ_IMPLS), help="read_impl values to time")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task("ballet")(level=args.level, questions="every_dancer")
    batch = task.sample(args.batch, torch.Generator().manual_seed(0))

    def make_step(read_impl: str):
        torch.manual_seed(0)
        model = build_model("htm", task, **BALLET_CPU["htm"], pooling="last", read_impl=read_impl)
        optimizer = torch.optim.Adam(model.parameters(), 1e-3)

        def step() -> float:
            start = time.perf_counter()
            logits, _ = model(batch.inputs)
            optimizer.zero_grad()
            F.cross_entropy(logits[batch.loss_mask], batch.targets[batch.loss_mask]).backward()
            optimizer.step()
            return time.perf_counter() - start

        return step

    steps = {name: make_step(name) for name in args.impls}
    seconds: dict[str, list[float]] = {name: [] for name in args.impls}
    with Measured(log=print):
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            for name, step in steps.items():
                t = step()
                if repeat:
                    seconds[name].append(t)
        median = {name: statistics.median(v) for name, v in seconds.items()}
        print(f"{args.level}, batch {args.batch} x {batch.inputs.shape[1]} steps, {torch.get_num_threads()} "
              f"threads, training step (median of {args.repeats})")
        for name in args.impls:
            print(f"  {name:10s} {median[name]:7.3f} s")
        if "auto" in median and len(median) > 1:
            print(", ".join(f"{name} / auto = {median[name] / median['auto']:.2f}" for name in median
                            if name != "auto"))


if __name__ == "__main__":
    main()
