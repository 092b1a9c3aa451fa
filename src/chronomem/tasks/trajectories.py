"""Offline RL data: episodes of (state, action, reward), their returns-to-go, Decision Transformer's windows,
and a reader for DQN-Replay (the paper's Atari data; docs/offline_rl.md).

``Trajectories`` holds one dataset as flat arrays, the episodes one after another: ``states [N, C, H, W]``
uint8, ``actions [N]``, ``rewards [N]`` float32, and ``ends``, each episode's exclusive end (the last is
N). It is stored as npz (``save``/``load``: no pickle). ``returns_to_go()`` is each step's undiscounted
sum of the rewards from it to its episode's end, and ``steps()`` each step's place in its episode.
``windows(...)`` samples DT's training batches: K consecutive steps of one episode, from a uniformly
drawn step; a window that would cross its episode's end starts earlier (as DT's sampler does), and an
episode shorter than K gives a short window, padded on the right and masked (DT's would borrow steps of
the episode before it).

``read_dqn_replay(directory, ...)`` reads Dopamine's replay checkpoints, the files of DQN-Replay
(Agarwal et al. 2020, 50 per game): ``$store$_observation_ckpt.<i>.gz`` (``np.save`` of uint8
``[capacity, 84, 84]`` in a gzip stream), ``$store$_action`` (int32), ``$store$_reward`` (float32,
clipped to [-1, 1] when stored), ``$store$_terminal`` (uint8) and ``add_count``. Following DT's
``create_dataset.py``: buffers are visited in a random order, only a buffer's first ``capacity``
(100,000) indices are read, from each visit ``episodes_per_visit`` whole episodes are taken, until at
least ``transitions`` are loaded; a state is the stack of a frame and the three before it (Dopamine
writes three blank steps at each episode's start, read as steps, as DT reads them).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["Trajectories", "Windows", "read_dqn_replay", "replay_file"]


@dataclass(frozen=True)
class Windows:
    """A batch of DT windows: ``states [B, K, C, H, W]`` (uint8), ``actions [B, K]``, ``returns [B, K]``
    (returns-to-go), ``timestep [B]`` (the first state's step in its episode), ``mask [B, K]`` (valid steps:
    a prefix)."""

    states: Tensor
    actions: Tensor
    returns: Tensor
    timestep: Tensor
    mask: Tensor

    def to(self, device) -> Windows:
        return Windows(*(t.to(device) for t in (self.states, self.actions, self.returns, self.timestep, self.mask)))


@dataclass(frozen=True)
class Trajectories:
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    ends: np.ndarray

    def __post_init__(self):
        n = len(self.states)
        if self.states.ndim != 4 or self.states.dtype != np.uint8:
            raise ValueError(f"states must be uint8 [N, C, H, W], got {self.states.dtype} {self.states.shape}")
        if self.actions.shape != (n,) or self.rewards.shape != (n,):
            raise ValueError(f"actions and rewards must be [N] = [{n}], got {self.actions.shape} and "
                             f"{self.rewards.shape}")
        ends = self.ends
        if ends.ndim != 1 or not len(ends) or ends[-1] != n or (np.diff(ends) <= 0).any() or ends[0] <= 0:
            raise ValueError(f"ends must be the episodes' increasing exclusive ends, the last = N = {n}, got {ends}")

    @classmethod
    def from_episodes(cls, episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Trajectories:
        """From ``[(states [T, C, H, W], actions [T], rewards [T]), ...]``."""
        if not episodes:
            raise ValueError("episodes must hold at least one episode")
        states, actions, rewards = (np.concatenate(part) for part in zip(*episodes, strict=True))
        ends = np.cumsum([len(a) for _, a, _ in episodes])
        return cls(states.astype(np.uint8), actions.astype(np.int64), rewards.astype(np.float32), ends.astype(np.int64))

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def episodes(self) -> int:
        return len(self.ends)

    def starts(self) -> np.ndarray:
        return np.concatenate([[0], self.ends[:-1]])

    def returns_to_go(self) -> np.ndarray:
        """``[N]``: each step's undiscounted sum of rewards from it to its episode's end."""
        out = np.empty(len(self), np.float32)
        for start, end in zip(self.starts(), self.ends, strict=True):
            out[start:end] = np.cumsum(self.rewards[start:end][::-1])[::-1]
        return out

    def steps(self) -> np.ndarray:
        """``[N]``: each step's index in its episode (0 at its first)."""
        return np.arange(len(self)) - np.repeat(self.starts(), np.diff(np.concatenate([[0], self.ends])))

    def episode_returns(self) -> np.ndarray:
        return np.add.reduceat(self.rewards, self.starts()).astype(np.float64)

    def windows(self, batch: int, context: int, generator: np.random.Generator,
                returns: np.ndarray | None = None, steps: np.ndarray | None = None) -> Windows:
        """``batch`` windows of ``context`` steps (module docstring); ``returns``/``steps``: the precomputed
        ``returns_to_go()``/``steps()`` (computed here otherwise)."""
        returns = self.returns_to_go() if returns is None else returns
        steps = self.steps() if steps is None else steps
        picks = generator.integers(0, len(self), batch)
        episode = np.searchsorted(self.ends, picks, side="right")
        start_of, end_of = self.starts()[episode], self.ends[episode]
        first = np.maximum(np.minimum(picks, end_of - context), start_of)  # shifted back inside its episode
        lengths = np.minimum(end_of - first, context)
        index = first[:, None] + np.arange(context)[None]
        mask = np.arange(context)[None] < lengths[:, None]
        index = np.where(mask, index, first[:, None])  # padding repeats the first step, then is masked
        states = torch.from_numpy(self.states[index])
        actions = torch.from_numpy(np.where(mask, self.actions[index], 0))
        rtg = torch.from_numpy(np.where(mask, returns[index], 0.0).astype(np.float32))
        return Windows(states, actions, rtg, torch.from_numpy(steps[first]), torch.from_numpy(mask))

    def save(self, path: str | Path, **meta: str) -> None:
        """npz (compressed; ``meta``: strings stored beside, e.g. the command that recorded it)."""
        np.savez_compressed(path, states=self.states, actions=self.actions, rewards=self.rewards, ends=self.ends,
                            **{f"meta_{k}": np.asarray(v) for k, v in meta.items()})

    @classmethod
    def load(cls, path: str | Path) -> Trajectories:
        with np.load(path, allow_pickle=False) as data:
            return cls(data["states"], data["actions"], data["rewards"], data["ends"])


# ----------------------------------------------------------------------------------------------
# DQN-Replay (Dopamine's replay checkpoints)
# ----------------------------------------------------------------------------------------------

STORE = ("observation", "action", "reward", "terminal")


def replay_file(directory: str | Path, name: str, checkpoint: int) -> Path:
    """The path of one of a checkpoint's arrays: ``$store$_<name>_ckpt.<i>.gz`` for the stored arrays,
    ``<name>_ckpt.<i>.gz`` for the others (``add_count``)."""
    prefix = "$store$_" if name in STORE else ""
    return Path(directory) / f"{prefix}{name}_ckpt.{checkpoint}.gz"


def _load(path: Path) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"DQN-Replay file not found: {path} (a game's folder holds "
                                "$store$_{observation,action,reward,terminal}_ckpt.<i>.gz and add_count_ckpt.<i>.gz)")
    with gzip.open(path, "rb") as f:
        return np.load(f, allow_pickle=False)


def read_dqn_replay(directory: str | Path, transitions: int = 500_000, buffers: int = 50, capacity: int = 100_000,
                    episodes_per_visit: int = 11, stack: int = 4, seed: int = 0,
                    max_visits: int = 10_000) -> Trajectories:
    """At least ``transitions`` steps of whole episodes from the checkpoints ``0 .. buffers - 1`` in
    ``directory`` (module docstring); states are ``stack`` frames ``[stack, 84, 84]``."""
    if transitions < 1 or buffers < 1 or capacity < 1 or episodes_per_visit < 1 or stack < 1:
        raise ValueError("transitions, buffers, capacity, episodes_per_visit and stack must be positive")
    rng = np.random.default_rng(seed)
    cursor: dict[int, int] = {}
    cache: dict[int, tuple[np.ndarray, ...]] = {}
    episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    loaded = 0
    for _ in range(max_visits):
        if loaded >= transitions:
            break
        b = int(rng.integers(buffers))
        if b not in cache:
            arrays = tuple(_load(replay_file(directory, name, b)) for name in STORE)
            added = int(_load(replay_file(directory, "add_count", b)))
            limit = min(capacity, added, len(arrays[0]))
            cache[b] = tuple(a[:limit] for a in arrays)
            cursor[b] = 0
        frames, actions, rewards, terminals = cache[b]
        ends = np.flatnonzero(terminals[cursor[b]:]) + cursor[b] + 1  # exclusive ends after this cursor
        if len(ends) < episodes_per_visit:  # the visit would run past what is read: thrown away, as DT does
            continue
        for end in ends[:episodes_per_visit]:
            start = cursor[b]
            index = np.arange(start, end)[:, None] + np.arange(1 - stack, 1)[None]  # frame i and the ones before
            blank = index < start  # before the episode: blank frames
            states = np.where(blank[..., None, None], 0, frames[np.maximum(index, 0)])
            episodes.append((states.astype(np.uint8), actions[start:end].astype(np.int64),
                             rewards[start:end].astype(np.float32)))
            loaded += end - start
            cursor[b] = int(end)
    if loaded < transitions:
        raise ValueError(f"only {loaded} transitions of whole episodes could be read from {directory}; "
                         f"asked for {transitions}")
    return Trajectories.from_episodes(episodes)
