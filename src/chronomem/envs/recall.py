"""Cue recall: the smallest memory test for an agent. A cue is shown at step 0, and ``delay`` steps
later the agent is asked for it.

Observations are float32 vectors of ``num_cues + 1`` features: step 0 shows the cue one-hot (the last
feature 0), the steps in between are all zeros, and the query step has only its last feature set.
Actions are ``Discrete(num_cues)``; every action before the query is ignored, and the action at the
query ends the episode with reward 1 if it names the cue, else 0. So an episode is ``delay + 1``
steps, a memoryless policy earns ``1 / num_cues`` on average and an agent that remembers earns 1.

``random_delay=True`` draws the delay uniformly from ``1..delay`` at every reset (the query feature
tells the agent when to answer), so the episodes of a vector env end at different steps.

Registered with Gymnasium as ``GYM_ID`` (``chronomem rl train --env chronomem/CueRecall-v0``).
"""

from __future__ import annotations

import numpy as np

from chronomem.layers import check_positive

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
        if self.t == self.episode_delay:  # the query: answer and end
            reward = float(int(action) == self.cue)
            self.t += 1
            return np.zeros(self.num_cues + 1, np.float32), reward, True, False, {}
        self.t += 1
        return self._observation(), 0.0, False, False, {}


GYM_ID = "chronomem/CueRecall-v0"  # gymnasium.make(GYM_ID, num_cues=..., delay=..., random_delay=...)
if gym is not None and GYM_ID not in gym.registry:
    gym.register(id=GYM_ID, entry_point=CueRecall)
