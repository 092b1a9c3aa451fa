"""The acting and learning paths of every causal core, side by side in one run.

An agent drives its memory core in two ways (docs/design.md, "Episode boundaries"):

* **acting**: one call per environment step, ``x [B, 1, D]`` with the state carried. Each core is
  first brought to its steady state: ``--fill`` steps (default 1,024, more than every bounded memory
  here holds) streamed in calls of 64 steps, the rows out of phase (``--phase staggered``, the
  default: row b starts b % 64 steps later, as an agent's envs do once their episodes have ended at
  different steps, so a chunked core completes a chunk in some row at most steps; ``--phase aligned``:
  every row in phase, a chunk's commit once per chunk for all rows together, what this script timed
  until the option). A timed repeat then runs ``--steps`` consecutive one-step calls from that state
  under ``torch.inference_mode`` (32 by default: whole chunks of the chunked cores) and divides by
  their number; the table shows the median over ``--repeats``, the env-steps per second ``B / seconds``
  and the ratio to the LSTM's step. Every repeat starts from the same steady state, so memories
  that grow with time (MemRNN, MemLSTM: every past step) are timed at ``--fill`` steps. With
  ``--compile BACKEND`` each core also runs under ``torch.compile(backend=BACKEND)`` (the same module
  and state, timed in the same rounds; the warm-up round compiles; ``--cpp-wrapper``: inductor's C++
  wrapper, as ``--compile-cpp-wrapper``), and its outputs are compared
  with the eager ones (``max_diff``). Beside the time, the work of an acting step, counted over the same
  steps: ``MFLOP`` (the floating-point operations of its matrix products, torch's ``FlopCounterMode``
  with the LSTM's and the CPU attention kernel's formulas added; elementwise work is not counted) and
  ``aten ops`` (the tensor operations it dispatches, views included). On one CPU thread at these
  sizes a step's time follows its operation count more than its arithmetic.
* **learning**: one call over a stored rollout ``x [B, 128, D]`` from the steady state (the same
  ``--phase``), forward and backward of ``mean(y^2)``, without and with episode ends inside it (``done``, each step with
  probability 1/64); the ratio is (with dones) / (without). A core that refuses ``done`` (an
  exception on the first call) is listed with "refuses done" and its message (segment-mode
  Transformer-XL refuses it by design). With ``--compile BACKEND`` the call with dones also runs under
  ``torch.compile(backend=BACKEND, dynamic=False)`` (PPO's replay), its ratio to the eager one beside it.

Cores and options are in ``CORES`` (registry names; Transformer-XL and GTrXL in the agents' sliding
memory and in the default segment recurrence, memory 64 and 256 steps; HTM holding 256 steps in its
chunk memory). All cores are timed interleaved (one repeat of each in turn), so a change of the
machine's load hits every core alike. One thread by default.

    python benchmarks/core_step.py                      # every core, dim 64, depth 2, 4 heads, B = 16
    python benchmarks/core_step.py --cores lstm htm --repeats 10 --json runs/core_step.json
    python benchmarks/core_step.py --cores transformer-xl htm --compile inductor --rollout 0
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from chronomem.layers import copy_state, fixed_stretch, parameters_fixed, state_donated
from chronomem.registry import build_backbone
from chronomem.threads import Measured
from chronomem.train.compile import compiled as compile_module

REFERENCE = "lstm"  # every ratio of the acting table is to this core's step
FILL_CALL = 64  # steps per call while filling the memory (a multiple of every chunk size here)
DONE_PROBABILITY = 1 / 64


@dataclass(frozen=True)
class Core:
    """One row: a registry model with its builder options; ``label`` says what the options mean."""

    name: str
    label: str
    options: dict = field(default_factory=dict)


CORES: tuple[Core, ...] = (
    Core("lstm", "", {}),
    Core("relevance-rnn", "buffer 10, relevant 15", {"buffer_size": 10, "relevant_size": 15}),
    Core("relevance-lstm", "buffer 10, relevant 15", {"buffer_size": 10, "relevant_size": 15}),
    Core("mem-rnn", "every past step", {}),
    Core("mem-lstm", "every past step", {}),
    *(
        Core(name, f"{mode}, memory {span}", {"memory_mode": mode, "mem_len": span, "segment_len": 64})
        for name in ("transformer-xl", "gtrxl")
        for mode in ("sliding", "segment")
        for span in (64, 256)
    ),
    Core("tlb", "chunk 16, 32 state slots, 1 self per cross",
         {"chunk_size": 16, "num_state": 32, "self_per_cross": 1}),
    Core("htm", "memory 16 x 16 steps, top-4, window 16",
         {"chunk_size": 16, "memory_size": 16, "top_k": 4, "window": 16}),
    Core("htm", "memory 16 x 16 steps, top-8, window 64",
         {"chunk_size": 16, "memory_size": 16, "top_k": 8, "window": 64}),
)


def select_cores(names: list[str] | None) -> list[Core]:
    """The rows of ``CORES`` whose registry name is in ``names`` (None: all), the reference always first.
    An unknown name raises ValueError listing the valid ones."""
    if names is None:
        return list(CORES)
    valid = sorted({core.name for core in CORES})
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise ValueError(f"--cores: unknown core(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    wanted = {REFERENCE, *names}
    return [core for core in CORES if core.name in wanted]


def build(core: Core, dim: int, depth: int, heads: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_backbone(core.name, dim=dim, depth=depth, num_heads=heads, causal=True, **core.options)


PHASES = ("staggered", "aligned")


def steady_state(model, batch: int, dim: int, fill: int, generator: torch.Generator, phase: str = "staggered"):
    """The state after ``fill`` random steps, streamed in calls of ``FILL_CALL`` steps, without gradients.

    ``phase="staggered"``: row b's first call pads its last ``b % n`` steps (n the call's length), so the rows'
    streams are out of phase, as an agent's envs are once their episodes have ended at different steps: a
    chunked core then completes a chunk in some row at most steps. ``"aligned"``: every row streams every
    step, so a chunked core's rows complete their chunks at the same step (what this script timed until
    the phase was an option)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    state = None
    with torch.no_grad():
        for start in range(0, fill, FILL_CALL):
            x = torch.randn(batch, min(FILL_CALL, fill - start), dim, generator=generator)
            mask = None
            if start == 0 and phase == "staggered":
                mask = torch.arange(x.shape[1])[None, :] < x.shape[1] - torch.arange(batch)[:, None] % x.shape[1]
            _, state = model(x, state=state, mask=mask)
    return state


def acting_outputs(model, state, inputs: torch.Tensor) -> torch.Tensor:
    """The outputs ``[steps, B, 1, D]`` of ``inputs`` fed one call per step from ``state``, the steps one
    fixed stretch as an agent's acting is (``rl.acting.Acting``: a core compares its parameters with the
    ones its cache was made with once, not at every step, and a compiled core reads the cache of every
    step after the first unchecked; ``layers.parameters_fixed``), and each step's input state donated to
    it as ``Acting`` donates (``layers.state_donated``): the steps start from a copy, ``state`` stays."""
    with torch.inference_mode():
        return _act(model, copy_state(state), inputs)


def _act(model, state, inputs: torch.Tensor) -> torch.Tensor:
    """``acting_outputs`` from ``state`` itself, which the steps may write into."""
    outputs, stretch = [], fixed_stretch()
    for t, x in enumerate(inputs):
        with parameters_fixed(stretch, continued=t > 0), state_donated():
            y, state = model(x, state=state)
        outputs.append(y)
    return torch.stack(outputs)


def time_acting(model, state, inputs: torch.Tensor) -> float:
    """Seconds per step of ``acting_outputs`` (its copy of the state outside the timing; the outputs' stack
    is one copy of a few kilobytes)."""
    with torch.inference_mode():
        state = copy_state(state)
        start = time.perf_counter()
        _act(model, state, inputs)
        return (time.perf_counter() - start) / len(inputs)


def _lstm_layer_flops(input_shape, weight_ih, weight_hh, *args, out_shape=None, **kwargs) -> int:
    """``aten.mkldnn_rnn_layer`` (the CPU LSTM, one layer over a sequence): the two products per step."""
    rows = math.prod(input_shape[:-1])  # steps x batch
    return 2 * rows * (weight_ih[0] * weight_ih[1] + weight_hh[0] * weight_hh[1])


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: scores and the weighted sum, as torch counts SDPA."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# kernels FlopCounterMode has no formula for: the CPU LSTM and the CPU attention kernel
EXTRA_FLOPS = {torch.ops.aten.mkldnn_rnn_layer: _lstm_layer_flops,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


class OperationCounter(TorchDispatchMode):
    """Counts the tensor operations dispatched inside it (views included)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def acting_work(model, state, inputs: torch.Tensor, formulas: dict | None = None) -> tuple[float, float]:
    """Per step of ``acting_outputs``: the matrix products' floating-point operations (torch's formulas and
    ``formulas``, ``EXTRA_FLOPS`` by default) and the tensor operations dispatched (means over the steps,
    so a chunked core's commit counts once per chunk)."""
    formulas = EXTRA_FLOPS if formulas is None else formulas
    flops, operations = FlopCounterMode(display=False, custom_mapping=formulas), OperationCounter()
    with flops, operations:
        acting_outputs(model, state, inputs)
    return flops.get_total_flops() / len(inputs), operations.count / len(inputs)


def time_learning(model, state, x: torch.Tensor, done: torch.Tensor | None) -> float:
    """Seconds of one forward + backward of ``mean(y^2)`` over the rollout ``x`` from ``state``."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    y, _ = model(x, state=state) if done is None else model(x, state=state, done=done)
    y.square().mean().backward()
    return time.perf_counter() - start


def _cores_and_states(cores, dim, depth, heads, batch, fill, seed, phase):
    generator = torch.Generator().manual_seed(seed)
    models = [build(core, dim, depth, heads, seed) for core in cores]
    return models, [steady_state(model, batch, dim, fill, generator, phase) for model in models]


def acting_rows(cores: list[Core], *, dim=64, depth=2, heads=4, batch=16, fill=1024, steps=32, repeats=20,
                seed=0, compile_backend: str | None = None, phase: str = "staggered",
                cpp_wrapper: bool = False) -> list[dict]:
    """One row per core: ``ms`` per step (median over repeats), ``env_steps_per_s`` and ``ratio`` to the
    reference core's eager ``ms`` (``REFERENCE``, which ``cores`` must hold); ``compiled`` None;
    ``mflop`` and ``operations`` per step (``acting_work``) and ``flop_ratio`` to the reference's. With
    ``compile_backend`` each core's row is followed by its compiled twin's (``compiled`` the backend,
    ``max_diff`` the largest difference of its outputs from the eager ones over the timed steps)."""
    if not any(core.name == REFERENCE for core in cores):
        raise ValueError(f"cores must include the reference {REFERENCE!r}")
    models, states = _cores_and_states(cores, dim, depth, heads, batch, fill, seed, phase)
    inputs = torch.randn(steps, batch, 1, dim, generator=torch.Generator().manual_seed(seed + 1))
    # (core, backend, callable, state): each compiled twin shares its eager module's weights and state
    runs = []
    for core, model, state in zip(cores, models, states, strict=True):
        runs.append((core, None, model, state))
        if compile_backend is not None:
            fast = compile_module(model, True, backend=compile_backend, cpp_wrapper=cpp_wrapper)
            runs.append((core, compile_backend, fast, state))
    seconds = [[] for _ in runs]
    for repeat in range(repeats + 1):  # the first round is a warm-up (and compiles)
        for index, (_, _, model, state) in enumerate(runs):
            t = time_acting(model, state, inputs)
            if repeat:
                seconds[index].append(t)
    medians = [statistics.median(s) for s in seconds]
    reference = medians[next(i for i, run in enumerate(runs) if run[0].name == REFERENCE and run[1] is None)]
    work = [acting_work(model, state, inputs) if backend is None else None for _, backend, model, state in runs]
    reference_flops = work[next(i for i, run in enumerate(runs) if run[0].name == REFERENCE and run[1] is None)][0]
    rows, eager_outputs = [], None
    for (core, backend, model, state), median, counted in zip(runs, medians, work, strict=True):
        row = {"core": core.name, "options": core.label, "compiled": backend, "ms": 1000 * median,
               "env_steps_per_s": batch / median, "ratio": median / reference}
        if backend is None:  # the outputs a compiled twin (the next row) must equal
            flops, operations = counted
            row.update(mflop=flops / 1e6, flop_ratio=flops / reference_flops, operations=operations)
            eager_outputs = acting_outputs(model, state, inputs) if compile_backend is not None else None
        else:
            row["max_diff"] = float((acting_outputs(model, state, inputs) - eager_outputs).abs().max())
        rows.append(row)
    return rows


def learning_rows(cores: list[Core], *, dim=64, depth=2, heads=4, batch=16, length=128, fill=1024, repeats=5,
                  seed=0, compile_backend: str | None = None, phase: str = "staggered",
                  cpp_wrapper: bool = False) -> list[dict]:
    """One row per core: ``ms`` of the rollout call without dones, ``ms_done`` with dones and ``ratio``
    (with / without); ``done_support`` False (``ms_done`` and ``ratio`` None, ``error`` the message)
    when the core raised on ``done``. With ``compile_backend`` each core that takes done is followed by
    its compiled twin's row (``torch.compile(dynamic=False)``, as PPO compiles its replay; timed with dones
    only): ``ms_done``, ``ratio`` to the eager ``ms_done``, ``max_diff`` of its outputs from eager's."""
    models, states = _cores_and_states(cores, dim, depth, heads, batch, fill, seed, phase)
    generator = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(batch, length, dim, generator=generator)
    done = torch.rand(batch, length, generator=generator) < DONE_PROBABILITY
    errors: dict[int, str] = {}
    for index, model in enumerate(models):  # warm-up, and which cores take done
        time_learning(model, states[index], x, None)
        try:
            time_learning(model, states[index], x, done)
        except (TypeError, ValueError, NotImplementedError) as err:
            errors[index] = f"{type(err).__name__}: {err}"
    compiled = {}
    if compile_backend is not None:
        for index, model in enumerate(models):
            if index not in errors:
                compiled[index] = compile_module(model, True, backend=compile_backend, dynamic=False,
                                                 cpp_wrapper=cpp_wrapper)
                time_learning(compiled[index], states[index], x, done)  # the warm-up compiles
    plain, with_done = [[] for _ in cores], [[] for _ in cores]
    compiled_done = {index: [] for index in compiled}
    for _ in range(repeats):
        for index, model in enumerate(models):
            plain[index].append(time_learning(model, states[index], x, None))
            if index not in errors:
                with_done[index].append(time_learning(model, states[index], x, done))
            if index in compiled:
                compiled_done[index].append(time_learning(compiled[index], states[index], x, done))
    rows = []
    for index, core in enumerate(cores):
        ms = 1000 * statistics.median(plain[index])
        ms_done = None if index in errors else 1000 * statistics.median(with_done[index])
        rows.append({
            "core": core.name,
            "options": core.label,
            "compiled": None,
            "ms": ms,
            "ms_done": ms_done,
            "ratio": None if ms_done is None else ms_done / ms,
            "done_support": index not in errors,
            "error": errors.get(index),
        })
        if index in compiled:
            fast = 1000 * statistics.median(compiled_done[index])
            eager_y = models[index](x, state=states[index], done=done)[0]
            compiled_y = compiled[index](x, state=states[index], done=done)[0]
            rows.append({"core": core.name, "options": core.label, "compiled": compile_backend, "ms": None,
                         "ms_done": fast, "ratio": fast / ms_done, "done_support": True, "error": None,
                         "max_diff": float((compiled_y - eager_y).detach().abs().max())})
    return rows


def format_acting(rows: list[dict]) -> str:
    lines = [f"{'core':16s} {'options':42s} {'ms/step':>8s} {'env-steps/s':>12s} {'x lstm':>7s} {'MFLOP':>7s} "
             f"{'x lstm':>7s} {'aten ops':>8s}"]
    for r in rows:
        line = (f"{r['core']:16s} {r['options']:42s} {r['ms']:8.3f} {r['env_steps_per_s']:12.0f} "
                f"{r['ratio']:7.2f}")
        if r["compiled"] is None:
            line += f" {r['mflop']:7.2f} {r['flop_ratio']:7.2f} {r['operations']:8.0f}"
        else:
            line += f"  compiled ({r['compiled']}), max |difference| {r['max_diff']:.1e}"
        lines.append(line)
    return "\n".join(lines)


def format_learning(rows: list[dict]) -> str:
    lines = [f"{'core':16s} {'options':42s} {'ms':>8s} {'ms done':>8s} {'ratio':>6s}"]
    for r in rows:
        if r.get("compiled"):
            tail = (f"{r['ms_done']:8.1f} {r['ratio']:6.2f}  compiled ({r['compiled']}): x its eager ms done, "
                    f"max |difference| {r['max_diff']:.1e}")
            lines.append(f"{r['core']:16s} {r['options']:42s} {'':>8s} {tail}")
            continue
        if r["done_support"]:
            tail = f"{r['ms_done']:8.1f} {r['ratio']:6.2f}"
        else:
            tail = f"refuses done ({r['error'][:60]})"
        lines.append(f"{r['core']:16s} {r['options']:42s} {r['ms']:8.1f} {tail}")
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cores", nargs="+", default=None, help="registry names (default: every row of CORES); "
                   f"{REFERENCE} is always included")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="environments B")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats of the acting path")
    p.add_argument("--steps", type=int, default=32, help="consecutive one-step calls per acting repeat")
    p.add_argument("--fill", type=int, default=1024, help="steps streamed before timing (the steady state)")
    p.add_argument("--phase", choices=PHASES, default="staggered",
                   help="the steady state's rows out of phase, as an agent's envs (default), or in phase")
    p.add_argument("--rollout", type=int, default=128, help="steps of the learning call (0: skip it)")
    p.add_argument("--learn-repeats", type=int, default=5, help="timed repeats of the learning path")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--compile", default=None, metavar="BACKEND",
                   help="also time each core's acting step and learning call (with dones) under "
                   "torch.compile(backend=BACKEND), e.g. inductor")
    p.add_argument("--cpp-wrapper", action="store_true",
                   help="with --compile inductor: the code calling each graph's kernels in C++ (--compile-cpp-wrapper)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="write the config and both tables here")
    return p


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser()
    args = parser.parse_args(argv)
    for name in ("dim", "depth", "heads", "batch", "repeats", "steps", "fill", "learn_repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.dim % args.heads:
        parser.error(f"--heads must divide --dim, got --dim {args.dim} --heads {args.heads}")
    try:
        cores = select_cores(args.cores)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    width = dict(dim=args.dim, depth=args.depth, heads=args.heads, batch=args.batch, fill=args.fill, seed=args.seed,
                 phase=args.phase)  # the steady state both tables start from
    start = time.perf_counter()
    measured = Measured(log=print).start()
    # Every core's call is CausalCore.forward, whose compiled variants (a module, a shape, grad mode each)
    # dynamo counts together: past its limit of 8 it runs the rest eagerly. Room for every row's.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 8 * len(CORES))
    if args.cpp_wrapper and args.compile != "inductor":
        parser.error(f"--cpp-wrapper needs --compile inductor, got --compile {args.compile}")
    compiling = dict(compile_backend=args.compile, cpp_wrapper=args.cpp_wrapper)
    acting = acting_rows(cores, steps=args.steps, repeats=args.repeats, **compiling, **width)
    print(f"acting: x [{args.batch}, 1, {args.dim}], depth {args.depth}, {args.heads} heads, state after "
          f"{args.fill} steps ({args.phase}), {torch.get_num_threads()} thread(s), inference_mode, median of "
          f"{args.repeats} x {args.steps} steps")
    print(format_acting(acting))
    learning = []
    if args.rollout:
        learning = learning_rows(cores, length=args.rollout, repeats=args.learn_repeats,
                                 **compiling, **width)
        print(f"\nlearning: x [{args.batch}, {args.rollout}, {args.dim}] from the state after {args.fill} "
              f"steps ({args.phase}), forward + backward, dones with p = {DONE_PROBABILITY:.4f} per step, median of "
              f"{args.learn_repeats}")
        print(format_learning(learning))
    print()
    conditions = measured.stop().record()
    result = {
        "config": {**vars(args), "threads": torch.get_num_threads()},
        "conditions": conditions,
        "loadavg": {end: conditions[end]["load_average"] for end in ("before", "after")},  # 1 minute
        "seconds": round(time.perf_counter() - start, 1),
        "acting": acting,
        "learning": learning,
    }
    print(f"{result['seconds']:.0f} s")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
