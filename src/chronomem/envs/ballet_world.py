"""The Ballet world's rules: remember who danced which dance (paper 001 Sec. 3.1 and App. B.1; the
rules of DeepMind's pycolab Ballet).

The facts of the task (room, dancer cells, the 13 dances of Listing 1, shapes, colours, levels, time
limits), the episode ``Layout`` and its sampling, the timing of the dances and the Gymnasium ids. No
gymnasium and no torch: the environment built on these rules is ``chronomem.envs.ballet``
(``BalletEnv``, the readable reference, and the mixture) with its natively vectorised twin
``chronomem.envs.ballet_vector``; the supervised dataset is ``chronomem.tasks.ballet``.

The rules follow DeepMind's released ``pycolab_ballet`` step for step (facts, not code):

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

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


GYM_ID = "chronomem/Ballet-v0"  # gymnasium.make(GYM_ID, level=..., observation=...)
MIXTURE = "mixture"


def ballet_id(level: str = MIXTURE, observation: str = "pixels", any_dancer: bool = False) -> str:
    """The Gymnasium id of one level (or of the paper's ``"mixture"``) with ``observation`` "pixels" or
    "symbolic": ``chronomem/Ballet-2_delay16-v0``, ``chronomem/Ballet-mixture-symbolic-v0``, ... Agents
    take the level from the id (``chronomem rl train --env chronomem/Ballet-mixture-symbolic-v0``).
    ``any_dancer``: the level's control, where touching any dancer pays 1 (``-any`` after the level:
    ``chronomem/Ballet-2_delay16-any-symbolic-v0``; not the paper's, see ``BalletEnv``)."""
    if level != MIXTURE:
        parse_level(level)
    elif any_dancer:
        raise ValueError("any_dancer is a control of one level, not of the mixture")
    if observation not in ("pixels", "symbolic"):
        raise ValueError(f"observation must be 'pixels' or 'symbolic', got {observation!r}")
    control = "-any" if any_dancer else ""
    return f"chronomem/Ballet-{level}{control}{'-symbolic' if observation == 'symbolic' else ''}-v0"
