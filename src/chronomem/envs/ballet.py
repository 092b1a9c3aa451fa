"""The Ballet world: remember who danced which dance (paper 001 Sec. 3.1 and App. B.1; the rules of
DeepMind's pycolab Ballet).

This module holds the environment and everything it is made of: the facts of the task (room,
dancer cells, the 13 dances of Listing 1, shapes, colours, levels, time limits), the episode
``Layout`` and its sampling, the timing of the dances, the rendering (pixels and symbolic grid) and
``BalletEnv``, a Gymnasium environment registered as ``GYM_ID``. No training code: the supervised
dataset built from these episodes is ``chronomem.tasks.ballet``.

The environment follows DeepMind's released ``pycolab_ballet`` step for step (facts, not code):

* An 11x11 board: a 9x9 room inside a one-tile wall. The agent starts at the centre (5, 5); the
  ``n`` dancers stand on a random subset of the 8 cells around it, ``DANCER_CELLS`` (each dancer moves
  inside its own 3x3 block, so dancers never meet each other, the walls or the waiting agent).
* Each dancer has a distinct shape (of 15) and colour (of 19) and a distinct dance (of the 13 of
  Listing 1: 16 moves each, directions 0-7 clockwise from 0 = up, every dance returns to its start).
* Dancers dance one at a time, in dancer order, with ``delay`` idle steps between dances. The
  agent's actions are ignored until the cue; the instruction is ``"watch"`` until then and the
  target's dance name from then on. Stepping onto a dancer ends the episode: reward 1 if it is the
  target, 0 otherwise. Levels ``'{n}_delay{d}'`` with n in {2, 4, 8} and d in {16, 48}; the time
  limit is 320 steps for delay 16 and 1024 for delay 48.

Timing (the reference's pycolab update order, which this module reproduces): the first frame is
produced by ``reset`` and already contains the first move of dancer 0. Calling the reset frame step 0,
dancer ``i`` makes its moves 1..16 at steps ``i * (delay + 15) + 0..15`` and the cue (the dance
name) appears in the observation of step ``n * (delay + 15)``; the action sent with that step is
still ignored, so the agent first moves at step ``n * (delay + 15) + 1``. The time limit is the
reference's: its frame counter (pycolab's ``the_plot.frame``) is 0 on the reset frame and the episode
ends once ``frame >= max_steps``, so an episode is truncated after ``max_steps`` actions (``step ==
max_steps``), 320 at delay 16 and 1024 at delay 48.

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
Agents are built on them through ``chronomem.envs.make.make_vector_env`` like any other id, so
the RL agent and the supervised dataset (``chronomem.tasks.ballet``) use this module's rules. Every id
also has a natively vectorised version, ``chronomem.envs.ballet_vector.BalletVectorEnv``
(``gymnasium.make_vec(id, num_envs=B)``): the same rules as array operations over ``B`` episodes,
tested step for step against ``BalletEnv``, which stays the readable reference.

Gymnasium is the optional extra ``chronomem[rl]``: without it this module still imports (the
supervised dataset needs only the facts and layouts) and ``BalletEnv(...)`` raises.

Deviations from the reference, all deliberate: dance names follow the paper's Listing 1
(``up_down``, ``left_right``; the released code says ``up_and_down``, ``left_and_right``); uint8
pixels; the instruction is a token id rather than a string; ``step`` after the end raises instead of
silently starting a new episode.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from chronomem.checks import check_positive

try:  # the environment needs the optional extra ``chronomem[rl]``; the supervised task does not
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

# --------------------------------------------------------------------------------------------
# Facts of the task (App. B.1, Listing 1; the reference environment)
# --------------------------------------------------------------------------------------------

ROOM_SIZE = 11  # a 9x9 room plus a one-tile wall on every side (App. B.1)
AGENT_START = (5, 5)  # the centre of the room
DANCER_CELLS = ((2, 2), (2, 5), (2, 8), (5, 2), (5, 8), (8, 2), (8, 5), (8, 8))  # 8 possible places
CELL_PIXELS = 9  # "upsampled at a resolution of 9 pixels per tile to form a 99x99 image"
VIEW = ROOM_SIZE  # the egocentric window is 11x11 cells, centred on the agent
DANCE_LENGTH = 16  # "All dances are 16 steps long"

# Direction d moves by DIRECTIONS[d] = (d_row, d_col); 0 = up, then clockwise (Listing 1 caption).
DIRECTIONS = np.array([(-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1)])

# Listing 1 of paper 001.
DANCES = {
    "circle_cw": [0, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6, 0, 2],
    "circle_ccw": [0, 6, 4, 4, 2, 2, 0, 0, 6, 6, 4, 4, 2, 2, 0, 6],
    "up_down": [0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0],
    "left_right": [2, 6, 6, 2, 2, 6, 6, 2, 2, 6, 6, 2, 2, 6, 6, 2],
    "diagonal_uldr": [7, 3, 3, 7, 7, 3, 3, 7, 7, 3, 3, 7, 7, 3, 3, 7],
    "diagonal_urdl": [1, 5, 5, 1, 1, 5, 5, 1, 1, 5, 5, 1, 1, 5, 5, 1],
    "plus_cw": [0, 4, 2, 6, 4, 0, 6, 2, 0, 4, 2, 6, 4, 0, 6, 2],
    "plus_ccw": [0, 4, 6, 2, 4, 0, 2, 6, 0, 4, 6, 2, 4, 0, 2, 6],
    "times_cw": [1, 5, 3, 7, 5, 1, 7, 3, 1, 5, 3, 7, 5, 1, 7, 3],
    "times_ccw": [7, 3, 5, 1, 3, 7, 1, 5, 7, 3, 5, 1, 3, 7, 1, 5],
    "zee": [1, 6, 6, 2, 2, 5, 1, 5, 5, 2, 2, 6, 6, 1, 5, 1],
    "chevron_down": [7, 4, 3, 1, 0, 5, 1, 5, 1, 4, 5, 7, 0, 3, 7, 3],
    "chevron_up": [3, 0, 7, 5, 4, 1, 5, 1, 5, 0, 1, 3, 4, 7, 3, 7],
}
DANCE_NAMES = tuple(DANCES)
DANCE_MOVES = np.array([DANCES[name] for name in DANCE_NAMES])  # [13, 16] directions
# DANCE_OFFSETS[k, m] = a dancer's displacement from its cell after m moves of dance k: [13, 17, 2].
DANCE_OFFSETS = np.concatenate(
    [np.zeros((len(DANCES), 1, 2), dtype=np.int64), np.cumsum(DIRECTIONS[DANCE_MOVES], axis=1)], axis=1
)

# Instruction tokens: "watch" until the cue, then the target's dance name.
VOCAB = ("watch", *DANCE_NAMES)
WATCH = 0

# "selected from 15 shapes and 19 colors" (App. B.1); names and RGB values as in the reference.
SHAPES = (
    "triangle", "empty_square", "plus", "inverse_plus", "ex", "inverse_ex", "circle", "empty_circle",
    "tee", "upside_down_tee", "h", "u", "upside_down_u", "vertical_stripes", "horizontal_stripes",
)
COLOURS = {
    "red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "purple": (128, 0, 128),
    "orange": (255, 165, 0), "yellow": (255, 255, 0), "brown": (128, 64, 0), "pink": (255, 64, 255),
    "cyan": (0, 255, 255), "dark_green": (0, 100, 0), "dark_red": (100, 0, 0), "dark_blue": (0, 0, 100),
    "olive": (100, 100, 0), "teal": (0, 100, 100), "lavender": (215, 200, 255), "peach": (255, 210, 170),
    "rose": (255, 205, 230), "light_green": (200, 255, 200), "light_yellow": (255, 255, 200),
}
COLOUR_NAMES = tuple(COLOURS)
WALL_RGB, AGENT_RGB = (40, 40, 40), (255, 255, 255)  # dark grey wall, white agent
# The status strip under a rendered board (for a viewer only; never in an observation).
CLOCK_RGB, SUCCESS_RGB, FAILURE_RGB = (90, 90, 90), (0, 150, 0), (150, 0, 0)

# Symbolic channels per cell: wall, agent, 15 shapes, 19 colours.
CH_WALL, CH_AGENT, CH_SHAPE, CH_COLOUR = 0, 1, 2, 2 + len(SHAPES)
SYMBOLIC_CHANNELS = CH_COLOUR + len(COLOURS)  # 36

NUM_DANCERS = (2, 4, 8)
DELAYS = (16, 48)
LEVELS = tuple(f"{n}_delay{d}" for d in DELAYS for n in NUM_DANCERS)
MAX_STEPS = {16: 320, 48: 1024}  # the reference's time limits


def parse_level(level: str) -> tuple[int, int]:
    """``'{n}_delay{d}'`` -> ``(n, d)``; ValueError listing the valid levels otherwise."""
    match = re.fullmatch(r"(\d+)_delay(\d+)", level) if isinstance(level, str) else None
    if match is None or level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return int(match.group(1)), int(match.group(2))


def cue_step(num_dancers: int, delay: int) -> int:
    """The step (reset = step 0) whose observation first carries the dance name: n * (delay + 15)."""
    return num_dancers * (delay + DANCE_LENGTH - 1)


def shape_mask(shape: str) -> np.ndarray:
    """The 9x9 boolean pixel mask of a dancer shape (drawn in the dancer's colour)."""
    i, j = np.mgrid[0:CELL_PIXELS, 0:CELL_PIXELS]
    h, last = CELL_PIXELS // 2, CELL_PIXELS - 1
    bar_v, bar_h = abs(j - h) <= 1, abs(i - h) <= 1  # 3-pixel-wide bars through the centre
    diag = (abs(i - j) <= 1) | (abs(i + j - last) <= 1)
    r2 = (i - h) ** 2 + (j - h) ** 2
    sides = (j < 3) | (j > last - 3)
    masks = {
        "triangle": i >= 2 * abs(j - h),  # apex at the top centre
        "empty_square": np.minimum(np.minimum(i, j), np.minimum(last - i, last - j)) < 2,
        "plus": bar_v | bar_h,
        "inverse_plus": ~(bar_v | bar_h),
        "ex": diag,
        "inverse_ex": ~diag,
        "circle": r2 <= h * h,
        "empty_circle": abs(r2 - h * h) < 6,
        "tee": bar_v | (i < 3),
        "upside_down_tee": bar_v | (i > last - 3),
        "h": sides | bar_h,
        "u": sides | (i > last - 3),
        "upside_down_u": sides | (i < 3),
        "vertical_stripes": j % 2 == 0,
        "horizontal_stripes": i % 2 == 0,
    }
    if shape not in masks:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    return masks[shape]


# --------------------------------------------------------------------------------------------
# Episodes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """One episode: dancer ``i`` stands on ``DANCER_CELLS[cells[i]]``, dances ``DANCE_NAMES[dances[i]]``
    (in dancer order), looks like ``SHAPES[shapes[i]]`` in ``COLOUR_NAMES[colours[i]]``; dancer
    ``target`` is the one the agent must reach."""

    cells: tuple[int, ...]
    dances: tuple[int, ...]
    shapes: tuple[int, ...]
    colours: tuple[int, ...]
    target: int

    def __post_init__(self):
        n = len(self.cells)
        for name, size in (("cells", 8), ("dances", 13), ("shapes", 15), ("colours", 19)):
            values = getattr(self, name)
            if len(values) != n or len(set(values)) != n or not all(0 <= v < size for v in values):
                raise ValueError(f"layout.{name} must be {n} distinct indices in [0, {size}), got {values}")
        if not 0 <= self.target < n:
            raise ValueError(f"layout.target must be in [0, {n}), got {self.target}")

    @property
    def label(self) -> int:
        """The target dancer's cell: an index into ``DANCER_CELLS``."""
        return self.cells[self.target]


def sample_layout(rng: np.random.Generator, num_dancers: int) -> Layout:
    """The reference's sampling: a uniform target, shuffled cells, dances, colours and shapes, each
    dancer taking the next of each (so all are distinct within an episode)."""
    target = int(rng.integers(num_dancers))

    def pick(k):
        return tuple(int(v) for v in rng.permutation(k)[:num_dancers])

    return Layout(pick(len(DANCER_CELLS)), pick(len(DANCES)), pick(len(SHAPES)), pick(len(COLOURS)), target)


def moves_done(num_dancers: int, delay: int, length: int) -> np.ndarray:
    """``[length, n]``: how many moves dancer ``i`` has made in the observation of step ``t``.

    Dancer ``i`` starts at step ``i * (delay + 15)`` and makes one move per step (its first move is
    already visible in that step's observation), so after step ``t`` it has made
    ``clip(t - i * (delay + 15) + 1, 0, 16)`` moves."""
    t = np.arange(length)[:, None]
    start = np.arange(num_dancers)[None, :] * (delay + DANCE_LENGTH - 1)
    return np.clip(t - start + 1, 0, DANCE_LENGTH)


# --------------------------------------------------------------------------------------------
# The Gymnasium environment
# --------------------------------------------------------------------------------------------

_EnvBase = gym.Env if gym is not None else object


class BalletEnv(_EnvBase):
    """The Ballet environment with the Gymnasium API (see the module docstring for the rules).

    ``BalletEnv(level="2_delay16", observation="pixels" | "symbolic", max_steps=None, seed=None)``.
    Actions are ``Discrete(8)``: the directions 0-7 (0 = up, clockwise), as in the reference (there is
    no no-op; moves into a wall leave the agent in place). ``reset(seed=..., options={"layout":
    Layout(...)})`` plays a given episode instead of a sampled one. ``info`` holds the ``phase``
    ("dance" or "choice"), the ``step`` (reset = 0), the ``cue_step`` and the ``target_cell``.
    ``render()`` (``render_mode="rgb_array"``) draws the whole board, not the egocentric view, above
    a status strip one cell high (``status_strip``) that shows a viewer the clock and the cue.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, level: str = "2_delay16", observation: str = "pixels", max_steps: int | None = None,
                 seed: int | None = None, render_mode: str | None = None):
        if gym is None:
            raise ModuleNotFoundError("BalletEnv needs gymnasium: pip install 'chronomem[rl]'")
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
                reward += 1.0 if i == self.layout.target else 0.0
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


GYM_ID = "chronomem/Ballet-v0"  # gymnasium.make(GYM_ID, level=..., observation=...)
MIXTURE = "mixture"


def ballet_id(level: str = MIXTURE, observation: str = "pixels") -> str:
    """The Gymnasium id of one level (or of the paper's ``"mixture"``) with ``observation`` "pixels" or
    "symbolic": ``chronomem/Ballet-2_delay16-v0``, ``chronomem/Ballet-mixture-symbolic-v0``, ... Agents
    take the level from the id (``chronomem rl train --env chronomem/Ballet-mixture-symbolic-v0``)."""
    if level != MIXTURE:
        parse_level(level)
    if observation not in ("pixels", "symbolic"):
        raise ValueError(f"observation must be 'pixels' or 'symbolic', got {observation!r}")
    return f"chronomem/Ballet-{level}{'-symbolic' if observation == 'symbolic' else ''}-v0"


# Every id also has the natively vectorised env (``gymnasium.make_vec(id, num_envs=B)``), named by a
# string: ballet_vector imports this module, so importing it here would be circular.
VECTOR_ENTRY_POINT = "chronomem.envs.ballet_vector:BalletVectorEnv"
if gym is not None and GYM_ID not in gym.registry:
    gym.register(id=GYM_ID, entry_point=BalletEnv, vector_entry_point=VECTOR_ENTRY_POINT)
    for _observation in ("pixels", "symbolic"):
        for _level in LEVELS:
            gym.register(id=ballet_id(_level, _observation), entry_point=BalletEnv,
                         vector_entry_point=VECTOR_ENTRY_POINT, kwargs={"level": _level, "observation": _observation})
        # the levels are spelled out so that both entry points read them: BalletMixture(levels=...) and
        # BalletVectorEnv(levels=...), which tells the mixture from one level by them
        gym.register(id=ballet_id(MIXTURE, _observation), entry_point=BalletMixture,
                     vector_entry_point=VECTOR_ENTRY_POINT, kwargs={"levels": LEVELS, "observation": _observation})
