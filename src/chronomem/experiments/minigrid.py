"""minigrid-transfer (paper 004 Sec. 3.2, Table 3): agents trained on a small MiniGrid, tested on a large one.

Each core (LSTM, MemLSTM, ReLSTM with nu = rho = 5; beside them, from us, the memoryless ``mlp``) is
the memory of a PPO agent
(``chronomem.rl.ppo``, rl-starter-files' settings: docs/rl.md) trained for a fixed number of frames on
the small environment of a pair (``chronomem.envs.minigrid.PAIRS``); the trained agent's mean return
over ``episodes`` episodes is measured on the small and on the large environment
(``chronomem.rl.evaluate``; actions sampled, evaluation seeds apart from the training ones). A cell is
the mean over the seeds; ``extra`` holds every seed's numbers, the success rates and the runs' speed.
DoorKey-5x5 is also the control (results.json's ``control``): a task that needs no memory, which the
settings must learn (mean return >= 0.9) on every seed before the Memory columns say anything.
HTM, TLB and GTrXL are extra rows (beyond the paper), run only when named with ``--models``; a core
the agent cannot use (one that does not take episode ends inside a call yet) gets ``"n/a"`` cells
and its reason in ``extra``.

The paper trains for 5M steps per environment and does not say how many evaluation episodes it
averages, nor how many seeds. ``chronomem run minigrid-transfer --jobs K`` spreads the runs (pair x
model x seed) over K processes of one torch thread each (``chronomem.experiments.jobs``; the quick
scale was sized for 2); each run is seeded on its own, so the numbers do not depend on K.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronomem.envs.minigrid import PAIRS
from chronomem.experiments.base import Experiment, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.experiments.rl_runs import check_no_time_budget, control_summary, kept_evaluation, ppo_run
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.threads import threads_set_to

# The paper's row names (Table 3) of each pair's train and test environment.
COLUMNS: dict[str, tuple[str, str]] = {
    "redbluedoors": ("RedBlueDoors-6x6", "RedBlueDoors-8x8"),
    "gotoobject": ("GoToObject-6x6", "GoToObject-8x8"),
    "memory": ("MemoryS7", "MemoryS13"),
    "gotodoor": ("GoToDoor-5x5", "GoToDoor-8x8"),
    "fetch": ("Fetch-5x5", "Fetch-8x8"),
    "doorkey": ("DoorKey-5x5", "DoorKey-16x16"),
}

# Paper 004, Table 3: average reward, train rows then test rows.
_TABLE_3 = {
    "RedBlueDoors-6x6": (0.97, 0.97, 0.97), "GoToObject-6x6": (0.81, 0.85, 0.84), "MemoryS7": (0.96, 0.4, 0.94),
    "GoToDoor-5x5": (0.28, 0.17, 0.25), "Fetch-5x5": (0.48, 0.42, 0.5), "DoorKey-5x5": (0.94, 0.94, 0.93),
    "RedBlueDoors-8x8": (0.95, 0.95, 0.95), "GoToObject-8x8": (0.66, 0.66, 0.74), "MemoryS13": (0.25, 0.24, 0.30),
    "GoToDoor-8x8": (0.13, 0.11, 0.15), "Fetch-8x8": (0.38, 0.44, 0.45), "DoorKey-16x16": (0.09, 0.31, 0.44),
}
PAPER_MODELS = ("lstm", "mem-lstm", "relevance-lstm")  # the paper's LSTM, MemLSTM, ReLSTM
PAPER: dict[str, dict[str, float]] = {
    model: {column: row[i] for column, row in _TABLE_3.items()} for i, model in enumerate(PAPER_MODELS)
}

# Core options: ReLSTM's short-term buffer nu = 5 and relevant set rho = 5 (paper 004 Sec. 3.2).
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {},  # no memory: the bar the memories must clear (beyond the paper)
    "lstm": {},
    "mem-lstm": {},
    "relevance-lstm": {"buffer_size": 5, "relevant_size": 5},
    "htm": {},  # extra rows, beyond the paper
    "tlb": {},
    "gtrxl": {},
}


@dataclass(frozen=True)
class TransferScale:
    pairs: tuple[str, ...]  # keys of PAIRS
    models: tuple[str, ...]  # run when --models is not given
    frames: int  # training frames per run (a multiple of num_envs * num_steps)
    episodes: int  # evaluation episodes per environment
    seeds: int  # runs per pair and model: seeds seed, seed + 1, ...
    num_envs: int = 16  # rl-starter-files' PPO settings (docs/rl.md, "Defaults")
    num_steps: int = 128
    num_minibatches: int = 8
    recurrence: int | None = None  # back-propagation windows (None: whole rollouts)
    minibatch: str = "envs"  # chronomem.rl.ppo.Args.minibatch: "windows" draws them from every env and time
    dim: int = 64
    eval_max_steps: int | None = None  # cap on episode length (smoke only; None: each env's own limit)
    pair_frames: dict[str, int] = field(default_factory=dict)  # a pair's own frames, in place of ``frames``
    # Adam's schedule and epsilon; the defaults are chronomem's PPO's (CleanRL's: annealed, 1e-5), the scales
    # set torch-ac's (rl-starter-files' ``--lr`` kept constant, ``--optim-eps 1e-8``), as the authors trained.
    anneal_lr: bool = True
    adam_eps: float = 1e-5

    def frames_of(self, pair: str) -> int:
        return self.pair_frames.get(pair, self.frames)


SCALES: dict[str, TransferScale] = {
    # Seconds: 64 frames per run and evaluation episodes cut at 16 steps.
    "smoke": TransferScale(pairs=("doorkey",), models=("mlp", *PAPER_MODELS), frames=64, episodes=4, seeds=2,
                           num_envs=4, num_steps=8, num_minibatches=2, recurrence=4, minibatch="windows", dim=16,
                           eval_max_steps=16, anneal_lr=False, adam_eps=1e-8),
    # docs/rl.md, "minigrid-transfer": the authors' PPO (rl-starter-files' settings, gradients cut every 16
    # steps and minibatches of such windows, Adam's learning rate constant and its epsilon 1e-8, as their
    # torch-ac fork trains); 200 updates of 16 x 128 frames for DoorKey (the memoryless control needs them
    # in every seed), 400 for Memory, where an agent leaves chance after 0.25M frames or more, varying by
    # seed. Resumable (chronomem run --resume).
    "quick": TransferScale(pairs=("doorkey", "memory"), models=("mlp", *PAPER_MODELS), frames=200 * 2048,
                           episodes=100, seeds=3, recurrence=16, minibatch="windows",
                           pair_frames={"memory": 400 * 2048}, anneal_lr=False, adam_eps=1e-8),
    # Paper 004: 5M steps per environment (rounded up to whole rollouts by the trainer), the authors' PPO.
    "paper": TransferScale(pairs=tuple(PAIRS), models=("mlp", *PAPER_MODELS), frames=5_000_000, episodes=1000,
                           seeds=3, recurrence=16, minibatch="windows", anneal_lr=False, adam_eps=1e-8),
}

CHECKPOINT_EVERY = 50  # updates (100k frames at quick)
EVAL_SEED = 1_000_000  # evaluation episodes are seeded apart from every training seed
# The control (docs/rl.md "Controls and the memoryless agent"): DoorKey-5x5 needs no memory (the 7x7 view
# shows the key, the door and the goal), and rl-starter-files' settings solve it; learned at this return.
CONTROL, CONTROL_LEARNED = "DoorKey-5x5", 0.9


@dataclass(frozen=True)
class Job:
    pair: str
    model: str
    seed: int
    scale: TransferScale
    out: str
    progress: bool
    resume: bool = False  # load the run from ``out`` if it finished there (chronomem run --resume)


def ppo_settings(scale: TransferScale) -> dict[str, Any]:
    """The ``chronomem.rl.ppo.Args`` fields a scale sets (the others keep rl-starter-files' defaults).
    A checkpoint every ``CHECKPOINT_EVERY`` updates lets ``--resume`` continue a run cut short (MemLSTM's
    and ReLSTM's runs outlast a session); it changes nothing in training."""
    return dict(num_envs=scale.num_envs, num_steps=scale.num_steps, num_minibatches=scale.num_minibatches,
                recurrence=scale.recurrence, minibatch=scale.minibatch, dim=scale.dim, hidden=scale.dim,
                anneal_lr=scale.anneal_lr, adam_eps=scale.adam_eps, checkpoint_every=CHECKPOINT_EVERY)


def run_job(job: Job) -> dict[str, Any]:
    """Train one agent on the pair's small env and evaluate it on both envs; its row of numbers. The
    evaluation is kept in the run's directory, and a resumed experiment reads it back
    (``rl_runs.kept_evaluation``)."""
    from chronomem.rl.evaluate import evaluate

    s, pair = job.scale, PAIRS[job.pair]
    result = ppo_run(pair.train, job.model, MODELS[job.model], ppo_settings(s), s.frames_of(job.pair), job.seed,
                     Path(job.out), job.progress, reuse=job.resume)
    options = {} if s.eval_max_steps is None else {"max_episode_steps": s.eval_max_steps}
    envs = dict(zip(COLUMNS[job.pair], (pair.train, pair.test), strict=True))

    def evaluate_both() -> dict[str, dict]:
        with threads_set_to(1):  # the evaluation, as the training, on one thread
            evaluations = {}
            for column, env_id in envs.items():  # the sampled actions, as the env seeds, fixed per run
                evaluations[column] = evaluate(result.agent.eval(), env_id, s.episodes, EVAL_SEED + job.seed,
                                               min(16, s.episodes), progress=job.progress,
                                               action_seed=EVAL_SEED + job.seed, **options)
        return evaluations

    settings = {"envs": envs, "episodes": s.episodes, "seed": EVAL_SEED + job.seed, "options": options}
    evaluations = kept_evaluation(Path(job.out), result.agent, settings, evaluate_both, job.resume)
    last = result.history[-1] if result.history else {}
    return {"pair": job.pair, "model": job.model, "seed": job.seed, "frames": result.frames,
            "train_seconds": round(result.seconds, 1), "sps": round(result.frames / max(result.seconds, 1e-9)),
            "last_train_return": last.get("return_mean"), "eval": evaluations}


def refusal(model: str, scale: TransferScale) -> str | None:
    """Why the agent cannot use ``model`` as its memory, or None if it can."""
    from chronomem.envs.make import make_env
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(PAIRS[scale.pairs[0]].train)
    try:
        make_agent(Args(core=model, dim=scale.dim, hidden=scale.dim), MODELS[model], env.observation_space,
                   env.action_space)
    except ValueError as err:
        return str(err)
    finally:
        env.close()
    return None


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, resume: bool = False, progress: bool = True,
         jobs: Jobs = SEQUENTIAL) -> dict:
    check_no_time_budget("minigrid-transfer", time_budget)

    s = SCALES[scale]
    chosen = s.models if models is None else select_models(MODELS, models, "minigrid-transfer")
    refused = {m: reason for m in chosen if (reason := refusal(m, s)) is not None}
    runs = [Job(pair, model, seed + i, s, str(Path(out) / "runs" / pair / model / f"seed_{seed + i}"), progress,
                resume)
            for pair in s.pairs for model in chosen if model not in refused for i in range(s.seeds)]
    return summarise(jobs.map(run_job, runs), chosen, refused, s)


def summarise(rows: list[dict], models: tuple[str, ...], refused: dict[str, str], s: TransferScale) -> dict:
    """The table (mean return over the seeds per model and env), the per-seed numbers and the config."""
    import numpy as np

    results: dict[str, dict[str, Any]] = {}
    per_seed: dict[str, dict[str, list[float]]] = {}  # the mean returns the cells average, in seed order
    extra: dict[str, Any] = {"runs": rows, "per_seed": {}, "refused": refused}
    for model in models:
        results[model], extra["per_seed"][model] = {}, {}
        for pair in s.pairs:
            for column in COLUMNS[pair]:
                if model in refused:
                    results[model][column] = "n/a"
                    continue
                evals = [r["eval"][column] for r in sorted(rows, key=lambda r: r["seed"])
                         if r["model"] == model and r["pair"] == pair]
                returns = [e["return_mean"] for e in evals]
                results[model][column] = round(float(np.mean(returns)), 3)
                per_seed.setdefault(model, {})[column] = returns
                extra["per_seed"][model][column] = {
                    "return_mean": returns, "return_std_over_seeds": round(float(np.std(returns)), 3),
                    "success_rate": [e["success_rate"] for e in evals],
                    "length_mean": [e["length_mean"] for e in evals]}
    paper = {m: {c: v for c, v in PAPER[m].items() if any(c in COLUMNS[p] for p in s.pairs)}
             for m in models if m in PAPER}
    config = {"scale": dataclasses.asdict(s), "models": {m: MODELS[m] for m in models},
              "pairs": {p: dataclasses.asdict(PAIRS[p]) for p in s.pairs}, "eval_seed": EVAL_SEED}
    produced = {"results": results, "per_seed": per_seed, "paper": paper, "config": config, "extra": extra}
    if "doorkey" in s.pairs:  # the control is a cell of the table itself: its own runs, not extra ones
        trained = {m: per_seed[m][CONTROL] for m in models if m in per_seed}
        produced["control"] = control_summary(
            f"`{PAIRS['doorkey'].train}` (the 7x7 view shows key, door and goal)", s.frames_of("doorkey"),
            "mean return", f"mean return >= {CONTROL_LEARNED} over {s.episodes} evaluation episodes", trained,
            {m: [r >= CONTROL_LEARNED for r in returns] for m, returns in trained.items()})
    return produced


MINIGRID_TRANSFER = register_experiment(
    Experiment(
        name="minigrid-transfer",
        description="PPO agents with LSTM, MemLSTM and ReLSTM (nu = rho = 5) memories trained on small "
                    "MiniGrid environments and evaluated on the small and on the large one.",
        run=_run,
        paper=PAPER,
        metric="mean episode return (MiniGrid: 1 - 0.9 steps / max_steps on success, else 0)",
        paper_source="paper 004 Table 3 (5M training steps per environment)",
        # Table 3's headline: ReLSTM transfers best to DoorKey-16x16 (0.44 vs MemLSTM 0.31, LSTM 0.09); and
        # on MemoryS7 MemLSTM is the one that fails (0.40 vs LSTM 0.96, ReLSTM 0.94).
        claims=(
            Claim("ReLSTM transfers best to the large DoorKey: above MemLSTM", "relevance-lstm", "mem-lstm",
                  settings=("DoorKey-16x16",)),
            Claim("ReLSTM transfers best to the large DoorKey: above the LSTM", "relevance-lstm", "lstm",
                  settings=("DoorKey-16x16",)),
            Claim("The LSTM solves MemoryS7 where MemLSTM does not", "lstm", "mem-lstm", settings=("MemoryS7",)),
            Claim("ReLSTM solves MemoryS7 where MemLSTM does not", "relevance-lstm", "mem-lstm",
                  settings=("MemoryS7",)),
        ),
        notes="HTM, TLB and GTrXL rows (--models) are beyond the paper, as is the memoryless row (`mlp`): a "
              "memory result needs a memory above it. The control is DoorKey-5x5 (no memory needed). "
              "MemoryS7's cue is in the 7x7 view from the junction where the agent chooses, so a memoryless "
              "policy that turns back to look can pass it (benchmarks/minigrid_memory_reactive.py); of the "
              "pair only MemoryS13 demands memory.",
    )
)
