"""BabyAI behaviour cloning (paper 003 Sec. 4.2): expert demonstrations from the BabyAI bot -> batches.

* ``generate_demos(level, count, seed, workers)`` plays episodes ``seed .. seed + count - 1`` of a
  BabyAI level with minigrid's bot (``minigrid.utils.baby_ai_bot.BabyAIBot``, the oracle of the
  paper's "expert trajectories from an oracle") in ``workers`` processes, and keeps the episodes the
  bot finished with the goal reached (a failure, or a bot error, is left out and counted).
* ``load_demos(level, count, seed, cache_dir)`` caches them in ``cache_dir`` as one ``.npz`` per
  (level, first seed, count): arrays only (uint8 observations, actions and mission tokens, int32
  lengths, int64 seeds), read with ``allow_pickle=False``; a second call reads the file.
* ``BabyAIDemos`` is a per-step action tagger for the supervised trainer: a step's input is the
  observation the bot acted on (the 7x7x3 view, the direction and the mission tokens,
  ``step_features``), its target the bot's action. Its inputs are integer ids, read by
  ``chronomem.agents.InstructedPolicy`` (not by the generic heads of ``chronomem train``), so it is
  not a registered task: the experiments ``babyai`` and ``babyai-multi`` build it.

Levels (``LEVELS``): the paper's names -> minigrid 3.2 ids. minigrid 3.2 has no ``BabyAI-PutNext-v0``:
the paper's PutNext is ``BabyAI-PutNextS7N4-v0`` (the largest of BabyAI's PutNext levels: 7x7 rooms,
4 objects per side). The paper lists seven of its eight multi-task levels (PutNext, Unlock, Synth,
GoToSeq, SynthLoc, GoToImpUnlock, BossLevel); the eighth is not named, and ours is ``GoTo``.

Level generation prints "Sampling rejected ..." on stdout; it is kept out of our output.
No model code here (docs/design.md: tasks never import models).
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from chronomem.checks import check_positive
from chronomem.tasks.base import Batch, Task

LEVELS: dict[str, str] = {
    "PutNext": "BabyAI-PutNextS7N4-v0",  # minigrid 3.2 has no BabyAI-PutNext-v0
    "Unlock": "BabyAI-Unlock-v0",
    "Synth": "BabyAI-Synth-v0",
    "GoToSeq": "BabyAI-GoToSeq-v0",
    "SynthLoc": "BabyAI-SynthLoc-v0",
    "GoToImpUnlock": "BabyAI-GoToImpUnlock-v0",
    "BossLevel": "BabyAI-BossLevel-v0",
    "GoTo": "BabyAI-GoTo-v0",  # the eighth level, which the paper does not name (module docstring)
    # small levels for tests and smoke runs
    "GoToObj": "BabyAI-GoToObj-v0",
    "GoToLocal": "BabyAI-GoToLocal-v0",
}
MULTI_TASK = ("PutNext", "Unlock", "Synth", "GoToSeq", "SynthLoc", "GoToImpUnlock", "BossLevel", "GoTo")

NUM_ACTIONS = 7  # minigrid.core.actions.Actions: left, right, forward, pickup, drop, toggle, done
VIEW = 7  # the agent's egocentric view, cells per side
# BabyAI's longest missions (BossLevel: "put ... next to ... after you ...") are longer than MiniGrid's.
MAX_WORDS = 48
# A step's features: the view (object, colour, state per cell), the direction, the mission tokens.
IMAGE_FEATURES = VIEW * VIEW * 3
STEP_FEATURES = IMAGE_FEATURES + 1 + MAX_WORDS

CACHE_FORMAT = 1  # bumped when the arrays of a cache file change meaning
DEMO_SHARE = 25  # seeds per task of the demo generators: small enough for a smooth progress line
# On a few layouts the bot's planner never returns (Unlock seed 63: a replan call after step ~160 runs
# for minutes). An episode the bot has not finished within this many seconds is a failure; a normal
# episode takes well under a second, so on any machine the same episodes are kept.
BOT_SECONDS = 30.0
_ARRAYS = ("images", "directions", "actions", "missions", "lengths", "seeds", "format")


def level_id(level: str) -> str:
    """The Gymnasium id of ``level``: a name of ``LEVELS`` or a BabyAI id itself."""
    if level in LEVELS:
        return LEVELS[level]
    if isinstance(level, str) and level.startswith("BabyAI-"):
        return level
    raise ValueError(f"level must be one of {sorted(LEVELS)} or a BabyAI-* id, got {level!r}")


def make_level(level: str):
    """The level's environment with token missions (``chronomem.envs.make``), quiet while it resets."""
    from chronomem.envs.make import make_env

    return make_env(level_id(level), max_words=MAX_WORDS)


def quiet_reset(env, seed: int):
    """``env.reset(seed=seed)`` without the "Sampling rejected" lines BabyAI's level generator prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        return env.reset(seed=seed)


def step_features(obs: dict) -> np.ndarray:
    """uint8 ``[STEP_FEATURES]`` of one (token-mission) observation: the view, the direction, the mission."""
    return np.concatenate([np.asarray(obs["image"], np.uint8).reshape(-1),
                           np.asarray([obs["direction"]], np.uint8),
                           np.asarray(obs["mission"], np.uint8)])


def level_vector_env(level: str, num_envs: int, one_episode: bool = False):
    """``num_envs`` copies of the level as one vector env with same-step autoreset (what
    ``chronomem.rl.acting.Acting`` steps), each observation its step features, quiet while it resets.

    ``one_episode`` (an evaluation of fixed episodes): each env plays the episode of its seeded
    ``reset`` and then idles, its later steps returning its last observation, reward 0 and no end,
    without stepping or generating a level, so rows that finished early cost no environment time."""
    import gymnasium as gym

    class StepFeatures(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = gym.spaces.Box(0, 255, (STEP_FEATURES,), np.uint8)

        def reset(self, **kwargs):
            with contextlib.redirect_stdout(io.StringIO()):
                return super().reset(**kwargs)

        def observation(self, obs):
            return step_features(obs)

    class OneEpisode(gym.Wrapper):
        last = None  # the ended episode's last observation, once it ended

        def reset(self, *, seed=None, options=None):
            if self.last is not None and seed is None:  # the vector env's autoreset: idle
                return self.last, {}
            self.last = None
            return self.env.reset(seed=seed, options=options)

        def step(self, action):
            if self.last is not None:
                return self.last, 0.0, False, False, {}
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                self.last = obs
            return obs, reward, terminated, truncated, info

    def make():
        env = StepFeatures(make_level(level))
        return OneEpisode(env) if one_episode else env

    check_positive(num_envs, "num_envs")
    return gym.vector.SyncVectorEnv([make for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


# --------------------------------------------------------------------------------------------
# Demonstrations
# --------------------------------------------------------------------------------------------


@dataclass
class Demos:
    """Episodes of one level laid end to end: episode ``i`` holds steps ``offsets[i] : offsets[i + 1]``.

    ``images uint8 [S, 7, 7, 3]``, ``directions uint8 [S]``, ``actions uint8 [S]`` (the bot's action at
    each observation), ``missions uint8 [n, MAX_WORDS]`` (token ids, ``chronomem.envs.minigrid``),
    ``lengths int32 [n]``, ``seeds int64 [n]`` (the reset seed of each episode), ``failures``: episodes
    tried and left out (bot failed or raised)."""

    level: str
    images: np.ndarray
    directions: np.ndarray
    actions: np.ndarray
    missions: np.ndarray
    lengths: np.ndarray
    seeds: np.ndarray
    failures: int = 0

    def __post_init__(self):
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths, dtype=np.int64)])

    def __len__(self) -> int:
        return len(self.lengths)

    def episode(self, i: int) -> dict[str, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"image": self.images[a:b], "direction": self.directions[a:b], "action": self.actions[a:b],
                "mission": self.missions[i], "seed": int(self.seeds[i])}

    @classmethod
    def concat(cls, level: str, parts: list[Demos]) -> Demos:
        join = lambda k: np.concatenate([getattr(p, k) for p in parts])
        return cls(level, join("images"), join("directions"), join("actions"), join("missions"), join("lengths"),
                   join("seeds"), sum(p.failures for p in parts))


class BotTimeout(Exception):
    """The bot did not finish an episode within ``BOT_SECONDS``."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise ``BotTimeout`` inside the block once ``seconds`` have passed (a SIGALRM timer: Unix, main
    thread only, as in a demo worker; elsewhere the block runs without a limit)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise BotTimeout(f"the bot took more than {seconds} s on one episode")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _play(level: str, seeds: list[int]) -> Demos:
    """The bot's episodes of ``seeds`` (one process's share of ``generate_demos``)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = make_level(level)
    steps: list[tuple] = []
    missions, lengths, kept, failures = [], [], [], 0
    try:
        for seed in seeds:
            obs, _ = quiet_reset(env, seed)
            episode, reward, ended = [], 0.0, False
            try:
                with contextlib.redirect_stdout(io.StringIO()), _time_limit(BOT_SECONDS):
                    bot = BabyAIBot(env.unwrapped)
                    while not ended:
                        action = int(bot.replan())
                        episode.append((obs["image"], obs["direction"], action))
                        obs, reward, terminated, truncated, _ = env.step(action)
                        ended = terminated or truncated
            except Exception:  # the bot gives up (e.g. a blocked door) or times out on a few layouts: leave them out
                reward = 0.0
            if reward <= 0:
                failures += 1
                continue
            steps += episode
            missions.append(np.asarray(obs["mission"], np.uint8))
            lengths.append(len(episode))
            kept.append(seed)
    finally:
        env.close()
    images = np.stack([s[0] for s in steps]).astype(np.uint8) if steps else np.zeros((0, VIEW, VIEW, 3), np.uint8)
    column = lambda j: np.asarray([s[j] for s in steps], np.uint8)
    return Demos(level, images, column(1), column(2),
                 np.stack(missions) if missions else np.zeros((0, MAX_WORDS), np.uint8),
                 np.asarray(lengths, np.int32), np.asarray(kept, np.int64), failures)


def generate_demos(level: str, count: int, seed: int = 0, workers: int = 1, progress: bool = False) -> Demos:
    """The bot's successful episodes among seeds ``seed .. seed + count - 1`` of ``level``, played in
    ``workers`` processes (in shares of ``DEMO_SHARE`` consecutive seeds, joined in seed order, so the
    result does not depend on ``workers``). ``progress``: show it on stderr (``chronomem run`` does)."""
    from chronomem.progress import Progress

    check_positive(count, "count")
    check_positive(workers, "workers")
    level_id(level)
    end = seed + count
    shares = [list(range(first, min(first + DEMO_SHARE, end))) for first in range(seed, end, DEMO_SHARE)]
    reporter = Progress(count, f"{level} bot demos", progress, unit="demo")
    parts = []
    with contextlib.ExitStack() as stack:
        if workers > 1 and len(shares) > 1:
            import multiprocessing

            pool = stack.enter_context(ProcessPoolExecutor(min(workers, len(shares)),
                                                           mp_context=multiprocessing.get_context("spawn")))
            played = pool.map(_play, [level] * len(shares), shares)  # results in order, as they complete
        else:
            played = (_play(level, share) for share in shares)
        for share, part in zip(shares, played, strict=True):
            parts.append(part)
            reporter.update(share[-1] - seed + 1)
    demos = Demos.concat(level, parts)
    reporter.close()
    return demos


def cache_path(cache_dir: str | Path, level: str, count: int, seed: int) -> Path:
    """The cache file of ``count`` episodes of ``level`` from ``seed``: its name holds all three."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", level_id(level))
    return Path(cache_dir) / f"{name}_seed{seed}_n{count}.npz"


def save_demos(path: str | Path, demos: Demos) -> None:
    """Write ``demos`` to ``path`` (arrays only; atomically: a partial file never has the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, images=demos.images, directions=demos.directions, actions=demos.actions,
                        missions=demos.missions, lengths=demos.lengths, seeds=demos.seeds,
                        format=np.asarray([CACHE_FORMAT, demos.failures], np.int64), level=np.asarray(demos.level))
    tmp.replace(path)


def read_demos(path: str | Path) -> Demos:
    """The demos of a cache file; a file that is not one (truncated, corrupted, other arrays) is a
    ValueError naming it."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in (*_ARRAYS, "level")}
    except Exception as err:
        raise ValueError(f"demo cache {path} cannot be read ({type(err).__name__}: {err}); delete it to "
                         "generate the demos again") from None
    lengths, images = arrays["lengths"], arrays["images"]
    steps = int(lengths.sum())
    if (int(arrays["format"][0]) != CACHE_FORMAT or images.shape != (steps, VIEW, VIEW, 3)
            or arrays["actions"].shape != (steps,) or arrays["directions"].shape != (steps,)
            or arrays["missions"].shape != (len(lengths), MAX_WORDS) or arrays["seeds"].shape != lengths.shape):
        raise ValueError(f"demo cache {path} does not hold consistent demos (format {arrays['format'].tolist()}, "
                         f"{len(lengths)} episodes of {steps} steps, images {images.shape}); delete it to generate "
                         "the demos again")
    return Demos(str(arrays["level"]), images, arrays["directions"], arrays["actions"], arrays["missions"], lengths,
                 arrays["seeds"], int(arrays["format"][1]))


def load_demos(level: str, count: int, seed: int = 0, cache_dir: str | Path | None = None,
               workers: int = 1, progress: bool = False) -> Demos:
    """``generate_demos(level, count, seed, workers, progress)``, read from ``cache_dir`` when generated
    before (``cache_path``) and written there otherwise; ``cache_dir=None`` caches nothing."""
    if cache_dir is None:
        return generate_demos(level, count, seed, workers, progress)
    path = cache_path(cache_dir, level, count, seed)
    if path.exists():
        return read_demos(path)
    demos = generate_demos(level, count, seed, workers, progress)
    save_demos(path, demos)
    return demos


# --------------------------------------------------------------------------------------------
# The supervised task: a per-step action tagger
# --------------------------------------------------------------------------------------------


class BabyAIDemos(Task):
    """Behaviour cloning on demos: each example is one whole episode.

    ``inputs uint8 [B, N, STEP_FEATURES]`` (``step_features`` of each step: view, direction, mission),
    ``targets [B, N]`` the bot's actions, ``mask [B, N]`` the valid steps (episodes are padded to the
    longest of the batch). ``kind="tag"``, ``causal``: the action at step t may depend only on steps
    ``<= t``. Episodes are drawn uniformly with replacement; the last ``held_out`` demos (of each
    level) are never drawn for training and form the ``val``/``test`` set of the trainer's per-step
    action accuracy (the success rate by acting is measured in the environment,
    ``chronomem.experiments.babyai``). ``demos``: one ``Demos`` per level (multi-task: several).
    """

    name = "babyai"
    kind = "tag"
    num_classes = NUM_ACTIONS
    input_dim = STEP_FEATURES
    causal = True

    def __init__(self, demos: list[Demos], held_out: int = 0):
        if isinstance(demos, Demos):
            demos = [demos]
        if not demos or any(len(d) <= held_out for d in demos):
            raise ValueError(f"demos must be a non-empty list of Demos, each with more than held_out={held_out} "
                             f"episodes, got {[len(d) for d in demos] if demos else demos!r}")
        self.demos, self.held_out = list(demos), int(held_out)
        self.levels = tuple(d.level for d in self.demos)
        # (level index, episode index) of every training and held-out episode
        self.episodes = {
            "train": [(k, i) for k, d in enumerate(self.demos) for i in range(len(d) - self.held_out)],
            "held_out": [(k, i) for k, d in enumerate(self.demos) for i in range(len(d) - self.held_out, len(d))],
        }

    def collate(self, chosen: list[tuple[int, int]]) -> Batch:
        """The batch of the chosen ``(level index, episode index)`` episodes, padded to the longest."""
        episodes = [self.demos[k].episode(i) for k, i in chosen]
        n = max(len(e["action"]) for e in episodes)
        inputs = torch.zeros(len(episodes), n, STEP_FEATURES, dtype=torch.uint8)
        targets = torch.zeros(len(episodes), n, dtype=torch.long)
        mask = torch.zeros(len(episodes), n, dtype=torch.bool)
        for b, e in enumerate(episodes):
            t = len(e["action"])
            inputs[b, :t, :IMAGE_FEATURES] = torch.from_numpy(e["image"].reshape(t, -1))
            inputs[b, :t, IMAGE_FEATURES] = torch.from_numpy(e["direction"])
            inputs[b, :t, IMAGE_FEATURES + 1:] = torch.from_numpy(e["mission"])
            targets[b, :t] = torch.from_numpy(e["action"].astype(np.int64))
            mask[b, :t] = True
        return Batch(inputs, targets, mask=mask)

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        pool = self.episodes["train" if split == "train" else "held_out"]
        if not pool:
            raise ValueError(f"split {split!r} has no episodes (held_out={self.held_out})")
        picks = torch.randint(len(pool), (batch_size,), generator=generator).tolist()
        return self.collate([pool[p] for p in picks])

    def eval_batches(self, batch_size: int, num_examples: int, split: str = "test"):
        """The held-out episodes in order (at most ``num_examples``), the same every call."""
        pool = self.episodes["train" if split == "train" else "held_out"][:num_examples]
        for start in range(0, len(pool), batch_size):
            yield self.collate(pool[start:start + batch_size])

    def describe(self) -> dict:
        return {"name": self.name, "levels": list(self.levels), "episodes": [len(d) for d in self.demos],
                "held_out": self.held_out}


__all__ = ["LEVELS", "MULTI_TASK", "BabyAIDemos", "Demos", "generate_demos", "load_demos",
           "read_demos", "save_demos", "step_features"]
