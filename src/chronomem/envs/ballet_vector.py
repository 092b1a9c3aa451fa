"""Ballet as a natively vectorised Gymnasium environment: ``B`` episodes stepped by array operations.

``BalletVectorEnv`` (a ``gymnasium.vector.VectorEnv``) plays ``num_envs`` Ballet episodes at once
with the rules of ``BalletEnv`` (``chronomem.envs.ballet``: paper 001 App. B.1, DeepMind's pycolab
Ballet), which stays the readable reference. It returns what ``SyncVectorEnv(autoreset_mode=SAME_STEP)``
over ``BalletEnv`` (one level) or ``BalletMixture`` (``levels=``, the paper's mixture) returns, step
for step, under the same seeds and actions: observations, rewards, terminations, truncations and
infos, ``final_obs`` and ``final_info`` included (``tests/test_envs_vector.py``). A step is a fixed
handful of numpy operations over all rows, whatever ``B``; only the rows that start a new episode are
visited one by one, to draw their layouts (``benchmarks/ballet_env_speed.py`` times both).

Get it by id (``ballet_id(level, observation)``, every level and the mixture)::

    gymnasium.make_vec(ballet_id("mixture", "symbolic"), num_envs=256, vectorization_mode="vector_entry_point")
    chronomem.envs.make.make_vector_env(ballet_id("mixture", "symbolic"), 256)   # native when an id has one

How the array formulas follow from ``BalletEnv`` (ballet.py's docstring, "Timing"; ``t`` is
``BalletEnv``'s frame counter, 0 on the reset frame and ``info["step"]``):

* **The dances are a function of ``t``.** Dancer ``i`` starts at ``t = i * (delay + 15)`` and makes one
  move per frame, so at frame ``t`` it has made ``clip(t - i * (delay + 15) + 1, 0, 16)`` moves
  (``moves_done``) and stands at its cell plus ``DANCE_OFFSETS[dance_i, moves]``. No dancer is ever
  blocked (each moves inside its own 3x3 block, inside the room), so no state besides ``t`` is needed.
* **The cue.** ``BalletEnv`` switches to the choice phase in the frame whose countdown reaches zero
  after the last dance: ``t == cue_step``. From then on the phase is "choice" and the instruction is
  ``1 + dance of the target``; before it, "dance" and ``WATCH``.
* **The agent.** ``BalletEnv._advance`` applies an action only when the phase was already "choice" at
  the frame's start, i.e. at ``t > cue_step`` (the cue step's own action is ignored). A move whose
  destination leaves rows and columns 1..9 is blocked whole (no slide), as in ``BalletEnv._move``.
* **Contact.** From the cue on every dancer is back on its cell (every dance returns to its start),
  and before ``t > cue_step`` the agent stands at the centre, which no dancer's block reaches; so the
  episode terminates exactly when ``t > cue_step`` and the agent stands on a dancer's cell, with
  reward 1 if that cell is the target's (dancers' cells are distinct: at most one contact).
* **Time limits.** Truncated when not terminated and ``t >= max_steps`` (pycolab's ``frame >=
  max_steps``). ``max_episode_steps`` adds what ``gymnasium.make(id, max_episode_steps=...)`` wraps
  around a single env, Gymnasium's ``TimeLimit``: truncated once ``t >= max_episode_steps``, terminated
  or not.
* **Observations** are a function of ``(t, agent, layout)``. The board is drawn (agent first, dancers
  over it, as ``BalletEnv.board``) into a floor-padded ``[B, 21, 21]`` canvas; the 11x11 window of the
  canvas starting at the agent's board position is the egocentric view (``BalletEnv._egocentric``).
  A dancer's cell holds a look code ``3 + shape * 19 + colour`` rather than ``BalletEnv``'s per-episode
  ``3 + i``, so one table (``LOOK_SYMBOLS``, ``LOOK_PIXELS``) maps every env's cells to symbols or
  pixels at once.

Randomness: one ``np.random.Generator`` per env (``gymnasium.utils.seeding.np_random``, as
``gymnasium.Env.reset`` makes it) drawn from in ``BalletEnv.reset``'s order (``sample_layout``) or
``BalletMixture.reset``'s (the level's index, then ``sample_layout``), so every env samples the layouts
its single counterpart would. ``reset(seed=s)`` seeds env ``i`` with ``s + i``, ``reset(seed=[...])``
one seed per env, ``None`` continues each generator (a fresh, unseeded one at the first reset), as
``SyncVectorEnv`` does.

The checks and the info layout every native env shares (``seed_list``, ``check_actions``,
``check_reset_mask``, ``RowGenerators``, ``final_entries``, ``batched_info``) are ``SyncVectorEnv``'s
rules written once, in ``chronomem.envs.vector``; ``chronomem.envs.recall.CueRecallVector`` uses them too.

Autoreset on the same step (``metadata["autoreset_mode"] = AutoresetMode.SAME_STEP``, what chronomem's
PPO expects; docs/rl.md, "Autoreset and truncation"): the step that ends an episode returns the next
episode's first observation and info; the ended episode's last ones are in ``info["final_obs"]`` (an
object array of ``B`` single observations, None where no episode ended; mask ``info["_final_obs"]``)
and ``info["final_info"]`` (the single infos batched, with their masks). ``render()`` therefore shows
the new episode after an end, as ``SyncVectorEnv.render()`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    DANCE_OFFSETS,
    DANCER_CELLS,
    DIRECTIONS,
    LEVELS,
    MAX_STEPS,
    ROOM_SIZE,
    SHAPES,
    SYMBOLIC_CHANNELS,
    VIEW,
    VOCAB,
    WALL_RGB,
    WATCH,
    Layout,
    cue_step,
    parse_level,
    sample_layout,
    shape_mask,
)
from chronomem.envs.vector import (
    RowGenerators,
    batched_info,
    check_actions,
    check_max_episode_steps,
    check_num_envs,
    check_reset_mask,
    final_entries,
    seed_list,
)

try:  # the environment needs the optional extra ``chronomem[rl]``; this module imports without it
    import gymnasium as gym
    from gymnasium import spaces
    from gymnasium.vector.utils import batch_space
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

# --------------------------------------------------------------------------------------------
# Look codes: what a board cell holds, the same in every env
# --------------------------------------------------------------------------------------------

FLOOR, WALL, AGENT = 0, 1, 2
NUM_LOOKS = 3 + len(SHAPES) * len(COLOURS)  # floor, wall, agent, then every (shape, colour) of a dancer
MAX_DANCERS = len(DANCER_CELLS)  # the rows of the per-dancer arrays (fewer dancers leave rows unused)
PAD = VIEW // 2  # the canvas: the board inside PAD floor cells, so that every egocentric window fits
CANVAS = ROOM_SIZE + 2 * PAD
OFF_BOARD = -PAD  # an unused dancer row "stands" here: canvas cell (0, 0), in no window and no render


def look(shape: int, colour: int) -> int:
    """The look code of a dancer with ``SHAPES[shape]`` in ``COLOUR_NAMES[colour]``."""
    return 3 + shape * len(COLOURS) + colour


def _look_tables() -> tuple[np.ndarray, np.ndarray]:
    """``LOOK_SYMBOLS [NUM_LOOKS, 36]`` and ``LOOK_PIXELS [NUM_LOOKS, 9, 9, 3]``: ``BalletEnv._build_palette``
    for every dancer look at once (a dancer sets one shape and one colour channel; its sprite is its
    shape's mask in its colour)."""
    symbols = np.zeros((NUM_LOOKS, SYMBOLIC_CHANNELS), np.uint8)
    pixels = np.zeros((NUM_LOOKS, CELL_PIXELS, CELL_PIXELS, 3), np.uint8)
    symbols[WALL, CH_WALL] = symbols[AGENT, CH_AGENT] = 1
    pixels[WALL], pixels[AGENT] = WALL_RGB, AGENT_RGB
    for s, shape in enumerate(SHAPES):
        mask = shape_mask(shape)[..., None]
        for c, name in enumerate(COLOUR_NAMES):
            code = look(s, c)
            symbols[code, CH_SHAPE + s] = symbols[code, CH_COLOUR + c] = 1
            pixels[code] = mask * np.array(COLOURS[name], np.uint8)
    return symbols, pixels


LOOK_SYMBOLS, LOOK_PIXELS = _look_tables()

# The empty canvas: floor everywhere, the wall ring of the board at PAD..PAD + 10.
_EMPTY = np.zeros((CANVAS, CANVAS), np.int16)
_EMPTY[PAD : PAD + ROOM_SIZE, PAD : PAD + ROOM_SIZE] = WALL
_EMPTY[PAD + 1 : PAD + ROOM_SIZE - 1, PAD + 1 : PAD + ROOM_SIZE - 1] = FLOOR
_PHASES = np.array(["dance", "choice"], dtype=object)  # info["phase"], indexed by "the cue has come"


# LOOK_PIXELS one pixel row at a time: row ``9 * code + r`` is pixel row r of look ``code`` (27 bytes).
_LOOK_ROWS = LOOK_PIXELS.reshape(NUM_LOOKS * CELL_PIXELS, CELL_PIXELS * 3)
_PIXEL_ROWS = np.arange(CELL_PIXELS)[:, None]


def _paint(codes: np.ndarray) -> np.ndarray:
    """``[..., rows, cols]`` look codes -> ``[..., rows * 9, cols * 9, 3]`` uint8 (``BalletEnv._paint``).

    One gather of pixel rows whose index already has the image's layout ``[..., rows, 9, cols]``, so
    the result needs no transpose (3-4x faster than gathering whole tiles and transposing them)."""
    *lead, rows, cols = codes.shape
    index = codes.astype(np.intp)[..., :, None, :] * CELL_PIXELS + _PIXEL_ROWS  # [..., rows, 9, cols]
    return np.take(_LOOK_ROWS, index, axis=0).reshape(*lead, rows * CELL_PIXELS, cols * CELL_PIXELS, 3)


_VectorBase = gym.vector.VectorEnv if gym is not None else object


class BalletVectorEnv(_VectorBase):
    """``num_envs`` Ballet environments stepped together (module docstring: the rules as array formulas).

    ``BalletVectorEnv(num_envs, level="2_delay16" | levels=(...), observation="pixels" | "symbolic",
    max_steps=None, render_mode=None, max_episode_steps=None, any_dancer=False)``:

    * ``level``: every env plays this level (``BalletEnv``); ``levels``: the mixture (``BalletMixture``),
      each env drawing a level per episode uniformly from ``levels`` with its own generator; give one or
      the other (neither: ``"2_delay16"``, ``BalletEnv``'s default). The registered ids pass them.
    * ``max_steps``: the time limit of a single level (default: the level's, 320 or 1024); the mixture
      keeps each level's own, as ``BalletMixture`` does. ``max_episode_steps``: Gymnasium's ``TimeLimit``
      on top, as ``gymnasium.make(id, max_episode_steps=...)`` adds to a single env.
    * ``any_dancer``: the control, as ``BalletEnv(any_dancer=True)``: touching any dancer pays 1.
    * Spaces: ``single_observation_space`` / ``single_action_space`` are ``BalletEnv``'s; the batched
      ones are ``batch_space`` of them (a ``MultiDiscrete`` of 8 directions per env).
    * ``reset(seed=..., options={"layouts": [Layout | None, ...]})`` plays given episodes (one entry per
      env, None to sample); ``options={"layout": Layout}`` gives every env the same one, as
      ``SyncVectorEnv`` passes its options to every env; ``options["reset_mask"]`` resets only those
      rows, as ``SyncVectorEnv`` does. ``layouts`` holds each env's current ``Layout``.
    * ``render()`` (``render_mode="rgb_array"``): a tuple of every env's frame, ``render_env(i)``: env
      ``i``'s; both equal ``BalletEnv.render()`` (the whole board above its status strip).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8,
                "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP if gym is not None else None}

    def __init__(self, num_envs: int, level: str | None = None, levels: Sequence[str] | None = None,
                 observation: str = "pixels", max_steps: int | None = None, render_mode: str | None = None,
                 max_episode_steps: int | None = None, any_dancer: bool = False):
        if gym is None:
            raise ModuleNotFoundError("BalletVectorEnv needs gymnasium: pip install 'chronomem[rl]'")
        if not isinstance(any_dancer, bool):
            raise TypeError(f"any_dancer must be a bool, got {any_dancer!r}")
        self.any_dancer = any_dancer
        self.num_envs = check_num_envs(num_envs)
        if level is not None and levels is not None:
            raise ValueError(f"give level (one level) or levels (the mixture), not both: got level={level!r}, "
                             f"levels={levels!r}")
        self.mixture = levels is not None
        if self.mixture:
            if isinstance(levels, str) or not isinstance(levels, Sequence) or not levels:
                raise ValueError(f"levels must be a non-empty sequence of levels ({', '.join(LEVELS)}), "
                                 f"got {levels!r}")
            self.levels = tuple(levels)
            if max_steps is not None:
                raise ValueError(f"max_steps sets one level's time limit; the mixture keeps each level's own (as "
                                 f"BalletMixture), got max_steps={max_steps!r}; use max_episode_steps for a "
                                 f"shorter limit")
        else:
            self.levels = ("2_delay16" if level is None else level,)
        parsed = [parse_level(name) for name in self.levels]  # ValueError listing the levels
        if observation not in ("pixels", "symbolic"):
            raise ValueError(f"observation must be 'pixels' or 'symbolic', got {observation!r}")
        self.observation = observation
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.max_episode_steps = check_max_episode_steps(max_episode_steps)
        # Per level: dancers, delay, cue step, time limit (indexed by a row's level).
        self._level_dancers = np.array([n for n, _ in parsed])
        self._level_delay = np.array([d for _, d in parsed])
        self._level_cue = np.array([cue_step(n, d) for n, d in parsed])
        if max_steps is None:
            self._level_limit = np.array([MAX_STEPS[d] for _, d in parsed])
        else:
            self._level_limit = np.array([check_positive(max_steps, "max_steps")])
        self._level_names = np.array(self.levels, dtype=object)
        self.level = None if self.mixture else self.levels[0]
        self.max_steps = None if self.mixture else int(self._level_limit[0])

        self.single_action_space = spaces.Discrete(len(DIRECTIONS))
        if observation == "pixels":
            view = spaces.Box(0, 255, (VIEW * CELL_PIXELS, VIEW * CELL_PIXELS, 3), np.uint8)
        else:
            view = spaces.Box(0, 1, (VIEW, VIEW, SYMBOLIC_CHANNELS), np.uint8)
        self._view_key = "image" if observation == "pixels" else "grid"
        self.single_observation_space = spaces.Dict({self._view_key: view, "instruction": spaces.Discrete(len(VOCAB))})
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

        self._rngs = RowGenerators(self.num_envs)
        self.layouts: list[Layout | None] = [None] * self.num_envs
        self._t = None  # the frame counter of every row; None until the first reset
        B, N = self.num_envs, MAX_DANCERS
        self._level = np.zeros(B, np.int64)  # index into self.levels
        self._cue = np.zeros(B, np.int64)
        self._limit = np.zeros(B, np.int64)
        self._agent = np.zeros((B, 2), np.int64)
        self._home = np.full((B, N, 2), OFF_BOARD, np.int64)  # each dancer's cell (unused rows off board)
        self._dance = np.zeros((B, N), np.int64)
        self._start = np.zeros((B, N), np.int64)  # the frame of each dancer's first move
        self._looks = np.zeros((B, N), np.int16)  # look codes (FLOOR for unused rows)
        self._target = np.zeros(B, np.int64)
        self._target_home = np.zeros((B, 2), np.int64)
        self._target_cell = np.zeros(B, np.int64)  # info["target_cell"]: an index into DANCER_CELLS
        self._cue_token = np.zeros(B, np.int64)  # the instruction from the cue on

    # ---- randomness ---------------------------------------------------------------------------

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Every env's generator (``SyncVectorEnv.np_random``'s tuple)."""
        return tuple(self._rngs[row] for row in range(self.num_envs))

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        generators = self.np_random  # makes the ones never seeded yet, as SyncVectorEnv's envs do
        return tuple(self._rngs.seeds[row] for row in range(len(generators)))

    # ---- episode start ------------------------------------------------------------------------

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        """Starts a new episode in every env (or in ``options["reset_mask"]``'s rows); see the class docstring."""
        self._check_open()
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {options!r}")
        options = options or {}
        seeds = seed_list(seed, self.num_envs)
        mask = check_reset_mask(options, self.num_envs)
        rows = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        layouts = self._given_layouts(options)
        if self._t is None:
            self._t = np.zeros(self.num_envs, np.int64)
        for row in rows:
            self._rngs.seed(int(row), seeds[row])
        self._start_episodes(rows, [layouts[row] for row in rows])
        info = self._info(None if mask is None else rows)
        return self._observe(), info

    def _given_layouts(self, options: dict) -> list[Layout | None]:
        """``options["layouts"]`` (one per env) or ``options["layout"]`` (every env), checked; None entries sample."""
        if options.get("layout") is not None and options.get("layouts") is not None:
            raise ValueError("give options['layout'] (every env) or options['layouts'] (one per env), not both")
        if options.get("layout") is not None:
            layouts = [options["layout"]] * self.num_envs
            name = "options['layout']"
        elif options.get("layouts") is not None:
            layouts = options["layouts"]
            if isinstance(layouts, Layout) or not isinstance(layouts, Sequence) or len(layouts) != self.num_envs:
                raise ValueError(f"options['layouts'] must be a list of num_envs={self.num_envs} Layouts (or None), "
                                 f"got {layouts!r}")
            layouts = list(layouts)
            name = "options['layouts']"
        else:
            return [None] * self.num_envs
        for row, layout in enumerate(layouts):
            if layout is not None and not isinstance(layout, Layout):
                raise ValueError(f"{name} must hold Layouts (or None), got {layout!r} for env {row}")
            if layout is not None and not self.mixture and len(layout.cells) != self._level_dancers[0]:
                raise ValueError(f"{name} must be Layouts with {self._level_dancers[0]} dancers (level "
                                 f"{self.levels[0]}), got {layout!r} for env {row}")
        return layouts

    def _start_episodes(self, rows: np.ndarray, given: list[Layout | None]) -> None:
        """New episodes in ``rows`` (ascending), drawing from each row's generator exactly as
        ``BalletEnv.reset`` (``sample_layout``) or ``BalletMixture.reset`` (the level, then the layout) do.
        All are drawn and checked before any row changes, so a bad given layout leaves the envs as they were."""
        episodes = []
        for row, layout in zip(rows, given, strict=True):
            rng = self._rngs[int(row)]
            level = int(rng.integers(len(self.levels))) if self.mixture else 0
            n = int(self._level_dancers[level])
            if layout is None:
                layout = sample_layout(rng, n)
            elif len(layout.cells) != n:  # the mixture: the drawn level decides (BalletMixture -> BalletEnv.reset)
                raise ValueError(f"options['layout(s)'] must be a Layout with {n} dancers for env {row}'s level "
                                 f"{self.levels[level]}, got {layout!r}")
            episodes.append((int(row), level, layout))
        for row, level, layout in episodes:
            n = len(layout.cells)
            self.layouts[row] = layout
            self._level[row] = level
            self._cue[row] = self._level_cue[level]
            self._limit[row] = self._level_limit[level]
            self._t[row] = 0
            self._agent[row] = AGENT_START
            self._home[row] = OFF_BOARD
            self._home[row, :n] = [DANCER_CELLS[c] for c in layout.cells]
            self._dance[row] = 0
            self._dance[row, :n] = layout.dances
            # dancer i's first move is at frame i * (delay + 15); unused rows never move (and are off board)
            self._start[row] = np.iinfo(np.int32).max
            self._start[row, :n] = np.arange(n) * (self._level_delay[level] + DANCE_LENGTH - 1)
            self._looks[row] = FLOOR
            self._looks[row, :n] = [look(s, c) for s, c in zip(layout.shapes, layout.colours, strict=True)]
            self._target[row] = layout.target
            self._target_home[row] = DANCER_CELLS[layout.label]
            self._target_cell[row] = layout.label
            self._cue_token[row] = 1 + layout.dances[layout.target]

    # ---- dynamics -----------------------------------------------------------------------------

    def step(self, actions):
        """One frame of every env (module docstring), then a new episode in the rows that ended."""
        self._check_open()
        if self._t is None:
            raise RuntimeError("BalletVectorEnv.step before reset: call reset() first")
        actions = check_actions(actions, self.num_envs, len(DIRECTIONS))
        self._t += 1
        t = self._t
        # the agent: actions count only once the choice phase began before this frame (t > cue_step)
        moved = self._agent + DIRECTIONS[actions]
        inside = ((moved >= 1) & (moved <= ROOM_SIZE - 2)).all(1)
        self._agent = np.where(((t > self._cue) & inside)[:, None], moved, self._agent)
        # contact: in the choice phase every dancer is on its cell
        on_dancer = (self._home == self._agent[:, None, :]).all(-1).any(1)
        terminated = on_dancer & (t > self._cue)
        paid = terminated if self.any_dancer else terminated & (self._target_home == self._agent).all(1)
        rewards = paid.astype(np.float64)
        truncated = ~terminated & (t >= self._limit)
        if self.max_episode_steps is not None:  # Gymnasium's TimeLimit: truncated whether terminated or not
            truncated |= t >= self.max_episode_steps
        ended = np.flatnonzero(terminated | truncated)
        infos = {}
        if len(ended):
            final_obs = self._observe(ended)
            singles = [{key: value[k] if key != "instruction" else int(value[k]) for key, value in final_obs.items()}
                       for k in range(len(ended))]
            final_entries(infos, singles, self._info(ended), ended, self.num_envs)
            self._start_episodes(ended, [None] * len(ended))
        infos.update(self._info(None))
        return self._observe(), rewards, terminated, truncated, infos

    # ---- observations -------------------------------------------------------------------------

    def _canvas(self, rows) -> np.ndarray:
        """``[R, 21, 21]`` look codes: each row's board at ``PAD..PAD + 10``, floor around it."""
        t, count = self._t[rows], len(self._t[rows])
        moves = np.clip(t[:, None] - self._start[rows] + 1, 0, DANCE_LENGTH)  # moves_done, every dancer
        dancers = self._home[rows] + DANCE_OFFSETS[self._dance[rows], moves] + PAD  # [R, N, 2]
        agent = self._agent[rows] + PAD
        canvas = np.broadcast_to(_EMPTY, (count, CANVAS, CANVAS)).copy()
        index = np.arange(count)
        canvas[index, agent[:, 0], agent[:, 1]] = AGENT
        canvas[index[:, None], dancers[..., 0], dancers[..., 1]] = self._looks[rows]  # over the agent
        return canvas

    def _observe(self, rows=slice(None)) -> dict:
        """The observations of ``rows`` (all by default): the egocentric view and the instruction."""
        canvas = self._canvas(rows)
        agent = self._agent[rows]
        windows = np.lib.stride_tricks.sliding_window_view(canvas, (VIEW, VIEW), axis=(1, 2))
        codes = windows[np.arange(len(canvas)), agent[:, 0], agent[:, 1]]  # [R, 11, 11] centred on the agent
        view = _paint(codes) if self.observation == "pixels" else np.take(LOOK_SYMBOLS, codes, axis=0)
        cued = self._t[rows] >= self._cue[rows]
        instruction = np.where(cued, self._cue_token[rows], WATCH)
        return {self._view_key: view, "instruction": instruction}

    def _info(self, rows) -> dict:
        """``BalletEnv``'s (and ``BalletMixture``'s) infos of ``rows`` (None: all), batched with masks."""
        index = slice(None) if rows is None else rows
        values = {
            "phase": _PHASES[(self._t[index] >= self._cue[index]).astype(np.intp)],
            "step": self._t[index].copy(),
            "cue_step": self._cue[index].copy(),
            "target_cell": self._target_cell[index].copy(),
        }
        if self.mixture:
            values["level"] = self._level_names[self._level[index]]
        return batched_info(values, rows, self.num_envs)

    # ---- rendering ----------------------------------------------------------------------------

    def render(self) -> tuple:
        """Every env's frame (``SyncVectorEnv.render``): a tuple of ``render_env(i)``."""
        return tuple(self.render_env(i) for i in range(self.num_envs))

    def render_env(self, index: int) -> np.ndarray | None:
        """Env ``index``'s frame, ``BalletEnv.render()``: the whole board (99x99) above its status strip
        (9 pixels: the clock until the cue, then the target's sprite); None without ``render_mode="rgb_array"``
        or before the first reset. An episode that ended has already been replaced by the next one."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < self.num_envs:
            raise ValueError(f"index must be an int in [0, {self.num_envs}), got {index!r}")
        if self.render_mode != "rgb_array" or self._t is None:
            return None
        canvas = self._canvas([int(index)])[0]
        board = _paint(canvas[PAD : PAD + ROOM_SIZE, PAD : PAD + ROOM_SIZE])
        strip = np.zeros((CELL_PIXELS, ROOM_SIZE * CELL_PIXELS, 3), np.uint8)
        t, cue = int(self._t[index]), int(self._cue[index])
        if t < cue:  # BalletEnv.status_strip: a grey bar fills up to the cue
            strip[:, : round(strip.shape[1] * t / cue)] = CLOCK_RGB
        else:
            sprite = LOOK_PIXELS[self._looks[index, self._target[index]]]
            drawn = sprite.any(-1)
            strip[:, :CELL_PIXELS][drawn] = sprite[drawn]
        return np.concatenate([board, strip], axis=0)

    # ---- lifetime -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("BalletVectorEnv is closed: make a new one")

    def close_extras(self, **kwargs) -> None:
        self._t = None
