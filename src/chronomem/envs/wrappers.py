"""The Gymnasium wrappers chronomem puts around other packages' environments (``chronomem.envs.make``
applies them; the facts and ids they serve are in ``chronomem.envs.minigrid`` and
``chronomem.envs.popgym``, which need no gymnasium).

* ``MissionTokens`` (MiniGrid, BabyAI): the mission string replaced by token ids
  (``chronomem.envs.minigrid.tokenize``), so that every observation is a fixed-shape array.
* ``fast_view(env)`` (MiniGrid, BabyAI): the env's ``gen_obs`` reads the agent's 7x7 view straight from
  the grid's cells (``agent_view``), the same arrays as MiniGrid's own (tested over every step of random
  episodes in several envs), ~3x faster: MiniGrid builds a sliced ``Grid``, rotates it (up to 4 times,
  each a new ``Grid``) and encodes it, ~130 us per observation, the largest part of a MiniGrid env's
  step on one CPU thread (docs/rl.md, "Throughput"; ``benchmarks/minigrid_speed.py``).
* ``wrap_popgym(env)`` (POPGym, Morad et al. 2023) applies POPGym's experimental protocol (its
  ``baselines/ppo.py``: every environment is ``Antialias(PreviousAction(env))``), then makes the
  result something a vector env batches and a categorical policy acts in:

  1. ``PreviousAction``: the observation carries the action just taken (a null action, 0, after
     ``reset``); POPGym's paper counts it as part of the observation (Sec. 1, footnote). Some of its
     games cannot be played without it (``env.obs_requires_prev_action``: bandit, Battleship,
     Concentration, MineSweeper); POPGym gives it to every environment, and so do we.
  2. ``Antialias``: a flag, 1 on the first step of an episode, so the null action is not mistaken for
     action 0.
  3. ``NamedParts`` (ours): POPGym's nested ``Tuple`` observation (``(obs..., prev_action, is_t0)``)
     becomes a flat ``Dict`` of arrays, ``{"obs": ..., "prev_action": ..., "is_t0": ...}``
     (``obs_0``, ``obs_1``, ... when the observation itself is a tuple), each a ``Discrete``,
     ``MultiDiscrete`` or 1-D ``Box`` that ``chronomem.encoders.SpacesEncoder`` reads.
  4. Actions: a ``MultiDiscrete`` action (Battleship, MineSweeper: a cell) becomes one ``Discrete``
     through POPGym's ``DiscreteAction``; a continuous action (the pendulums' torque, ``Box(-2, 2)``)
     becomes ``Discrete(TORQUES)`` evenly spaced values (``DiscreteTorque``, ours). The previous action
     in the observation stays in the environment's own form (two indices, a torque).

  Deviation from POPGym: the pendulums' torque is discretised (``TORQUES`` = 5 values from -2 to 2),
  because chronomem's PPO has a categorical policy; POPGym's RLlib agents used a Gaussian one.
"""

from __future__ import annotations

import functools

import numpy as np

from chronomem.envs.minigrid import MAX_WORDS, VOCAB_SIZE, tokenize
from chronomem.envs.popgym import TORQUES

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None


class MissionTokens(gym.ObservationWrapper if gym is not None else object):
    """A MiniGrid observation with its mission string replaced by token ids ``int64 [max_words]``."""

    def __init__(self, env, max_words: int = MAX_WORDS):
        super().__init__(env)
        self.max_words = max_words
        self._mission, self._tokens = None, None
        space = env.observation_space
        self.observation_space = spaces.Dict({
            **{key: value for key, value in space.spaces.items() if key != "mission"},
            "mission": spaces.Box(0, VOCAB_SIZE - 1, (max_words,), np.int64),
        })

    def observation(self, observation):
        mission = observation["mission"]
        if mission != self._mission:  # a mission is fixed for an episode: tokenize it once
            self._mission, self._tokens = mission, tokenize(mission, self.max_words)
        return {**observation, "mission": self._tokens.copy()}


def agent_view(env) -> np.ndarray:
    """The agent's partial view ``uint8 [view, view, 3]`` of a ``MiniGridEnv``: per cell (column ``i``,
    row ``j``, the agent at the bottom middle facing up) the encoded ``(object, colour, state)``, zeros
    where the cell is hidden. The same array as ``MiniGridEnv.gen_obs()["image"]`` (MiniGrid 3:
    ``gen_obs_grid`` then ``Grid.encode``): cells beyond the grid are walls; a cell hides what lies
    behind it unless ``see_behind()`` (MiniGrid's sweep: from the agent's row upwards, each row swept
    right then left, a seen transparent cell showing its neighbour in the row and the two above it); the
    agent's own cell shows what it carries."""
    wall, empty, _ = _minigrid_facts()
    size, grid = env.agent_view_size, env.grid
    width, height, cells = grid.width, grid.height, grid.grid
    ax, ay = env.agent_pos
    # view[i * size + j]: the object at view column i, row j (None: empty floor)
    view = [cells[(ay + dy) * width + ax + dx] if 0 <= ax + dx < width and 0 <= ay + dy < height else wall
            for dx, dy in _view_offsets(size, env.agent_dir)]
    agent = (size // 2) * size + size - 1  # the bottom middle
    if env.see_through_walls:
        seen = [True] * size * size
    else:
        seen = [False] * size * size
        seen[agent] = True
        for j in range(size - 1, -1, -1):  # rows from the agent's upwards, each swept right then left
            for step, columns in ((1, range(size - 1)), (-1, range(size - 1, 0, -1))):
                for i in columns:
                    here = i * size + j
                    thing = view[here]
                    if seen[here] and (thing is None or thing.see_behind()):
                        beside = here + step * size
                        seen[beside] = True
                        if j > 0:
                            seen[beside - 1] = seen[here - 1] = True
    view[agent] = env.carrying  # the agent sees what it carries (None: nothing)
    codes, hidden, wall_code = [], (0, 0, 0), _WALL_CODE
    for thing, shown in zip(view, seen, strict=True):
        codes.extend(hidden if not shown else empty if thing is None else wall_code if thing is wall
                     else thing.encode())
    return np.array(codes, dtype=np.uint8).reshape(size, size, 3)


@functools.lru_cache(maxsize=64)
def _view_offsets(size: int, direction: int) -> tuple[tuple[int, int], ...]:
    """Where each cell of the view lies from the agent, ``(dx, dy)`` in the grid, column by column: the
    view's row ``j`` is ``size - 1 - j`` steps ahead, its column ``i`` is ``i - size // 2`` to the right."""
    fx, fy = _minigrid_facts()[2][direction]
    rx, ry = -fy, fx  # the agent's right hand
    return tuple((fx * (size - 1 - j) + rx * (i - size // 2), fy * (size - 1 - j) + ry * (i - size // 2))
                 for i in range(size) for j in range(size))


_FACTS = []
_WALL_CODE = (2, 5, 0)  # Wall().encode(): ("wall", "grey", 0), checked by the tests


def _minigrid_facts():
    """MiniGrid's wall beyond the grid's edge (one instance: only its encoding is read), the empty
    cell's code and the four directions as int pairs (imported once: MiniGrid is an optional extra)."""
    if not _FACTS:
        from minigrid.core.constants import DIR_TO_VEC, OBJECT_TO_IDX
        from minigrid.core.world_object import Wall

        _FACTS.extend([Wall(), (OBJECT_TO_IDX["empty"], 0, 0), [tuple(int(v) for v in d) for d in DIR_TO_VEC]])
    return _FACTS


def _fast_gen_obs(self):
    """``MiniGridEnv.gen_obs`` with the view from ``agent_view``."""
    return {"image": agent_view(self), "direction": self.agent_dir, "mission": self.mission}


VIEWS = ("fast", "minigrid")


def fast_view(env):
    """``env`` (a MiniGrid or BabyAI env, wrapped or not) with its observations' view computed by
    ``agent_view``: its base env's ``gen_obs`` replaced on this instance. An env whose class defines its
    own ``gen_obs`` keeps it. Returns ``env``."""
    from minigrid.minigrid_env import MiniGridEnv

    base = env.unwrapped
    if isinstance(base, MiniGridEnv) and type(base).gen_obs is MiniGridEnv.gen_obs:
        base.gen_obs = functools.partial(_fast_gen_obs, base)  # a partial pickles and copies with its env
    return env


class NamedParts(gym.ObservationWrapper if gym is not None else object):
    """POPGym's (nested) ``Tuple`` observation ``(obs..., prev_action, is_t0)`` as a flat ``Dict`` of
    ``Discrete`` / ``MultiDiscrete`` / ``Box`` parts with names (``wrap_popgym``, 3.)."""

    def __init__(self, env):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Tuple) or len(space.spaces) < 3:
            raise ValueError(f"expected POPGym's Tuple (obs..., prev_action, is_t0), got {space}")
        *obs, prev_action, is_t0 = space.spaces
        if len(obs) == 1 and isinstance(obs[0], spaces.Tuple):
            obs = list(obs[0].spaces)
        names = ["obs"] if len(obs) == 1 else [f"obs_{i}" for i in range(len(obs))]
        self._parts = [*zip(names, obs, strict=True), ("prev_action", prev_action), ("is_t0", is_t0)]
        for name, part in self._parts:
            if not isinstance(part, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)) or (
                    isinstance(part, spaces.Box) and len(part.shape) != 1):
                raise ValueError(f"POPGym observation part {name!r}: expected Discrete, MultiDiscrete or a 1-D "
                                 f"Box, got {part}")
        self.observation_space = spaces.Dict({name: part for name, part in self._parts})

    def observation(self, observation):
        *obs, prev_action, is_t0 = observation
        if len(obs) == 1 and isinstance(obs[0], tuple):
            obs = list(obs[0])
        values = [*obs, prev_action, is_t0]
        return {name: np.asarray(value, dtype=part.dtype).reshape(part.shape)
                for (name, part), value in zip(self._parts, values, strict=True)}


class DiscreteTorque(gym.ActionWrapper if gym is not None else object):
    """A 1-D continuous action ``Box(low, high, (1,))`` as ``Discrete(n)`` evenly spaced values."""

    def __init__(self, env, n: int = TORQUES):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Box) or space.shape != (1,):
            raise ValueError(f"DiscreteTorque needs a Box action of shape (1,), got {space}")
        self.values = np.linspace(space.low[0], space.high[0], n, dtype=space.dtype)
        self.action_space = spaces.Discrete(n)

    def action(self, action):
        return self.values[int(action)].reshape(1)


def wrap_popgym(env):
    """POPGym's protocol and the adapters listed in the module docstring, in that order."""
    from popgym.wrappers import Antialias, DiscreteAction, PreviousAction

    env = Antialias(PreviousAction(env.unwrapped))  # POPGym's wrappers take its own env class only
    if isinstance(env.action_space, spaces.MultiDiscrete):
        env = DiscreteAction(env)
    env = NamedParts(env)
    return DiscreteTorque(env) if isinstance(env.action_space, spaces.Box) else env
