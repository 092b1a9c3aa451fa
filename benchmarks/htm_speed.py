"""Where HTM's time goes, and how it compares: the 16k training step and the agent's step (issue 39).

Two commands, one torch thread:

* ``profile``: ``torch.profiler`` over HTM's training step at the setting of ``chronomem bench --models
  transformer htm --lengths 16384 --mode train`` (dim 64, depth 2, 4 heads, chunk 32, top-k 8, memory
  64 chunks, window 64, fed in calls of 512 steps, forward + backward of ``mean(y^2)``) and over its
  acting step (``benchmarks/core_step.py``'s HTM rows, B = 16, 32 one-step calls from the state after
  1,024 steps). Each forward op is labelled by the part of the layer it runs in (``PARTS``), each
  backward op by the label of the forward op that recorded it (autograd's sequence number), and the
  fractions of the profiled time are printed:

  - ``read``: the HTM block's relevance and top-k (``HTMAttention.read`` outside the mix);
  - ``mix``: the within-chunk attention over the selected chunks (``mix_chunks``);
  - ``write``: building the call's chunks, committing them, the per-query chunk mask (``_store_and_read``);
  - ``local``: the local self-attention (its LayerNorm included);
  - ``feed-forward``: the FFN block (its LayerNorm included);
  - ``bookkeeping``: everything else of the forward (episode numbering, the local layout, caches,
    residual adds, the other LayerNorm) and the backward ops no forward op claims.

* ``compare``: the ratios, side by side in one process, one repeat of each in turn, medians: HTM's
  16k training step against the full-attention transformer's (``chronomem bench``'s settings, B = 1),
  and the acting step against Transformer-XL's with a 256-step sliding memory and the LSTM's
  (``benchmarks/core_step.py``). Run it under two ``PYTHONPATH``s to compare two versions of the code.

    OMP_NUM_THREADS=1 python benchmarks/htm_speed.py profile
    OMP_NUM_THREADS=1 python benchmarks/htm_speed.py compare --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from chronomem.registry import build_backbone
from chronomem.threads import Measured

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core_step  # noqa: E402  (the acting rows and their timing)

WIDTH = dict(dim=64, depth=2, num_heads=4)  # chronomem bench's shared width
HTM_16K = dict(chunk_size=32, top_k=8, memory_size=64, window=64)  # bench/sweep.py SPECS["htm"]
STREAM = 512  # bench/sweep.py: HTM is fed in calls of 512 steps
PARTS = ("read", "mix", "write", "local", "feed-forward", "bookkeeping")
ACTING_CORES = {
    "htm top-4": core_step.CORES[-2],
    "htm top-8": core_step.CORES[-1],
    "transformer-xl": next(c for c in core_step.CORES if c.name == "transformer-xl"
                           and c.options["memory_mode"] == "sliding" and c.options["mem_len"] == 256),
    "lstm": core_step.CORES[0],
}


def build_htm(**options):
    torch.manual_seed(0)
    return build_backbone("htm", **WIDTH, causal=True, **{**HTM_16K, **options})


def train_step(model, x, stream: int | None = STREAM) -> None:
    """chronomem bench's training step: forward (in calls of ``stream`` steps, state passed on) and
    backward of ``mean(y^2)``."""
    model.zero_grad(set_to_none=True)
    parts, state = [], None
    for piece in (x.split(stream, 1) if stream else [x]):
        y, state = model(piece, state=state)
        parts.append(y)
    (sum(y.float().square().sum() for y in parts) / x.numel()).backward()


# =============================================================================================
# profile
# =============================================================================================


@contextlib.contextmanager
def labelled(model):
    """Wrap the parts of ``model``'s HTM layers in ``record_function("htm::<part>")`` while inside (each
    LayerNorm with its block), whichever version of ``chronomem.htm`` is imported."""
    import chronomem.htm as htm
    from chronomem.ops import htm_local

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            with torch.profiler.record_function(f"htm::{label}"):
                return original(*args, **kwargs)

        setattr(owner, name, wrapped)
        return owner, name, original

    patches = [
        wrap(htm.HTMAttention, "read", "read"),
        wrap(htm, "mix_chunks", "mix"),
        wrap(htm.HTMTransformer, "_store_and_read", "write"),
        wrap(htm_local.LocalLayout, "attend", "local"),
        wrap(htm.FeedForward, "forward", "feed-forward"),
    ]
    for layer in model.layers:  # instance attributes: removed again below
        patches += [wrap(layer.norm_local, "forward", "local"), wrap(layer.norm_memory, "forward", "read"),
                    wrap(layer.norm_ff, "forward", "feed-forward")]
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            if isinstance(owner, torch.nn.Module):
                del owner.forward
            else:
                setattr(owner, name, original)


def _label_of(event) -> str | None:
    while event is not None:
        if event.name.startswith("htm::"):
            return event.name[5:]
        event = event.cpu_parent
    return None


def fractions(model, run) -> dict:
    """Profile ``run()`` (already warmed up) and return the seconds of each part, forward and backward."""
    with labelled(model), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    events = prof.events()
    by_seq: dict[int, str] = {}
    seconds = defaultdict(float)
    backward_roots = []
    for e in events:
        if e.name.startswith("autograd::engine::evaluate_function"):
            backward_roots.append(e)
            continue
        if _inside_backward(e):
            continue
        label = _label_of(e) or "bookkeeping"  # a part's own range: the Python between its ops
        if e.sequence_nr >= 0:
            by_seq.setdefault(e.sequence_nr, label)
        seconds[("forward", label)] += e.self_cpu_time_total / 1e6
    for e in backward_roots:
        label = by_seq.get(e.sequence_nr, "bookkeeping")
        seconds[("backward", label)] += e.cpu_time_total / 1e6
    # Python outside every op and range (the calls between the layers, the loss): bookkeeping
    seconds[("forward", "bookkeeping")] += max(0.0, wall - sum(seconds.values()))
    return dict(seconds)


def _inside_backward(event) -> bool:
    while event is not None:
        if event.name.startswith("autograd::engine::evaluate_function"):
            return True
        event = event.cpu_parent
    return False


def format_fractions(title: str, seconds: dict) -> str:
    total = sum(seconds.values())
    fwd = sum(v for (phase, _), v in seconds.items() if phase == "forward")
    lines = [f"{title}: profiled {total:.3f} s ({fwd / total:.0%} forward)",
             f"  {'part':14s} {'forward':>8s} {'backward':>9s} {'total':>7s}"]
    for part in PARTS:
        f, b = seconds.get(("forward", part), 0.0), seconds.get(("backward", part), 0.0)
        lines.append(f"  {part:14s} {f / total:8.1%} {b / total:9.1%} {(f + b) / total:7.1%}")
    return "\n".join(lines)


def profile(args) -> dict:
    out = {}
    if args.length:
        model = build_htm(**args.option)
        x = torch.randn(args.batch, args.length, WIDTH["dim"], generator=torch.Generator().manual_seed(1))
        train_step(model, x[:, :STREAM])  # warm-up
        seconds = fractions(model, lambda: train_step(model, x))
        print(format_fractions(f"training step, x [{args.batch}, {args.length}, 64], calls of {STREAM}", seconds))
        out["train"] = {f"{p}/{k}": v for (p, k), v in seconds.items()}
    for name in ("htm top-4", "htm top-8"):
        core = ACTING_CORES[name]
        model = core_step.build(core, WIDTH["dim"], WIDTH["depth"], WIDTH["num_heads"])
        generator = torch.Generator().manual_seed(0)
        state = core_step.steady_state(model, 16, WIDTH["dim"], 1024, generator)
        inputs = torch.randn(32, 16, 1, WIDTH["dim"], generator=generator)
        core_step.time_acting(model, state, inputs)  # warm-up
        seconds = fractions(model, lambda m=model, s=state, i=inputs: core_step.time_acting(m, s, i))
        print(format_fractions(f"acting step, {name} ({core.label}), x [16, 1, 64] x 32 calls", seconds))
        out[name] = {f"{p}/{k}": v for (p, k), v in seconds.items()}
    return out


# =============================================================================================
# compare
# =============================================================================================


def compare(args) -> dict:
    result = {}
    if args.length:
        torch.manual_seed(0)
        full = build_backbone("transformer", **WIDTH, causal=False)
        htm = build_htm(**args.option)
        x = torch.randn(args.batch, args.length, WIDTH["dim"], generator=torch.Generator().manual_seed(1))
        steps = {"htm": lambda: train_step(htm, x), "transformer": lambda: train_step(full, x, None)}
        times = defaultdict(list)
        for repeat in range(args.repeats + 1):  # the first round is a warm-up
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                if repeat:
                    times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) for name, t in times.items()}
        result["train"] = {**medians, "speedup": medians["transformer"] / medians["htm"]}
        print(f"training step, x [{args.batch}, {args.length}, 64]: htm {medians['htm']:.3f} s, transformer "
              f"{medians['transformer']:.3f} s, full attention / htm = {result['train']['speedup']:.2f}x")
    if args.acting_repeats:
        rows = core_step.acting_rows(list(ACTING_CORES.values()), repeats=args.acting_repeats)
        ms = {name: row["ms"] for name, row in zip(ACTING_CORES, rows, strict=True)}
        result["acting"] = {"ms": ms, **{f"{name} / transformer-xl": ms[name] / ms["transformer-xl"]
                                          for name in ("htm top-4", "htm top-8")},
                            **{f"{name} / lstm": ms[name] / ms["lstm"] for name in ("htm top-4", "htm top-8")}}
        print("acting step, B = 16: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
        print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in result["acting"].items() if k != "ms"))
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("profile", "compare"))
    p.add_argument("--length", type=int, default=16384, help="training steps N (0: skip training)")
    p.add_argument("--batch", type=int, default=1, help="training batch (chronomem bench: 1)")
    p.add_argument("--repeats", type=int, default=3, help="compare: timed training repeats")
    p.add_argument("--acting-repeats", type=int, default=10, help="compare: timed acting repeats (0: skip)")
    p.add_argument("--option", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help="extra HTM option (value parsed as JSON), e.g. --option read_impl '\"gather\"'")
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args(argv)
    args.option = {key: json.loads(value) for key, value in args.option}
    torch.set_num_threads(1)
    measured = Measured(log=print).start()
    result = profile(args) if args.command == "profile" else compare(args)
    result["conditions"] = measured.stop().record()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
