"""Byte-level generation speed: Transformer-XL vs causal TLB, the state carried (``CausalLM.generate``).

Both models at the ``lm`` experiment's quick sizes (width 128, 4 blocks, 4 heads; Transformer-XL
sliding memory 128; TLB chunk 64, state 16), untrained (the speed does not depend on the weights),
one thread. Each new byte is one call of one token with the state carried; beside it, the cost
without a state: recomputing the whole context (prompt + bytes so far) for every byte, as a
stateless sampler would. Bytes per second, the best of ``--repeats`` runs (wall clock, which other
processes on a shared machine slow down: the best run is the least disturbed).

    OMP_NUM_THREADS=1 python benchmarks/lm_generate.py [--bytes 500 --repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from chronomem.experiments.lm import SCALES, model_options
from chronomem.heads import build_model

PROMPT = b"Memory, n. The faculty of the mind by which it retains the knowledge of past events. "


class _ByteTask:  # what build_model reads of the text task, without reading a corpus
    kind, vocab_size, num_classes, causal = "lm", 256, 256, True


def with_state(net, n: int) -> float:
    start = time.perf_counter()
    net.generate(PROMPT, n, temperature=1.0, generator=torch.Generator().manual_seed(0))
    return n / (time.perf_counter() - start)


@torch.inference_mode()
def recomputing(net, n: int) -> float:
    """The stateless sampler: the whole context through the model for every byte."""
    sequence = list(PROMPT)
    start = time.perf_counter()
    for _ in range(n):
        logits, _ = net(torch.tensor([sequence]))
        sequence.append(int(torch.multinomial(logits[0, -1].float().softmax(-1), 1)))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=500, help="bytes generated per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scale = SCALES["quick"]
    print(f"{args.bytes} bytes after a {len(PROMPT)}-byte prompt, one thread, best of {args.repeats}")
    print(f"{'model':<16}{'params':>10}{'state carried (B/s)':>22}{'recomputing (B/s)':>20}")
    for model in ("transformer-xl", "tlb"):
        torch.manual_seed(0)
        net = build_model(model, _ByteTask(), **model_options(model, scale)).eval()
        fast = max(with_state(net, args.bytes) for _ in range(args.repeats))
        slow = max(recomputing(net, args.bytes // 5) for _ in range(args.repeats))
        params = sum(p.numel() for p in net.parameters())
        print(f"{model:<16}{params:>10,}{fast:>22.0f}{slow:>20.0f}")


if __name__ == "__main__":
    main()
