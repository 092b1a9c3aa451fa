"""Visual Match and Key-to-Door: the 2D memory tasks of TVT (Hung et al. 2019), with the rules of the
pycolab games DeepMind released (google-deepmind/deepmind-research, ``tvt/pycolab``); paper 001's
Fig. 6a row is the passive Visual Match.

An episode is three phases, each its own 7x11 board, each ended by a timer (the reference's
``DEFAULT_MAX_FRAMES_PER_PHASE``: 15, 90 and 15 actions; ``distractor=`` sets the middle one):

1. **explore.** Visual Match: a room whose wall has one cell painted the *target colour*: in the active
   mode (as released) one of the room's 26 wall cells, drawn per episode; in the passive mode the middle
   of the top wall, straight ahead of the start cells (``cue_cell``, below). Key-to-Door: a room with a
   key on one of 10 cells; stepping on it takes it (and lights an indicator at the top of the wall for
   one frame).
2. **distractor.** ``num_apples`` (10) apples on cells drawn from the reference's apple grid (22 cells);
   eating one pays the episode's apple reward, drawn once per episode from ``apple_rewards`` ((1, 10):
   TVT's flags with ``fix_apple_reward_in_episode``), and it grows back 21 frames after it was eaten
   (``frame > eaten + 20``, with 20 the reference's respawn time).
3. **reward.** Visual Match: three squares in three colours (the hues 0, 1/3, 2/3, shuffled); stepping
   on the target's colour pays ``final_reward`` (10), stepping on any square hides all three.
   Key-to-Door: a door that lets the agent through only if it took the key, and pays ``final_reward``
   when it does.

Each phase starts the player on its cell (explore: one of 10 cells drawn per episode; then the
boards' fixed ``+``). Four actions, north, south, west, east (0-3); a move into a wall (or the
explore room's coloured cell, the indicator, a closed door) leaves the player in place. Within a
frame the player moves, then the objects react (the reference's update order), then the timer
counts; the action that ends the reward phase ends the episode (terminated: pycolab's
``terminate_episode`` has discount 0). So every episode is ``explore + distractor + reward`` steps.

Observations are dicts of one grid of cells. ``mode="active"`` (the released game): a 5x5 window
centred on the player (the reference's ``ScrollingCropper`` with margins 2; cells beyond the board are
floor), so the agent must walk to see the colour. ``mode="passive"`` (paper 001's Fig. 6a, after TVT's
DMLab ``passive_visual_match``; the 2D version is ours): the whole 7x11 board, so the colour is in view
from the first frame, with nothing to explore. TVT's DMLab levels differ in where the colour is
(``tvt/dmlab/README.md``): passive, "a colour square right in front of the agent"; active, "randomly
placed". So in our passive mode the colour sits on one fixed wall cell, the middle of the top wall
(``PASSIVE_CUE_CELL``), at the same place in every frame as DMLab's square in front of the agent;
``cue_cell="any"`` draws it among the 26 as the active mode does, and an index puts it on that cell
(diagnostics: docs/rl.md, "The memory runs are not learned at quick").
``observation="symbolic"``: ``{"grid": uint8 [H, W, 9]}``, per cell the channels ``SYMBOLS`` (a coloured
cell sets one colour channel; floor is all zeros; the player sets its channel over what it stands on);
``"pixels"``: ``{"image": uint8 [H, W, 3]}``, one pixel per cell as the reference renders (its
``FIXED_COLOURS`` scaled to 255, the player drawn on top).

``control=True`` (not in the reference) removes the memory demand; it is the control every setting must
learn first (docs/rl.md, "Controls"). Visual Match: the reward room also shows the target colour, on the
wall cell above the middle square, so choosing needs no memory. Key-to-Door: the key is drawn on the
player while it is held (the key's channel on the player's cell; in pixels the player takes a colour
halfway to the key's), as MiniGrid shows what its agent carries, so whether the door will open is in
view at every step: what is left to learn is the credit for taking the key, across the apples.

``info``: ``phase`` (0 explore, 1 distractor, 2 reward; ``PHASES``), ``step`` (actions so far),
``apple_reward`` (the part of this step's reward the apples paid: PPO's ``--reward-part``), and at
the episode's last step ``success`` (Visual Match: stepped on the target's colour; Key-to-Door: went
through the door) and ``apples`` (the apple reward of the episode), so a table reports the choice and
the apples separately. ``reset(options={"layout": Layout(...)})`` plays a given episode.

Deviations from the reference, all deliberate: the squares' colours are shuffled per episode (the
reference shuffles them once per game object, so one env's colours keep their places); an apple's
reward is drawn once per episode (the reference's other option, a fresh uniform draw per apple, is not
offered); the player is drawn over everything; ``step`` after the end raises.

Registered ids (``visual_match_id``, ``key_to_door_id``): ``chronomem/VisualMatch-<mode>-d<distractor>[-control]
[-pixels]-v0`` and ``chronomem/KeyToDoor-d<distractor>[-control][-pixels]-v0`` (active, as released) for the
distractor lengths ``DISTRACTORS``, symbolic unless ``-pixels``; any other length through
``gymnasium.make(id, distractor=N)``.
Every id has the natively vectorised twin ``chronomem.envs.tvt_vector.TVTVectorEnv``, tested step for step
against ``TVTEnv``, which stays the readable reference.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass

import numpy as np

from chronomem.checks import check_positive

try:  # the environment needs the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None

GAMES = ("visual_match", "key_to_door")
MODES = ("passive", "active")
PHASES = ("explore", "distractor", "reward")
DISTRACTORS = (5, 15, 30, 90, 250, 500)  # registered ids; the reference's default is 90
ROWS, COLS = 7, 11  # every board
CROP = 5  # the active view (the reference's ScrollingCropper)
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])  # north, south, west, east (the reference's 0-3)
RESPAWN = 20  # frames until an eaten apple may grow back (the reference's DEFAULT_APPLE_RESPAWN_TIME)
EXPLORE, REWARD = 15, 15  # the first and last phases' actions (the reference's DEFAULT_MAX_FRAMES_PER_PHASE)

# Cell codes on a board. The player is not on the board: it is drawn over it.
FLOOR, WALL, APPLE, KEY, DOOR, INDICATOR, COLOUR = 0, 1, 2, 3, 4, 5, 6  # COLOUR + k: colour k of 3
NUM_COLOURS = 3
NUM_CODES = COLOUR + NUM_COLOURS
SYMBOLS = ("wall", "player", "apple", "key", "door", "indicator", "colour 0", "colour 1", "colour 2")
CODE_SYMBOLS = np.zeros((NUM_CODES, len(SYMBOLS)), np.uint8)  # floor: no channel
for _code, _channel in ((WALL, 0), (APPLE, 2), (KEY, 3), (DOOR, 4), (INDICATOR, 5)):
    CODE_SYMBOLS[_code, _channel] = 1
CODE_SYMBOLS[np.arange(COLOUR, NUM_CODES), np.arange(6, 9)] = 1
PLAYER_CHANNEL = 1
COLOUR_CHANNELS = CODE_SYMBOLS[COLOUR:NUM_CODES].argmax(1)  # the symbolic grid's channels of colours 0-2


def _rgb(r: int, g: int, b: int) -> tuple[int, int, int]:
    """The reference's colours are in [0, 1000]; pixels in [0, 255]."""
    return tuple(int(v * 255 / 1000) for v in (r, g, b))


CODE_PIXELS = np.zeros((NUM_CODES, 3), np.uint8)
CODE_PIXELS[FLOOR], CODE_PIXELS[WALL] = _rgb(800, 800, 800), _rgb(100, 100, 100)
CODE_PIXELS[APPLE], CODE_PIXELS[KEY], CODE_PIXELS[DOOR] = _rgb(550, 700, 0), _rgb(627, 321, 176), _rgb(529, 808, 922)
CODE_PIXELS[INDICATOR] = _rgb(1000, 1000, 1000)
for _k in range(NUM_COLOURS):  # equally spaced hues (the reference's get_shuffled_symbol_colour_map)
    CODE_PIXELS[COLOUR + _k] = _rgb(*(int(c * 1000) for c in colorsys.hsv_to_rgb(_k / NUM_COLOURS, 1.0, 1.0)))
PLAYER_PIXEL = np.array(_rgb(898, 584, 430), np.uint8)
KEY_CHANNEL = SYMBOLS.index("key")
# Key-to-Door's control: the player holding the key, halfway between the player's colour and the key's
PLAYER_KEY_PIXEL = ((PLAYER_PIXEL.astype(np.int64) + CODE_PIXELS[KEY]) // 2).astype(np.uint8)


def _board(art: list[str], walls: str = "#") -> np.ndarray:
    """Wall and floor codes of a board drawn as text (a character of ``walls`` is wall; others floor)."""
    return np.array([[WALL if ch in walls else FLOOR for ch in row] for row in art], np.int64)


def _cells(art: list[str], mark: str) -> tuple[tuple[int, int], ...]:
    return tuple((r, c) for r, row in enumerate(art) for c, ch in enumerate(row) if ch == mark)


# The reference's boards (tvt/pycolab): p = a wall cell that may hold the colour, + = a start cell,
# k = a key cell, a = an apple cell, b/c/e = the three squares, d = the door, i = the indicator.
_EXPLORE_VM = ["  ppppppp  ", "  p     p  ", "  p     p  ", "  pp   pp  ", "  p+++++p  ", "  p+++++p  ", "  ppppppp  "]
_EXPLORE_KD = ["  #######  ", "  #kkkkk#  ", "  #kkkkk#  ", "  ##   ##  ", "  #+++++#  ", "  #+++++#  ", "  #######  "]
_APPLES = ["###########", "#a a a a a#", "# a a a a #", "#a a a a a#", "# a a a a #", "#a a + a a#", "###########"]
_REWARD_VM = ["###########", "# b  c  e #", "#         #", "#         #", "####   ####", "   # + #   ", "   #####   "]
_REWARD_KD = ["           ", "   ##d##   ", "   #   #   ", "   # + #   ", "   #   #   ", "   #####   ", "           "]

CUE_CELLS = _cells(_EXPLORE_VM, "p")  # 26 wall cells, one of which shows the target colour
PASSIVE_CUE_CELL = CUE_CELLS.index((0, 5))  # the passive mode's: the top wall's middle, ahead of the starts
START_CELLS = _cells(_EXPLORE_VM, "+")  # 10 (the same cells in both explore rooms)
KEY_CELLS = _cells(_EXPLORE_KD, "k")  # 10
APPLE_CELLS = _cells(_APPLES, "a")  # 22
SQUARE_CELLS = _cells(_REWARD_VM, "b") + _cells(_REWARD_VM, "c") + _cells(_REWARD_VM, "e")  # left, middle, right
DOOR_CELL = _cells(_REWARD_KD, "d")[0]
INDICATOR_CELL = (0, 5)  # the reference's override_position
CONTROL_CUE_CELL = (0, 5)  # the control's colour in the reward room: the wall above the middle square
DISTRACTOR_START = _cells(_APPLES, "+")[0]
REWARD_START = {"visual_match": _cells(_REWARD_VM, "+")[0], "key_to_door": _cells(_REWARD_KD, "+")[0]}
BOARDS = {  # walls and floor of each game's three boards (the explore room's p cells are its wall)
    "visual_match": (_board(_EXPLORE_VM, "p"), _board(_APPLES), _board(_REWARD_VM)),
    "key_to_door": (_board(_EXPLORE_KD), _board(_APPLES), _board(_REWARD_KD)),
}
SQUARES = np.zeros((ROWS, COLS), bool)  # the only coloured cells a player may step on (reward phase)
SQUARES[tuple(np.array(SQUARE_CELLS).T)] = True
assert (len(CUE_CELLS), len(START_CELLS), len(KEY_CELLS), len(APPLE_CELLS)) == (26, 10, 10, 22)


@dataclass(frozen=True)
class Layout:
    """What is random in an episode. ``start``: index into ``START_CELLS``; ``apples``: indices into
    ``APPLE_CELLS``; ``apple_reward``: this episode's. Visual Match: ``cue``, index into ``CUE_CELLS``;
    ``colours``: the colour (0-2) of the left, middle and right squares; ``target``: the square (0-2)
    whose colour the cue shows. Key-to-Door: ``key``, index into ``KEY_CELLS``."""

    start: int
    apples: tuple[int, ...]
    apple_reward: float
    cue: int = 0
    colours: tuple[int, int, int] = (0, 1, 2)
    target: int = 0
    key: int = 0

    @property
    def target_colour(self) -> int:
        return self.colours[self.target]


def sample_layout(rng: np.random.Generator, game: str, num_apples: int, apple_rewards: tuple[float, ...],
                  cue_cell: int | None = None) -> Layout:
    """One episode's draws, in a fixed order (the vector env draws the same from the same generator);
    ``cue_cell`` (Visual Match) puts the cue on that wall cell whatever was drawn."""
    if game == "visual_match":
        drawn = int(rng.integers(len(CUE_CELLS)))  # drawn either way: the later draws stay the same
        cue = drawn if cue_cell is None else cue_cell
        start = int(rng.integers(len(START_CELLS)))
        colours = tuple(int(c) for c in rng.permutation(NUM_COLOURS))
        target = int(rng.integers(NUM_COLOURS))
        key = 0
    else:
        key = int(rng.integers(len(KEY_CELLS)))
        start = int(rng.integers(len(START_CELLS)))
        cue, colours, target = 0, (0, 1, 2), 0
    apples = tuple(int(i) for i in np.sort(rng.choice(len(APPLE_CELLS), num_apples, replace=False)))
    apple_reward = float(apple_rewards[int(rng.integers(len(apple_rewards)))])
    return Layout(start, apples, apple_reward, cue, colours, target, key)


def check_layout(layout, num_apples: int, name: str) -> Layout:
    """``layout`` if it is a ``Layout`` whose indices fit the boards, else a ValueError naming ``name``."""
    fits = (isinstance(layout, Layout) and len(layout.apples) == num_apples == len(set(layout.apples))
            and all(0 <= i < len(APPLE_CELLS) for i in layout.apples) and 0 <= layout.start < len(START_CELLS)
            and 0 <= layout.cue < len(CUE_CELLS) and 0 <= layout.key < len(KEY_CELLS)
            and sorted(layout.colours) == list(range(NUM_COLOURS)) and 0 <= layout.target < NUM_COLOURS)
    if not fits:
        raise ValueError(f"{name} must be a Layout with {num_apples} distinct apple cells (indices < "
                         f"{len(APPLE_CELLS)}), start < {len(START_CELLS)}, cue < {len(CUE_CELLS)}, key < "
                         f"{len(KEY_CELLS)}, colours a permutation of 0-2 and target 0-2, got {layout!r}")
    return layout


def phase_board(game: str, phase: int, layout: Layout, control: bool) -> np.ndarray:
    """The ``[7, 11]`` codes a phase starts with."""
    board = BOARDS[game][phase].copy()
    if phase == 0 and game == "visual_match":
        board[CUE_CELLS[layout.cue]] = COLOUR + layout.target_colour
    elif phase == 0:
        board[KEY_CELLS[layout.key]] = KEY
    elif phase == 1:
        for i in layout.apples:
            board[APPLE_CELLS[i]] = APPLE
    elif game == "visual_match":
        for cell, colour in zip(SQUARE_CELLS, layout.colours, strict=True):
            board[cell] = COLOUR + colour
        if control:
            board[CONTROL_CUE_CELL] = COLOUR + layout.target_colour
    else:
        board[DOOR_CELL] = DOOR
    return board


def phase_start(game: str, phase: int, layout: Layout) -> tuple[int, int]:
    return START_CELLS[layout.start] if phase == 0 else DISTRACTOR_START if phase == 1 else REWARD_START[game]


def visual_match_id(mode: str = "passive", distractor: int = 90, control: bool = False,
                    observation: str = "symbolic") -> str:
    return (f"chronomem/VisualMatch-{mode}-d{distractor}{'-control' if control else ''}"
            f"{'-pixels' if observation == 'pixels' else ''}-v0")


def key_to_door_id(distractor: int = 90, control: bool = False, observation: str = "symbolic") -> str:
    return (f"chronomem/KeyToDoor-d{distractor}{'-control' if control else ''}"
            f"{'-pixels' if observation == 'pixels' else ''}-v0")


def check_options(game, mode, observation, distractor, explore, reward, num_apples, apple_rewards, final_reward,
                  control) -> tuple:
    """The constructor's arguments checked (``TVTEnv`` and ``TVTVectorEnv`` take the same)."""
    if game not in GAMES:
        raise ValueError(f"game must be one of {GAMES}, got {game!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if observation not in ("symbolic", "pixels"):
        raise ValueError(f"observation must be 'symbolic' or 'pixels', got {observation!r}")
    lengths = tuple(check_positive(n, name) for n, name in ((explore, "explore"), (distractor, "distractor"),
                                                             (reward, "reward")))
    check_positive(num_apples, "num_apples")
    if num_apples > len(APPLE_CELLS):
        raise ValueError(f"num_apples must be <= {len(APPLE_CELLS)} (the apple grid's cells), got {num_apples}")
    if isinstance(apple_rewards, (int, float)):
        apple_rewards = (apple_rewards,)
    if not apple_rewards or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in apple_rewards):
        raise ValueError(f"apple_rewards must be a number or a non-empty tuple of numbers, got {apple_rewards!r}")
    if not isinstance(final_reward, (int, float)) or isinstance(final_reward, bool):
        raise TypeError(f"final_reward must be a number, got {final_reward!r}")
    if not isinstance(control, bool):
        raise TypeError(f"control must be a bool, got {control!r}")
    return lengths, tuple(float(r) for r in apple_rewards)


def check_cue_cell(cue_cell, game: str, mode: str) -> int | None:
    """The wall cell every episode's cue sits on, or None where it is drawn per episode.

    ``cue_cell``: None, the mode's own (passive: ``PASSIVE_CUE_CELL``; active, and Key-to-Door: drawn);
    ``"any"``: drawn among the 26; an index into ``CUE_CELLS``: that cell. Anything else, or a cue for
    Key-to-Door, is a ValueError."""
    if cue_cell is None:
        return PASSIVE_CUE_CELL if game == "visual_match" and mode == "passive" else None
    if game == "visual_match" and isinstance(cue_cell, str) and cue_cell == "any":
        return None
    if game != "visual_match" or isinstance(cue_cell, bool) or not isinstance(cue_cell, (int, np.integer)) or not (
            0 <= cue_cell < len(CUE_CELLS)):
        raise ValueError(f"cue_cell must be None, 'any' or an index 0-{len(CUE_CELLS) - 1} into the wall cells, "
                         f"and None for Key-to-Door; got {cue_cell!r} (game={game!r})")
    return int(cue_cell)


def view_shape(mode: str) -> tuple[int, int]:
    return (CROP, CROP) if mode == "active" else (ROWS, COLS)


def observation_space(mode: str, observation: str):
    rows, cols = view_shape(mode)
    if observation == "symbolic":
        return spaces.Dict({"grid": spaces.Box(0, 1, (rows, cols, len(SYMBOLS)), np.uint8)})
    return spaces.Dict({"image": spaces.Box(0, 255, (rows, cols, 3), np.uint8)})


class TVTEnv(gym.Env if gym is not None else object):
    """One episode at a time of Visual Match or Key-to-Door (the module docstring has the rules).

    ``TVTEnv(game="visual_match" | "key_to_door", mode="passive" | "active", observation="symbolic" |
    "pixels", distractor=90, explore=15, reward=15, num_apples=10, apple_rewards=(1.0, 10.0),
    final_reward=10.0, control=False, cue_cell=None)``. ``cue_cell``: where Visual Match's cue sits, None
    for the mode's own place (the module docstring), ``"any"`` to draw it among the 26 wall cells, an
    index to put it on that one (``check_cue_cell``)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, game: str = "visual_match", mode: str = "passive", observation: str = "symbolic",
                 distractor: int = 90, explore: int = EXPLORE, reward: int = REWARD, num_apples: int = 10,
                 apple_rewards: tuple[float, ...] = (1.0, 10.0), final_reward: float = 10.0, control: bool = False,
                 cue_cell: int | str | None = None, render_mode: str | None = None):
        if gym is None:
            raise ModuleNotFoundError("TVTEnv needs gymnasium: pip install 'chronomem[rl]'")
        self.lengths, self.apple_rewards = check_options(game, mode, observation, distractor, explore, reward,
                                                         num_apples, apple_rewards, final_reward, control)
        self.cue_cell = check_cue_cell(cue_cell, game, mode)  # None: drawn per episode
        self.game, self.mode, self.observation, self.control = game, mode, observation, control
        self.num_apples, self.final_reward = num_apples, float(final_reward)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = observation_space(mode, observation)
        self.action_space = spaces.Discrete(len(MOVES))
        self.layout: Layout | None = None
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        layout = (options or {}).get("layout")
        if layout is None:
            layout = sample_layout(self.np_random, self.game, self.num_apples, self.apple_rewards, self.cue_cell)
        self.layout = check_layout(layout, self.num_apples, "options['layout']")
        self._steps, self._apples, self._success, self._has_key, self._apple_now = 0, 0.0, False, False, 0.0
        self._done = False
        self._enter(0)
        return self._observe(), self._info()

    def _enter(self, phase: int) -> None:
        self._phase, self._frame = phase, 0  # the reference's chapter frame counter
        self._board = phase_board(self.game, phase, self.layout, self.control)
        self._player = np.array(phase_start(self.game, phase, self.layout))
        self._eaten = np.full((ROWS, COLS), -1)  # the frame each apple was last eaten (-1: not yet)
        self._indicator = self._door_open = False

    def _blocked(self, cell: tuple[int, int]) -> bool:
        """Walls, the indicator, a closed door and every coloured cell but the reward room's squares."""
        code = self._board[cell]
        if code == DOOR:
            return not self._door_open
        return code in (WALL, INDICATOR) or (code >= COLOUR and not (self._phase == 2 and SQUARES[cell]))

    def step(self, action):
        if self._done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, {self.action_space.n}), got {action!r}")
        self._frame += 1
        self._steps += 1
        self._door_open |= self._has_key  # the key opens the door for the rest of the phase
        target = self._player + MOVES[int(action)]
        inside = 0 <= target[0] < ROWS and 0 <= target[1] < COLS
        if inside and not self._blocked(tuple(target)):
            self._player = target
        reward, here = 0.0, tuple(self._player)
        self._indicator, self._apple_now = False, 0.0
        if self._phase == 1:  # the apples: eaten, then grown back 21 frames later
            if self._board[here] == APPLE:
                self._board[here], self._eaten[here] = FLOOR, self._frame
                reward += self.layout.apple_reward
                self._apples += self.layout.apple_reward
                self._apple_now = self.layout.apple_reward
            regrow = (self._eaten >= 0) & (self._frame > self._eaten + RESPAWN)
            self._board[regrow] = APPLE
        elif self._phase == 0 and self.game == "key_to_door" and self._board[here] == KEY:
            self._board[here], self._has_key, self._indicator = FLOOR, True, True
        elif self._phase == 2 and self.game == "visual_match" and here in SQUARE_CELLS and self._board[here] != FLOOR:
            self._success = SQUARE_CELLS.index(here) == self.layout.target
            reward += self.final_reward if self._success else 0.0
            for cell in SQUARE_CELLS:  # touching any square hides all three
                self._board[cell] = FLOOR
        elif self._phase == 2 and self.game == "key_to_door" and here == DOOR_CELL and self._has_key:
            reward += self.final_reward
            self._has_key, self._success = False, True
        terminated = False
        if self._frame >= self.lengths[self._phase]:
            if self._phase == 2:
                terminated = self._done = True
            else:
                self._enter(self._phase + 1)
        return self._observe(), reward, terminated, False, self._info()

    def board(self) -> np.ndarray:
        """The whole board's codes, the indicator drawn while it is lit."""
        board = self._board.copy()
        if self._indicator:
            board[INDICATOR_CELL] = INDICATOR
        return board

    def _view(self, board: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
        """The observed codes and the player's cell in them."""
        if self.mode == "passive":
            return board, tuple(self._player)
        half = CROP // 2
        padded = np.pad(board, half)  # FLOOR beyond the board
        r, c = self._player
        return padded[r : r + CROP, c : c + CROP], (half, half)

    @property
    def _shows_key(self) -> bool:
        """Key-to-Door's control draws the key on the player while it is held."""
        return self.control and self._has_key

    def _observe(self) -> dict:
        codes, player = self._view(self.board())
        if self.observation == "symbolic":
            grid = CODE_SYMBOLS[codes]
            grid[player + (PLAYER_CHANNEL,)] = 1
            if self._shows_key:
                grid[player + (KEY_CHANNEL,)] = 1
            return {"grid": grid}
        image = CODE_PIXELS[codes]
        image[player] = PLAYER_KEY_PIXEL if self._shows_key else PLAYER_PIXEL
        return {"image": image}

    def _info(self) -> dict:
        info = {"phase": self._phase, "step": self._steps, "apple_reward": self._apple_now}
        if self._done:
            info.update(success=self._success, apples=self._apples)
        return info

    def render(self):
        """The whole board, 8 pixels per cell: ``[56, 88, 3]`` uint8."""
        if self.render_mode != "rgb_array" or self.layout is None:
            return None
        image = CODE_PIXELS[self.board()]
        image[tuple(self._player)] = PLAYER_KEY_PIXEL if self._shows_key else PLAYER_PIXEL
        return image.repeat(8, 0).repeat(8, 1)


VECTOR_ENTRY_POINT = "chronomem.envs.tvt_vector:TVTVectorEnv"  # a string: tvt_vector imports this module
if gym is not None and visual_match_id() not in gym.registry:
    for _observation in ("symbolic", "pixels"):
        for _distractor in DISTRACTORS:
            for _mode in MODES:
                for _control in (False, True):
                    gym.register(id=visual_match_id(_mode, _distractor, _control, _observation), entry_point=TVTEnv,
                                 vector_entry_point=VECTOR_ENTRY_POINT,
                                 kwargs={"game": "visual_match", "mode": _mode, "distractor": _distractor,
                                         "control": _control, "observation": _observation})
            for _control in (False, True):
                gym.register(id=key_to_door_id(_distractor, _control, _observation), entry_point=TVTEnv,
                             vector_entry_point=VECTOR_ENTRY_POINT,
                             kwargs={"game": "key_to_door", "mode": "active", "distractor": _distractor,
                                     "control": _control, "observation": _observation})
