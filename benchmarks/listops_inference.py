"""Inference time of BLRP, TLB and full attention on long ListOps-shaped input (paper 002 Sec. 4.2).

Paper 002 reports 0.417 s (BLRP) vs 0.396 s (TLB) at batch 32 x 10,000 tokens on a GPU (1.05x). Here the
three backbones are built with the ListOps ``paper`` settings of ``chronomem run listops`` (width 64,
8 heads, FFN 128, segment/chunk 100, latent/state 100, two self-attention layers each) and timed side by
side in one process on the same random ``x [B, N, 64]`` (``torch.no_grad``, interleaved repeats,
median). The ratios BLRP/TLB and Transformer/TLB, Transformer/BLRP are printed, in seconds and in
floating-point operations (``torch.utils.flop_counter`` on one sequence of the same length: matmuls
and attention, the work the equations demand whatever the hardware).

    python benchmarks/listops_inference.py      # batch 32 x 10,000 (the Transformer takes minutes)
    python benchmarks/listops_inference.py --batch 4 --repeats 3 --skip-transformer
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from chronomem.bench import count_flops
from chronomem.experiments.listops import SCALES, model_options
from chronomem.registry import build_backbone
from chronomem.threads import Measured


def build(name: str):
    options = model_options(name, SCALES["paper"])
    dim, depth, heads = options.pop("dim"), options.pop("depth"), options.pop("num_heads")
    return build_backbone(name, dim=dim, depth=depth, num_heads=heads, causal=False, **options).eval()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (the Transformer: 1)")
    p.add_argument("--skip-transformer", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = ["tlb", "blrp"] + ([] if args.skip_transformer else ["transformer"])
    models = {name: build(name) for name in names}
    x = torch.randn(args.batch, args.length, 64)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    measured = Measured(log=print).start()
    with torch.no_grad():
        for name in ("tlb", "blrp"):
            models[name](x[:, :1000])  # warm-up
        for repeat in range(args.repeats):
            for name in names:
                if name == "transformer" and repeat > 0:
                    continue  # quadratic: one pass is enough to see the gap
                start = time.perf_counter()
                models[name](x)
                seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    threads = torch.get_num_threads()
    print(f"batch {args.batch} x {args.length} tokens, {threads} threads, inference (no_grad)")
    for name in names:
        params = sum(q.numel() for q in models[name].parameters())
        runs = [round(s, 3) for s in seconds[name]]
        print(f"  {name:12s} {median[name]:8.3f} s   ({params:,} parameters; runs {runs})")
    # FLOPs grow linearly with the batch: count one sequence (the Transformer's pass is quadratic, but
    # counting is cheap next to timing it).
    flops = {name: count_flops(models[name], x[:1]) for name in names}
    print("floating-point operations per sequence: "
          + ", ".join(f"{name} {flops[name] / 1e9:.2f} G" for name in names))
    ratio = median["blrp"] / median["tlb"]
    print(f"ratio BLRP / TLB         = {ratio:.2f} s, {flops['blrp'] / flops['tlb']:.2f} FLOPs"
          "   (paper 002: 0.417 / 0.396 s = 1.05; target <= 1.1)")
    if "transformer" in median:
        for name in ("tlb", "blrp"):
            print(f"ratio Transformer / {name.upper():4s} = {median['transformer'] / median[name]:.2f} s, "
                  f"{flops['transformer'] / flops[name]:.2f} FLOPs   (target >= 5)")
    measured.stop()


if __name__ == "__main__":
    main()
