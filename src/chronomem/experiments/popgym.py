"""popgym: every causal chronomem core that takes ``done`` as the memory of a PPO agent on POPGym
(Morad et al. 2023), scored with POPGym's metric.

Metric (POPGym Sec. 5): the maximum over training of the mean episodic return (MMER). POPGym's
environments scale their rewards so that an episode's return lies in [-1, 1], so the number is
already normalised; ours takes the mean return of the episodes ended in each PPO update and the
maximum over the run's updates, averaged over seeds.

The environments (``chronomem.envs.popgym``) carry the previous action and a first-step flag, as in
POPGym's own PPO protocol. Cores: ``lstm``, ``relevance-lstm`` (nu = rho = 5, paper 004's MiniGrid
setting), ``mem-lstm``, ``transformer-xl`` and ``gtrxl`` (sliding memory of 256 steps), ``tlb``,
``htm``; a core that does not take ``done`` inside a call yet is listed with the reason in the table
and not run (unless asked for by name, which is then an error naming the missing piece).

POPGym's published baselines (``PAPER``): the MMER its paper gives for each of its 13 models (GRU,
LSTM, Elman, IndRNN, LMU, S4D, FART, FWP, DiffNC, frame stacking, temporal convolution, MLP, PosMLP)
on each environment and difficulty, keyed like our settings (``"RepeatPreviousEasy"``). Its LSTM
sits beside our ``lstm``; its other models are rows of the paper's numbers only. They came from
RLlib's PPO with POPGym's hyper-parameters and 15M frames per run, not from our PPO at ``quick``'s
100k frames: what POPGym's models reached with 150 times the frames, not the same run. Only numbers
printed in the paper go here, never values read off a figure; the table is empty until its
per-environment results have been transcribed from the paper and checked (docs/rl.md "POPGym").

Scales fix the frames per run: ``smoke`` (seconds, tests), ``quick`` (RepeatPrevious and RepeatFirst, Easy, 1M frames a
run, CPU-sized cores), ``paper`` (the 15 environments at the 3 difficulties, POPGym's budget of 15M frames
per run, its widths: memory 256, MLPs of 128, rollouts of 1024 steps; ``popgym/baselines/ppo.py``).

``popgym-harder``: the same cores and settings on two harder memory tests, RepeatPrevious Medium (the
suit of the card 32 steps back, not 4) and CountRecall Easy (how many cards of the queried colour
have been dealt so far), 2M frames a run at quick; its paper scale is ``popgym``'s at those environments.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

from chronomem.envs.popgym import CONTROL_ID, DIFFICULTIES, ENVS, all_ids, popgym_id
from chronomem.experiments.base import Experiment, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs
from chronomem.experiments.rl_runs import (
    PPORun,
    check_cores,
    check_no_time_budget,
    control_summary,
    curve,
    max_mean_return,
    mean_curve,
    plot_curves,
    random_return,
    takes_done,
)
from chronomem.registry import register_experiment
from chronomem.report import Claim
from chronomem.rl.settings import check_ppo_settings

CORES = {
    "mlp": {},  # no memory: the bar the memories must clear (POPGym's MLP baseline)
    "lstm": {},
    "relevance-lstm": {"buffer_size": 5, "relevant_size": 5},
    "mem-lstm": {},
    "transformer-xl": {"mem_len": 256},
    "gtrxl": {"mem_len": 256},
    "tlb": {},
    "htm": {"chunk_size": 16, "top_k": 4, "memory_size": 64},
}
NOT_RUN = "not run: no done"
CONTROL_LEARNED = 0.9  # the control's MMER (a memoryless policy can earn 1)

# POPGym's 13 memory models (paper Sec. 4, its ``popgym/baselines/ray_models``) by their row names
# here. ``lstm`` is ours too, so the paper's LSTM is the paper column of our lstm row.
PAPER_MODELS = {
    "gru": "GRU", "lstm": "LSTM", "elman": "Elman", "indrnn": "IndRNN", "lmu": "LMU", "s4d": "S4D",
    "fart": "FART (linear attention)", "fwp": "FWP", "diffnc": "DiffNC", "frame-stacking": "Frame stacking",
    "temporal-conv": "Temporal convolution", "mlp": "MLP", "pos-mlp": "PosMLP",
}
# MMER per model and environment as POPGym (Morad et al., ICLR 2023, arXiv 2303.01859) prints them:
# ``{model: {"<Name><Difficulty>": MMER}}``. Empty: not transcribed yet (module docstring).
PAPER: dict[str, dict[str, float]] = {}


@dataclass(frozen=True)
class PopgymScale:
    """One scale: environments, fixed frames per run, seeds, PPO settings and the cores' options."""

    envs: tuple[str, ...]
    frames: int  # per (core, environment, seed)
    seeds: int
    ppo: dict = field(default_factory=dict)  # chronomem.rl.ppo.Args fields
    models: dict = field(default_factory=lambda: dict(CORES))
    control_frames: int = 0  # per (core, seed) on CONTROL_ID, trained first (0: no control)

    def __post_init__(self):  # a typo or a bad value in the PPO settings fails at import
        check_ppo_settings(self.ppo, type(self).__name__)


SCALES = {
    "smoke": PopgymScale(
        envs=(popgym_id("RepeatPrevious"), popgym_id("MineSweeper")), frames=128, seeds=1,
        ppo=dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=32, num_minibatches=1, update_epochs=1),
        models={"mlp": {}, "lstm": {}, "gtrxl": {"mem_len": 8},
                "htm": {"chunk_size": 4, "memory_size": 4, "top_k": 2}},
        control_frames=64),
    # Frames: docs/rl.md "POPGym" gives the measured frames per second that sized them.
    # The two memory tests the attention cores must pass (RepeatPrevious: the observation k steps back;
    # RepeatFirst: the episode's first), 1M frames per run: 64 envs x 64 steps per update (the attention
    # cores act fastest per frame at this B: docs/rl.md "Throughput"), TLB with chunks and state of 16
    # (its builder's 100 is sized for LRA's sequences of thousands of tokens). Advantages normalised:
    # POPGym's rewards are dense and small (+-1/52 a step in RepeatPrevious), so raw advantages of ~0.02
    # lose to the entropy bonus and the policy never leaves uniform (docs/rl.md "POPGym": a probe).
    # The control first: 200k frames on RepeatCurrent for every core (the memoryless agent passes it,
    # docs/rl.md "POPGym").
    "quick": PopgymScale(
        envs=tuple(popgym_id(name) for name in ("RepeatPrevious", "RepeatFirst")), frames=1_000_000, seeds=3,
        ppo=dict(dim=64, depth=1, heads=4, hidden=64, num_envs=64, num_steps=64, num_minibatches=4,
                 update_epochs=4, lr=5e-4, norm_adv=True),
        models={**CORES, "tlb": {"chunk_size": 16, "num_state": 16}}, control_frames=196_608),
    "paper": PopgymScale(
        envs=tuple(popgym_id(name, d) for name in ENVS for d in DIFFICULTIES), frames=15_000_000, seeds=3,
        ppo=dict(dim=256, depth=1, heads=4, hidden=128, num_envs=64, num_steps=1024, num_minibatches=8,
                 update_epochs=4, lr=5e-5), control_frames=2_097_152),
}


# Two harder memory tests for the same agents: RepeatPrevious at Medium (k = 32 steps back; Easy's 4) and
# CountRecall at Easy. Twice quick's frames, as the memories need longer; the rest is quick's.
HARDER_ENVS = (popgym_id("RepeatPrevious", "Medium"), popgym_id("CountRecall"))
HARDER_SCALES = {
    "smoke": replace(SCALES["smoke"], envs=(popgym_id("CountRecall"),)),
    "quick": replace(SCALES["quick"], envs=HARDER_ENVS, frames=2_000_000),
    "paper": replace(SCALES["paper"], envs=HARDER_ENVS),
}
EXPERIMENT_SCALES = {"popgym": SCALES, "popgym-harder": HARDER_SCALES}


def _name(env_id: str) -> str:
    return env_id.removeprefix("popgym-").removesuffix("-v0")


def check_paper_table(table: dict) -> None:
    """ValueError unless every row is one of ``PAPER_MODELS``, every setting a POPGym environment at a
    difficulty (``"RepeatPreviousEasy"``) and every value an MMER in [-1, 1] (so a typo fails)."""
    names = {_name(env_id) for env_id in all_ids()}
    for model, row in table.items():
        if model not in PAPER_MODELS:
            raise ValueError(f"paper table: model must be one of {', '.join(PAPER_MODELS)}, got {model!r}")
        for setting, value in row.items():
            if setting not in names:
                raise ValueError(f"paper table: setting of {model!r} must be a POPGym environment and "
                                 f"difficulty such as 'RepeatPreviousEasy', got {setting!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 <= value <= 1:
                raise ValueError(f"paper table: {model!r} on {setting!r} must be an MMER in [-1, 1], got {value!r}")


def paper_rows(envs: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """The rows of ``PAPER`` for the environments ``envs`` (ids), every model's, ours or not."""
    names = [_name(env_id) for env_id in envs]
    rows = {model: {n: row[n] for n in names if n in row} for model, row in PAPER.items()}
    return {model: row for model, row in rows.items() if row}


def _train_run(run: PPORun) -> dict:
    """Train one core on one environment with one seed (the job of ``Jobs.map``): its row of ``extra["runs"]``."""
    result = run.train()
    return {"env": _name(run.env_id), "seed": run.seed, "mmer": max_mean_return(result.history),
            "frames": result.frames, "train_seconds": round(result.seconds, 1),
            "frames_per_second": round(result.frames / max(result.seconds, 1e-9)),
            "curve": curve(result.history)}  # the seed band of learning_curves.png


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None,
         time_budget: float | None = None, resume: bool = False, progress: bool = True,
         jobs: Jobs = SEQUENTIAL, *, name: str = "popgym") -> dict:
    check_no_time_budget(name, time_budget)
    s = EXPERIMENT_SCALES[name][scale]
    chosen = select_models(s.models, models, name)
    probe = s.envs[0]
    if models is not None:  # asked for by name: every one must be able to run
        check_cores(name, chosen, probe, s.ppo, s.models)
    skipped = {m: reason for m in chosen if (reason := takes_done(m, probe, s.ppo, s.models[m]))}
    out = Path(out)
    trained = [m for m in chosen if m not in skipped]
    seeds = range(seed, seed + s.seeds)

    def run(env_id: str, model: str, frames: int, run_seed: int) -> PPORun:
        return PPORun(env_id, model, s.models[model], s.ppo, frames, run_seed,
                      str(out / f"{model}-{_name(env_id)}-seed{run_seed}"), progress and scale != "smoke", resume)

    # the control first: short, and the table means nothing unless its settings learn it
    controls = [run(CONTROL_ID, m, s.control_frames, r) for m in trained for r in seeds] if s.control_frames else []
    memory = [run(e, m, s.frames, r) for m in trained for e in s.envs for r in seeds]
    rows = iter(jobs.map(_train_run, [*controls, *memory]))
    control = {model: [next(rows) for _ in seeds] for model in trained} if controls else {}
    results = {m: {_name(e): NOT_RUN for e in s.envs} for m in skipped}
    panels: dict[str, dict] = {_name(e): {} for e in s.envs}
    runs, per_seed = {}, {}
    for model in trained:
        results[model], per_seed[model] = {}, {}
        for env_id in s.envs:
            done = [next(rows) for _ in range(s.seeds)]
            runs.setdefault(model, []).extend(done)
            ended = [row["mmer"] for row in done if row["mmer"] is not None]  # runs in which an episode ended
            results[model][_name(env_id)] = round(sum(ended) / len(ended), 3) if ended else None
            per_seed[model][_name(env_id)] = [row["mmer"] for row in done]  # None: no episode ended
            panels[_name(env_id)][model] = mean_curve([row["curve"] for row in done])
    results = {m: results[m] for m in chosen}
    config = {"scale": scale, **asdict(s), "models": list(chosen), "skipped": skipped}
    extra = {"runs": runs, "curves": panels, "random_return": random_returns(s.envs)}
    produced = {"results": results, "per_seed": per_seed, "config": config, "paper": paper_rows(s.envs),
                "extra": extra}
    if control:
        extra["control"] = control
        produced["control"] = control_summary(
            f"`{CONTROL_ID}` (RepeatPrevious with k = 1: name the suit of the card in view)", s.control_frames,
            "MMER", f"MMER >= {CONTROL_LEARNED}",
            {m: [row["mmer"] for row in ctl] for m, ctl in control.items()},
            {m: [row["mmer"] is not None and row["mmer"] >= CONTROL_LEARNED for row in ctl]
             for m, ctl in control.items()})
    plot_learning_curves({"experiment": name, "scale": scale, "config": config, "extra": extra},
                         out / "learning_curves.png")
    return produced


def random_returns(envs: tuple[str, ...]) -> dict[str, float]:
    """A uniformly random policy's mean episodic return on each environment (``rl_runs.random_return``,
    seeded): the floor a memory must rise above."""
    return {_name(env_id): random_return(env_id) for env_id in envs}


def plot_learning_curves(results: dict, path: Path) -> None:
    """learning_curves.png from a results dict (the run's, or a results.json read back): per environment
    the mean return of each core over its seeds with a band from the lowest to the highest seed, and a
    random policy's return dashed; every panel on POPGym's return scale, [-1, 1]. Results written before
    the per-seed curves and the random returns were kept draw the stored mean curves (no band) and compute
    the random returns here."""
    extra, config = results["extra"], results["config"]
    panels = {name: {model: [] for model in lines} for name, lines in extra["curves"].items()}
    for model, runs in extra["runs"].items():
        for run in runs:
            if "curve" in run:
                panels[run["env"]][model].append(run["curve"])
    stored_means = not any(panels[name][model] for name in panels for model in panels[name])
    if stored_means:
        panels = {name: {model: [points] for model, points in lines.items()} for name, lines in extra["curves"].items()}
    chance = extra.get("random_return") or random_returns(tuple(config["envs"]))
    if extra.get("control"):  # the control's panel last
        panels[f"control: {_name(CONTROL_ID)}"] = {m: [row["curve"] for row in ctl]
                                                    for m, ctl in extra["control"].items()}
    plot_curves(panels, path, f"{results.get('experiment', 'popgym')} ({results['scale']}): mean episodic return "
                "against frames", chance=chance,
                ylim=(-1, 1), seeds=config["seeds"] if stored_means else None)


POPGYM = register_experiment(
    Experiment(
        name="popgym",
        description="POPGym (Morad et al. 2023): every causal chronomem core that takes done as a PPO agent's "
        "memory, POPGym's MMER metric.",
        run=partial(_run, name="popgym"),
        paper=PAPER,
        metric="MMER: max over training of the mean episodic return (POPGym's returns lie in [-1, 1])",
        paper_source="POPGym (Morad et al., ICLR 2023, arXiv 2303.01859): its baselines' MMER, RLlib PPO, "
        "15M frames per run; not transcribed yet, so the paper column is empty",
        # The floor a memory must rise above: a uniformly random policy's mean return, measured by the run.
        chance=lambda results: results.get("extra", {}).get("random_return"),
        chance_label="random policy",
        # What any memory result needs first: a memory above no memory (the memoryless agent, `mlp`).
        claims=tuple(Claim(f"{core} above the memoryless agent", core, "mlp") for core in CORES if core != "mlp"),
        notes="A core listed as 'not run: no done' cannot take episode ends inside a call yet. "
        "learning_curves.png: mean return against frames, one panel per environment, one line per core "
        "(mean over seeds, the band from the lowest to the highest seed), a uniformly random policy's mean "
        "return dashed (extra.random_return).",
    )
)


POPGYM_HARDER = register_experiment(
    Experiment(
        name="popgym-harder",
        description="POPGym's harder memory tests (RepeatPrevious Medium, CountRecall Easy) for the popgym agents, "
        "with the same settings, control and memoryless agent.",
        run=partial(_run, name="popgym-harder"),
        paper=PAPER,
        metric=POPGYM.metric,
        paper_source=POPGYM.paper_source,
        chance=POPGYM.chance,
        chance_label=POPGYM.chance_label,
        claims=POPGYM.claims,
        notes="RepeatPrevious Medium asks for the suit of the card 32 steps back (Easy: 4), in episodes of two "
        "decks (104 cards); CountRecall Easy for how many cards of the queried colour have been dealt so far. "
        + POPGYM.notes,
    )
)
