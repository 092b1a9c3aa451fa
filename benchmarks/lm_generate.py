"""Byte-level generation speed: Transformer-XL vs causal TLB, the state carried (``CausalLM.generate``).

Both models at the ``lm`` experiment's quick sizes (width 128, 4 blocks, 4 heads; Transformer-XL
sliding memory 128; TLB chunk 64, state 16), untrained (the speed does not depend on the weights),
one thread. Each new byte is one call of one token with the state carried; beside it, the cost
without a state: recomputing the whole context (prompt + bytes so far) for every byte, as a
stateless sampler would. Bytes per CPU second of this process (which other processes on a shared
machine disturb less than wall time) and, in parentheses, per wall-clock second; the best of
``--repeats`` runs.

    OMP_NUM_THREADS=1 python benchmarks/lm_generate.py [--bytes 500 --repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from chronomem.experiments.lm import SCALES, model_options
from chronomem.heads import build_model
from chronomem.threads import Measured

PROMPT = b"Memory, n. The faculty of the mind by which it retains the knowledge of past events. "


class _ByteTask:  # what build_model reads of the text task, without reading a corpus
    kind, vocab_size, num_classes, causal = "lm", 256, 256, True


def best_speed(generate, net, n: int, repeats: int) -> str:
    """The best bytes per CPU second of this process and per wall-clock second of ``generate(net, n)``."""
    cpu_speeds, wall_speeds = [], []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        generate(net, n)
        cpu_speeds.append(n / (time.process_time() - cpu))
        wall_speeds.append(n / (time.perf_counter() - wall))
    return f"{max(cpu_speeds):.0f} ({max(wall_speeds):.0f})"


def with_state(net, n: int) -> None:
    net.generate(PROMPT, n, temperature=1.0, generator=torch.Generator().manual_seed(0))


@torch.inference_mode()
def recomputing(net, n: int) -> None:
    """The stateless sampler: the whole context through the model for every byte."""
    sequence = list(PROMPT)
    for _ in range(n):
        logits, _ = net(torch.tensor([sequence]))
        sequence.append(int(torch.multinomial(logits[0, -1].float().softmax(-1), 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=500, help="bytes generated per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scale = SCALES["quick"]
    measured = Measured(log=print).start()
    print(f"{args.bytes} bytes after a {len(PROMPT)}-byte prompt, one thread, best of {args.repeats}; "
          "bytes per CPU second (per wall-clock second)")
    print(f"{'model':<16}{'params':>10}{'state carried':>22}{'recomputing':>22}")
    for model in ("transformer-xl", "tlb"):
        torch.manual_seed(0)
        net = build_model(model, _ByteTask(), **model_options(model, scale)).eval()
        fast = best_speed(with_state, net, args.bytes, args.repeats)
        slow = best_speed(recomputing, net, args.bytes // 5, args.repeats)
        params = sum(p.numel() for p in net.parameters())
        print(f"{model:<16}{params:>10,}{fast:>22}{slow:>22}")
    measured.stop()


if __name__ == "__main__":
    main()
