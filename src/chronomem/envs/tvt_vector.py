"""Visual Match and Key-to-Door as a natively vectorised Gymnasium environment: ``B`` episodes stepped by
array operations with the rules of ``chronomem.envs.tvt.TVTEnv`` (which stays the readable reference).

``TVTVectorEnv(num_envs, **TVTEnv's keywords, max_episode_steps=None)`` returns what
``SyncVectorEnv(autoreset_mode=SAME_STEP)`` over ``TVTEnv`` returns, step for step, under the same seeds
and actions: observations, rewards, ends, infos, ``final_obs`` and ``final_info`` (with ``success`` and
``apples``); ``tests/test_envs_tvt.py`` drives both. ``reset(options={"layouts": [Layout | None, ...]})``
plays given episodes (one per env, None to sample), ``options={"layout": Layout}`` gives every env the
same one (what ``SyncVectorEnv`` passes to each); ``layouts`` holds each env's current one. Get it by id::

    gymnasium.make_vec(visual_match_id("passive", 90), num_envs=64, vectorization_mode="vector_entry_point")
    chronomem.envs.make.make_vector_env(visual_match_id("passive", 90), 64)   # native when an id has one

How the arrays follow ``TVTEnv``: each row holds the board of its current phase (``[B, 7, 11]`` codes),
copied from the three boards its episode was laid out with (``[B, 3, 7, 11]``, drawn when it starts),
the player's cell, the phase and its frame counter, and the apples' eating frames. A step moves every
player at once (a move is kept unless its cell blocks, ``TVTEnv._blocked``), applies each phase's
effect to the rows in that phase (masks), counts the timers and moves the rows whose phase ran out on
to the next board. Only the rows that start an episode are visited one by one, to draw their layouts
from their own generators (``sample_layout``, in ``TVTEnv.reset``'s order). Seeds, checks and the info
layout are ``chronomem.envs.vector``'s, shared with Ballet's and CueRecall's native envs.
"""

from __future__ import annotations

import numpy as np

from chronomem.envs.tvt import (
    APPLE,
    CODE_PIXELS,
    CODE_SYMBOLS,
    COLOUR,
    COLS,
    CROP,
    DOOR,
    DOOR_CELL,
    EXPLORE,
    FLOOR,
    INDICATOR,
    INDICATOR_CELL,
    KEY,
    KEY_CHANNEL,
    MOVES,
    PLAYER_CHANNEL,
    PLAYER_KEY_PIXEL,
    PLAYER_PIXEL,
    RESPAWN,
    REWARD,
    ROWS,
    SQUARE_CELLS,
    SQUARES,
    WALL,
    Layout,
    check_cue_cell,
    check_layout,
    check_options,
    observation_space,
    phase_board,
    phase_start,
    sample_layout,
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

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

SQUARE_INDEX = np.full((ROWS, COLS), -1)  # which square (0-2) a cell is, -1 elsewhere
SQUARE_INDEX[tuple(np.array(SQUARE_CELLS).T)] = np.arange(len(SQUARE_CELLS))


class TVTVectorEnv(gym.vector.VectorEnv if gym is not None else object):
    """``num_envs`` episodes of ``TVTEnv`` as arrays (module docstring)."""

    metadata = {"render_modes": [], "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP if gym is not None else None}

    def __init__(self, num_envs: int, game: str = "visual_match", mode: str = "passive", observation: str = "symbolic",
                 distractor: int = 90, explore: int = EXPLORE, reward: int = REWARD, num_apples: int = 10,
                 apple_rewards: tuple[float, ...] = (1.0, 10.0), final_reward: float = 10.0, control: bool = False,
                 cue_cell: int | str | None = None, max_episode_steps: int | None = None):
        if gym is None:
            raise ModuleNotFoundError("TVTVectorEnv needs gymnasium: pip install 'chronomem[rl]'")
        self.num_envs = check_num_envs(num_envs)
        lengths, self.apple_rewards = check_options(game, mode, observation, distractor, explore, reward, num_apples,
                                                    apple_rewards, final_reward, control)
        self.lengths = np.array(lengths)
        self.game, self.mode, self.observation, self.control = game, mode, observation, control
        self.num_apples, self.final_reward = num_apples, float(final_reward)
        self.cue_cell = check_cue_cell(cue_cell, game, mode)  # None: drawn per episode
        self.max_episode_steps = check_max_episode_steps(max_episode_steps)
        self.single_observation_space = observation_space(mode, observation)
        self.single_action_space = gym.spaces.Discrete(len(MOVES))
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._rngs = RowGenerators(self.num_envs)
        B = self.num_envs
        self._rows = np.arange(B)
        self._boards = np.zeros((B, 3, ROWS, COLS), np.int64)  # each episode's three starting boards
        self._starts = np.zeros((B, 3, 2), np.int64)
        self.board = np.zeros((B, ROWS, COLS), np.int64)  # the current phase's board
        self.eaten = np.full((B, ROWS, COLS), -1)
        self.player = np.zeros((B, 2), np.int64)
        self.phase, self.frame = np.zeros(B, np.int64), np.zeros(B, np.int64)
        self.apple_reward, self.target = np.zeros(B), np.zeros(B, np.int64)
        self.has_key, self.door_open, self.indicator = (np.zeros(B, np.bool_) for _ in range(3))
        self.success, self.apples, self.apple_now = np.zeros(B, np.bool_), np.zeros(B), np.zeros(B)
        self.steps = None  # actions in each row's episode; None until the first reset
        self.layouts: list[Layout | None] = [None] * B  # each row's current episode

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        return tuple(self._rngs[row] for row in range(self.num_envs))

    def _start(self, rows, given: list | None = None) -> None:
        for row in rows:
            layout = given[row] if given is not None and given[row] is not None else (
                sample_layout(self._rngs[int(row)], self.game, self.num_apples, self.apple_rewards, self.cue_cell))
            self.layouts[row] = layout
            for phase in range(3):
                self._boards[row, phase] = phase_board(self.game, phase, layout, self.control)
                self._starts[row, phase] = phase_start(self.game, phase, layout)
            self.apple_reward[row], self.target[row] = layout.apple_reward, layout.target
        rows = np.asarray(rows)
        self.steps[rows], self.has_key[rows], self.success[rows], self.apples[rows] = 0, False, False, 0.0
        self.apple_now[rows] = 0.0
        self._enter(rows, np.zeros(len(rows), np.int64))

    def _enter(self, rows: np.ndarray, phases: np.ndarray) -> None:
        self.phase[rows], self.frame[rows] = phases, 0
        self.board[rows] = self._boards[rows, phases]
        self.player[rows] = self._starts[rows, phases]
        self.eaten[rows] = -1
        self.indicator[rows] = self.door_open[rows] = False

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        if self.closed:
            raise RuntimeError("TVTVectorEnv is closed: make a new one")
        seeds = seed_list(seed, self.num_envs)
        mask = check_reset_mask(options or {}, self.num_envs)
        rows = self._rows if mask is None else np.flatnonzero(mask)
        if self.steps is None:
            self.steps = np.zeros(self.num_envs, np.int64)
        given = self._given_layouts(options or {})
        for row in rows:
            self._rngs.seed(int(row), seeds[row])
        self._start(rows, given)
        if mask is None:
            return self._observe(), self._info()
        return self._observe(), batched_info(self._values(rows), rows, self.num_envs)  # the reset rows' infos

    def _given_layouts(self, options: dict) -> list | None:
        """``options["layouts"]`` (one per env, None to sample) or ``options["layout"]`` (every env, as
        ``SyncVectorEnv`` passes it to each), checked as ``TVTEnv.reset`` checks one."""
        if options.get("layout") is not None and options.get("layouts") is not None:
            raise ValueError("give options['layout'] (every env) or options['layouts'] (one per env), not both")
        if options.get("layout") is not None:
            return [check_layout(options["layout"], self.num_apples, "options['layout']")] * self.num_envs
        layouts = options.get("layouts")
        if layouts is None:
            return None
        if not isinstance(layouts, (list, tuple)) or len(layouts) != self.num_envs:
            raise ValueError(f"options['layouts'] must be a list of num_envs={self.num_envs} Layouts or None, "
                             f"got {layouts!r}")
        return [None if layout is None else check_layout(layout, self.num_apples, f"options['layouts'][{i}]")
                for i, layout in enumerate(layouts)]

    def step(self, actions):
        if self.closed:
            raise RuntimeError("TVTVectorEnv is closed: make a new one")
        if self.steps is None:
            raise RuntimeError("TVTVectorEnv.step before reset: call reset() first")
        actions = check_actions(actions, self.num_envs, len(MOVES))
        b, phase = self._rows, self.phase
        self.frame += 1
        self.steps += 1
        self.door_open |= self.has_key
        # the move, kept unless its cell blocks (TVTEnv._blocked)
        target = self.player + MOVES[actions]
        inside = (target[:, 0] >= 0) & (target[:, 0] < ROWS) & (target[:, 1] >= 0) & (target[:, 1] < COLS)
        tr, tc = np.clip(target[:, 0], 0, ROWS - 1), np.clip(target[:, 1], 0, COLS - 1)
        code = self.board[b, tr, tc]
        blocked = (~inside | (code == WALL) | (code == INDICATOR) | ((code == DOOR) & ~self.door_open)
                   | ((code >= COLOUR) & ~((phase == 2) & SQUARES[tr, tc])))
        self.player = np.where(blocked[:, None], self.player, target)
        r, c = self.player[:, 0], self.player[:, 1]
        here = self.board[b, r, c]
        rewards = np.zeros(self.num_envs)
        self.indicator[:] = False
        # distractor: apples eaten, then grown back
        eat = np.flatnonzero((phase == 1) & (here == APPLE))
        self.board[eat, r[eat], c[eat]], self.eaten[eat, r[eat], c[eat]] = FLOOR, self.frame[eat]
        rewards[eat] += self.apple_reward[eat]
        self.apples[eat] += self.apple_reward[eat]
        self.apple_now[:] = 0.0
        self.apple_now[eat] = self.apple_reward[eat]
        regrow = (phase == 1)[:, None, None] & (self.eaten >= 0) & (self.frame[:, None, None] > self.eaten + RESPAWN)
        self.board[regrow] = APPLE
        if self.game == "key_to_door":
            take = np.flatnonzero((phase == 0) & (here == KEY))
            self.board[take, r[take], c[take]] = FLOOR
            self.has_key[take] = self.indicator[take] = True
            through = (phase == 2) & (r == DOOR_CELL[0]) & (c == DOOR_CELL[1]) & self.has_key
            rewards[through] += self.final_reward
            self.has_key[through], self.success[through] = False, True
        else:
            touch = np.flatnonzero((phase == 2) & SQUARES[r, c] & (here != FLOOR))
            right = SQUARE_INDEX[r[touch], c[touch]] == self.target[touch]
            self.success[touch] = right
            rewards[touch] += np.where(right, self.final_reward, 0.0)
            for cell in SQUARE_CELLS:  # touching any square hides all three
                self.board[touch, cell[0], cell[1]] = FLOOR
        # the timers
        ran_out = self.frame >= self.lengths[phase]
        terminated = ran_out & (phase == 2)
        onward = np.flatnonzero(ran_out & (phase < 2))
        self._enter(onward, phase[onward] + 1)
        truncated = np.zeros(self.num_envs, np.bool_)
        if self.max_episode_steps is not None:
            truncated = ~terminated & (self.steps >= self.max_episode_steps)
        obs = self._observe()
        ended = np.flatnonzero(terminated | truncated)
        if len(ended) == 0:
            return obs, rewards, terminated, truncated, self._info()
        final_info = batched_info(self._values(ended), ended, self.num_envs)
        over = np.flatnonzero(terminated)  # a time limit's truncation ends no game: no outcome to report
        if len(over):
            final_info.update(batched_info({"success": self.success[over], "apples": self.apples[over]}, over,
                                           self.num_envs))
        final_obs = [{key: value[row].copy() for key, value in obs.items()} for row in ended]
        self._start(ended)
        fresh = self._observe()
        for key in obs:
            obs[key][ended] = fresh[key][ended]
        infos = final_entries(self._info(), final_obs, final_info, ended, self.num_envs)
        return obs, rewards, terminated, truncated, infos

    def _values(self, rows: np.ndarray) -> dict:
        return {"phase": self.phase[rows], "step": self.steps[rows], "apple_reward": self.apple_now[rows]}

    def _info(self) -> dict:
        return batched_info(self._values(self._rows), None, self.num_envs)

    def _observe(self) -> dict:
        codes = self.board.copy()
        codes[self.indicator, INDICATOR_CELL[0], INDICATOR_CELL[1]] = INDICATOR
        b = self._rows
        if self.mode == "passive":
            pr, pc = self.player[:, 0], self.player[:, 1]
        else:  # the 5x5 window centred on the player, floor beyond the board (TVTEnv._view)
            half = CROP // 2
            padded = np.pad(codes, ((0, 0), (half, half), (half, half)))  # FLOOR = 0
            span = np.arange(CROP)
            rows = self.player[:, 0, None] + span
            cols = self.player[:, 1, None] + span
            codes = padded[b[:, None, None], rows[:, :, None], cols[:, None, :]]
            pr = pc = np.full(self.num_envs, half)
        if self.observation == "symbolic":
            grid = CODE_SYMBOLS[codes]
            grid[b, pr, pc, PLAYER_CHANNEL] = 1
            if self.control:  # Key-to-Door's control: the key drawn on the player while held
                grid[b, pr, pc, KEY_CHANNEL] |= self.has_key.astype(np.uint8)
            return {"grid": grid}
        image = CODE_PIXELS[codes]
        image[b, pr, pc] = PLAYER_PIXEL
        if self.control:
            image[b[self.has_key], pr[self.has_key], pc[self.has_key]] = PLAYER_KEY_PIXEL
        return {"image": image}
