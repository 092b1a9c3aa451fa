"""MiniGrid for agents: the mission as tokens and the train/test pairs of paper 004 (Sec. 3.2, Table 3).

* A MiniGrid observation is ``{"image": uint8 [7, 7, 3], "direction": int, "mission": str}``:
  ``tokenize`` turns the mission string into ``max_words`` int64 token ids (``VOCABULARY``), so that
  every observation is a fixed-shape array a vector env can batch (the Gymnasium wrapper that does it
  is ``chronomem.envs.wrappers.MissionTokens``, which ``chronomem.envs.make`` adds to every MiniGrid and
  BabyAI environment).
* The agent's 7x7x3 view (object, colour, state per cell) has the same shape in every grid size,
  which is what lets an agent trained on a small grid be evaluated on a large one (``PAIRS``).

No training code, no models and no gymnasium here (docs/design.md: envs import no models, tasks or
trainers; the tasks and experiments read these facts without importing gymnasium).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


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
