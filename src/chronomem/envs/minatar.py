"""MinAtar (Young & Tian 2019): five Atari games on a 10 x 10 grid of object channels, as Gymnasium envs.

``chronomem/MinAtar-<Game>-v0`` for Breakout, Seaquest, Asterix, Freeway and SpaceInvaders, with the
``minatar`` package (in the ``rl`` extra) as the game engine. What the decision-transformer experiment
needs of them (docs/offline_rl.md): a CPU-sized stand-in for the paper's Atari games, played by
chronomem's PPO agent to record a dataset, and played by the Decision Transformer to be scored.

* Observation: ``{"grid": uint8 [10, 10, C]}``, MinAtar's binary channels (4 for Breakout, 10 for
  Seaquest), which ``chronomem.encoders.encoder_for`` reads as a grid of cells.
* Actions: the game's minimal action set (MinAtar's ``minimal_action_set``: 3 for Breakout, 6 for
  Seaquest), in its order.
* MinAtar's defaults otherwise: sticky actions with probability 0.1 (the last action repeats) and
  difficulty ramping. An episode ends when the game does, or after ``max_episode_steps`` (10,000 by
  default; MinAtar sets none, and a good Breakout agent could play forever): a truncation.
* Seeding: ``reset(seed=s)`` seeds the game's generator from Gymnasium's ``np_random``; later episodes
  continue it.
"""

from __future__ import annotations

import numpy as np

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

__all__ = ["GAMES", "MinAtarEnv", "minatar_id"]

# chronomem's name of each game -> MinAtar's module name
GAMES = {"Breakout": "breakout", "Seaquest": "seaquest", "Asterix": "asterix", "Freeway": "freeway",
         "SpaceInvaders": "space_invaders"}
MAX_EPISODE_STEPS = 10_000


def minatar_id(game: str) -> str:
    """The Gymnasium id of a MinAtar game (``minatar_id("Breakout") == "chronomem/MinAtar-Breakout-v0"``)."""
    if game not in GAMES:
        raise ValueError(f"game must be one of {', '.join(GAMES)}, got {game!r}")
    return f"chronomem/MinAtar-{game}-v0"


def _engine(game: str, sticky_action_prob: float, difficulty_ramping: bool):
    try:
        from minatar import Environment
    except ModuleNotFoundError:
        raise ModuleNotFoundError("MinAtar games need the minatar package: pip install 'chronomem[rl]'") from None
    return Environment(GAMES[game], sticky_action_prob=sticky_action_prob, difficulty_ramping=difficulty_ramping)


class MinAtarEnv(gym.Env if gym is not None else object):
    """One MinAtar game (module docstring). ``MinAtarEnv(game="Breakout", sticky_action_prob=0.1,
    difficulty_ramping=True)``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, game: str = "Breakout", sticky_action_prob: float = 0.1, difficulty_ramping: bool = True,
                 render_mode: str | None = None):
        if gym is None:
            raise ModuleNotFoundError("MinAtarEnv needs gymnasium: pip install 'chronomem[rl]'")
        minatar_id(game)  # checks the name
        if not 0.0 <= sticky_action_prob < 1.0:
            raise ValueError(f"sticky_action_prob must be in [0, 1), got {sticky_action_prob!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.game_name, self.render_mode = game, render_mode
        self.game = _engine(game, sticky_action_prob, difficulty_ramping)
        self.actions = list(self.game.minimal_action_set())
        rows, cols, channels = self.game.state_shape()
        self.observation_space = spaces.Dict({"grid": spaces.Box(0, 1, (rows, cols, channels), np.uint8)})
        self.action_space = spaces.Discrete(len(self.actions))

    def _obs(self) -> dict:
        return {"grid": self.game.state().astype(np.uint8)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or not hasattr(self, "_seeded"):  # the game's generator follows Gymnasium's
            self.game.seed(int(self.np_random.integers(2**31 - 1)))
            self._seeded = True
        self.game.reset()
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be in [0, {self.action_space.n}), got {action!r}")
        reward, terminated = self.game.act(self.actions[int(action)])
        return self._obs(), float(reward), bool(terminated), False, {}

    def render(self):
        """An RGB picture of the grid, 8 pixels a cell: each channel a colour (channel order), black empty."""
        if self.render_mode != "rgb_array":
            return None
        grid = self.game.state()
        palette = (np.stack([np.linspace(60, 255, grid.shape[-1]), np.linspace(255, 60, grid.shape[-1]),
                             np.full(grid.shape[-1], 160.0)], 1)).astype(np.uint8)
        channel = np.where(grid.any(-1), grid.argmax(-1), -1)
        image = np.where(channel[..., None] >= 0, palette[channel.clip(0)], 0).astype(np.uint8)
        return image.repeat(8, 0).repeat(8, 1)


if gym is not None and minatar_id("Breakout") not in gym.registry:
    for _game in GAMES:
        gym.register(id=minatar_id(_game), entry_point=MinAtarEnv, kwargs={"game": _game},
                     max_episode_steps=MAX_EPISODE_STEPS)
