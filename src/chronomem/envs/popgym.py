"""POPGym's memory benchmark behind chronomem's env factory (Morad et al. 2023, "POPGym: Benchmarking
Partially Observable Reinforcement Learning", ICLR; PyPI ``popgym``, numpy and gymnasium only).

``import popgym`` registers its environments as ``popgym-<Name><Difficulty>-v0`` (``popgym_id``),
15 POMDPs (``ENVS``) at three difficulties (``DIFFICULTIES``); ``chronomem.envs.make.make_env``
builds any of them by that id and wraps it with ``wrap`` (below), so PPO, evaluation and the
experiments take a POPGym id as they take a MiniGrid one. Only the environments are used: POPGym's
RLlib baselines are unmaintained.

``wrap(env)`` applies POPGym's experimental protocol (its ``baselines/ppo.py``: every environment is
``Antialias(PreviousAction(env))``), then makes the result something a vector env batches and a
categorical policy acts in:

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

Rewards are POPGym's own, already scaled so that an episode's return lies in [-1, 1]: its metric, the
maximum over training of the mean episodic return (MMER), needs no further normalisation.

``LabyrinthEscape`` and ``LabyrinthExplore`` exist only when ``mazelib`` is installed (POPGym
registers them then); building one without it is a ValueError saying so.
"""

from __future__ import annotations

import numpy as np

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

# The 15 environments of POPGym's paper (Sec. 3), by class name (the "Stateless" CartPole and
# Pendulum of the paper are POPGym's PositionOnly* classes). ``VelocityOnlyCartpole`` is also
# registered by POPGym but is not one of the paper's 15.
ENVS = (
    "RepeatPrevious", "RepeatFirst", "Autoencode", "CountRecall",
    "PositionOnlyCartPole", "PositionOnlyPendulum", "NoisyPositionOnlyCartPole", "NoisyPositionOnlyPendulum",
    "MultiarmedBandit", "HigherLower", "Battleship", "Concentration", "MineSweeper",
    "LabyrinthEscape", "LabyrinthExplore",
)
DIFFICULTIES = ("Easy", "Medium", "Hard")
NEEDS_MAZELIB = ("LabyrinthEscape", "LabyrinthExplore")
TORQUES = 5  # evenly spaced torques in [low, high] for the pendulums (module docstring, 4.)


def popgym_id(name: str, difficulty: str = "Easy") -> str:
    """``popgym-<name><difficulty>-v0``, e.g. ``popgym_id("RepeatPrevious", "Hard")``."""
    if name not in ENVS:
        raise ValueError(f"name must be one of POPGym's environments ({', '.join(ENVS)}), got {name!r}")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    return f"popgym-{name}{difficulty}-v0"


def all_ids() -> tuple[str, ...]:
    """Every environment of the paper at every difficulty (45 ids)."""
    return tuple(popgym_id(name, d) for name in ENVS for d in DIFFICULTIES)


def is_popgym(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.startswith("popgym-")


def register() -> bool:
    """Import POPGym (which registers its ids); False when it is not installed."""
    try:
        import popgym  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def missing_hint(env_id: str) -> str:
    """Why a ``popgym-*`` id is unknown: POPGym not installed, or a labyrinth without mazelib."""
    if not register():
        return "POPGym is not installed: pip install 'chronomem[rl]'"
    if any(name in env_id for name in NEEDS_MAZELIB):
        return "POPGym registers its labyrinths only when mazelib is installed: pip install mazelib"
    return ""


class NamedParts(gym.ObservationWrapper if gym is not None else object):
    """POPGym's (nested) ``Tuple`` observation ``(obs..., prev_action, is_t0)`` as a flat ``Dict`` of
    ``Discrete`` / ``MultiDiscrete`` / ``Box`` parts with names (module docstring, 3.)."""

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


def wrap(env):
    """POPGym's protocol and the adapters of the module docstring, in that order."""
    from popgym.wrappers import Antialias, DiscreteAction, PreviousAction

    env = Antialias(PreviousAction(env.unwrapped))  # POPGym's wrappers take its own env class only
    if isinstance(env.action_space, spaces.MultiDiscrete):
        env = DiscreteAction(env)
    env = NamedParts(env)
    return DiscreteTorque(env) if isinstance(env.action_space, spaces.Box) else env
