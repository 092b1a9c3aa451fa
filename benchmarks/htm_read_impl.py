"""Which way of mixing HTM's selected chunks is fastest for a learner's call: the measurement behind
``read_impl="auto"``'s choice between the gather and the grouped path (``ops.htm_mix.grouped_pays``).

Both compute the same function (``tests/test_ops_htm_mix.py``). The gather copies each query's k chunks
and scores them in matrix products of H rows; the grouped path sorts the (query, chunk) pairs by chunk
and scores tiles of ``64 / H`` pairs of one chunk in products of 64 rows, padding each chunk's last tile.
How full the tiles are (``htm_grouped.tile_fill``) depends on how many queries choose the same chunks,
which the shapes alone do not say. Two tables, forward and backward, one thread by default, the
implementations interleaved (median of ``--repeats``):

* **replays**: a learning call of the RL agents' HTM cores from a filled memory, with episode ends
  inside (each step with probability 1/60), as PPO's learner makes them: the Visual Match and Ballet
  quick agent (minibatches of 2 whole 128-step sequences, top-4 of 24 chunks of 16, window 16) and the
  POPGym quick agent (16 sequences of 64 steps, top-4 of 64, window 64), each also with 8 heads.
  Columns: ms per call for ``auto`` (as shipped), ``gather`` and ``grouped``, what auto took, and the
  tiles' fill of its first read.
* **``--grid``**: ``mix_chunks`` alone over heads (4, 8), chunks M, queries Q, batch rows B and how
  concentrated the choices are (each query's top-k of ``randn + c * randn_per_row``: c = 0.5 spreads
  them, 8 makes the queries of a row agree), printing the fill, both times and their ratio.

    python benchmarks/htm_read_impl.py
    python benchmarks/htm_read_impl.py --grid --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from unittest import mock

import torch

from chronomem.ops import htm_mix
from chronomem.ops.htm_grouped import tile_fill, tile_pairs
from chronomem.registry import build_backbone
from chronomem.threads import Measured

IMPLS = ("auto", "gather", "grouped")
# (label, batch rows, steps per call, core options): PPO's minibatches of whole sequences
REPLAYS = (
    ("Visual Match / Ballet quick agent", 2, 128, dict(memory_size=24, window=16, num_heads=4)),
    ("  the same, 8 heads", 2, 128, dict(memory_size=24, window=16, num_heads=8)),
    ("POPGym quick agent", 16, 64, dict(memory_size=64, window=64, num_heads=4)),
    ("  the same, 8 heads", 16, 64, dict(memory_size=64, window=64, num_heads=8)),
)


def replay_call(impl: str, batch: int, steps: int, options: dict, dim: int = 64, seed: int = 0):
    """A function running one learning call (forward and backward of ``mean(y^2)``) of a one-layer HTM
    core with ``read_impl=impl`` from a memory filled by 512 steps."""
    torch.manual_seed(seed)
    core = build_backbone("htm", dim=dim, depth=1, causal=True, chunk_size=16, top_k=4, memory_gradient=True,
                          read_impl=impl, **options)
    g = torch.Generator().manual_seed(seed)
    state = None
    with torch.no_grad():
        for _ in range(8):
            _, state = core(torch.randn(batch, 64, dim, generator=g), state=state)
    x = torch.randn(batch, steps, dim, generator=g)
    done = torch.rand(batch, steps, generator=g) < 1 / 60

    def call() -> torch.Tensor:
        core.zero_grad(set_to_none=True)
        y, _ = core(x, state=state, done=done)
        y.square().mean().backward()
        return y.detach()

    return call


def first_read(call) -> tuple[str, float]:
    """What ``auto`` took on the call's first chunk read, and its tiles' fill."""
    seen = []
    original = htm_mix.grouped_pays

    def spy(rows, n_rows, heads):
        pays = original(rows, n_rows, heads)
        seen.append(("grouped" if pays else "gather", tile_fill(rows, n_rows, tile_pairs(heads))))
        return pays

    with mock.patch.object(htm_mix, "grouped_pays", spy):
        call()
    return seen[0] if seen else ("dense or gather (no choice)", float("nan"))


def timed(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each call, the calls interleaved."""
    times = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def replays_table(repeats: int) -> list[dict]:
    rows = []
    for label, batch, steps, options in REPLAYS:
        calls = {impl: replay_call(impl, batch, steps, options) for impl in IMPLS}
        outputs = {impl: call() for impl, call in calls.items()}
        diff = max(float((outputs[impl] - outputs["gather"]).abs().max()) for impl in IMPLS)
        took, fill = first_read(calls["auto"])
        ms = {impl: 1e3 * s for impl, s in timed(calls, repeats).items()}
        rows.append(dict(label=label, batch=batch, steps=steps, **ms, took=took, fill=fill, max_diff=diff))
    return rows


def grid_table(repeats: int, dim: int = 64, chunk: int = 16) -> list[dict]:
    rows = []
    for heads, chunks, queries, batch, concentration in itertools.product(
            (4, 8), (34, 68, 256), (64, 128), (2, 16), (0.5, 2.0, 8.0)):
        g = torch.Generator().manual_seed(0)
        k = 4
        q = torch.randn(batch, queries, heads, dim, generator=g, requires_grad=True)
        weights = torch.rand(batch, queries, k, generator=g, requires_grad=True)
        contents = torch.randn(batch, chunks, chunk, dim, generator=g, requires_grad=True)
        logits = torch.randn(batch, queries, chunks, generator=g) + concentration * torch.randn(
            batch, 1, chunks, generator=g)
        top_idx = logits.topk(k, -1).indices
        valid = torch.ones(batch, chunks, chunk, dtype=torch.bool)
        visible = torch.ones(batch, queries, chunks, dtype=torch.bool)

        def call(impl, q=q, weights=weights, top_idx=top_idx, contents=contents, valid=valid, visible=visible):
            return lambda: htm_mix.mix_chunks(q, weights, top_idx, contents, valid, visible,
                                              impl=impl).square().mean().backward()

        rows_ = torch.arange(batch)[:, None, None] * chunks + top_idx
        ms = {impl: 1e3 * s for impl, s in timed({impl: call(impl) for impl in ("gather", "grouped")}, repeats).items()}
        rows.append(dict(heads=heads, chunks=chunks, queries=queries, batch=batch, concentration=concentration,
                         pairs=rows_.numel(), fill=tile_fill(rows_, batch * chunks, tile_pairs(heads)), **ms,
                         ratio=ms["grouped"] / ms["gather"],
                         auto="grouped" if htm_mix.grouped_pays(rows_, batch * chunks, heads) else "gather"))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", action="store_true", help="time mix_chunks alone over a grid of shapes")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with Measured(args.threads, log=print):
        if args.grid:
            print(f"{'H':>2} {'M':>4} {'Q':>4} {'B':>3} {'c':>4} {'pairs':>6} {'fill':>5} {'gather ms':>10} "
                  f"{'grouped ms':>11} {'ratio':>6}  auto")
            for r in grid_table(args.repeats):
                print(f"{r['heads']:>2} {r['chunks']:>4} {r['queries']:>4} {r['batch']:>3} {r['concentration']:>4} "
                      f"{r['pairs']:>6} {r['fill']:>5.2f} {r['gather']:>10.2f} {r['grouped']:>11.2f} "
                      f"{r['ratio']:>6.2f}  {r['auto']}")
        else:
            print(f"{'replay (forward + backward)':<36} {'B x T':>8} {'auto ms':>8} {'gather ms':>10} "
                  f"{'grouped ms':>11}  auto took (tiles' fill)  max diff")
            for r in replays_table(args.repeats):
                print(f"{r['label']:<36} {r['batch']:>3} x {r['steps']:<3} {r['auto']:>8.1f} {r['gather']:>10.1f} "
                      f"{r['grouped']:>11.1f}  {r['took']} ({r['fill']:.2f})  {r['max_diff']:.1e}")


if __name__ == "__main__":
    main()
