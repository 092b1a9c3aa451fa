"""POPGym's memory benchmark behind chronomem's env factory (Morad et al. 2023, "POPGym: Benchmarking
Partially Observable Reinforcement Learning", ICLR; PyPI ``popgym``, numpy and gymnasium only).

``import popgym`` registers its environments as ``popgym-<Name><Difficulty>-v0`` (``popgym_id``),
15 POMDPs (``ENVS``) at three difficulties (``DIFFICULTIES``); ``chronomem.envs.make.make_env``
builds any of them by that id and wraps it with ``wrap_popgym``, so PPO, evaluation and the
experiments take a POPGym id as they take a MiniGrid one. Only the environments are used: POPGym's
RLlib baselines are unmaintained.

The Gymnasium wrappers that apply POPGym's experimental protocol and make its observations and
actions something a vector env batches and a categorical policy acts in are
``chronomem.envs.wrappers.wrap_popgym`` (its docstring lists them, with the deviation for the
pendulums). This module is the catalogue: ids, names and difficulties, without gymnasium.

Rewards are POPGym's own, already scaled so that an episode's return lies in [-1, 1]: its metric, the
maximum over training of the mean episodic return (MMER), needs no further normalisation.

``LabyrinthEscape`` and ``LabyrinthExplore`` exist only when ``mazelib`` is installed (POPGym
registers them then); building one without it is a ValueError saying so.

``CONTROL_ID`` (``popgym-RepeatCurrent-v0``, ours, not one of POPGym's ids) is the control of the
memory tasks (docs/rl.md "Controls and the memoryless agent"): POPGym's ``RepeatPrevious`` with one
deck and ``k = 1``, where the suit to name is that of the card in view, so a memoryless policy earns
the full return of 1 (POPGym's ``k = 0`` would index the first card, ``[-0]``, not the current one).
The rest is RepeatPreviousEasy's: its cards, its episode of 51 steps, its rewards of +-1/51.
"""

from __future__ import annotations

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


CONTROL_ID = "popgym-RepeatCurrent-v0"


def register() -> bool:
    """Import POPGym (which registers its ids) and register ``CONTROL_ID``; False when it is not installed."""
    try:
        import gymnasium as gym
        import popgym  # noqa: F401
    except ModuleNotFoundError:
        return False
    if CONTROL_ID not in gym.registry:
        gym.register(CONTROL_ID, entry_point="popgym.envs.repeat_previous:RepeatPrevious",
                     kwargs={"num_decks": 1, "k": 1})
    return True


def missing_hint(env_id: str) -> str:
    """Why a ``popgym-*`` id is unknown: POPGym not installed, or a labyrinth without mazelib."""
    if not register():
        return "POPGym is not installed: pip install 'chronomem[rl]'"
    if any(name in env_id for name in NEEDS_MAZELIB):
        return "POPGym registers its labyrinths only when mazelib is installed: pip install mazelib"
    return ""
