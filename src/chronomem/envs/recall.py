"""Cue recall: the smallest memory test for an agent. A cue is shown at step 0, and ``delay`` steps
later the agent is asked for it.

Observations are float32 vectors of ``num_cues + 1`` features: step 0 shows the cue one-hot (the last
feature 0), the steps in between are all zeros, and the query step has only its last feature set.
Actions are ``Discrete(num_cues)``; every action before the query is ignored, and the action at the
query ends the episode with reward 1 if it names the cue, else 0. So an episode is ``delay + 1``
steps, a memoryless policy earns ``1 / num_cues`` on average and an agent that remembers earns 1.

``random_delay=True`` draws the delay uniformly from ``1..delay`` at every reset (the query feature
tells the agent when to answer), so the episodes of a vector env end at different steps.

Registered with Gymnasium as ``GYM_ID`` (``chronomem rl train --env chronomem/CueRecall-v0``), with a
natively vectorised version, ``CueRecallVector`` (``gymnasium.make_vec(GYM_ID, num_envs=B)``, and what
``chronomem.envs.make.make_vector_env`` builds): ``B`` episodes as arrays, equal step for step to
``SyncVectorEnv(autoreset_mode=SAME_STEP)`` over ``CueRecall`` (``tests/test_envs_vector.py``).
"""

from __future__ import annotations

import numpy as np

from chronomem.checks import check_positive
from chronomem.envs.vector import (  # the rules every native vector env shares
    RowGenerators,
    check_actions,
    check_max_episode_steps,
    check_num_envs,
    check_reset_mask,
    final_entries,
    seed_list,
)

try:  # the environment needs the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None


class CueRecall(gym.Env if gym is not None else object):
    metadata = {"render_modes": []}

    def __init__(self, num_cues: int = 2, delay: int = 5, random_delay: bool = False):
        if gym is None:
            raise ModuleNotFoundError("CueRecall needs gymnasium: pip install 'chronomem[rl]'")
        self.num_cues = check_positive(num_cues, "num_cues", minimum=2)
        self.delay = check_positive(delay, "delay")
        self.random_delay = bool(random_delay)
        self.observation_space = spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)
        self.action_space = spaces.Discrete(num_cues)
        self.cue = self.episode_delay = self.t = 0

    def _observation(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        elif self.t == self.episode_delay:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.num_cues))
        self.episode_delay = int(self.np_random.integers(1, self.delay + 1)) if self.random_delay else self.delay
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, {self.num_cues}), got {action!r}")
        if self.t == self.episode_delay:  # the query: answer and end
            reward = float(int(action) == self.cue)
            self.t += 1
            return np.zeros(self.num_cues + 1, np.float32), reward, True, False, {}
        self.t += 1
        return self._observation(), 0.0, False, False, {}


class CueRecallVector(gym.vector.VectorEnv if gym is not None else object):
    """``num_envs`` cue-recall episodes as arrays: ``CueRecall``'s rules (module docstring) for every row at
    once, with same-step autoreset (``metadata["autoreset_mode"]``; the ended episode's last observation in
    ``info["final_obs"]``, its empty info in ``info["final_info"]``, as ``SyncVectorEnv`` lays them out).

    ``CueRecallVector(num_envs, num_cues=2, delay=5, random_delay=False, max_episode_steps=None)``.
    ``max_episode_steps`` is what ``gymnasium.make(GYM_ID, max_episode_steps=...)`` adds to a single env,
    Gymnasium's ``TimeLimit``: truncated once an episode has made that many steps, terminated or not.
    Every env has its own generator, seeded and drawn from as ``CueRecall.reset`` does (the cue, then the
    delay when it is random); ``reset(seed=s)`` seeds env ``i`` with ``s + i`` (``SyncVectorEnv``'s rule).
    """

    metadata = {"render_modes": [], "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP if gym is not None else None}

    def __init__(self, num_envs: int, num_cues: int = 2, delay: int = 5, random_delay: bool = False,
                 max_episode_steps: int | None = None):
        if gym is None:
            raise ModuleNotFoundError("CueRecallVector needs gymnasium: pip install 'chronomem[rl]'")
        self.num_envs = check_num_envs(num_envs)
        self.num_cues = check_positive(num_cues, "num_cues", minimum=2)
        self.delay = check_positive(delay, "delay")
        self.random_delay = bool(random_delay)
        self.max_episode_steps = check_max_episode_steps(max_episode_steps)
        self.single_observation_space = spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)
        self.single_action_space = spaces.Discrete(num_cues)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._rngs = RowGenerators(self.num_envs)
        self.cue = np.zeros(self.num_envs, np.int64)
        self.episode_delay = np.zeros(self.num_envs, np.int64)
        self.t = None  # the steps taken in each row's episode; None until the first reset

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Every env's generator (``SyncVectorEnv.np_random``'s tuple)."""
        return tuple(self._rngs[row] for row in range(self.num_envs))

    def _observation(self) -> np.ndarray:
        obs = np.zeros((self.num_envs, self.num_cues + 1), np.float32)
        rows = np.arange(self.num_envs)
        obs[rows, self.cue] = self.t == 0  # the cue at step 0
        obs[:, -1] = self.t == self.episode_delay  # the query
        return obs

    def _start(self, rows) -> None:
        for row in rows:  # each row's generator in CueRecall.reset's order: the cue, then the delay
            rng = self._rngs[int(row)]
            self.cue[row] = rng.integers(self.num_cues)
            self.episode_delay[row] = rng.integers(1, self.delay + 1) if self.random_delay else self.delay
            self.t[row] = 0

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        if self.closed:
            raise RuntimeError("CueRecallVector is closed: make a new one")
        seeds = seed_list(seed, self.num_envs)
        mask = check_reset_mask(options or {}, self.num_envs)
        rows = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        if self.t is None:
            self.t = np.zeros(self.num_envs, np.int64)
        for row in rows:
            self._rngs.seed(int(row), seeds[row])
        self._start(rows)
        return self._observation(), {}

    def step(self, actions):
        if self.closed:
            raise RuntimeError("CueRecallVector is closed: make a new one")
        if self.t is None:
            raise RuntimeError("CueRecallVector.step before reset: call reset() first")
        actions = check_actions(actions, self.num_envs, self.num_cues)
        query = self.t == self.episode_delay  # the answer ends the episode
        rewards = (query & (actions == self.cue)).astype(np.float64)
        self.t += 1
        terminated = query
        truncated = np.zeros(self.num_envs, np.bool_)
        if self.max_episode_steps is not None:
            truncated = self.t >= self.max_episode_steps
        ended = np.flatnonzero(terminated | truncated)
        obs, infos = self._observation(), {}  # after the answer (t = delay + 1): zeros, as CueRecall returns
        if len(ended):
            final_entries(infos, list(obs[ended]), {}, ended, self.num_envs)
            self._start(ended)
            obs[ended] = self._observation()[ended]
        return obs, rewards, terminated, truncated, infos


GYM_ID = "chronomem/CueRecall-v0"  # gymnasium.make(GYM_ID, num_cues=..., delay=..., random_delay=...)
if gym is not None and GYM_ID not in gym.registry:
    gym.register(id=GYM_ID, entry_point=CueRecall, vector_entry_point=CueRecallVector)
