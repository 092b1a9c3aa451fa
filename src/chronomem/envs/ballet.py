"""The Ballet world: remember who danced which dance (paper 001 Sec. 3.1 and App. B.1; the rules of
DeepMind's pycolab Ballet).

This module holds the Gymnasium environment: the rendering (pixels and symbolic grid), ``BalletEnv``
(registered as ``GYM_ID``) and ``BalletMixture``. The rules it plays (the facts of the task, the
episode ``Layout`` and its sampling, the timing of the dances: DeepMind's released ``pycolab_ballet``
step for step) are ``chronomem.envs.ballet_world``, which needs no gymnasium. No training code: the
supervised dataset built from these episodes is ``chronomem.tasks.ballet``.

Observations (``BalletEnv``, a Gymnasium environment) are dicts:

* ``observation="pixels"``: ``{"image": uint8 [99, 99, 3], "instruction": int}``: the 11x11-cell
  view centred on the agent (egocentric, out-of-board cells drawn as floor), 9 pixels per cell.
  The reference returns float32 in [0, 1]; we return uint8 in [0, 255] (divide by 255 to match).
* ``observation="symbolic"``: ``{"grid": uint8 [11, 11, 36], "instruction": int}``: the same
  egocentric window, one-hot per cell over [wall, agent, 15 shapes, 19 colours] (a dancer sets one
  shape and one colour channel; floor is all zeros).
* ``instruction`` is a token of ``VOCAB = ("watch",) + DANCE_NAMES``.

Registered ids (``ballet_id(level, observation)``): ``chronomem/Ballet-<level>-v0`` (pixels) and
``chronomem/Ballet-<level>-symbolic-v0`` for every level, and ``chronomem/Ballet-mixture[-symbolic]-v0``,
``BalletMixture``: paper 001's training distribution, a level drawn uniformly per episode (App. B.1).
Every level also has its control, ``chronomem/Ballet-<level>-any[-symbolic]-v0``
(``ballet_id(level, observation, any_dancer=True)``): touching any dancer pays 1, so nothing needs
remembering (not in the paper; the control that RL settings must learn, docs/rl.md).
Agents are built on them through ``chronomem.envs.make.make_vector_env`` like any other id, so
the RL agent and the supervised dataset (``chronomem.tasks.ballet``) play the same rules. Every id
also has a natively vectorised version, ``chronomem.envs.ballet_vector.BalletVectorEnv``
(``gymnasium.make_vec(id, num_envs=B)``): the same rules as array operations over ``B`` episodes,
tested step for step against ``BalletEnv``, which stays the readable reference.

Gymnasium is the optional extra ``chronomem[rl]``: without it this module still imports and
``BalletEnv(...)`` raises.

Deviations from the reference, all deliberate: dance names follow the paper's Listing 1
(``up_down``, ``left_right``; the released code says ``up_and_down``, ``left_and_right``); uint8
pixels; the instruction is a token id rather than a string; ``step`` after the end raises instead of
silently starting a new episode.
"""

from __future__ import annotations

import numpy as np

from chronomem.checks import check_positive
from chronomem.envs.ballet_world import (
    AGENT_RGB,
    AGENT_START,
    CELL_PIXELS,
    CH_AGENT,
    CH_COLOUR,
    CH_SHAPE,
    CH_WALL,
    CLOCK_RGB,
    COLOUR_NAMES,
    COLOURS,
    DANCE_LENGTH,
    DANCE_MOVES,
    DANCER_CELLS,
    DIRECTIONS,
    FAILURE_RGB,
    GYM_ID,
    LEVELS,
    MAX_STEPS,
    MIXTURE,
    ROOM_SIZE,
    SHAPES,
    SUCCESS_RGB,
    SYMBOLIC_CHANNELS,
    VIEW,
    VOCAB,
    WALL_RGB,
    WATCH,
    Layout,
    ballet_id,
    cue_step,
    parse_level,
    sample_layout,
    shape_mask,
)

try:  # the environment needs the optional extra ``chronomem[rl]``; the supervised task does not
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

# --------------------------------------------------------------------------------------------
# The Gymnasium environment
# --------------------------------------------------------------------------------------------

_EnvBase = gym.Env if gym is not None else object


class BalletEnv(_EnvBase):
    """The Ballet environment with the Gymnasium API (see the module docstring for the rules).

    ``BalletEnv(level="2_delay16", observation="pixels" | "symbolic", max_steps=None, seed=None,
    any_dancer=False)``. ``any_dancer=True`` is the level's control (not the paper's): touching any
    dancer pays 1, not only the target, so a memoryless agent can earn every reward; all else is equal.
    Actions are ``Discrete(8)``: the directions 0-7 (0 = up, clockwise), as in the reference (there is
    no no-op; moves into a wall leave the agent in place). ``reset(seed=..., options={"layout":
    Layout(...)})`` plays a given episode instead of a sampled one. ``info`` holds the ``phase``
    ("dance" or "choice"), the ``step`` (reset = 0), the ``cue_step`` and the ``target_cell``.
    ``render()`` (``render_mode="rgb_array"``) draws the whole board, not the egocentric view, above
    a status strip one cell high (``status_strip``) that shows a viewer the clock and the cue.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, level: str = "2_delay16", observation: str = "pixels", max_steps: int | None = None,
                 seed: int | None = None, render_mode: str | None = None, any_dancer: bool = False):
        if gym is None:
            raise ModuleNotFoundError("BalletEnv needs gymnasium: pip install 'chronomem[rl]'")
        if not isinstance(any_dancer, bool):
            raise TypeError(f"any_dancer must be a bool, got {any_dancer!r}")
        self.any_dancer = any_dancer
        self.level = level
        self.num_dancers, self.delay = parse_level(level)
        if observation not in ("pixels", "symbolic"):
            raise ValueError(f"observation must be 'pixels' or 'symbolic', got {observation!r}")
        self.observation = observation
        if max_steps is None:
            max_steps = MAX_STEPS[self.delay]
        self.max_steps = check_positive(max_steps, "max_steps")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.cue_step = cue_step(self.num_dancers, self.delay)
        self.action_space = spaces.Discrete(len(DIRECTIONS))
        if observation == "pixels":
            view = spaces.Box(0, 255, (VIEW * CELL_PIXELS, VIEW * CELL_PIXELS, 3), np.uint8)
        else:
            view = spaces.Box(0, 1, (VIEW, VIEW, SYMBOLIC_CHANNELS), np.uint8)
        self.observation_space = spaces.Dict(
            {"image" if observation == "pixels" else "grid": view, "instruction": spaces.Discrete(len(VOCAB))}
        )
        self._seed = seed  # used by the first reset() that is given no seed
        self.layout: Layout | None = None
        self._done = True

    # ---- episode start ----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        super().reset(seed=seed)
        layout = (options or {}).get("layout")
        if layout is None:
            layout = sample_layout(self.np_random, self.num_dancers)
        elif not isinstance(layout, Layout) or len(layout.cells) != self.num_dancers:
            raise ValueError(
                f"options['layout'] must be a Layout with {self.num_dancers} dancers, got {layout!r}"
            )
        self.layout = layout
        self._positions = np.array([DANCER_CELLS[c] for c in layout.cells])  # [n, 2] (row, col)
        self._agent = np.array(AGENT_START)
        self._phase = "dance"
        self._instruction = WATCH
        self._queue = list(range(self.num_dancers))  # dancers dance in dancer order
        self._dancer = None  # who is dancing now
        self._moves = 0  # moves made by the current dancer
        self._countdown = 1  # steps until the next dance starts (or the cue, once all have danced)
        self._frame = -1  # pycolab's frame counter: the reset frame below is frame 0
        self._done = False
        self._build_palette()
        self._advance(None)  # the reference's first frame is an update without an action
        return self._observe(), self._info()

    def _build_palette(self):
        """Object codes on the board: 0 floor, 1 wall, 2 agent, 3 + i dancer i; their pixels and symbols."""
        layout, n = self.layout, self.num_dancers
        pixels = np.zeros((3 + n, CELL_PIXELS, CELL_PIXELS, 3), np.uint8)
        symbols = np.zeros((3 + n, SYMBOLIC_CHANNELS), np.uint8)
        pixels[1], pixels[2] = WALL_RGB, AGENT_RGB
        symbols[1, CH_WALL] = symbols[2, CH_AGENT] = 1
        for i in range(n):
            colour = np.array(COLOURS[COLOUR_NAMES[layout.colours[i]]], np.uint8)
            pixels[3 + i] = shape_mask(SHAPES[layout.shapes[i]])[..., None] * colour
            symbols[3 + i, CH_SHAPE + layout.shapes[i]] = symbols[3 + i, CH_COLOUR + layout.colours[i]] = 1
        self._pixels, self._symbols = pixels, symbols

    # ---- dynamics -----------------------------------------------------------------------------

    @staticmethod
    def _move(position: np.ndarray, direction: int) -> np.ndarray:
        """One step; blocked (no move) if the destination is a wall. Inside this room a diagonal step
        is blocked exactly when its destination is (pycolab's corner rule never triggers here)."""
        new = position + DIRECTIONS[direction]
        inside = (1 <= new[0] <= ROOM_SIZE - 2) and (1 <= new[1] <= ROOM_SIZE - 2)
        return new if inside else position

    def _advance(self, action: int | None) -> tuple[float, bool]:
        """One frame in the reference's update order: the agent (which also runs the clock while the
        dances last), then each dancer in order (a dancing one moves, the others check for contact)."""
        self._frame += 1
        if self._phase == "dance":  # actions are ignored while the dances run
            if self._countdown > 0:
                self._countdown -= 1
                if self._countdown == 0:
                    if self._queue:  # the next dancer starts (and moves in this same frame)
                        self._dancer, self._moves = self._queue.pop(0), 0
                    else:  # all have danced: the cue
                        self._phase = "choice"
                        self._instruction = 1 + self.layout.dances[self.layout.target]
        elif action is not None:
            self._agent = self._move(self._agent, action)
        reward, terminated = 0.0, False
        for i in range(self.num_dancers):
            if self._phase == "dance" and self._dancer == i:
                dance = self.layout.dances[i]
                self._positions[i] = self._move(self._positions[i], DANCE_MOVES[dance, self._moves])
                self._moves += 1
                if self._moves == DANCE_LENGTH:
                    self._dancer, self._countdown = None, self.delay
            elif (self._positions[i] == self._agent).all():  # contact ends the episode
                reward += 1.0 if i == self.layout.target or self.any_dancer else 0.0
                terminated = True
        return reward, terminated

    def step(self, action):
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, {self.action_space.n}), got {action!r}")
        reward, terminated = self._advance(int(action))
        truncated = not terminated and self._frame >= self.max_steps  # the reference's frame >= max_steps
        self._done = terminated or truncated
        return self._observe(), reward, terminated, truncated, self._info()

    # ---- observations -------------------------------------------------------------------------

    def board(self) -> np.ndarray:
        """``[11, 11]`` object codes of the whole board (dancers drawn over the agent, as in pycolab)."""
        board = np.ones((ROOM_SIZE, ROOM_SIZE), np.int64)
        board[1:-1, 1:-1] = 0
        board[tuple(self._agent)] = 2
        for i, (r, c) in enumerate(self._positions):
            board[r, c] = 3 + i
        return board

    def _egocentric(self) -> np.ndarray:
        """The 11x11 window centred on the agent; cells beyond the board are floor."""
        half = VIEW // 2
        padded = np.pad(self.board(), half)
        r, c = self._agent
        return padded[r : r + VIEW, c : c + VIEW]

    @staticmethod
    def _paint(codes: np.ndarray, pixels: np.ndarray) -> np.ndarray:
        tiles = pixels[codes]  # [rows, cols, 9, 9, 3]
        rows, cols = codes.shape
        return tiles.transpose(0, 2, 1, 3, 4).reshape(rows * CELL_PIXELS, cols * CELL_PIXELS, 3)

    def _observe(self) -> dict:
        codes = self._egocentric()
        if self.observation == "pixels":
            return {"image": self._paint(codes, self._pixels), "instruction": self._instruction}
        return {"grid": self._symbols[codes], "instruction": self._instruction}

    def _info(self) -> dict:
        return {"phase": self._phase, "step": self._frame, "cue_step": self.cue_step,
                "target_cell": self.layout.label}

    def render(self):
        """The whole board (99x99 pixels) above ``status_strip`` (9 pixels high): ``[108, 99, 3]`` uint8."""
        if self.render_mode != "rgb_array" or self.layout is None:
            return None
        return np.concatenate([self._paint(self.board(), self._pixels), self.status_strip()], axis=0)

    def status_strip(self) -> np.ndarray:
        """``[9, 99, 3]``: what the instruction means, drawn for a person watching a rendered episode.
        Until the cue a grey bar fills up to it (its length is the share of the dances gone by); from
        the cue on, the first cell shows the target dancer (the one whose dance the cue names) on black,
        and once the episode is over on green (it ended on the target) or red (another dancer, or the
        time limit)."""
        strip = np.zeros((CELL_PIXELS, ROOM_SIZE * CELL_PIXELS, 3), np.uint8)
        if self._phase == "dance":
            strip[:, : round(strip.shape[1] * self._frame / self.cue_step)] = CLOCK_RGB
            return strip
        if self._done:  # contact ends an episode, so it ended on the target iff the agent stands there
            on_target = (self._positions[self.layout.target] == self._agent).all()
            strip[:] = SUCCESS_RGB if on_target else FAILURE_RGB
        target = self._pixels[3 + self.layout.target]
        drawn = target.any(-1)  # the sprite's own pixels, over the strip's background
        strip[:, :CELL_PIXELS][drawn] = target[drawn]
        return strip


class BalletMixture(_EnvBase):
    """Paper 001's training distribution (App. B.1: "levels uniformly sampled to have 16 or 48 steps of
    delay between dances, and 2, 4, or 8 dances"): every episode is one ``BalletEnv`` episode of a
    level drawn uniformly from ``levels``, with that level's rules and time limit (the same
    ``BalletEnv`` code, one instance per level). Observation and action spaces do not depend on the
    level (the 11x11 view, 8 directions), so one agent plays them all. ``info["level"]`` names the
    episode's level; ``render()`` draws the current episode's board.
    """

    metadata = BalletEnv.metadata

    def __init__(self, levels: tuple[str, ...] = LEVELS, observation: str = "pixels", seed: int | None = None,
                 render_mode: str | None = None):
        if gym is None:
            raise ModuleNotFoundError("BalletMixture needs gymnasium: pip install 'chronomem[rl]'")
        if isinstance(levels, str) or not levels:
            raise ValueError(f"levels must be a non-empty sequence of levels ({', '.join(LEVELS)}), got {levels!r}")
        self.levels = tuple(levels)
        self.envs = {level: BalletEnv(level, observation, render_mode=render_mode) for level in self.levels}
        first = self.envs[self.levels[0]]
        self.observation_space, self.action_space = first.observation_space, first.action_space
        self.render_mode = render_mode
        self._seed = seed
        self.env: BalletEnv | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None and self._seed is not None:
            seed, self._seed = self._seed, None
        super().reset(seed=seed)
        self.env = self.envs[self.levels[int(self.np_random.integers(len(self.levels)))]]
        layout = (options or {}).get("layout") or sample_layout(self.np_random, self.env.num_dancers)
        obs, info = self.env.reset(options={"layout": layout})
        return obs, {**info, "level": self.env.level}

    def step(self, action):
        if self.env is None:
            raise RuntimeError("the episode never started: call reset() first")
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "level": self.env.level}

    def render(self):
        return None if self.env is None else self.env.render()


# Every id also has the natively vectorised env (``gymnasium.make_vec(id, num_envs=B)``), named by a
# string: ballet_vector imports this module, so importing it here would be circular.
VECTOR_ENTRY_POINT = "chronomem.envs.ballet_vector:BalletVectorEnv"
if gym is not None and GYM_ID not in gym.registry:
    gym.register(id=GYM_ID, entry_point=BalletEnv, vector_entry_point=VECTOR_ENTRY_POINT)
    for _observation in ("pixels", "symbolic"):
        for _level in LEVELS:
            for _any in (False, True):
                gym.register(id=ballet_id(_level, _observation, _any), entry_point=BalletEnv,
                             vector_entry_point=VECTOR_ENTRY_POINT,
                             kwargs={"level": _level, "observation": _observation, "any_dancer": _any})
        # the levels are spelled out so that both entry points read them: BalletMixture(levels=...) and
        # BalletVectorEnv(levels=...), which tells the mixture from one level by them
        gym.register(id=ballet_id(MIXTURE, _observation), entry_point=BalletMixture,
                     vector_entry_point=VECTOR_ENTRY_POINT, kwargs={"levels": LEVELS, "observation": _observation})
