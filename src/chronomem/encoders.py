"""Observation encoders: an environment's observations -> ``x [B, N, dim]``, the input of any core.

Every encoder takes observations with a batch and a time dimension in front, ``[B, N, ...]`` (an agent
acting feeds ``N = 1``; a learner replays ``N = T`` steps), and returns ``[B, N, dim]``.

* ``FeatureEncoder``: float features ``[B, N, F]`` -> a linear layer.
* ``MiniGridEncoder``: MiniGrid's symbolic observation ``{"image": [B, N, 7, 7, 3], "direction":
  [B, N], "mission": [B, N, L]}`` (``chronomem.envs.minigrid``: the mission as token ids). Each cell
  of the 7x7 view is (object, colour, state); each index has its own embedding (an object's index is
  a category, not a quantity), the three are concatenated per cell and a small conv net reads the
  grid: rl-starter-files' (the code paper 004's MiniGrid agents built on) Conv 2x2 -> ReLU -> MaxPool
  2x2 -> Conv 2x2 -> ReLU -> Conv 2x2 -> ReLU, 16/32/64 channels, which leaves one 64-channel cell of
  a 7x7 view. The mission is a bag of word embeddings (the mean over its words): the missions of
  paper 004's environments are told apart by their colour and object words (GoToObject, GoToDoor,
  Fetch) or never change within an environment (DoorKey, Memory, RedBlueDoors). The direction the
  agent faces gets an embedding too. Image, direction and mission features are concatenated and
  projected to ``dim``.

  Deviations from rl-starter-files: embeddings of the cell indices in place of the raw integers as
  conv channels; a bag of words in place of its GRU over the mission; the direction (which it drops).

``encoder_for(observation_space, dim)`` picks one from a Gymnasium observation space.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from chronomem.layers import check_positive, check_tensor, parameter_dtype

# Sizes of MiniGrid's index tables (minigrid.core.constants: OBJECT_TO_IDX, COLOR_TO_IDX, STATE_TO_IDX),
# written here so that an encoder needs no MiniGrid install; tests/test_encoders.py checks them.
NUM_OBJECTS, NUM_COLORS, NUM_STATES, NUM_DIRECTIONS = 11, 6, 3, 4


class FeatureEncoder(nn.Module):
    """Float features ``[B, N, input_dim]`` -> ``[B, N, dim]`` (one linear layer)."""

    def __init__(self, input_dim: int, dim: int):
        super().__init__()
        self.input_dim, self.dim = check_positive(input_dim, "input_dim"), check_positive(dim, "dim")
        self.linear = nn.Linear(input_dim, dim)

    def forward(self, obs: Tensor) -> Tensor:
        return self.linear(check_tensor(obs, "obs", 3, self.input_dim, "[B, N, input_dim]",
                                        dtype=parameter_dtype(self)))


def _check_ids(x, name: str, shape: tuple, high) -> Tensor:
    """``x`` as int64 if it is an integer tensor ``[B, N, *shape]`` with values in ``[0, high)`` (``high``
    an int, or a tuple of one bound per entry of the last dimension)."""
    doc = f"[B, N{''.join(f', {s}' for s in shape)}]"
    if not isinstance(x, Tensor) or x.is_floating_point() or x.dtype == torch.bool:
        what = type(x).__name__ if not isinstance(x, Tensor) else f"dtype {x.dtype}"
        raise TypeError(f"{name} must be an integer tensor {doc}, got {what}")
    if x.dim() != 2 + len(shape) or tuple(x.shape[2:]) != tuple(shape) or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape {doc}, got {tuple(x.shape)}")
    x = x.long()
    bound = torch.tensor(high, device=x.device) if isinstance(high, tuple) else high
    if bool(((x < 0) | (x >= bound)).any()):
        raise ValueError(f"{name} must hold indices in [0, {high}), got values in [{int(x.min())}, {int(x.max())}]")
    return x


class MiniGridEncoder(nn.Module):
    """MiniGrid's symbolic observation -> ``[B, N, dim]`` (module docstring).

    ``view``: the side of the agent's view (7, MiniGrid's default); ``vocab_size`` and ``max_words``:
    the mission's token ids (``chronomem.envs.minigrid``); ``mission=False`` ignores the mission.
    """

    def __init__(self, dim: int, vocab_size: int, max_words: int, view: int = 7, embed_dim: int = 8,
                 word_dim: int = 32, channels: tuple[int, int, int] = (16, 32, 64), mission: bool = True):
        super().__init__()
        self.dim = check_positive(dim, "dim")
        self.view = check_positive(view, "view", minimum=4)  # the conv net needs 4x4 cells at least
        self.vocab_size = check_positive(vocab_size, "vocab_size")
        self.max_words = check_positive(max_words, "max_words")
        self.objects = nn.Embedding(NUM_OBJECTS, embed_dim)
        self.colors = nn.Embedding(NUM_COLORS, embed_dim)
        self.states = nn.Embedding(NUM_STATES, embed_dim)
        self.direction = nn.Embedding(NUM_DIRECTIONS, embed_dim)
        c1, c2, c3 = channels
        self.conv = nn.Sequential(
            nn.Conv2d(3 * embed_dim, c1, 2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 2), nn.ReLU(),
            nn.Conv2d(c2, c3, 2), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            image_features = self.conv(torch.zeros(1, 3 * embed_dim, view, view)).shape[1]
        self.mission = mission
        self.words = nn.Embedding(vocab_size, word_dim, padding_idx=0) if mission else None
        self.project = nn.Linear(image_features + embed_dim + (word_dim if mission else 0), dim)

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        if not isinstance(obs, dict) or not {"image", "direction"} <= set(obs):
            raise TypeError(f"obs must be a dict with 'image', 'direction' (and 'mission'), got "
                            f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        image = _check_ids(obs["image"], "obs['image']", (self.view, self.view, 3),
                           (NUM_OBJECTS, NUM_COLORS, NUM_STATES))  # (object, colour, state) per cell
        batch, steps = image.shape[:2]
        cells = torch.cat([self.objects(image[..., 0]), self.colors(image[..., 1]), self.states(image[..., 2])],
                          -1)  # [B, N, v, v, 3 * embed_dim]
        grid = self.conv(cells.flatten(0, 1).permute(0, 3, 1, 2))  # [B * N, features]
        features = [grid.view(batch, steps, -1),
                    self.direction(_check_ids(obs["direction"], "obs['direction']", (), NUM_DIRECTIONS))]
        if self.mission:
            if "mission" not in obs:
                raise TypeError("obs must hold 'mission' token ids (or build the encoder with mission=False)")
            tokens = _check_ids(obs["mission"], "obs['mission']", (self.max_words,), self.vocab_size)
            words = (tokens != 0).unsqueeze(-1).to(grid.dtype)  # padding (id 0) is not a word
            features.append((self.words(tokens) * words).sum(-2) / words.sum(-2).clamp_min(1.0))
        return self.project(torch.cat(features, -1))


def encoder_for(observation_space, dim: int) -> nn.Module:
    """The encoder of a Gymnasium observation space: a MiniGrid dict (``image`` [v, v, 3], ``direction``,
    ``mission`` token ids) or a 1-D float ``Box``."""
    spaces = getattr(observation_space, "spaces", None)
    if isinstance(spaces, dict) and "image" in spaces and "direction" in spaces:
        view = spaces["image"].shape[0]
        if spaces["image"].shape != (view, view, 3):
            raise ValueError(f"a MiniGrid image must be [view, view, 3], got {spaces['image'].shape}")
        mission = spaces.get("mission")
        if mission is None:
            return MiniGridEncoder(dim, vocab_size=1, max_words=1, view=view, mission=False)
        if mission.dtype.kind not in "iu" or len(mission.shape) != 1:
            raise TypeError("obs 'mission' must be token ids (wrap the env with chronomem.envs.minigrid."
                            f"MissionTokens), got the space {mission}")
        return MiniGridEncoder(dim, vocab_size=int(mission.high.max()) + 1, max_words=mission.shape[0], view=view)
    shape, dtype = getattr(observation_space, "shape", None), getattr(observation_space, "dtype", None)
    if spaces is None and shape is not None and len(shape) == 1 and dtype is not None and dtype.kind == "f":
        return FeatureEncoder(shape[0], dim)
    raise TypeError(f"no encoder for the observation space {observation_space}: expected a MiniGrid dict "
                    "(image, direction, mission) or a 1-D float Box")
