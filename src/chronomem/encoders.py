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

  The embeddings and the first convolution run as one function of the ids (``chronomem.ops.embed_conv``,
  ``cell_impl``: folded into one convolution of the one-hot ids for a learner's replay, the same values
  and gradients up to summation order).

  Deviations from rl-starter-files: embeddings of the cell indices in place of the raw integers as
  conv channels; a bag of words in place of its GRU over the mission; the direction (which it drops).

* ``BalletEncoder``: Ballet's observation (``chronomem.envs.ballet``) ``{"grid": uint8 [B, N, 11, 11, 36]``
  (symbolic) or ``"image": uint8 [B, N, 99, 99, 3]`` (pixels), ``"instruction": [B, N]}``. The visual
  encoder is paper 001's (App. A, Table 1, Ballet column: a CNN of 16, 32, 32 channels, filters 9, 3, 3,
  strides 9, 1, 1, ReLU): on pixels the 9x9 stride-9 layer reads one 9x9-pixel cell at a time; on the
  symbolic grid, where a cell is already one vector, the first layer is a 1x1 convolution (the same
  per-cell map), and the 3x3 layers follow unchanged (padding 1, so the 11x11 grid of cells is kept).
  The instruction is one token per step (``"watch"`` or a dance name), embedded (32 dimensions, the
  paper's word embedding): the paper's 1-layer LSTM over the words of an instruction has a single
  word to read here, so we use the word's embedding itself (deviation: no LSTM). Grid and word are
  concatenated and projected to ``dim``. ``decoder(width)`` builds the reconstruction decoder of
  App. A.1 ("architectural transposes of the encoders, with independent weights"):
  ``default_reconstruction = 1`` (App. A Table 1's weight; App. D.4 shows Ballet needs it).
  ``visual="cells"`` (deviation, CPU-sized: the ``quick`` scale of ``ballet-rl``) keeps only the
  per-cell layer (the 1x1 convolution, or on pixels the 9x9 stride-9 one) and drops the two 3x3
  layers, so the projection reads the cells directly; its decoder is the same map transposed. A
  frame then costs about a tenth of the CNN's multiply-adds in the encoder and in the decoder
  (docs/rl.md, "A Ballet agent sized for a CPU"). ``chronomem.ops.cell_map`` computes that per-cell
  map and the projection (``cell_impl``): where every cell holds at most one symbol, as on Visual
  Match's board, the ReLU of the map is a table lookup, folded into the projection's weights.
  The same encoder reads a grid of cells with no instruction (``vocab_size=0``, rectangular ``view``):
  Visual Match's and Key-to-Door's ``{"grid": [H, W, 9]}`` or ``{"image": [H, W, 3]}``, one pixel per cell
  (``chronomem.envs.tvt``; paper 001 encodes its DMLab frames with a ResNet, our 2D boards need none).
* ``SpacesEncoder``: a dict of ``Discrete`` / ``MultiDiscrete`` / 1-D ``Box`` parts (POPGym's
  observations, ``chronomem.envs.popgym``): each discrete index has an embedding (a ``MultiDiscrete``
  part one table per component), a ``Box`` part a linear map, and the encoder returns their sum:
  a linear layer over the concatenated one-hot codes and float features, computed without
  building the one-hot vectors.

* ``PatchEncoder``: an image as a raster-ordered sequence of patches (papers 002 and 003, after ViT,
  Dosovitskiy et al. 2020): each step is one patch's pixels followed by the image coordinates of its
  centre, ``[B, N, C * p * p + 2]`` (``chronomem.tasks.images.patchify``). A linear map embeds the
  pixels (ViT's patch embedding) and a fixed 2-D sinusoid of the patch's row and column is added
  (half the width each). Positions are measured in patches of the *training* grid (``grid`` patches
  per side; training patches sit at 0, 1, ..., grid - 1), so an image of another resolution gets
  the positions of the same places in the image: at 2x resolution the patches fall between the
  trained positions (0.5 apart) and span the same range, which is how ViT transfers to a new
  resolution (its Sec. 3.2 interpolates the learned positions in 2-D; sinusoids interpolate by
  themselves). Indices counted in patches (0 .. 2 * grid - 1) would put half the image at
  positions never trained on. ``positions="learned"`` is ViT's own scheme in place of the sinusoids:
  a learned table of one vector per patch of the training grid (``[grid, grid, dim]``), added to the
  patch embedding; at another resolution the table is resized to that grid by 2-D bilinear
  interpolation (ViT Sec. 3.2, "Fine-tuning and higher resolution"). Between the trained entries it
  holds no more than their blend, where the sinusoids hold a code the model may have learned to read:
  the decisive test of whether our sinusoids hand ViT its resolution invariance (docs/images.md).

``encoder_for(observation_space, dim)`` picks one from a Gymnasium observation space.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_positive, check_tensor, parameter_dtype
from chronomem.layers import sinusoid_from_positions
from chronomem.ops.cell_map import cell_map, check_cell_impl
from chronomem.ops.embed_conv import embed_conv

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


class PatchEncoder(nn.Module):
    """Patches with their centres ``[B, N, channels * patch_size**2 + 2]`` -> ``[B, N, dim]`` (module
    docstring): ``Linear(pixels) + position code``, where the last two features are the centre's row
    and column as fractions of the image's height and width (in ``(0, 1)``).

    ``positions``: ``"sinusoid"`` (the default) adds ``[sin2d(row) ; sin2d(col)]`` of the positions
    ``fraction * grid - 0.5``, in patches of the training grid; ``"learned"`` adds ViT's learned
    table of one vector per patch of the training grid, ``grid`` x ``grid``, resized bilinearly to
    the grid of an image of another resolution (``learned_positions``)."""

    POSITIONS = ("sinusoid", "learned")

    def __init__(self, channels: int, patch_size: int, dim: int, grid: int, positions: str = "sinusoid"):
        super().__init__()
        self.channels, self.patch_size = check_positive(channels, "channels"), check_positive(patch_size, "patch_size")
        self.dim, self.grid = check_positive(dim, "dim"), check_positive(grid, "grid")
        if positions not in self.POSITIONS:
            raise ValueError(f"positions must be one of {self.POSITIONS}, got {positions!r}")
        self.position_scheme = positions
        if positions == "sinusoid" and dim % 4:
            raise ValueError(f"dim of a PatchEncoder must be a multiple of 4 (sin and cos of row and column), "
                             f"got {dim}")
        self.pixels = channels * patch_size * patch_size
        self.input_dim = self.pixels + 2
        self.linear = nn.Linear(self.pixels, dim)
        if positions == "learned":
            # ViT's position embeddings (Dosovitskiy et al. 2020, Sec. 3.1), one per patch of the training
            # grid, kept as the 2-D grid they are resized on; initialised N(0, 0.02) as in the authors' code
            # (vit_jax AddPositionEmbs, "from BERT"; timm draws a truncated normal of the same std).
            self.table = nn.Parameter(torch.empty(grid, grid, dim))
            nn.init.normal_(self.table, std=0.02)

    def sinusoid_positions(self, centres: Tensor) -> Tensor:
        """The 2-D sinusoid code ``[..., dim]`` of patch centres ``[..., 2]`` (row, column fractions)."""
        pos = centres * self.grid - 0.5  # in patches of the training grid: 0, 1, ..., grid - 1 there
        return torch.cat([sinusoid_from_positions(pos[..., 0], self.dim // 2),
                          sinusoid_from_positions(pos[..., 1], self.dim // 2)], -1)

    def table_at(self, side: int) -> Tensor:
        """The learned table ``[side, side, dim]`` for an image of ``side`` x ``side`` patches: as trained
        at the training grid, else resized by 2-D bilinear interpolation (ViT Sec. 3.2: "we perform 2D
        interpolation of the pre-trained position embeddings, according to their location in the
        original image"). ``align_corners=False`` takes each entry as the value at its patch's centre,
        so an entry of the new grid is read at ``fraction * grid - 0.5`` trained patches, the very place
        the sinusoid scheme gives it, and the two schemes differ only in the code found there. timm
        resizes with the same convention (bicubic); the authors' JAX code (scipy.ndimage.zoom, order 1)
        aligns the corner entries instead (the outer entries move out to the new outer patches)."""
        if side == self.grid:
            return self.table
        grid = self.table.permute(2, 0, 1).unsqueeze(0)  # [1, dim, grid, grid]: channels first for interpolate
        resized = F.interpolate(grid, size=(side, side), mode="bilinear", align_corners=False)
        return resized[0].permute(1, 2, 0)

    def learned_positions(self, centres: Tensor) -> Tensor:
        """The learned code ``[..., N, dim]`` of the centres ``[..., N, 2]`` of an image's ``N = side**2``
        patches: the entry of the table resized to ``side`` x ``side`` at each patch's row and column."""
        n = centres.shape[-2] if centres.dim() >= 2 else 0
        side = math.isqrt(n)
        if side * side != n or n == 0:
            raise ValueError(f"positions='learned' needs the patches of a square grid (side * side of them), got "
                             f"{n} patches")
        cell = (centres * side).long().clamp(0, side - 1)  # [..., N, 2] the patch's row and column in its grid
        return self.table_at(side)[cell[..., 0], cell[..., 1]]

    def positions(self, centres: Tensor) -> Tensor:
        """The position code ``[..., N, dim]`` of patch centres ``[..., N, 2]`` in this encoder's scheme."""
        if self.position_scheme == "learned":
            return self.learned_positions(centres)
        return self.sinusoid_positions(centres)

    def forward(self, obs: Tensor) -> Tensor:
        obs = check_tensor(obs, "obs", 3, self.input_dim, f"[B, N, channels * patch_size**2 + 2 = {self.input_dim}]",
                           dtype=parameter_dtype(self))
        centres = obs[..., self.pixels:]
        if bool(((centres <= 0) | (centres >= 1)).any()):
            raise ValueError("obs must end with each patch's centre as (row, column) fractions of the image in "
                             f"(0, 1), got values in [{float(centres.min())}, {float(centres.max())}]")
        return self.linear(obs[..., :self.pixels]) + self.positions(centres).to(obs.dtype)


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
    outside = (x < 0) | (x >= bound)
    if torch.compiler.is_compiling():  # a graph reads no value: an assert the device checks (a GPU, unsynced)
        torch._assert_async(~outside.any(), f"{name} must hold indices in [0, {high})")
    elif bool(outside.any()):
        raise ValueError(f"{name} must hold indices in [0, {high}), got values in [{int(x.min())}, {int(x.max())}]")
    return x


class MiniGridEncoder(nn.Module):
    """MiniGrid's symbolic observation -> ``[B, N, dim]`` (module docstring).

    ``view``: the side of the agent's view (7, MiniGrid's default); ``vocab_size`` and ``max_words``:
    the mission's token ids (``chronomem.envs.minigrid``); ``mission=False`` ignores the mission;
    ``cell_impl``: how the cell embeddings and the first convolution are computed (``chronomem.ops.embed_conv``).
    """

    def __init__(self, dim: int, vocab_size: int, max_words: int, view: int = 7, embed_dim: int = 8,
                 word_dim: int = 32, channels: tuple[int, int, int] = (16, 32, 64), mission: bool = True,
                 cell_impl: str = "auto"):
        super().__init__()
        self.cell_impl = check_cell_impl(cell_impl)
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
        first = self.conv[0]  # the cells' embeddings, concatenated, through the first convolution
        grid = embed_conv(image.flatten(0, 1), [self.objects.weight, self.colors.weight, self.states.weight],
                          first.weight, first.bias, impl=self.cell_impl)
        grid = self.conv[1:](grid)  # [B * N, features]
        features = [grid.view(batch, steps, -1),
                    self.direction(_check_ids(obs["direction"], "obs['direction']", (), NUM_DIRECTIONS))]
        if self.mission:
            if "mission" not in obs:
                raise TypeError("obs must hold 'mission' token ids (or build the encoder with mission=False)")
            tokens = _check_ids(obs["mission"], "obs['mission']", (self.max_words,), self.vocab_size)
            words = (tokens != 0).unsqueeze(-1).to(grid.dtype)  # padding (id 0) is not a word
            features.append((self.words(tokens) * words).sum(-2) / words.sum(-2).clamp_min(1.0))
        return self.project(torch.cat(features, -1))


class BalletEncoder(nn.Module):
    """Ballet's observation -> ``[B, N, dim]`` (module docstring).

    ``observation``: ``"symbolic"`` (``grid``) or ``"pixels"`` (``image``); ``vocab_size``: the
    instruction's tokens (0: observations without one, a grid alone, as Visual Match's); ``view``: cells
    per side, or ``(rows, cols)``; ``symbols``: channels of a symbolic cell;
    ``cell_pixels``: pixels per cell side; ``visual``: ``"cnn"`` (paper 001's three layers) or
    ``"cells"`` (its per-cell layer alone, module docstring: a linear map of each cell's vector, its
    symbols or its 9x9x3 pixels, computed channels last)."""

    default_reconstruction = 1.0  # paper 001, App. A Table 1 (Ballet)
    VISUALS = ("cnn", "cells")

    def __init__(self, dim: int, observation: str = "symbolic", vocab_size: int = 14, view: int | tuple[int, int] = 11,
                 symbols: int = 36, cell_pixels: int = 9, channels: tuple[int, int, int] = (16, 32, 32),
                 word_dim: int = 32, visual: str = "cnn", cell_impl: str = "auto"):
        super().__init__()
        if observation not in ("symbolic", "pixels"):
            raise ValueError(f"observation must be 'symbolic' or 'pixels', got {observation!r}")
        if visual not in self.VISUALS:
            raise ValueError(f"visual must be one of {self.VISUALS}, got {visual!r}")
        self.dim = check_positive(dim, "dim")
        self.observation, self.key, self.visual = observation, "grid" if observation == "symbolic" else "image", visual
        self.cell_impl = check_cell_impl(cell_impl)
        if cell_impl == "folded" and observation != "symbolic":
            raise ValueError("cell_impl='folded' needs observation='symbolic' (pixels are not one-hot symbols)")
        self.vocab_size = check_positive(vocab_size, "vocab_size", minimum=0)
        rows, cols = (view, view) if not isinstance(view, (tuple, list)) else view
        self.view = (check_positive(rows, "view"), check_positive(cols, "view"))  # (rows, cols) of cells
        self.symbols = check_positive(symbols, "symbols")
        self.cell_pixels, self.channels = check_positive(cell_pixels, "cell_pixels"), tuple(channels)
        c1, c2, c3 = self.channels
        if visual == "cnn":
            first = (nn.Conv2d(symbols, c1, 1) if observation == "symbolic"
                     else nn.Conv2d(3, c1, cell_pixels, stride=cell_pixels))
            self.conv = nn.Sequential(first, nn.ReLU(), nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.Flatten())
        else:  # the same per-cell map as the CNN's first layer, as a linear layer over each cell's vector
            self.cells = nn.Linear(self.cell_inputs, c1)
        self.words = nn.Embedding(vocab_size, word_dim) if vocab_size else None
        self.project = nn.Linear(self.cell_features * rows * cols + (word_dim if vocab_size else 0), dim)

    @property
    def cell_inputs(self) -> int:
        """The numbers that describe one cell: its symbols, or its pixels and their colours."""
        return self.symbols if self.observation == "symbolic" else self.cell_pixels**2 * 3

    @property
    def cell_features(self) -> int:
        """Features per cell that the projection reads: the last layer's channels."""
        return self.channels[2] if self.visual == "cnn" else self.channels[0]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        rows, cols = self.view
        if self.observation == "symbolic":
            return (rows, cols, self.symbols)
        return (rows * self.cell_pixels, cols * self.cell_pixels, 3)

    def reconstruction_targets(self, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(picture, instruction [B, N] int64, or None without one)`` of a checked observation: the
        encoder's inputs, and what ``BalletDecoder`` reconstructs. ``picture`` is in [0, 1]: ``[B, N, C, H,
        W]`` for the CNN, ``[B, N, rows, cols, cell_inputs]`` (one vector per cell) for ``visual="cells"``."""
        keys = {self.key, "instruction"} if self.vocab_size else {self.key}
        if not isinstance(obs, dict) or not keys <= set(obs):
            raise TypeError(f"obs must be a dict with {' and '.join(map(repr, sorted(keys)))} (observation="
                            f"{self.observation!r}), got "
                            f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        picture, key = obs[self.key], f"obs[{self.key!r}]"
        doc = f"[B, N, {', '.join(map(str, self.input_shape))}]"
        if not isinstance(picture, Tensor) or picture.is_floating_point() or picture.dtype == torch.bool:
            what = f"dtype {picture.dtype}" if isinstance(picture, Tensor) else type(picture).__name__
            raise TypeError(f"{key} must be an integer tensor {doc} (uint8), got {what}")
        if picture.dim() != 5 or tuple(picture.shape[2:]) != self.input_shape or 0 in picture.shape[:2]:
            raise ValueError(f"{key} must have shape {doc}, got {tuple(picture.shape)}")
        high = 1 if self.observation == "symbolic" else 255  # one-hot symbols; 8-bit pixels
        if picture.dtype != torch.uint8 and bool(((picture < 0) | (picture > high)).any()):
            raise ValueError(f"{key} must hold values in [0, {high}], got [{int(picture.min())}, {int(picture.max())}]")
        instruction = None
        if self.vocab_size:
            instruction = _check_ids(obs["instruction"], "obs['instruction']", (), self.vocab_size)
        # No int64 copy of the pixels: straight to floats in [0, 1] (the paper's pixel range).
        picture = picture.to(parameter_dtype(self))
        if high != 1:
            picture = picture / high
        if self.visual == "cnn":
            return picture.permute(0, 1, 4, 2, 3), instruction  # channels first
        if self.observation == "pixels":  # [.., 99, 99, 3] -> the 9x9x3 pixels of each of the 11x11 cells
            batch, steps, (rows, cols), p = *picture.shape[:2], self.view, self.cell_pixels
            picture = picture.view(batch, steps, rows, p, cols, p, 3).transpose(3, 4)
            picture = picture.reshape(batch, steps, rows, cols, -1)
        return picture, instruction

    def encode(self, picture: Tensor, instruction: Tensor | None) -> Tensor:
        """``[B, N, dim]`` from ``reconstruction_targets``' output (so a learner checks and converts once)."""
        batch, steps = picture.shape[:2]
        if self.visual == "cnn":
            grid = self.conv(picture.flatten(0, 1)).view(batch, steps, -1)
            return self.project(grid if instruction is None else torch.cat([grid, self.words(instruction)], -1))
        # the per-cell map and the projection in one (chronomem.ops.cell_map: folded for one-hot cells)
        return cell_map(picture.flatten(2, 3), self.cells.weight, self.cells.bias, self.project.weight,
                        self.project.bias, None if instruction is None else self.words(instruction),
                        impl=self.cell_impl if self.observation == "symbolic" else "reference")

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        return self.encode(*self.reconstruction_targets(obs))

    def decoder(self, width: int) -> BalletDecoder:
        """The reconstruction decoder from the core's output of ``width`` (paper 001, App. A.1)."""
        return BalletDecoder(self, width)


class BalletDecoder(nn.Module):
    """Paper 001's reconstruction of each step's observation from the core's output (App. A.1): the
    transpose of the visual encoder (a linear map back to the 11x11 grid of cells, then transposed
    convolutions mirroring the encoder's, or with ``visual="cells"`` the per-cell linear map
    transposed; independent weights) and a linear map to the instruction's token logits.
    ``decoder(y, picture, instruction)`` (the targets from the encoder's ``reconstruction_targets(obs)``)
    returns the loss of each step ``[B, N]``: the sigmoid cross-entropy of the picture (pixels scaled
    to [0, 1], or the 0/1 symbols) averaged over pixels and channels, plus the softmax cross-entropy of
    the instruction (one word per step: the paper's sum over the instruction's words is this one term)."""

    def __init__(self, encoder: BalletEncoder, width: int):
        super().__init__()
        c1, c2, c3 = encoder.channels
        (rows, cols), self.visual = encoder.view, encoder.visual
        self.unproject = nn.Linear(check_positive(width, "width"), encoder.cell_features * rows * cols)
        if self.visual == "cnn":
            self.shape = (c3, rows, cols)
            last = (nn.ConvTranspose2d(c1, encoder.symbols, 1) if encoder.observation == "symbolic"
                    else nn.ConvTranspose2d(c1, 3, encoder.cell_pixels, stride=encoder.cell_pixels))
            self.deconv = nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(c3, c2, 3, padding=1), nn.ReLU(),
                                        nn.ConvTranspose2d(c2, c1, 3, padding=1), nn.ReLU(), last)
        else:
            self.shape = (rows, cols, c1)
            self.cells = nn.Linear(c1, encoder.cell_inputs)
        self.words = nn.Linear(width, encoder.vocab_size) if encoder.vocab_size else None

    def forward(self, y: Tensor, picture: Tensor, instruction: Tensor | None) -> Tensor:
        batch, steps = picture.shape[:2]
        grid = self.unproject(y).reshape(batch * steps, *self.shape)
        # [B * N, C, H, W] for the CNN; channels last, [B * N, rows, cols, cell_inputs], for the cells
        logits = self.deconv(grid) if self.visual == "cnn" else self.cells(torch.relu(grid))
        image_loss = F.binary_cross_entropy_with_logits(logits.float(), picture.flatten(0, 1).float(),
                                                        reduction="none").mean((1, 2, 3)).view(batch, steps)
        if instruction is None:
            return image_loss
        word_loss = F.cross_entropy(self.words(y).flatten(0, 1).float(), instruction.flatten(),
                                    reduction="none").view(batch, steps)
        return image_loss + word_loss


class SpacesEncoder(nn.Module):
    """A dict of ``Discrete(n)``, ``MultiDiscrete(nvec)`` and 1-D ``Box(k)`` parts -> ``[B, N, dim]``
    (module docstring). ``parts``: ``{name: ("discrete", n) | ("multidiscrete", nvec) | ("box", k)}``;
    observations are ``{name: [B, N] ids | [B, N, len(nvec)] ids | [B, N, k] floats}``."""

    def __init__(self, parts: dict[str, tuple[str, int | tuple[int, ...]]], dim: int):
        super().__init__()
        if not isinstance(parts, dict) or not parts:
            raise ValueError(f"parts must be a non-empty dict of observation parts, got {parts!r}")
        self.dim = check_positive(dim, "dim")
        self.parts = dict(parts)
        self.tables = nn.ModuleDict()
        for name, (kind, size) in self.parts.items():
            if kind == "discrete":
                self.tables[name] = nn.Embedding(check_positive(size, f"parts[{name!r}] size"), dim)
            elif kind == "multidiscrete":
                sizes = tuple(check_positive(int(n), f"parts[{name!r}] sizes") for n in size)
                self.register_buffer(f"_offsets_{name}", torch.tensor((0, *sizes[:-1])).cumsum(0), persistent=False)
                self.tables[name] = nn.Embedding(sum(sizes), dim)
            elif kind == "box":
                self.tables[name] = nn.Linear(check_positive(size, f"parts[{name!r}] size"), dim, bias=False)
            else:
                raise ValueError(f"parts[{name!r}] must be ('discrete', n), ('multidiscrete', sizes) or "
                                 f"('box', k), got {(kind, size)!r}")
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        if not isinstance(obs, dict) or set(obs) != set(self.parts):
            raise TypeError(f"obs must be a dict with the parts {sorted(self.parts)}, got "
                            f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        out = self.bias
        for name, (kind, size) in self.parts.items():
            x, key = obs[name], f"obs[{name!r}]"
            if kind == "discrete":
                out = out + self.tables[name](_check_ids(x, key, (), size))
            elif kind == "multidiscrete":
                ids = _check_ids(x, key, (len(size),), tuple(int(n) for n in size))
                out = out + self.tables[name](ids + getattr(self, f"_offsets_{name}")).sum(-2)
            else:
                out = out + self.tables[name](check_tensor(x, key, 3, size, "[B, N, k]", dtype=parameter_dtype(self)))
        return out


def _space_part(name: str, space) -> tuple[str, int | tuple[int, ...]]:
    """``SpacesEncoder``'s description of one Gymnasium space (ids must start at 0)."""
    kind = type(space).__name__
    if kind == "Discrete" and int(space.start) == 0:
        return ("discrete", int(space.n))
    if kind == "MultiDiscrete" and len(space.nvec.shape) == 1 and not space.start.any():
        return ("multidiscrete", tuple(int(n) for n in space.nvec))
    if kind == "Box" and len(space.shape) == 1 and space.dtype.kind == "f":
        return ("box", int(space.shape[0]))
    raise TypeError(f"observation part {name!r}: expected Discrete or MultiDiscrete (from 0) or a 1-D float Box, "
                    f"got {space}")


def encoder_for(observation_space, dim: int, visual: str = "cnn") -> nn.Module:
    """The encoder of a Gymnasium observation space: a MiniGrid dict (``image`` [v, v, 3], ``direction``,
    ``mission`` token ids), a Ballet dict, a grid of cells alone (``{"grid"}`` symbols or ``{"image"}``
    one pixel per cell: Visual Match, Key-to-Door), a dict of POPGym parts or a 1-D float ``Box``. ``visual``
    chooses Ballet's visual encoder (``BalletEncoder``); another space takes only ``"cnn"``, its own."""
    if visual not in BalletEncoder.VISUALS:
        raise ValueError(f"visual must be one of {BalletEncoder.VISUALS}, got {visual!r}")
    spaces = getattr(observation_space, "spaces", None)
    is_ballet = isinstance(spaces, dict) and (
        ("instruction" in spaces and bool({"grid", "image"} & set(spaces))) or set(spaces) in ({"grid"}, {"image"}))
    if visual != "cnn" and not is_ballet:
        raise ValueError(f"visual={visual!r} is Ballet's per-cell encoder; this observation space has its own "
                         f"encoder (use visual='cnn'): {observation_space}")
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
    if is_ballet and "instruction" not in spaces:  # a grid of cells alone (Visual Match, Key-to-Door)
        observation = "symbolic" if "grid" in spaces else "pixels"
        rows, cols, channels = spaces["grid" if observation == "symbolic" else "image"].shape
        return BalletEncoder(dim, observation, vocab_size=0, view=(rows, cols), symbols=channels, cell_pixels=1,
                             visual=visual)
    if is_ballet:
        observation = "symbolic" if "grid" in spaces else "pixels"
        picture = spaces["grid" if observation == "symbolic" else "image"].shape
        if observation == "symbolic":
            return BalletEncoder(dim, observation, vocab_size=int(spaces["instruction"].n), view=picture[0],
                                 symbols=picture[2], visual=visual)
        return BalletEncoder(dim, observation, vocab_size=int(spaces["instruction"].n), visual=visual)
    if isinstance(spaces, dict):
        return SpacesEncoder({name: _space_part(name, space) for name, space in spaces.items()}, dim)
    shape, dtype = getattr(observation_space, "shape", None), getattr(observation_space, "dtype", None)
    if spaces is None and shape is not None and len(shape) == 1 and dtype is not None and dtype.kind == "f":
        return FeatureEncoder(shape[0], dim)
    raise TypeError(f"no encoder for the observation space {observation_space}: expected a MiniGrid dict "
                    "(image, direction, mission), a Ballet dict (grid or image, instruction), a dict of "
                    "Discrete / MultiDiscrete / 1-D Box parts (POPGym) or a 1-D float Box")
