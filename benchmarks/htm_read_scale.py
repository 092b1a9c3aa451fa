"""How large is HTM's memory read at initialisation, beside the residual stream it is added to?

An untrained one-layer HTM (the quick RL agent's: width 64, 4 heads, chunks of 16, top-4 of 24 chunks,
a local window of 16) reads a batch of random sequences of unit-variance inputs; the script prints the
mean norm per step of the input, of the memory read (``x + read`` in ``HTMLayer``: the HTM block) and
of the layer's whole update ``y - x``, for the released module's ``init_scale=2`` (docs/htm.md) and
PyTorch's default (``init_scale=None``). docs/rl.md, "HTM's read at initialisation".

A second table (``--input-scale``: the inputs' standard deviation per feature; 0.09 gives the quick
agent's encoder outputs, of norm ~0.7 at width 64) prints the mean norm per step of the output the
policy and value read, before the first chunk completes (no read) and after, for the paper's layer
(``init_scale=2``), without the slot encoding, with the read gated shut, and with ``final_norm``
(docs/htm.md, "final_norm").

    python benchmarks/htm_read_scale.py
    python benchmarks/htm_read_scale.py --dim 256 --steps 120
    python benchmarks/htm_read_scale.py --input-scale 0.09
"""

from __future__ import annotations

import argparse
import contextlib
from statistics import fmean

import torch

from chronomem.experiments.visual_match import CPU_AGENT, CPU_HTM


@contextlib.contextmanager
def recorded_reads(record):
    """Within the block, every ``HTMAttention.read`` calls ``record(module, inputs, output)`` after reading
    (``inputs``: its positional arguments after ``self``); the method is restored on the way out."""
    from chronomem.htm import HTMAttention

    original = HTMAttention.read

    def read(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        record(self, args, out)
        return out

    HTMAttention.read = read
    try:
        yield
    finally:
        HTMAttention.read = original


def quick_core(dim: int, **options):
    """The quick RL agent's HTM (visual_match's CPU_AGENT and CPU_HTM: one layer, 4 heads, chunks of 16,
    top-4 of 24, window 16), with ``options``."""
    from chronomem.htm import build_htm

    return build_htm(dim, CPU_AGENT["depth"], CPU_AGENT["heads"], **CPU_HTM, **options)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60, help="a Key-to-Door episode at distractor 30")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--input-scale", type=float, default=1.0, help="the inputs' std per feature")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    print("| init_scale | input | memory read | read / input | layer update y - x |")
    print("|---|---|---|---|---|")
    for init_scale in (2.0, None):
        inputs, reads, updates = [], [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            core = quick_core(args.dim, init_scale=init_scale)
            x = args.input_scale * torch.randn(args.batch, args.steps, args.dim)

            def norm(module, inputs, out, reads=reads):  # the mean norm per step of each read
                reads.append(out.norm(dim=-1).mean().item())

            with torch.no_grad(), recorded_reads(norm):
                y, _ = core(x)
            inputs.append(x.norm(dim=-1).mean().item())
            updates.append((y - x).norm(dim=-1).mean().item())
        print(f"| {init_scale} | {fmean(inputs):.2f} | {fmean(reads):.2f} | {fmean(reads) / fmean(inputs):.2f} "
              f"| {fmean(updates):.2f} |")
    print()
    chunk = CPU_HTM["chunk_size"]
    print("| layer | output before the first chunk completes | after |")
    print("|---|---|---|")
    for name, options in OUTPUT_VARIANTS.items():
        before, after = [], []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            core = quick_core(args.dim, **options)
            with torch.no_grad():
                y, _ = core(args.input_scale * torch.randn(args.batch, args.steps, args.dim))
            norms = y.norm(dim=-1)
            before.append(norms[:, :chunk].mean().item())  # no chunk complete yet: nothing read
            after.append(norms[:, chunk:].mean().item())
        print(f"| {name} | {fmean(before):.2f} | {fmean(after):.2f} |")


# The output the heads read, per layer (the second table)
OUTPUT_VARIANTS = {
    "paper's (init_scale=2)": {},
    "no slot encoding": {"position_encoding": False},
    "read gated shut": {"read_gate": 0.0},
    "final_norm": {"final_norm": True},
}


if __name__ == "__main__":
    main()
