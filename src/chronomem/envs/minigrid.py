"""MiniGrid for agents: environment construction, the mission as tokens, vector envs, and the
train/test pairs of paper 004 (Sec. 3.2, Table 3).

* ``make_env(env_id)`` builds any Gymnasium environment by id. ``import minigrid`` registers the
  MiniGrid and BabyAI ids (Gymnasium 1.x raises ``NameNotFound`` without it) and importing
  ``chronomem.envs.recall`` registers the cue-recall test env, ``chronomem.envs.ballet`` the Ballet
  levels and the paper's level mixture, ``import popgym`` POPGym's environments (wrapped by
  ``chronomem.envs.popgym.wrap``); an unknown id is a ValueError listing close matches. A MiniGrid
  observation is ``{"image": uint8 [7, 7, 3], "direction": int, "mission": str}``: ``MissionTokens``
  replaces the mission string by ``max_words`` int64 token ids (``VOCABULARY``), so
  every observation is a fixed-shape array that a vector env can batch.
* The agent's 7x7x3 view (object, colour, state per cell) has the same shape in every grid size,
  which is what lets an agent trained on a small grid be evaluated on a large one (``PAIRS``).
* ``make_vector_env`` builds ``num_envs`` copies, ``SyncVectorEnv`` (one process: tests, and as fast
  as subprocesses on 2 cores) or ``AsyncVectorEnv`` (one subprocess each, ``shared_memory=False``),
  with ``autoreset_mode=SAME_STEP``: the step that ends an episode returns the *next* episode's first
  observation and the final one in ``info["final_obs"]``. (Gymnasium 1.x's default, NEXT_STEP,
  spends one extra step per episode whose action is ignored; docs/rl.md, "Autoreset".)
* Seeding: ``envs.reset(seed=[s_0, ..., s_{B-1}])`` seeds every env once; later episodes continue
  each env's own generator. ``env_seeds(seed, frames, B)`` gives distinct seeds per run and restart.

No training code and no models here (docs/design.md: envs import no models, tasks or trainers).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import numpy as np

from chronomem.envs.popgym import is_popgym, missing_hint
from chronomem.envs.popgym import wrap as wrap_popgym

try:  # the optional extra ``chronomem[rl]``
    import gymnasium as gym
    from gymnasium import spaces
except ModuleNotFoundError:  # pragma: no cover - exercised only without gymnasium
    gym = None


@dataclass(frozen=True)
class EnvPair:
    """Train on ``train`` (the small grid), evaluate on ``test`` (the large one)."""

    train: str
    test: str


# Paper 004, Table 3: "trained on the smaller version of the environment and tested on the larger version".
PAIRS: dict[str, EnvPair] = {
    "redbluedoors": EnvPair("MiniGrid-RedBlueDoors-6x6-v0", "MiniGrid-RedBlueDoors-8x8-v0"),
    "gotoobject": EnvPair("MiniGrid-GoToObject-6x6-N2-v0", "MiniGrid-GoToObject-8x8-N2-v0"),
    "memory": EnvPair("MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13-v0"),
    "gotodoor": EnvPair("MiniGrid-GoToDoor-5x5-v0", "MiniGrid-GoToDoor-8x8-v0"),
    "fetch": EnvPair("MiniGrid-Fetch-5x5-N2-v0", "MiniGrid-Fetch-8x8-N3-v0"),
    "doorkey": EnvPair("MiniGrid-DoorKey-5x5-v0", "MiniGrid-DoorKey-16x16-v0"),
}

# The words of MiniGrid's and BabyAI's missions. Id 0 pads a mission to ``max_words``, id 1 stands for
# a word not listed. The list is fixed (not grown from the missions seen) so that token ids, and with
# them a trained agent's word embeddings, mean the same in every run and every environment.
PAD, UNKNOWN = 0, 1
VOCABULARY: tuple[str, ...] = (
    "<pad>", "<unk>",
    # colours and objects (minigrid.core.constants)
    "red", "green", "blue", "purple", "yellow", "grey",
    "unseen", "empty", "wall", "floor", "door", "key", "ball", "box", "goal", "lava", "agent",
    "square", "object", "objects", "hallway", "room", "end",
    # the verbs and function words of the missions
    "a", "an", "the", "to", "of", "at", "and", "then", "after", "before", "next", "on", "your", "you", "must",
    "go", "get", "fetch", "pick", "up", "put", "open", "use", "find", "avoid", "reach", "matching", "left",
    "right", "behind", "front", "in", "it", "unlock", "locked", "closed", "first", "second", "third", "is",
    "that", "this", "same", "color", "colour", "near", "touch", "toggle", "drop", "carry",
)
WORD_IDS: dict[str, int] = {word: i for i, word in enumerate(VOCABULARY)}
VOCAB_SIZE = len(VOCABULARY)
MAX_WORDS = 32  # longer than every MiniGrid mission and BabyAI's usual ones

_WORD = re.compile(r"[a-z]+")


def tokenize(mission: str, max_words: int = MAX_WORDS) -> np.ndarray:
    """The token ids of ``mission`` (lower-cased words; punctuation dropped), padded with ``PAD`` to
    ``max_words``. A word not in ``VOCABULARY`` is ``UNKNOWN``; a longer mission is a ValueError."""
    words = _WORD.findall(mission.lower())
    if len(words) > max_words:
        raise ValueError(f"mission {mission!r} has {len(words)} words, more than max_words={max_words}")
    ids = np.full(max_words, PAD, dtype=np.int64)
    ids[: len(words)] = [WORD_IDS.get(word, UNKNOWN) for word in words]
    return ids


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


def _require_gymnasium() -> None:
    if gym is None:
        raise ModuleNotFoundError("environments need gymnasium (and MiniGrid): pip install 'chronomem[rl]'")


def _register_ids() -> None:
    """Import the packages whose import registers environment ids."""
    import chronomem.envs.ballet  # noqa: F401  (chronomem/Ballet-<level or mixture>[-symbolic]-v0)
    import chronomem.envs.popgym
    import chronomem.envs.recall  # noqa: F401  (chronomem/CueRecall-v0)

    chronomem.envs.popgym.register()  # popgym-<Name><Difficulty>-v0 when POPGym is installed
    try:
        import minigrid  # noqa: F401  (MiniGrid-*, BabyAI-*)
    except ModuleNotFoundError:  # MiniGrid ids then stay unknown: check_env_id says how to install it
        pass


def check_env_id(env_id: str) -> str:
    """``env_id`` if Gymnasium knows it, else a ValueError naming ``--env`` with the closest ids."""
    _require_gymnasium()
    _register_ids()
    if not isinstance(env_id, str) or env_id not in gym.registry:
        close = difflib.get_close_matches(str(env_id), list(gym.registry), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if str(env_id).startswith(("MiniGrid", "BabyAI")) and not any(k.startswith("MiniGrid") for k in gym.registry):
            hint = "; MiniGrid is not installed: pip install 'chronomem[rl]'"
        if is_popgym(env_id) and missing_hint(env_id):
            hint = f"; {missing_hint(env_id)}"
        pairs = ", ".join(f"{p.train} -> {p.test}" for p in PAIRS.values())
        raise ValueError(f"--env {env_id!r} is not a registered Gymnasium environment{hint} (paper 004's pairs: "
                         f"{pairs})")
    return env_id


def make_env(env_id: str, render_mode: str | None = None, max_words: int = MAX_WORDS, **options):
    """One environment ``env_id`` (any Gymnasium id; ``options`` go to ``gym.make``). MiniGrid and BabyAI
    environments get ``MissionTokens``, POPGym's ``chronomem.envs.popgym.wrap`` (its previous-action
    protocol and flat observations); Ballet's observations are batchable as they are."""
    check_env_id(env_id)
    env = gym.make(env_id, **options) if render_mode is None else gym.make(env_id, render_mode=render_mode, **options)
    if is_popgym(env_id):
        return wrap_popgym(env)
    space = env.observation_space
    if isinstance(space, spaces.Dict) and "mission" in space.spaces and "image" in space.spaces:
        env = MissionTokens(env, max_words)
    return env


def make_vector_env(env_id: str, num_envs: int, asynchronous: bool = False, **options):
    """``num_envs`` copies of ``make_env(env_id, **options)`` with same-step autoreset (module docstring)."""
    check_env_id(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    fns = [lambda: make_env(env_id, **options) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    if asynchronous:
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)


def env_seeds(seed: int, frames: int, num_envs: int) -> list[int]:
    """Distinct env seeds for a run with ``seed`` starting (or restarting) at ``frames``: a resumed run's
    environments restart with new episodes, not the ones of the run's beginning."""
    state = np.random.SeedSequence([int(seed), int(frames)]).generate_state(num_envs)
    return [int(s) for s in state]
