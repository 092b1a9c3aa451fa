"""Causal TLB as an agent's memory: the cost of one step, and of episode ends inside a rollout.

* step: one call ``x [B, 1, D]`` with the state carried, ``torch.inference_mode``, after 300 steps.
  "aligned": every row at the same slot of its chunk (no resets), so all rows end a chunk together
  once every K steps; "desynced": random resets put the rows at different slots, so some row ends its
  chunk (and updates its state, Eq. 7) at most steps. Mean over a whole number of chunks, so the
  updates are counted. A two-layer ``nn.LSTM`` step of the same width is timed beside it.
* rollout: one call ``x [B, T, D]`` with episode ends inside it (``done`` True with probability p per
  step) and the same call without, from a fresh state and from a state whose rows are mid-chunk;
  forward under ``torch.inference_mode``, and forward + backward. Interleaved repeats, median.

Times are CPU time of this process (``time.process_time``), which other processes on a shared
machine disturb less than wall time; the step table gives the wall-clock median too.

    OMP_NUM_THREADS=1 python benchmarks/tlb_step.py [--batch 16 --dim 64 --heads 4 --chunk 16 --state 16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from chronomem.threads import Measured
from chronomem.tlb import TLB


def steady_state(model: TLB, batch: int, dim: int, generator: torch.Generator, reset_prob: float):
    state = None
    with torch.no_grad():  # (not inference mode: the rollouts backpropagate from this state)
        for _ in range(300):
            _, state = model(torch.randn(batch, 1, dim, generator=generator), state)
            state = state.reset(torch.rand(batch, generator=generator) < reset_prob)
    return state


def time_steps(step, state, xs) -> tuple[float, float]:
    """Mean CPU time and median wall time of ``state = step(x, state)`` over ``xs``."""
    wall = []
    cpu = time.process_time()
    with torch.inference_mode():
        for x in xs:
            start = time.perf_counter()
            state = step(x, state)
            wall.append(time.perf_counter() - start)
    return (time.process_time() - cpu) / len(xs), statistics.median(wall)


def time_rollout(model: TLB, state, x, done, backward: bool) -> float:
    start = time.process_time()
    if backward:
        y, _ = model(x, state, done=done)
        y.square().mean().backward()
    else:
        with torch.inference_mode():
            model(x, state, done=done)
    return time.process_time() - start


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--state", type=int, default=16, help="N, state vectors")
    parser.add_argument("--shapes", nargs="+", default=["1x2", "2x1", "2x2"],
                        help="depth x R (self-attention layers per group)")
    parser.add_argument("--steps", type=int, default=1024, help="timed steps (a multiple of --chunk)")
    parser.add_argument("--rollout", type=int, default=128)
    parser.add_argument("--done-probs", type=float, nargs="+", default=[1 / 128, 1 / 32])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    measured = Measured(log=print).start()
    generator = torch.Generator().manual_seed(0)
    B, D = args.batch, args.dim
    xs = torch.randn(args.steps, B, 1, D, generator=generator)

    lstm = torch.nn.LSTM(D, D, num_layers=2, batch_first=True).eval()
    zeros = torch.zeros(2, B, D)
    lstm_cpu, lstm_wall = time_steps(lambda x, s: lstm(x, s)[1], (zeros, zeros), xs)
    steps = [f"{'LSTM (2 layers)':>15} | {'':>8} | {1000 * lstm_cpu:>11.3f} | {1000 * lstm_wall:>14.3f} | "
             f"{B / lstm_cpu:>11.0f} | {1.0:>7.2f}"]
    rollouts = []
    for shape in args.shapes:
        depth, per_cross = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        model = TLB(dim=D, num_heads=args.heads, depth=depth, self_per_cross=per_cross, chunk_size=args.chunk,
                    num_state=args.state, causal=True).eval()
        name = f"TLB {depth} x [{per_cross}+1]"
        for rows, reset_prob in (("aligned", 0.0), ("desynced", 0.02)):
            state = steady_state(model, B, D, generator, reset_prob)
            cpu, wall = time_steps(lambda x, s: model(x, s)[1], state, xs)  # noqa: B023 (used at once)
            steps.append(f"{name:>15} | {rows:>8} | {1000 * cpu:>11.3f} | {1000 * wall:>14.3f} | "
                         f"{B / cpu:>11.0f} | {cpu / lstm_cpu:>7.2f}")

        x = torch.randn(B, args.rollout, D, generator=generator)
        for p in args.done_probs:
            done = torch.rand(B, args.rollout, generator=generator) < p
            for start, state in (("fresh", None), ("mid-chunk", steady_state(model, B, D, generator, 0.02))):
                timings = {(kind, backward): [] for backward in (False, True) for kind in ("none", "done")}
                for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
                    for (kind, backward), times in timings.items():
                        times.append(time_rollout(model, state, x, done if kind == "done" else None, backward))
                med = {key: 1000 * statistics.median(times) for key, times in timings.items()}
                cells = [f"{med['none', b]:>7.2f} / {med['done', b]:>7.2f} = {med['done', b] / med['none', b]:.2f}x"
                         for b in (False, True)]
                rollouts.append(f"{name:>15} | {f'1/{round(1 / p)}':>6} {int(done.sum()):>4} | {start:>9} | "
                                f"{cells[0]:>25} | {cells[1]:>25}")

    print(f"B={B}, dim={D}, heads={args.heads}, K={args.chunk}, N={args.state}, one thread")
    print(f"\none step x [{B}, 1, {D}], state carried, torch.inference_mode, {args.steps} steps")
    print(f"{'model':>15} | {'rows':>8} | {'cpu mean ms':>11} | {'wall median ms':>14} | {'env-steps/s':>11} | "
          f"{'/ LSTM':>7}")
    print("\n".join(steps))
    print(f"\nrollout x [{B}, {args.rollout}, {D}], CPU ms, median of {args.repeats}: without done / with done")
    print(f"{'model':>15} | {'p':>6} {'ends':>4} | {'state':>9} | {'forward':>25} | {'forward + backward':>25}")
    print("\n".join(rollouts))
    measured.stop()


if __name__ == "__main__":
    main()
