"""Our ``chronomem.htm.HTMAttention`` against other published implementations of the same read.

Peers (``PEERS``): ``htm-pytorch``'s ``HTMAttention`` (the ``[bench]`` extra), on identical shapes and
inputs. Times are measured side by side in one process (interleaved repeats, median: a change of the
machine's load hits every implementation alike); peak memory in one fresh process per implementation
(``worker.measure``). Peers that cannot be imported are reported as unavailable.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chronomem.bench.worker import UNAVAILABLE, measure


@dataclass
class PeerShape:
    """An agent-sized read: B=4, Q=128 queries over M=256 chunks of C=32 steps, top-k 8 chunks,
    D=256 (8 heads of 32)."""

    batch: int = 4
    queries: int = 128
    chunks: int = 256
    chunk_size: int = 32
    top_k: int = 8
    dim: int = 256
    heads: int = 8


def _ours(shape: PeerShape, queries, flat_memory):
    """chronomem.htm.HTMAttention over a full HierarchicalMemory holding ``flat_memory`` in order."""
    from dataclasses import replace

    import torch

    from chronomem.htm import HierarchicalMemory, HTMAttention

    B, M, C, D = shape.batch, shape.chunks, shape.chunk_size, shape.dim
    attn = HTMAttention(D, shape.heads, shape.top_k, C)
    contents = flat_memory.reshape(B, M, C, D)
    memory = replace(
        HierarchicalMemory.empty(B, M, C, D),
        keys=contents.mean(2),
        contents=contents,  # Section 2: the summary key is the chunk mean
        slot_valid=torch.ones(B, M, C, dtype=torch.bool),
        valid=torch.ones(B, M, dtype=torch.bool),
    )
    return attn, lambda q: attn(q, memory)


def _htm_pytorch(shape: PeerShape, queries, flat_memory):
    """``htm_pytorch.HTMAttention`` (PyPI ``htm-pytorch``): memories as one flat [B, M*C, D] sequence."""
    from htm_pytorch import HTMAttention

    attn = HTMAttention(
        dim=shape.dim,
        heads=shape.heads,
        topk_mems=shape.top_k,
        mem_chunk_size=shape.chunk_size,
        dim_head=shape.dim // shape.heads,
    )
    return attn, lambda q: attn(q, flat_memory)


# name -> builder(shape, queries, flat_memory) -> (module, read(queries) -> [B, Q, D]); "chronomem" first.
PEERS: dict[str, Callable] = {"chronomem": _ours, "htm-pytorch": _htm_pytorch}


def _peer_inputs(shape: PeerShape, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.batch, shape.queries, shape.dim, generator=g)
    mem = torch.randn(shape.batch, shape.chunks * shape.chunk_size, shape.dim, generator=g)
    return q, mem


def _peer_step(module, read, q, train: bool) -> None:
    import torch

    if train:
        module.zero_grad(set_to_none=True)
        q = q.detach().requires_grad_(True)
        read(q).square().mean().backward()
    else:
        with torch.no_grad():
            read(q)


def peer_job(spec: dict, meter) -> None:
    """Peak memory of one implementation (``worker.measure``'s job): infer, then train."""
    shape = PeerShape(**spec["shape"])
    q, mem = _peer_inputs(shape, spec["seed"])
    try:
        module, read = PEERS[spec["name"]](shape, q, mem)
    except ImportError as err:
        meter.fail(err, status=UNAVAILABLE)
        return
    meter.set_baseline()
    for mode in ("infer", "train"):
        meter.run(mode, lambda mode=mode: _peer_step(module, read, q, mode == "train"))


def compare_peers(
    shape: PeerShape | None = None,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    timeout: float | None = 300,
    seed: int = 0,
    log: Callable[[str], Any] = print,
) -> dict:
    """Time every importable peer side by side (interleaved repeats, median) and measure each one's
    peak memory in a fresh process; ratios are peer / chronomem (> 1: ours is faster / smaller)."""
    import torch

    shape = shape or PeerShape()
    if threads:
        torch.set_num_threads(threads)
    q, mem = _peer_inputs(shape, seed)
    built, unavailable = {}, {}
    for name, builder in PEERS.items():
        try:
            torch.manual_seed(seed)
            built[name] = builder(shape, q, mem)
        except ImportError as err:
            unavailable[name] = str(err)
    times: dict[str, dict[str, list[float]]] = {name: {"infer": [], "train": []} for name in built}
    for mode in ("infer", "train"):
        for i in range(warmup + repeats):
            for name, (module, read) in built.items():  # interleaved: load changes hit everyone alike
                t0 = time.perf_counter()
                _peer_step(module, read, q, mode == "train")
                if i >= warmup:
                    times[name][mode].append(time.perf_counter() - t0)
    memory = {
        name: measure("chronomem.bench.peers:peer_job", {"name": name, "shape": asdict(shape), "seed": seed},
                      ("infer", "train"), timeout=timeout, threads=threads)
        for name in built
    }
    rows = {}
    for name in built:
        rows[name] = {}
        for mode in ("infer", "train"):
            rows[name][mode] = {
                "seconds": statistics.median(times[name][mode]),
                "delta_rss_mb": memory[name][mode].get("delta_rss_mb"),
                "times": [round(t, 6) for t in times[name][mode]],
            }
    ref = rows.get("chronomem")
    for name, row in rows.items():
        for mode, r in row.items():
            if ref and name != "chronomem":
                r["time_ratio"] = round(r["seconds"] / ref[mode]["seconds"], 2)
                ours_mb = ref[mode]["delta_rss_mb"]
                r["memory_ratio"] = (
                    round(r["delta_rss_mb"] / ours_mb, 2) if r["delta_rss_mb"] and ours_mb else None
                )
    result = {"shape": asdict(shape), "repeats": repeats, "rows": rows, "unavailable": unavailable}
    for line in peer_report(result):
        log(line)
    return result


def peer_report(peers: dict) -> list[str]:
    s = peers["shape"]
    lines = [
        "## HTMAttention against peers",
        "",
        f"B={s['batch']}, Q={s['queries']} queries, M={s['chunks']} chunks of C={s['chunk_size']}, "
        f"top-k {s['top_k']}, D={s['dim']} ({s['heads']} heads); median of {peers['repeats']} interleaved "
        "repeats; peak memory above the baseline in a fresh process per implementation. "
        "Ratio = peer / chronomem (> 1: chronomem is faster / smaller).",
        "",
        "| implementation | infer s | infer MB | train s | train MB | time ratio (infer / train) "
        "| memory ratio (infer / train) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in peers["rows"].items():
        i, t = row["infer"], row["train"]
        mb = lambda v: "-" if v is None else f"{v:.0f}"
        ratio = lambda a, b: "-" if a is None else f"{a} / {b}"
        lines.append(
            f"| {name} | {i['seconds']:.4f} | {mb(i['delta_rss_mb'])} | {t['seconds']:.4f} | "
            f"{mb(t['delta_rss_mb'])} | {ratio(i.get('time_ratio'), t.get('time_ratio'))} | "
            f"{ratio(i.get('memory_ratio'), t.get('memory_ratio'))} |"
        )
    for name, why in peers.get("unavailable", {}).items():
        lines.append(f"| {name} | not installed ({why}) | | | | | |")
    return lines + [""]
