"""The Transformer's decoding step (``Transformer.step``, BabyAI's acting path) with its ``KVCache``
written in place, against the same step concatenating the keys and values at every step (how it was
built before issue 53), side by side in one run.

Width 64, depth 2, 4 heads, one thread, untrained (the speed does not depend on the weights). An episode
of ``--steps`` one-token steps from an empty cache, under ``torch.inference_mode``; the table gives the
mean milliseconds per step over the first 64, 256 and ``--steps`` steps (the best of ``--repeats``), at
B = 16, 64 and 256 rows, and the ratio concatenating / in place. Both paths give the same outputs
(checked here on every run, and in tests/test_baselines.py against one call over the episode).

    OMP_NUM_THREADS=1 python benchmarks/kv_cache_step.py [--steps 512 --repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from chronomem.baselines import Transformer
from chronomem.layers import sinusoid_from_positions
from chronomem.threads import Measured


def concatenating_step(model: Transformer, x: torch.Tensor, layers: tuple | None):
    """The reference: ``Transformer.step`` with the cache as per-layer ``(keys, values)`` grown by
    ``torch.cat`` at every step (O(t) copied per step, O(t^2) per episode)."""
    past = 0 if layers is None else layers[0][0].shape[-2]
    h = x + sinusoid_from_positions(torch.arange(past, past + x.shape[1]), model.dim).to(x.dtype)
    grown = []
    for i, block in enumerate(model.blocks):
        attn, normed = block.attn, block.norm_attn(h)
        k, v = attn.heads_kv(normed)
        if layers is not None:
            k, v = torch.cat([layers[i][0], k], -2), torch.cat([layers[i][1], v], -2)
        grown.append((k, v))
        h = h + attn.attend(attn.heads_q(normed), k, v, causal=True)
        h = h + block.ff(block.norm_ff(h))
    return model.norm(h), tuple(grown)


@torch.inference_mode()
def episode(step, model, x: torch.Tensor, marks: tuple[int, ...]) -> tuple[dict[int, float], torch.Tensor]:
    """Seconds per step over the first ``mark`` steps of one episode, and the outputs."""
    cache, seconds, outputs, start = None, {}, [], time.perf_counter()
    for t in range(x.shape[1]):
        y, cache = step(model, x[:, t : t + 1], cache)
        outputs.append(y)
        if t + 1 in marks:
            seconds[t + 1] = (time.perf_counter() - start) / (t + 1)
    return seconds, torch.cat(outputs, 1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(dim=64, depth=2, num_heads=4, causal=True).eval()
    paths = {"in place": lambda m, x, c: m.step(x, c), "concatenating": concatenating_step}
    marks = tuple(sorted({m for m in (64, 256, args.steps) if m <= args.steps}))
    measured = Measured(log=print).start()
    print(f"ms per step of an episode from an empty cache (mean over its first {' / '.join(map(str, marks))} "
          f"steps), best of {args.repeats}")
    print(f"{'B':>5}  {'path':<14}" + "".join(f"{m:>9}" for m in marks))
    for batch in args.batches:
        x = torch.randn(batch, args.steps, 64)
        best, outputs = {}, {}
        for _ in range(args.repeats):
            for name, step in paths.items():  # interleaved: a change of load hits both
                seconds, outputs[name] = episode(step, model, x, marks)
                best[name] = {m: min(s, best.get(name, {}).get(m, float("inf"))) for m, s in seconds.items()}
        torch.testing.assert_close(outputs["in place"], outputs["concatenating"], atol=1e-5, rtol=1e-5)
        for name in paths:
            print(f"{batch:>5}  {name:<14}" + "".join(f"{1000 * best[name][m]:>9.3f}" for m in marks))
        ratio = [best["concatenating"][m] / best["in place"][m] for m in marks]
        print(f"{batch:>5}  {'ratio':<14}" + "".join(f"{r:>8.2f}x" for r in ratio))
    measured.stop()


if __name__ == "__main__":
    main()
