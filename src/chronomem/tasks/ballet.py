"""Supervised Ballet: the dataset built from the Ballet world (paper 001 App. B.1).

The world itself (facts, dances, layouts, rendering and the Gymnasium ``BalletEnv``) lives in
``chronomem.envs.ballet``; this module turns its episodes into batches and needs no gymnasium.

``SupervisedBallet`` (task ``"ballet"``; ``MixedBallet`` with ``level="mixed"``) is the CPU-friendly
variant used by the experiments: the observation stream of an episode up to and including the cue
while the agent stands still, one feature vector per step, and the label is the target dancer's cell
(an index into ``DANCER_CELLS``; 8 classes, chance 1/n since only n cells hold a dancer). Its
episodes are generated directly and vectorised (dance trajectories from cumulative moves), and the
tests check that they equal stepping ``BalletEnv`` on the same episode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from chronomem.checks import check_positive
from chronomem.envs.ballet_world import (
    AGENT_START,
    CH_AGENT,
    CH_COLOUR,
    CH_SHAPE,
    CH_WALL,
    COLOURS,
    DANCE_OFFSETS,
    DANCER_CELLS,
    DANCES,
    LEVELS,
    ROOM_SIZE,
    SHAPES,
    SYMBOLIC_CHANNELS,
    VOCAB,
    WATCH,
    Layout,
    cue_step,
    moves_done,
    parse_level,
)
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

QUESTIONS = ("target", "every_dancer")  # what the supervised task asks at the cue (SupervisedBallet)


# --------------------------------------------------------------------------------------------
# Supervised Ballet: classify the target's cell from the stream up to the cue
# --------------------------------------------------------------------------------------------


@dataclass
class Episodes:
    """A batch of layouts as tensors: ``cells, dances, shapes, colours [B, n]`` and ``target [B]``."""

    cells: Tensor
    dances: Tensor
    shapes: Tensor
    colours: Tensor
    target: Tensor

    def layout(self, b: int) -> Layout:
        row = lambda k: tuple(int(v) for v in getattr(self, k)[b])
        return Layout(row("cells"), row("dances"), row("shapes"), row("colours"), target=int(self.target[b]))

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> Episodes:
        get = lambda k: torch.tensor([getattr(lay, k) for lay in layouts], dtype=torch.long)
        return cls(get("cells"), get("dances"), get("shapes"), get("colours"), get("target"))

    @property
    def labels(self) -> Tensor:
        return self.cells.gather(1, self.target[:, None])[:, 0]


class SupervisedBallet(Task):
    """The observation stream of a Ballet episode up to the cue, then a classification.

    Step ``t = 0 .. n * (delay + 15)`` of the input is the environment's observation at step ``t``
    while the agent stands still (its actions are ignored until then anyway); the last step carries
    the target's dance name, every earlier one ``"watch"``. The label is the target dancer's cell, an
    index into ``DANCER_CELLS`` (``num_classes = 8``; only the ``n`` occupied cells can be right, so
    chance is 1/n). Length ``n * (delay + 15) + 1``, no padding (``mask`` is None), ``causal``.

    ``observation`` chooses the feature vector of a step (the instruction is always a 14-way one-hot
    appended at the end):

    * ``"symbolic"`` (default, 81 + 14 = 95 features): which of the 81 room cells hold a dancer. The
      agent, walls and dancer looks never change within an episode and the label is a cell, so the
      shapes and colours carry nothing a model needs (the paper: they "merely served to distinguish
      the dancers"); the cells alone tell the dancers apart because each stays in its own 3x3 block.
    * ``"symbolic_full"`` (11 * 11 * 36 + 14 = 4370 features): the environment's whole symbolic
      observation, flattened. Faithful but large; meant for checks and small runs.

    Episodes are drawn vectorised from ``generator`` (``split`` only selects the evaluation seed in
    ``eval_batches``): ``sample_episodes`` draws layouts and ``encode`` renders their streams.

    ``questions`` (our training protocol, not the paper's; the paper's agents learn by RL):

    * ``"target"`` (default): the episode above, ``kind="classify"``, ``targets [B]``.
    * ``"every_dancer"``: the same stream up to the cue, then one question per dancer, ``n`` steps
      in all: each is the cue frame with one dancer's dance name, the target's first and the others
      in random order. ``kind="tag"``: ``targets [B, L + n - 1]`` holds each question's answer (the
      asked dancer's cell; 0 elsewhere), ``loss_mask`` marks the ``n`` questions and ``score_mask``
      only the first. The first ``L`` steps are exactly the ``"target"`` episode, so for a causal
      model the accuracy is that of the single-question task, while the loss gets ``n`` answers per
      episode instead of one (like MEMO's data, which asks several questions of one memory).
    """

    name = "ballet"
    num_classes = len(DANCER_CELLS)
    causal = True

    def __init__(self, level: str = "8_delay48", observation: str = "symbolic", questions: str = "target"):
        self.level = level
        self.num_dancers, self.delay = parse_level(level)
        if observation not in ("symbolic", "symbolic_full"):
            raise ValueError(f"observation must be 'symbolic' or 'symbolic_full', got {observation!r}")
        if questions not in QUESTIONS:
            raise ValueError(f"questions must be one of {QUESTIONS}, got {questions!r}")
        self.observation, self.questions = observation, questions
        self.length = cue_step(self.num_dancers, self.delay) + 1  # of the stream up to the cue
        room = (ROOM_SIZE - 2) ** 2
        view = ROOM_SIZE * ROOM_SIZE * SYMBOLIC_CHANNELS
        self.input_dim = (room if observation == "symbolic" else view) + len(VOCAB)
        self._moves = torch.from_numpy(moves_done(self.num_dancers, self.delay, self.length))  # [L, n]
        self._offsets = torch.from_numpy(DANCE_OFFSETS)  # [13, 17, 2]
        self._cells = torch.tensor(DANCER_CELLS)  # [8, 2]

    @property
    def kind(self) -> str:
        return "classify" if self.questions == "target" else "tag"

    def sample_episodes(self, batch_size: int, generator: torch.Generator) -> Episodes:
        """Layouts as in ``sample_layout``: permutations via argsort of uniform noise."""
        check_positive(batch_size, "batch_size")
        n = self.num_dancers

        def pick(k):
            return torch.rand(batch_size, k, generator=generator).argsort(dim=1)[:, :n]

        target = torch.randint(n, (batch_size,), generator=generator)
        cells, dances = pick(len(DANCER_CELLS)), pick(len(DANCES))
        return Episodes(cells, dances, pick(len(SHAPES)), pick(len(COLOURS)), target)

    def positions(self, episodes: Episodes) -> Tensor:
        """``[B, L, n, 2]`` (row, col) of every dancer at every step: its cell plus the displacement
        after the moves it has made by then (cumulative moves of its dance)."""
        steps = self._moves[None].expand(episodes.dances.shape[0], -1, -1)  # [B, L, n]
        dance = episodes.dances[:, None, :].expand_as(steps)
        return self._cells[episodes.cells][:, None] + self._offsets[dance, steps]

    def encode(self, episodes: Episodes) -> Tensor:
        """``[B, L, input_dim]`` float features of the streams of ``episodes``."""
        B, L, n = episodes.cells.shape[0], self.length, self.num_dancers
        pos = self.positions(episodes)  # [B, L, n, 2]
        b = torch.arange(B)[:, None, None].expand(B, L, n)
        t = torch.arange(L)[None, :, None].expand(B, L, n)
        if self.observation == "symbolic":
            cells = torch.zeros(B, L, ROOM_SIZE - 2, ROOM_SIZE - 2)
            cells[b, t, pos[..., 0] - 1, pos[..., 1] - 1] = 1.0  # interior cells hold row/col 1..9
            view = cells.flatten(2)
        else:  # the egocentric grid equals the board: the agent stays at the centre
            grid = torch.zeros(B, L, ROOM_SIZE, ROOM_SIZE, SYMBOLIC_CHANNELS)
            grid[:, :, [0, -1], :, CH_WALL] = 1.0
            grid[:, :, :, [0, -1], CH_WALL] = 1.0
            grid[:, :, AGENT_START[0], AGENT_START[1], CH_AGENT] = 1.0
            shapes = CH_SHAPE + episodes.shapes[:, None, :].expand(B, L, n)
            colours = CH_COLOUR + episodes.colours[:, None, :].expand(B, L, n)
            grid[b, t, pos[..., 0], pos[..., 1], shapes] = 1.0
            grid[b, t, pos[..., 0], pos[..., 1], colours] = 1.0
            view = grid.flatten(2)
        instruction = torch.zeros(B, L, len(VOCAB))
        instruction[:, :-1, WATCH] = 1.0
        target_dance = episodes.dances.gather(1, episodes.target[:, None])[:, 0]
        instruction[torch.arange(B), -1, 1 + target_dance] = 1.0  # the cue: the target's dance name
        return torch.cat([view, instruction], dim=-1)

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        episodes = self.sample_episodes(batch_size, generator)
        inputs = self.encode(episodes)
        if self.questions == "target":
            return Batch(inputs, episodes.labels)
        return self.ask_every_dancer(episodes, inputs, generator)

    def ask_every_dancer(self, episodes: Episodes, inputs: Tensor, generator: torch.Generator) -> Batch:
        """``questions="every_dancer"``: the cue frame once per dancer, each time with that dancer's dance
        name (the target's first, the others in random order); the answers at those steps, the loss on
        all of them, the score on the first."""
        B, L, n = inputs.shape[0], self.length, self.num_dancers
        others = torch.rand(B, n, generator=generator)
        others.scatter_(1, episodes.target[:, None], -1.0)  # the target sorts first: it is the cue
        asked = others.argsort(dim=1)  # [B, n] dancer of each question
        questions = inputs[:, -1:].repeat(1, n, 1)  # the cue frame: dancers at rest, an instruction
        questions[..., -len(VOCAB):] = 0.0
        names = 1 + episodes.dances.gather(1, asked)  # instruction token: the asked dancer's dance
        questions.scatter_(2, (inputs.shape[-1] - len(VOCAB) + names)[..., None], 1.0)
        targets = torch.zeros(B, L + n - 1, dtype=torch.long)
        targets[:, L - 1 :] = episodes.cells.gather(1, asked)
        loss_mask = torch.zeros(B, L + n - 1, dtype=torch.bool)
        loss_mask[:, L - 1 :] = True
        score_mask = torch.zeros_like(loss_mask)
        score_mask[:, L - 1] = True
        inputs = torch.cat([inputs[:, :-1], questions], dim=1)
        return Batch(inputs, targets, loss_mask=loss_mask, score_mask=score_mask)

    def describe(self) -> dict:
        return {"name": self.name, "level": self.level, "observation": self.observation,
                "questions": self.questions}


def observation_features(obs: dict, observation: str = "symbolic") -> np.ndarray:
    """The ``SupervisedBallet`` feature vector of one symbolic ``BalletEnv`` observation (while the
    agent is at the centre): what ``SupervisedBallet.encode`` computes for a whole stream at once."""
    grid = obs["grid"]
    instruction = np.eye(len(VOCAB), dtype=np.float32)[obs["instruction"]]
    if observation == "symbolic":
        view = grid[1:-1, 1:-1, CH_SHAPE:CH_COLOUR].sum(-1).reshape(-1)  # a dancer has one shape bit
    elif observation == "symbolic_full":
        view = grid.reshape(-1)
    else:
        raise ValueError(f"observation must be 'symbolic' or 'symbolic_full', got {observation!r}")
    return np.concatenate([view.astype(np.float32), instruction])


class MixedBallet(Task):
    """The paper's training distribution (App. B.1): "levels uniformly sampled to have 16 or 48 steps
    of delay between dances, and 2, 4, or 8 dances", one agent for all levels.

    Each batch is one level drawn uniformly from ``levels`` (a batch of one level needs no padding,
    and a 2-dancer batch costs an eighth of an ``8_delay48`` one); its examples are those of
    ``SupervisedBallet(level)``. Evaluate a trained model on single levels with ``SupervisedBallet``.
    """

    name = "ballet"
    num_classes = len(DANCER_CELLS)
    causal = True

    def __init__(self, levels: tuple[str, ...] = LEVELS, observation: str = "symbolic", questions: str = "target"):
        if isinstance(levels, str) or not levels:
            raise ValueError(f"levels must be a non-empty sequence of levels like {LEVELS}, got {levels!r}")
        self.levels = tuple(levels)
        self.tasks = tuple(SupervisedBallet(level, observation, questions) for level in self.levels)
        self.observation, self.questions = observation, questions
        self.input_dim = self.tasks[0].input_dim

    @property
    def kind(self) -> str:
        return self.tasks[0].kind

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        # A mixture of one level draws no level, so that it is that level batch for batch (the same
        # test set, the same accuracy).
        level = int(torch.randint(len(self.tasks), (1,), generator=generator)) if len(self.tasks) > 1 else 0
        return self.tasks[level].sample(batch_size, generator, split)

    def describe(self) -> dict:
        return {"name": self.name, "level": "mixed", "levels": list(self.levels), "observation": self.observation,
                "questions": self.questions}


@register_task("ballet")
def ballet_task(
    level: str = "8_delay48", observation: str = "symbolic", levels=None, questions: str = "target"
) -> Task:
    """Task ``"ballet"``: ``SupervisedBallet(level)``, or with ``level="mixed"`` the paper's mixture of
    ``levels`` (default: all six) as ``MixedBallet``; ``questions`` as in ``SupervisedBallet``."""
    if level == "mixed":
        return MixedBallet(LEVELS if levels is None else tuple(levels), observation, questions)
    if levels is not None:
        raise ValueError(f"levels is only used with level='mixed', got level={level!r}")
    return SupervisedBallet(level, observation, questions)
