"""The first layer of ``MiniGridEncoder``: each cell's ids (object, colour, state) through one embedding
table per field, the embeddings concatenated, then a convolution::

    h = conv(cat_f E_f[x_f], W, b),    x [N, v, v, F] ids,  E_f [V_f, e],  W [C, F * e, k, k]

Two implementations of that one function, chosen by name (``embed_conv(..., impl=)``; ``cell_impl`` on
``MiniGridEncoder``):

* ``"reference"``: as written. Its backward scatters a gradient row into the tables for every cell of
  every replayed frame (``embedding_dense_backward``, 18% of a DoorKey learner update on one CPU thread)
  and computes the convolution's gradient with respect to its input.
* ``"folded"``: an embedding is a linear map of the one-hot id, so it folds into the convolution:
  ``W'[c, o_f + i] = sum_j W[c, f e + j] E_f[i, j]`` (``o_f``: field f's offset among the ``sum_f V_f``
  ids) and ``h = conv(onehot(x), W', b)``, with the ``F`` one-hot blocks stacked as channels. The same
  function, values and gradients (to the tables, ``W`` and ``b``) up to summation order. The one-hot
  input needs no gradient, so neither the scatter nor the input gradient is computed.
* ``"auto"`` (default): folded for a call of at least ``FOLD_MIN_ROWS`` observations (a learner's
  replay), the reference below (an acting step: for 16 observations building ``W'`` costs as much as it
  saves; ``benchmarks/minigrid_speed.py``).

``tests/test_ops_embed_conv.py`` checks the folded path against the reference (values, gradients).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from chronomem.ops.cell_map import CELL_IMPLS, check_cell_impl

FOLD_MIN_ROWS = 64

__all__ = ["CELL_IMPLS", "FOLD_MIN_ROWS", "embed_conv", "embed_conv_folded", "embed_conv_reference"]


def embed_conv_reference(ids: Tensor, tables: list[Tensor], weight: Tensor, bias: Tensor | None) -> Tensor:
    """``[N, C, v', v']`` from ``ids [N, v, v, F]`` (int64; field f's ids index ``tables[f]``)."""
    cells = torch.cat([F.embedding(ids[..., f], table) for f, table in enumerate(tables)], -1)
    return F.conv2d(cells.permute(0, 3, 1, 2), weight, bias)


def embed_conv_folded(ids: Tensor, tables: list[Tensor], weight: Tensor, bias: Tensor | None) -> Tensor:
    """``embed_conv_reference`` through the folded weight (module docstring)."""
    N, v, _, fields = ids.shape
    e = tables[0].shape[1]
    folded = torch.cat([torch.einsum("cjkl,ij->cikl", weight[:, f * e:(f + 1) * e], table)
                        for f, table in enumerate(tables)], 1)  # [C, sum_f V_f, k, k]
    offsets = torch.tensor([0] + [t.shape[0] for t in tables[:-1]], device=ids.device).cumsum(0)
    onehot = torch.zeros(N, v, v, folded.shape[1], dtype=weight.dtype, device=ids.device)
    onehot.scatter_(-1, ids + offsets, 1.0)  # each field's block of ids
    # channels last in memory, as the reference's permuted embeddings: 1.7x faster here on one CPU thread
    return F.conv2d(onehot.permute(0, 3, 1, 2), folded, bias)


def embed_conv(ids: Tensor, tables: list[Tensor], weight: Tensor, bias: Tensor | None, impl: str = "auto") -> Tensor:
    """The embedded ids' convolution by ``impl`` (module docstring); ``ids`` checked by the caller."""
    check_cell_impl(impl)
    if len(tables) != ids.shape[-1] or weight.shape[1] != sum(t.shape[1] for t in tables):
        raise ValueError(f"embed_conv needs one table per field of ids (got {len(tables)} for {ids.shape[-1]}) "
                         f"and weight's input channels the tables' widths summed (got {weight.shape[1]})")
    if impl == "reference" or (impl == "auto" and ids.shape[0] < FOLD_MIN_ROWS):
        return embed_conv_reference(ids, tables, weight, bias)
    return embed_conv_folded(ids, tables, weight, bias)
