"""lm: byte-level language modelling, Transformer-XL vs causal TLB (paper 003 Sec. 4.3).

Paper 003 reports enwik8 test bits per byte: Transformer-XL 0.99, TLB 0.97. Both models here have
the same width and the same number of Transformer blocks (Transformer-XL: ``layers`` layers; TLB:
``layers / 2`` repetitions of [1 self-attention, 1 cross-attention to the state]) and train for the
same steps on the same batches (windows of ``seq_len`` bytes at random offsets, the state carried
across the segments / chunks of a window: ``chronomem.tasks.text``). The rows (models):

* ``transformer-xl``: Transformer-XL, sliding memory of ``mem_len`` bytes;
* ``tlb``: causal TLB, chunks of ``chunk_size`` bytes, ``num_state`` state vectors;
* ``tlb-small-chunk``: the same TLB with chunks of ``small_chunk_size`` bytes (quick: 16 of a 256-byte
  window, 64 at ``tlb``), so its slow state is updated four times as often and each byte sees fewer
  bytes of its chunk directly. Paper 003 gives no chunk size for language modelling (Sec. 4.3; its
  appendix is lost from our copy) and calls the chunk size a hyperparameter that needs domain
  knowledge (Sec. 5); on bytes (LRA Text) the authors' code used K=10. 16 is near that, divides the
  window, and gives 16 state updates per window, near the paper scale's 3,072 / 128 = 24 (quick's
  ``tlb``: 4). If TLB's gap to Transformer-XL at quick comes from too little direct context, this row
  does worse than ``tlb``; if from a state updated too rarely, better.

We report, per model:

* ``test bpb``: bits per byte over the test split, streamed with the state
  (``CausalLM.evaluate_stream``; ``eval_streams`` pieces side by side), averaged over the seeds;
* in ``extra``: training tokens per second (wall clock), generation bytes per second on one thread
  (state carried, ``CausalLM.generate``; CPU time), parameters, seconds, and a sampled continuation.

Transformer-XL runs with ``memory_mode="sliding"``: every query sees the ``mem_len`` bytes before it,
at any cut (Dai et al.'s evaluation setting ``same_length``), so a streamed evaluation and one-byte
generation compute exactly what the whole prefix would. Deviations (docs/lm.md): Dai et al. train with
segment recurrence (a query sees ``mem_len`` plus its place in the segment) and stop the gradient at the
memory; we train with the sliding window, and within a window the gradient flows through the memory
(across calls it is cut: every window starts from the empty state). Dai et al. carry the memory from
batch to batch (the corpus read as parallel streams in order); our windows are drawn at random
offsets so that a batch is a function of the step (exact resume), and the first segment of a window
starts with an empty memory.

Scales:

* ``smoke``: a few steps of tiny models (tests).
* ``quick``: the GCIDE dictionary (Debian's ``dict-gcide``, ~40 MB of English), width 128, 4 blocks,
  windows of 256 bytes, batch 16, 600 steps, 3 seeds, the whole 2 MB test split. Sized by measuring
  5 training steps on one thread of this 2-core machine while another experiment ran: Transformer-XL
  1.1 s per step, TLB 0.33 s (streamed evaluation ~19,000 and ~35,000 bytes/s): 3 x 600 steps of each
  (~43 min) plus six evaluations of the test split (~8 min) fit the ~60 minutes of a quick run.
* ``paper``: enwik8 (``--data-dir`` holding the file ``enwik8``). Paper 003's appendix with its
  language-modelling sizes is lost from our copy; its Transformer-XL number (0.99) is Dai et al.'s
  24-layer enwik8 model, whose published settings we use for both models: width 1024, 24 blocks,
  8 heads, FFN 3072, dropout 0.15, Adam lr 2.5e-4, 4,000 warm-up steps, cosine decay, 400,000 steps,
  64 x 768 bytes per step (here 16 windows of 4 segments of 768), memory 768 (Dai et al. evaluate with
  a longer memory, 3,800, which this fixed-size model does not). TLB's chunk (128), the small chunk
  (32) and the state size (64) are our choices.

Equal wall-clock time (``run_experiment(..., time_budget=seconds)``, ``chronomem run lm --time-budget``):
the clock alone ends every run (``Scale.train_config``: the step count becomes a far ceiling, so TLB,
which trains about twice as many steps per second, takes more steps than Transformer-XL), and the cosine
decay anneals over the budget, so every model ends at lr 0 after the same seconds of training.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from chronomem.experiments.base import Experiment, Scale, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.threads import threads_set_to

# Each row of the table and the registry model it trains (module docstring).
ROW_MODEL = {"transformer-xl": "transformer-xl", "tlb": "tlb", "tlb-small-chunk": "tlb"}
MODELS = tuple(ROW_MODEL)
PROMPT = b"Memory, n. "  # the start of a dictionary entry: what a sample continues


@dataclass(frozen=True, kw_only=True)
class LMScale(Scale):
    corpus: str = "gcide"
    seeds: int = 1
    dim: int
    layers: int  # Transformer blocks of each model (TLB: layers / 2 groups of [self, cross])
    num_heads: int
    ff_mult: float = 4.0
    dropout: float = 0.0
    seq_len: int  # bytes per training window
    segment_len: int  # Transformer-XL's segment
    mem_len: int  # Transformer-XL's memory: the bytes before it each query sees
    chunk_size: int  # TLB's K
    small_chunk_size: int = 16  # K of the row tlb-small-chunk
    num_state: int  # TLB's N
    eval_segment_len: int  # bytes per call of the streamed evaluation
    eval_streams: int  # pieces of the test split read side by side
    eval_bytes: int | None = None  # the first bytes of the test split to evaluate (None: all of it)
    generate_bytes: int = 200  # bytes generated to measure the speed of generation


SCALES = {
    "smoke": LMScale(dim=16, layers=2, num_heads=2, seq_len=32, segment_len=8, mem_len=8, chunk_size=8,
                     small_chunk_size=4, num_state=4, steps=2, batch_size=2, lr=1e-3, eval_examples=4,
                     eval_segment_len=16, eval_streams=2, eval_bytes=64, generate_bytes=8),
    "quick": LMScale(dim=128, layers=4, num_heads=4, seq_len=256, segment_len=64, mem_len=128, chunk_size=64,
                     small_chunk_size=16, num_state=16, steps=600, batch_size=16, lr=1e-3, schedule="cosine",
                     warmup=50, seeds=3, eval_examples=64, eval_segment_len=256, eval_streams=64),
    "paper": LMScale(corpus="enwik8", dim=1024, layers=24, num_heads=8, ff_mult=3.0, dropout=0.15, seq_len=3072,
                     segment_len=768, mem_len=768, chunk_size=128, small_chunk_size=32, num_state=64,
                     steps=400_000, batch_size=16, lr=2.5e-4, schedule="cosine", warmup=4_000, clip=0.25,
                     eval_examples=256, eval_segment_len=768, eval_streams=16),
}


def model_options(row: str, s: LMScale) -> dict:
    """The backbone options of the table row ``row`` at scale ``s`` (its registry model:
    ``ROW_MODEL[row]``): equal width and number of blocks."""
    common = dict(dim=s.dim, num_heads=s.num_heads, ff_mult=s.ff_mult, dropout=s.dropout)
    if row == "transformer-xl":
        return {**common, "depth": s.layers, "segment_len": s.segment_len, "mem_len": s.mem_len,
                "memory_mode": "sliding"}
    if row not in ("tlb", "tlb-small-chunk"):
        raise ValueError(f"no settings for row {row!r}; valid rows: {', '.join(MODELS)}")
    if s.layers % 2:
        raise ValueError(f"layers must be even (TLB has layers / 2 groups of [self, cross]), got {s.layers}")
    return {**common, "depth": s.layers // 2, "self_per_cross": 1,
            "chunk_size": s.chunk_size if row == "tlb" else s.small_chunk_size, "num_state": s.num_state}


def generation_speed(net, n: int, seed: int) -> tuple[float, str]:
    """Bytes per second of ``net.generate`` on one thread (state carried), and the sample it wrote.
    Seconds of CPU time of this process, which other processes on a shared machine disturb less than
    wall time (with one thread, the same on an idle core)."""
    with threads_set_to(1):
        generator = torch.Generator(device=net.embed.weight.device).manual_seed(seed)
        start = time.process_time()
        out = net.generate(PROMPT, n, temperature=1.0, top_k=None, generator=generator)
        seconds = max(time.process_time() - start, 1e-9)
    return n / seconds, (PROMPT + bytes(out.tolist())).decode("utf-8", errors="replace")


def evaluated_bytes(task, s: LMScale) -> torch.Tensor:
    """The bytes of the test split the scale evaluates on."""
    test = task.split_tokens("test")
    return test if s.eval_bytes is None else test[: s.eval_bytes]


@dataclass(frozen=True)
class LMRun:
    """One row and seed, the job of ``Jobs.map``."""

    model: str  # the table's row
    options: dict
    task: Any  # chronomem.tasks.text.TextTask
    scale: LMScale
    seed: int
    time_budget: float | None
    progress: bool
    out: str
    resume: bool = False  # continue the run ``out`` holds (chronomem run --resume)


def _train_lm(run: LMRun) -> tuple[dict, int]:
    """Train, evaluate streamed on the test split and time generation: the run's row and the parameters."""
    from chronomem.heads import build_model
    from chronomem.train import train
    from chronomem.train.resume import rejoin

    s, task = run.scale, run.task
    torch.manual_seed(run.seed)
    net = build_model(ROW_MODEL[run.model], task, **run.options)
    # the registry's name, so that ``chronomem lm sample`` rebuilds the run
    spec = {"model": ROW_MODEL[run.model], "model_options": run.options, "task": task.name,
            "task_options": {k: v for k, v in task.describe().items() if k != "name"}}
    cfg = s.train_config(run.seed, run.time_budget, run.progress, out=run.out)
    cfg, resumed = rejoin(cfg, spec) if run.resume else (cfg, None)
    result = train(net, task, cfg, spec=spec, resume=resumed)
    bpb = net.evaluate_stream(evaluated_bytes(task, s), s.eval_segment_len, s.eval_streams)["bits_per_token"]
    speed, sample = generation_speed(net, s.generate_bytes, run.seed)
    row = {"seed": run.seed, "test bpb": round(bpb, 4), "steps": result.steps,
           "seconds": round(result.seconds, 1), "stopped_early": result.stopped_early,
           "train_tokens_per_second": round(result.steps * s.batch_size * s.seq_len / result.seconds),
           "generate_bytes_per_second": round(speed), "sample": sample}
    return row, sum(p.numel() for p in net.parameters())


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, data_dir: str | None = None, progress: bool = True,
         jobs: Jobs = SEQUENTIAL, resume: bool = False) -> dict:
    from chronomem.tasks.text import TextTask

    s = SCALES[scale]
    task = TextTask(corpus=s.corpus, data_dir=data_dir, seq_len=s.seq_len)
    test = evaluated_bytes(task, s)  # read here: a run in another process gets the corpus with its task
    configs = {m: model_options(m, s) for m in select_models(MODELS, models, "lm")}
    lm_runs = [LMRun(model, options, task, s, seed + k, time_budget, progress,
                     str(out / model / f"seed{seed + k}"), resume)
               for model, options in configs.items() for k in range(s.seeds)]
    done = iter(jobs.map(_train_lm, lm_runs))
    results, per_seed, extra = {}, {}, {}
    for model in configs:
        runs, parameters = [], 0
        for _ in range(s.seeds):
            row, parameters = next(done)
            runs.append(row)
        mean = sum(r["test bpb"] for r in runs) / len(runs)
        results[model] = {"test bpb": round(mean, 4)}
        per_seed[model] = {"test bpb": [r["test bpb"] for r in runs]}
        extra[model] = {"parameters": parameters, "runs": runs}
    config = {"scale": asdict(s), "models": configs, "corpus": str(task.file), "test_bytes": len(test)}
    return {"results": results, "per_seed": per_seed, "config": config, "extra": extra}


LM = register_experiment(
    Experiment(
        name="lm",
        description="Byte-level language modelling: Transformer-XL vs causal TLB of equal width and depth "
        "(and TLB with a smaller chunk), test bits per byte streamed with the state (quick: the GCIDE "
        "dictionary; paper: enwik8).",
        run=_run,
        paper={"transformer-xl": {"test bpb": 0.99}, "tlb": {"test bpb": 0.97}},
        metric="test bits per byte (lower is better)",
        paper_source="paper 003 Sec. 4.3 (enwik8)",
        claims=(Claim("TLB models bytes better than Transformer-XL: fewer bits per byte (0.97 vs 0.99)",
                      "tlb", "transformer-xl", lower_is_better=True),),
        notes="Training and generation speeds per run are in the extra measurements; docs/lm.md lists the "
        "deviations from Dai et al.'s training.",
    )
)
