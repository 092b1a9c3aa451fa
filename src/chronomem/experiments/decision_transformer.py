"""decision-transformer: Decision Transformer against DT + TLB, offline RL (paper 003 Sec. 4.2, Table 3).

Both models (``chronomem.dt``) learn by behaviour cloning conditioned on the return-to-go, from windows of
K steps of a fixed dataset, and are scored by playing the game: each episode starts from the scale's
target return, and the score is the mean return over the evaluation episodes (actions sampled from the
policy, as DT's evaluation does), per game and seed. The claim (Table 3): DT + TLB scores higher than DT
on every game.

The data:

* ``paper``: 1% of DQN-Replay per game (500,000 transitions, read by
  ``chronomem.tasks.trajectories.read_dqn_replay`` from ``--data-dir/<Game>/`` as DT's loader reads
  them), Breakout, Pong, Qbert and Seaquest, played in ALE (``gymnasium``'s ``ALE/<Game>-v5`` with
  ``ale-py``: frame skip 4 with a max over the last two frames, up to 30 no-ops, 84 x 84 grey, 4-frame
  stacks, no sticky actions, as DT's evaluation env). Never run here.
* ``quick`` (**a deviation**, no DQN-Replay offline): MinAtar's Breakout and Seaquest
  (``chronomem.envs.minatar``), a dataset per game recorded from chronomem's own PPO agent while it
  learns: the agent (memoryless, ``mlp``, a constant learning rate) trains for ``record_frames``
  frames in ``record_checkpoints`` equal stages; after each stage it plays an equal share of the
  ``transitions`` (whole episodes, actions sampled), so the data mixes a poor policy with better ones,
  as DQN-Replay's 1% mixes the stages of a DQN's training ("suboptimal trajectories of a learned
  agent"). The dataset is recorded once per (game, settings, seed) and cached as npz under
  ``$CHRONOMEM_CACHE/offline`` (default ``~/.cache/chronomem/offline``) with its settings beside it.
* ``smoke``: seconds, for the tests.

Each run's result (model, game, seed) is kept in ``OUT/runs`` when it ends; ``chronomem run
decision-transformer --resume OUT`` reads those back and trains the others from their start.

Settings from DT's Atari code: context K = 30 (50 for Pong), AdamW (betas 0.9, 0.95, weight decay 0.1
on the weights of linear maps and convolutions), lr 6e-4 with a linear warm-up over 10,240 tokens then
a cosine decay to 10%, gradients clipped at 1, dropout 0.1, batch 128 (512 for Pong), actions sampled
at evaluation, 10 episodes (``eval_examples``). The paper-scale model is DT's (6 layers, 8 heads, width
128); the quick one is smaller (width 64, 2 layers, 4 heads, no dropout, 2,000 steps of 32 windows).
DT + TLB: the causal TLB over the same tokens, ``depth // 2`` x [1 self-attention, 1 cross-attention]
(as many attention layers as the Transformer), chunks of 30 tokens (10 steps) and 5 state vectors;
paper 003 gives neither number (its appendix with them is not in
the text), so they are our choice. The target return: at ``paper``, DT's per game (Breakout 90, Pong 20,
Qbert 14,000, Seaquest 1,150, from its code); at ``quick``, the best episode return in the dataset.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chronomem.experiments.base import Experiment, Scale, select_models
from chronomem.experiments.jobs import SEQUENTIAL, Jobs, Recorded, run_recorded
from chronomem.registry import register_experiment
from chronomem.report import Claim

MODELS = ("dt", "dt-tlb")
CORE = {"dt": "transformer", "dt-tlb": "tlb"}
PAPER_GAMES = ("Breakout", "Pong", "Qbert", "Seaquest")
# Paper 003 Table 3: mean return (its +- are the spread over seeds).
PAPER = {"dt": {"Breakout": 71.51, "Pong": 13.68, "Qbert": 3268.0, "Seaquest": 1039.11},
         "dt-tlb": {"Breakout": 87.63, "Pong": 14.71, "Qbert": 5019.75, "Seaquest": 1248.22}}
DT_TARGETS = {"Breakout": 90.0, "Pong": 20.0, "Qbert": 14_000.0, "Seaquest": 1_150.0}  # DT's Atari code
EVAL_SEED = 1_000_000_000  # evaluation episodes are seeded apart from the recorded ones


@dataclass(frozen=True)
class DTScale(Scale):
    games: tuple[str, ...] = ("Breakout", "Seaquest")
    source: str = "minatar"  # "minatar": recorded here; "dqn-replay": read from --data-dir
    transitions: int = 500_000  # per game
    # the recording agent (source "minatar"): chronomem's PPO, memoryless, on the game itself
    record_frames: int = 1_000_000
    record_checkpoints: int = 5
    record_envs: int = 16
    context: int = 30
    context_by_game: dict = field(default_factory=dict)  # DT: 50 for Pong
    batch_by_game: dict = field(default_factory=dict)  # DT: 512 for Pong
    dim: int = 64
    depth: int = 2  # the Transformer's layers; TLB's: depth // 2 x [1 self-attention, 1 cross-attention]
    num_heads: int = 4
    dropout: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_tokens: int = 512 * 20
    final_lr: float = 0.1  # the cosine ends at this fraction of lr
    chunk_size: int = 30  # TLB's chunk, in tokens (10 steps of 3)
    num_state: int = 5
    eval_max_steps: int = 10_000
    targets: dict = field(default_factory=dict)  # per game; empty: the dataset's best episode return
    seeds: int = 3

    def context_of(self, game: str) -> int:
        return self.context_by_game.get(game, self.context)

    def batch_of(self, game: str) -> int:
        return self.batch_by_game.get(game, self.batch_size)


SCALES = {
    "smoke": DTScale(steps=3, batch_size=4, lr=6e-4, eval_examples=2, games=("Breakout",), transitions=300,
                     record_frames=1024, record_checkpoints=2, record_envs=4, context=6, dim=16, depth=1,
                     num_heads=2, chunk_size=6, num_state=2, eval_max_steps=40, seeds=1),
    # CPU-sized: 2,000 steps of 32 windows (64,000 windows, about 2.6% of DT's 5 epochs over 500k), so no
    # dropout (a third of a CPU step, against over-fitting a run too short to over-fit)
    "quick": DTScale(steps=2_000, batch_size=32, lr=6e-4, eval_examples=10, depth=2, dropout=0.0),
    # DT's Atari settings: 5 epochs over 500k windows at batch 128 (Pong: 512)
    "paper": DTScale(steps=5 * 500_000 // 128, batch_size=128, lr=6e-4, eval_examples=10, games=PAPER_GAMES,
                     source="dqn-replay", context_by_game={"Pong": 50}, batch_by_game={"Pong": 512}, dim=128,
                     depth=6, num_heads=8, eval_max_steps=27_000, targets=DT_TARGETS),
}

CLAIMS = (Claim("DT + TLB scores higher than DT (paper 003 Table 3)", "dt-tlb", "dt"),)


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("CHRONOMEM_CACHE") or Path.home() / ".cache" / "chronomem"
    return Path(root) / "offline"


def setting_name(game: str, s: DTScale) -> str:
    """A game's column: "MinAtar Breakout" apart from the paper's Atari "Breakout"."""
    return f"MinAtar {game}" if s.source == "minatar" else game


def env_id(game: str, s: DTScale) -> str:
    if s.source == "minatar":
        from chronomem.envs.minatar import minatar_id

        return minatar_id(game)
    return f"ALE/{game}-v5"


def recording_settings(game: str, s: DTScale, seed: int) -> dict[str, Any]:
    return {"game": game, "env": env_id(game, s), "transitions": s.transitions, "record_frames": s.record_frames,
            "record_checkpoints": s.record_checkpoints, "record_envs": s.record_envs, "seed": seed,
            "agent": f"ppo mlp, visual cells, width 64, {s.record_envs} envs x 128 steps, lr 1e-3 constant, "
                     "entropy 0.01, norm-adv, trained in stages"}


def record_dataset(game: str, s: DTScale, seed: int, progress: bool = False):
    """The recorded dataset of ``game`` (module docstring), from the cache or recorded now."""
    from chronomem.tasks.trajectories import Trajectories

    settings = recording_settings(game, s, seed)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / f"{game}-{key}.npz"
    if path.exists():
        return Trajectories.load(path)
    data = _record(settings, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial.npz")
    data.save(partial, settings=json.dumps(settings, sort_keys=True))
    partial.replace(path)  # whole or absent: a run cut short leaves no half dataset behind
    return data


def _record(settings: dict[str, Any], progress: bool):
    """Train the recording agent in ``record_checkpoints`` stages (each continuing the last, ``--resume``),
    and after each let the agent of that stage play its share of the transitions."""
    import tempfile

    from chronomem.rl.ppo import Args, train
    from chronomem.tasks.trajectories import Trajectories

    k, envs = settings["record_checkpoints"], settings["record_envs"]
    per_update = envs * 128
    updates = max(k, settings["record_frames"] // per_update)
    share = [settings["transitions"] // k + (i < settings["transitions"] % k) for i in range(k)]
    episodes = []
    with tempfile.TemporaryDirectory() as run_dir:
        for stage in range(k):
            # a constant learning rate: each stage's total is the run's new total, which would restart a decay
            args = Args(env=settings["env"], core="mlp", visual="cells", dim=64, hidden=64, num_envs=envs,
                        num_steps=128, num_minibatches=min(8, envs), update_epochs=4, lr=1e-3, anneal_lr=False,
                        ent_coef=0.01, norm_adv=True, total_frames=(stage + 1) * (updates // k) * per_update,
                        seed=settings["seed"], out=run_dir, progress=progress, torch_threads=1)
            agent = train(args, resume=run_dir if stage else None).agent
            episodes += play(agent, settings["env"], share[stage], seed=settings["seed"] * 1_000 + stage)
    return Trajectories.from_episodes(episodes)


def play(agent, env: str, transitions: int, seed: int, num_envs: int = 16) -> list[tuple]:
    """Whole episodes of ``agent`` (actions sampled), at least ``transitions`` steps:
    ``[(states [T, C, H, W] uint8, actions [T], rewards [T]), ...]``."""
    import torch

    from chronomem.envs.make import env_seeds, make_vector_env
    from chronomem.rl.acting import Acting, drawn

    agent.eval()
    envs = make_vector_env(env, num_envs)
    torch.manual_seed(seed)
    try:
        obs, _ = envs.reset(seed=env_seeds(seed, 0, num_envs))
        acting = Acting(agent, envs, obs, agent.initial_state(num_envs, next(agent.parameters()).device), drawn)
        running: list[list] = [[] for _ in range(num_envs)]
        episodes, kept = [], 0
        while kept < transitions:
            step = acting.step()
            grids = step.obs["grid"].cpu().numpy()
            for i in range(num_envs):
                running[i].append((grids[i], int(step.action[i]), float(step.reward[i])))
                if step.done[i]:
                    states, actions, rewards = zip(*running[i], strict=True)
                    episodes.append((np.stack(states).transpose(0, 3, 1, 2), np.array(actions),
                                     np.array(rewards, np.float32)))
                    kept += len(actions)
                    running[i] = []
    finally:
        envs.close()
    return episodes


def load_data(game: str, s: DTScale, seed: int, data_dir: str | None, progress: bool):
    if s.source == "minatar":
        return record_dataset(game, s, seed, progress)
    from chronomem.tasks.trajectories import read_dqn_replay

    if data_dir is None:
        raise ValueError("the paper scale reads DQN-Replay: give --data-dir (a folder with one sub-folder per game, "
                         "e.g. Breakout/, holding $store$_observation_ckpt.<i>.gz and the rest)")
    return read_dqn_replay(Path(data_dir) / game, s.transitions, seed=seed)


# ----------------------------------------------------------------------------------------------
# One run: train, then play
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DTRun:
    model: str
    game: str
    scale: DTScale
    seed: int
    data_seed: int
    data_dir: str | None
    progress: bool


def build_model(model: str, game: str, s: DTScale, state_shape, num_actions: int, max_timestep: int):
    from chronomem.dt import DecisionTransformer
    from chronomem.registry import build_backbone

    options = (dict(positions=False, dropout=s.dropout) if CORE[model] == "transformer" else
               dict(chunk_size=s.chunk_size, num_state=s.num_state, self_per_cross=1, dropout=s.dropout))
    depth = s.depth if CORE[model] == "transformer" else max(1, s.depth // 2)
    core = build_backbone(CORE[model], dim=s.dim, depth=depth, num_heads=s.num_heads, causal=True, **options)
    return DecisionTransformer(core, num_actions, state_shape, s.context_of(game), max_timestep, dropout=s.dropout)


def lr_factor(tokens: int, s: DTScale, final_tokens: int) -> float:
    """DT's schedule by tokens seen: linear warm-up over ``warmup_tokens``, then a cosine to ``final_lr``."""
    if tokens < s.warmup_tokens:
        return max(tokens, 1) / s.warmup_tokens
    progress = min(1.0, (tokens - s.warmup_tokens) / max(1, final_tokens - s.warmup_tokens))
    return max(s.final_lr, 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_and_play(run: DTRun) -> dict[str, Any]:
    import torch

    from chronomem.progress import Progress
    from chronomem.train.distributed import default_device

    s = run.scale
    device = default_device()
    data = load_data(run.game, s, run.data_seed, run.data_dir, False)
    returns, steps = data.returns_to_go(), data.steps()
    context, batch = s.context_of(run.game), s.batch_of(run.game)
    torch.manual_seed(run.seed)
    model = build_model(run.model, run.game, s, data.states.shape[1:], int(data.actions.max()) + 1,
                        int(steps.max())).to(device)
    optimizer = torch.optim.AdamW(model.param_groups(s.weight_decay), lr=s.lr, betas=s.betas, foreach=True)
    generator = np.random.default_rng(run.seed)
    final_tokens = 2 * len(data) * context * 3  # DT's: about 6 epochs' worth, so 5 never reach the floor
    reporter = Progress(s.steps, f"{run.model} on {run.game}, seed {run.seed}", run.progress)
    start, loss = time.perf_counter(), float("nan")
    model.train()
    for step in range(1, s.steps + 1):
        w = data.windows(batch, context, generator, returns, steps).to(device)
        for group in optimizer.param_groups:
            group["lr"] = s.lr * lr_factor((step - 1) * batch * context, s, final_tokens)
        out = model.loss(w.states, w.actions, w.returns, w.timestep, w.mask)
        optimizer.zero_grad()
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        optimizer.step()
        loss = float(out.detach())
        reporter.update(step, {"loss": f"{loss:.3f}"})
    reporter.close()
    seconds = time.perf_counter() - start
    target = s.targets.get(run.game, float(data.episode_returns().max()))
    scores = play_dt(model, env_id(run.game, s), target, s.eval_examples, EVAL_SEED + run.seed, s.eval_max_steps)
    return {"returns": scores, "mean": round(statistics.fmean(scores), 2), "target": target, "loss": round(loss, 4),
            "seconds": round(seconds, 1), "parameters": sum(p.numel() for p in model.parameters())}


def play_dt(model, env: str, target: float, episodes: int, seed: int, max_steps: int) -> list[float]:
    """The return of each of ``episodes`` episodes of ``env`` played by ``model`` from the target return
    (module docstring), all at once, one env each; each window holds the last K steps, its timestep the
    step of its first state. An episode not over after ``max_steps`` steps scores what it has. Rewards
    are clipped to [-1, 1] before they are taken off the return-to-go where the data was clipped
    (DQN-Replay), so that it stays in the data's units (DT's evaluation takes off the raw reward)."""
    import torch

    from chronomem.envs.make import env_seeds

    clip = env.startswith("ALE/")
    envs = evaluation_envs(env, episodes)
    model.eval()
    torch.manual_seed(seed)
    k, device = model.context, next(model.parameters()).device
    try:
        obs, _ = envs.reset(seed=env_seeds(seed, 0, episodes))
        states, actions = [observation_states(obs).to(device)], []
        rtg = [torch.full((episodes,), float(target), device=device)]
        scores, over = np.zeros(episodes), np.zeros(episodes, dtype=bool)
        for t in range(max_steps):
            first = t + 1 - len(states)  # the step of the window's first state
            taken_actions = (torch.stack(actions, 1) if actions else
                             torch.zeros(episodes, 0, dtype=torch.long, device=device))
            with torch.no_grad():
                logits = model(torch.stack(states, 1), taken_actions, torch.stack(rtg, 1),
                               torch.full((episodes,), first, dtype=torch.long, device=device))[:, -1]
            action = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
            obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
            reward = np.asarray(reward, dtype=np.float64)
            scores += np.where(over, 0.0, reward)
            over |= terminated | truncated
            if over.all():
                break
            taken = np.clip(reward, -1.0, 1.0) if clip else reward
            states.append(observation_states(obs).to(device))
            actions.append(action)
            rtg.append(rtg[-1] - torch.as_tensor(taken, dtype=torch.float32, device=device))
            if len(states) > k:  # the window: the last K states, the K - 1 actions between them
                states, rtg = states[-k:], rtg[-k:]
                actions = actions[len(actions) - (k - 1):]
    finally:
        envs.close()
    return [round(float(x), 2) for x in scores]


def observation_states(obs):
    """The batch of states ``[E, C, H, W]`` uint8 of a vector env's observation: MinAtar's ``{"grid": [E, H,
    W, C]}`` channels first, or Atari's frame stacks ``[E, 4, 84, 84]`` as they are."""
    import torch

    if isinstance(obs, dict):
        return torch.as_tensor(np.asarray(obs["grid"])).permute(0, 3, 1, 2).contiguous()
    return torch.as_tensor(np.asarray(obs))


def evaluation_envs(env: str, num_envs: int):
    """``num_envs`` copies of ``env`` for scoring: Atari as DT plays it (``make_atari_env``), MinAtar as made."""
    from chronomem.envs.make import make_vector_env

    return make_atari_env(env, num_envs) if env.startswith("ALE/") else make_vector_env(env, num_envs)


def make_atari_env(env: str, num_envs: int):
    """``num_envs`` ALE games as DT's evaluation plays them (module docstring), same-step autoreset."""
    import gymnasium as gym

    try:
        import ale_py
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the paper scale plays Atari through ale-py: pip install ale-py") from None
    gym.register_envs(ale_py)

    def one():
        game = gym.make(env, frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=108_000)
        game = gym.wrappers.AtariPreprocessing(game, noop_max=30, frame_skip=4, screen_size=84,
                                               terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
        return gym.wrappers.FrameStackObservation(game, 4)

    return gym.vector.SyncVectorEnv([one] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def random_returns(env: str, episodes: int, seed: int, max_steps: int) -> list[float]:
    """The return of a uniformly random policy in each of ``episodes`` episodes (the table's chance row)."""
    from chronomem.envs.make import env_seeds

    envs = evaluation_envs(env, episodes)
    generator = np.random.default_rng(seed)
    try:
        envs.reset(seed=env_seeds(seed, 0, episodes))
        scores, over = np.zeros(episodes), np.zeros(episodes, dtype=bool)
        for _ in range(max_steps):
            action = generator.integers(envs.single_action_space.n, size=episodes)
            _, reward, terminated, truncated, _ = envs.step(action)
            scores += np.where(over, 0.0, np.asarray(reward, dtype=np.float64))
            over |= terminated | truncated
            if over.all():
                break
    finally:
        envs.close()
    return [round(float(x), 2) for x in scores]


def _run(scale: str, out: Path, seed: int, models: tuple[str, ...] | None = None, time_budget: float | None = None,
         data_dir: str | None = None, progress: bool = True, jobs: Jobs = SEQUENTIAL, resume: bool = False) -> dict:
    from chronomem.experiments.rl_runs import check_no_time_budget

    check_no_time_budget("decision-transformer", time_budget)
    s = SCALES[scale]
    chosen = select_models(MODELS, models, "decision-transformer")
    datasets = {}
    for game in s.games:  # recorded (or read) once, before any model trains on it
        data = load_data(game, s, seed, data_dir, progress)
        datasets[setting_name(game, s)] = {"transitions": len(data), "episodes": data.episodes,
                          "episode_return": {"mean": round(float(data.episode_returns().mean()), 2),
                                             "max": round(float(data.episode_returns().max()), 2)}}
    runs = [DTRun(m, game, s, seed + k, seed, data_dir, progress) for m in chosen for game in s.games
            for k in range(s.seeds)]
    # each run's result is kept in OUT/runs as it ends; --resume reads back those of the same runs
    done = iter(jobs.map(run_recorded, [
        Recorded(train_and_play, run, str(Path(out) / "runs" / run.model / run.game / f"seed{run.seed}.json"), resume)
        for run in runs]))
    results, per_seed, extra = {}, {}, {"datasets": datasets, "runs": {}}
    for m in chosen:
        results[m], per_seed[m] = {}, {}
        for game in s.games:
            rows = [next(done) for _ in range(s.seeds)]
            name = setting_name(game, s)
            per_seed[m][name] = [r["mean"] for r in rows]
            results[m][name] = round(statistics.fmean(per_seed[m][name]), 2)
            for k, r in enumerate(rows):
                extra["runs"][f"{m}/{name}/seed{seed + k}"] = {key: r[key] for key in
                                                               ("returns", "target", "loss", "seconds", "parameters")}
    extra["random_return"] = {
        setting_name(game, s): round(statistics.fmean(random_returns(env_id(game, s), s.eval_examples, EVAL_SEED,
                                                                     s.eval_max_steps)), 2)
        for game in s.games}
    config = {"scale": asdict(s), "models": {m: CORE[m] for m in chosen}}
    return {"results": results, "per_seed": per_seed, "config": config, "extra": extra}


def random_policy(results: dict) -> dict[str, float] | None:
    """The chance row: a uniformly random policy's mean return per game, as the run measured it."""
    return (results.get("extra") or {}).get("random_return")


DECISION_TRANSFORMER = register_experiment(Experiment(
    name="decision-transformer",
    description="Decision Transformer and DT + TLB trained offline on a game's recorded trajectories, then scored "
                "by playing it from a target return",
    run=_run,
    paper={m: dict(v) for m, v in PAPER.items()},
    metric="mean return over the evaluation episodes, mean over seeds",
    chance=random_policy,
    chance_label="random policy",
    claims=CLAIMS,
    paper_source="paper 003 Table 3 (Atari, 1% of DQN-Replay; at quick the games are MinAtar's, so the paper's "
                 "numbers are not comparable there)",
    notes="Different data at quick: MinAtar games and a dataset recorded from chronomem's PPO agent, not DQN-Replay; "
          "docs/offline_rl.md.",
))
