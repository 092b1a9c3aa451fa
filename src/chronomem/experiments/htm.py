"""HTM experiments (paper 001): supervised Ballet (Table 3) and paired associative inference (Fig. 6b).

* ``ballet``: HTM transformer vs Transformer-XL vs LSTM on the Ballet levels ``2_delay16``,
  ``8_delay16`` and ``8_delay48``, each model trained once on the paper's mixture of all six levels
  (App. B.1). The paper trains agents with RL (IMPALA, reconstruction loss) and reports the final
  success rate (Table 3); ours is the *supervised* variant of the task
  (``tasks/ballet.py``: the observation stream up to the cue, then classify the target dancer's
  cell), so the numbers compare memories, not agents.
* ``pai``: paired associative inference, length 3 (MEMO's task), HTM (paper: 97.5%, Fig. 6b) vs a
  causal Transformer reading the same sequence (the stored pairs, the choices and the probe), both
  trained on MEMO's mix of AB, BC and AC trials and scored on the AC (indirect) ones. HTM
  follows App. B.4: the pairs are chunks of length 2, every layer reads the same memory of the
  embedded inputs (``shared_memory=True``), and both models answer by dot products of a projection of
  the probe's output with the embedded choices (``readout="choices"``).
"""

from __future__ import annotations

from pathlib import Path

from chronomem.experiments.base import Experiment, select_models, train_and_evaluate
from chronomem.registry import get_task, register_experiment
from chronomem.train import TrainConfig

LEVELS = ("2_delay16", "8_delay16", "8_delay48")  # the levels of Table 3
ALL_LEVELS = tuple(f"{n}_delay{d}" for d in (16, 48) for n in (2, 4, 8))  # the training mixture (App. B.1)


def _train_config(s: dict, seed: int, warmup: int, clip: float | None) -> TrainConfig:
    """Trainer settings from a scale's dict ``s``: steps, batch size, lr and its schedule (``"constant"``
    unless ``s["schedule"]`` says otherwise; a decay runs over the budget when there is one), wall-clock
    budget, evaluation size."""
    schedule = s.get("schedule", "constant")
    return TrainConfig(
        steps=s["steps"],
        batch_size=s["batch_size"],
        lr=s["lr"],
        schedule=schedule,
        anneal_by="budget" if schedule != "constant" and s["budget"] else "steps",
        warmup=min(warmup, s["steps"] // 10),
        clip=clip,
        seed=seed,
        eval_examples=s["eval_examples"],
        time_budget=s["budget"],
        progress=False,
    )


# ---------------------------------------------------------------------------------------------
# Ballet
# ---------------------------------------------------------------------------------------------

# Paper defaults (Table 1): memory dim 512, 4 layers, 8 heads, chunk 32, top-k 8 (Ballet column),
# memory larger than episode length // chunk size, unroll 64, TrXL extra length 256, Adam lr 2e-4,
# batch 32. Quick scale shrinks width/depth so that a model trains in minutes on a 2-core CPU; it keeps
# the paper's top-k 8 and window 64 (with top-k 4 and window 32, 20 min gave 72.6 / 12.9 / 12.0 on
# 2_delay16 / 8_delay16 / 8_delay48 against 88.4 / 19.3 / 15.5; chunk 32 gave 82.7 / 14.7 / 13.9).
# Quick runs leave out the reconstruction loss, which costs steps and did not help in 20 min
# (85.9 / 16.9 / 13.3 with weight 1; memory_gradient=True: 84.3 / 15.9 / 13.3).
BALLET_MODELS = {
    "smoke": {
        "htm": dict(dim=16, depth=1, num_heads=2, top_k=2, chunk_size=8, memory_size=8, window=8, output_steps=8),
        "transformer-xl": dict(dim=16, depth=1, num_heads=2, segment_len=16, mem_len=16, output_steps=8),
        "lstm": dict(dim=16, depth=1),
    },
    # Quick HTM reads its memory through a LayerNorm (memory_norm, a deviation; see docs/htm.md): read raw,
    # the relevance saturated and the memory went unused. 20 min on one core, 2_delay16 / 8_delay16 /
    # 8_delay48: raw 88.4 / 19.3 / 15.5 (without relative positions; with them 85.7 / 15.4 / 13.6);
    # memory_norm 93.5 / 48.3 / 45.0 without relative positions, 95.3 / 50.8 / 49.4 with them (the
    # model's default, as in the paper's agent), 92.6 / 47.0 / 48.5 with memory_gradient=True.
    "quick": {
        # output_steps=8 (HTM and Transformer-XL): the questions at the end (at most 8) are all a tagger
        # reads, so the last layer computes only those steps (the same outputs; HTM's training steps
        # 2.0x faster on one core). top_k=16: the k of the paper's main text (App. D.3; Table 1 lists 8
        # with chunks of 32, the same 256 steps read in detail). 20 min on two threads, constant lr, before
        # the dense read: top-k 16 99.5 / 80.2 / 78.6 (3,992 steps), top-k 8 99.8 / 73.6 / 63.0 (5,840).
        "htm": dict(dim=64, depth=2, num_heads=4, top_k=16, chunk_size=16, memory_size=40, window=64,
                    memory_norm=True, output_steps=8),
        "transformer-xl": dict(dim=64, depth=2, num_heads=4, segment_len=64, mem_len=256, output_steps=8),
        "lstm": dict(dim=128, depth=1),
    },
    # Table 1: every agent also reconstructs its input at each step, loss weight 1 on Ballet (App. A.1).
    "paper": {
        "htm": dict(dim=512, depth=4, num_heads=8, top_k=8, chunk_size=32, memory_size=40, window=64,
                    reconstruction=1.0),
        "transformer-xl": dict(dim=512, depth=4, num_heads=8, segment_len=64, mem_len=256, reconstruction=1.0),
        "lstm": dict(dim=512, depth=4, reconstruction=1.0),
    },
}

BALLET_SCALES = {
    # Like the paper (App. B.1), one model per memory is trained on a uniform mixture of
    # ``train_levels`` (each batch one level) and then evaluated on each of ``levels``.
    # steps, batch, wall-clock budget per model (seconds), evaluation examples per level, and what the
    # supervised task asks at the cue (``SupervisedBallet(questions=...)``): with "every_dancer" a model
    # trains on one question per dancer and is scored on the first, the target's, exactly the
    # single-question task. Quick: the lr decays to 0 along a cosine over the 20-minute budget (whichever
    # of steps and budget ends first; Li et al. 2020's budgeted training), so a run cut by the clock has
    # annealed, and starts at 3e-3 (the paper's 2e-4 is for its 512-wide model). Quick, 20 min,
    # 2_delay16 / 8_delay16 / 8_delay48, HTM (the config above, two threads): lr 3e-3 100.0 / 99.1 / 98.4
    # (7,300 steps; seed 1 100.0 / 98.5 / 98.3, 7,480), lr 2e-3 99.9 / 96.8 / 94.3 (7,236); before the
    # faster relative attention, lr 1e-3 99.9 / 93.0 / 91.7 (6,380; seed 1 99.8 / 95.3 / 93.7), with the
    # per-query gather read (slower) 99.3 / 89.3 / 85.6 (4,267 steps), and with a constant lr as well
    # 99.5 / 80.2 / 78.6 (3,992). The quick config, two threads: Transformer-XL 100.0 / 92.2 / 72.0
    # (11,754 steps), LSTM 97.3 / 54.0 / 54.4 (18,162).
    # On one core with top-k 8, before output_steps, constant lr: HTM 97.7 / 68.6 / 66.5 (the target's
    # question alone: 94.9 / 49.7 / 48.3), Transformer-XL 97.7 / 74.7 / 57.2 (94.2 / 58.6 / 41.4), LSTM
    # 92.9 / 53.6 / 51.7 (50.3 / 12.6 / 12.6); README.
    "smoke": dict(levels=("2_delay16",), train_levels=("2_delay16", "4_delay16"), steps=2, batch_size=4,
                  lr=1e-3, budget=None, eval_examples=8, questions="every_dancer"),
    # The tour shows HTM learning within its 3 minutes: 2 dancers (8 stay near chance that briefly).
    "tour": dict(levels=("2_delay16",), train_levels=("2_delay16",), steps=100_000, batch_size=32, lr=1e-3,
                 budget=180, eval_examples=512, questions="target"),
    "quick": dict(levels=LEVELS, train_levels=ALL_LEVELS, steps=100_000, batch_size=32, lr=3e-3, budget=1200,
                  eval_examples=1000, questions="every_dancer", schedule="cosine"),
    "paper": dict(levels=LEVELS, train_levels=ALL_LEVELS, steps=200_000, batch_size=32, lr=2e-4, budget=None,
                  eval_examples=10_000, questions="every_dancer"),
}


def _ballet(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None) -> dict:
    s = BALLET_SCALES[scale]
    configs = BALLET_MODELS["smoke" if scale == "smoke" else "paper" if scale == "paper" else "quick"]
    models = select_models(configs, models, "ballet")
    task = get_task("ballet")(level="mixed", levels=s["train_levels"], questions=s["questions"])
    levels = {level: get_task("ballet")(level=level, questions=s["questions"]) for level in s["levels"]}
    results, extra = {}, {}
    for model in models:
        # The class is read at the cue (a classifier's last step, or the tagger's question steps),
        # after the model has streamed the episode.
        options = dict(configs[model], pooling="last")
        # Gradient clipping at norm 1 (our choice; the paper's Adam does not clip): HTM without it
        # scored 85.6 / 17.5 / 13.3 under the quick protocol, no better than with it.
        cfg = _train_config(s, seed, warmup=100, clip=1.0)
        row = train_and_evaluate(model, task, options, cfg, eval_tasks=levels)
        results[model] = row["eval"]
        extra[model] = {k: row[k] for k in ("seconds", "steps", "stopped_early", "parameters")}
        extra[model]["accuracy_on_training_mixture"] = row["accuracy"]
    config = {"scale": s, "models": {m: configs[m] for m in models}}
    return {"results": results, "config": config, "extra": extra}


BALLET = register_experiment(
    Experiment(
        name="ballet",
        description="Supervised Ballet: HTM transformer vs Transformer-XL vs LSTM (paper 001 Table 3).",
        run=_ballet,
        paper={
            "htm": {"2_delay16": 99.8, "8_delay16": 98.1, "8_delay48": 97.2},
            "transformer-xl": {"2_delay16": 96.9, "8_delay16": 65.7, "8_delay48": 49.2},
            "lstm": {"2_delay16": 97.4, "8_delay16": 25.2, "8_delay48": 29.7},
        },
        metric="test accuracy (%) on the target dancer",
        paper_source="paper 001 Table 3 (final success rate of RL agents; TrXL is the gated TrXL agent)",
        notes="The paper's numbers are success rates of RL agents (IMPALA with an image/language "
        "reconstruction loss) that must also walk to the dancer; ours are test accuracies of the "
        "supervised variant (the observation stream up to the cue, then classify the target cell), so "
        "they compare the memories, not the agents. Chance is 1/n (50% for 2 dancers, 12.5% for 8). "
        "As in the paper (App. B.1) one model per memory is trained on all six levels, uniformly sampled "
        "(one level per batch), and evaluated per level. The quick scale trains each model for at most "
        "20 minutes on a CPU.",
        tour=lambda out, seed: _ballet("tour", out, seed, models=("htm",)),
    )
)

# ---------------------------------------------------------------------------------------------
# Paired associative inference
# ---------------------------------------------------------------------------------------------

# Paper (Table 1, "Associative" column): chunk 2, top-k 32, lr 1e-4 (swept {1, 2, 4} x 1e-4), 4 layers.
# Top-k 32 of 32 stored pairs reads every pair; the quick scale keeps that (top-k = all 9 chunks).
# Quick: 15 min, the lr decaying to 0 along a cosine over them. AC trials, one thread, two runs side by
# side: seeds 0 / 1 / 2 / 3 96.6 / 85.2 / 90.1 / 91.3 (about 45,000 steps); with a constant lr seeds
# 0 / 1 / 2 94.0 / 75.1 / 87.0 (batch 64: 88.7 / 81.5 / 90.0). Cosine from lr 3e-3 (Ballet's): seeds 0 / 1
# 51.8 / 69.5; from 5e-4: 96.5 / 82.3; docs/htm.md.
PAI_SCALES = {
    "smoke": dict(
        n_triplets=2,
        item_dim=8,
        dim=16,
        depth=2,
        num_heads=2,
        top_k=2,
        steps=2,
        batch_size=4,
        lr=1e-3,
        budget=None,
        eval_examples=8,
    ),
    "quick": dict(
        n_triplets=4,
        item_dim=16,
        dim=64,
        depth=4,
        num_heads=4,
        top_k=9,
        steps=100_000,
        batch_size=32,
        lr=1e-3,
        budget=900,
        eval_examples=1000,
        schedule="cosine",
    ),
    "paper": dict(
        n_triplets=16,
        item_dim=64,
        dim=512,
        depth=4,
        num_heads=8,
        top_k=32,
        steps=500_000,
        batch_size=32,
        lr=1e-4,
        budget=None,
        eval_examples=10_000,
    ),
}


def _pai(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None) -> dict:
    s = PAI_SCALES[scale]
    pai = lambda query: get_task("pai")(n_triplets=s["n_triplets"], item_dim=s["item_dim"], query=query)
    # MEMO's data (used unmodified by paper 001, App. B.4) trains on AB, BC and AC trials alike and
    # reports the AC (indirect) trials; the direct AB trials are reported beside them.
    task = pai("mixed")
    evals = {"length 3": pai("indirect"), "direct (A -> B)": pai("direct")}
    chunks = 2 * s["n_triplets"] + 1  # the pairs and the chunk of the two choices
    # App. B.4: the output embedding (a projection of the probe's output) is compared with the embedded
    # choices by dot products, which are the logits (``readout="choices"``).
    common = dict(dim=s["dim"], depth=s["depth"], num_heads=s["num_heads"], pooling="last", readout="choices")
    configs = {
        # App. B.4: the query alone is the input of the HTM layers, and every layer reads the same
        # memory of embedded pairs: a window of one step (the probe attends locally only to itself),
        # and only the probe goes through the layers (output_steps=1: the same output, 2.7x faster steps).
        "htm": dict(
            common,
            top_k=min(s["top_k"], chunks),
            chunk_size=2,
            memory_size=chunks + 1,
            window=1,
            shared_memory=True,
            output_steps=1,
        ),
        "transformer": dict(common),
    }
    configs = {m: configs[m] for m in select_models(configs, models, "pai")}
    results, extra = {}, {}
    for model, options in configs.items():
        # Paper 001 Table 1: Adam without gradient clipping. Clipping at norm 1 kept HTM (top-k 4) on the
        # direct query at chance for 1,500 steps where the same run without it reached 91% (same batches).
        cfg = _train_config(s, seed, warmup=200, clip=None)
        row = train_and_evaluate(model, task, options, cfg, eval_tasks=evals)
        results[model] = row["eval"]
        extra[model] = {k: row[k] for k in ("seconds", "steps", "stopped_early", "parameters")}
        extra[model]["accuracy_on_training_mixture"] = row["accuracy"]
    return {
        "results": results,
        "config": {"scale": s, "task": task.describe(), "evaluated_on": list(evals), "models": configs},
        "extra": extra,
    }


PAI = register_experiment(
    Experiment(
        name="pai",
        description="Paired associative inference, length 3: HTM vs a Transformer over the same memory "
        "(paper 001 Fig. 6b).",
        run=_pai,
        paper={"htm": {"length 3": 97.5}},
        metric="test accuracy (%) on the indirect (A -> C) query",
        paper_source="paper 001 Fig. 6b (HTM 97.5%; MEMO's task, Banino et al. 2020)",
        notes="Items are random vectors drawn per episode (MEMO used ImageNet images); the probe and the "
        "two choices follow the stored pairs in one sequence, so both models read the same memory. "
        "Both read the answer out as in App. B.4: dot products of a projection of the probe's output "
        "with the embedded choices. As in MEMO's released data, models train on a uniform mix of AB, BC "
        "(direct) and AC (indirect) trials; 'length 3' is the accuracy on AC trials, the paper's metric. "
        "Chance is 50%. The quick scale uses fewer triplets per episode than the paper scale.",
    )
)
