"""The per-cell encoder of a grid of symbols (``BalletEncoder(visual="cells")``): each cell's vector of
``S`` symbols through a linear map and a ReLU, then every cell's features projected together::

    y = P flatten_c(relu(W x_c + b)) + p,    x [.., cells, S],  W [K, S],  P [dim, cells * K]

Two implementations of that one function, chosen by name (``cell_map(..., impl=)``; ``cell_impl`` on
``BalletEncoder``):

* ``"reference"``: the formula as written. It builds the ``[.., cells, K]`` features and their ReLU, the
  largest tensors of a small agent's step (on Visual Match's 7x11 board with ``K = 16``, 5x its input).
* ``"folded"``: when every cell holds at most one symbol, each 0 or 1 (a one-hot symbol, or an empty
  cell), ``relu(W x_c + b)`` takes one of ``S + 1`` values: ``T_s = relu(W_s + b)`` for symbol ``s`` and
  ``relu(b)`` for an empty cell. The ReLU is then a table lookup, linear in ``x``, and the table folds
  into ``P``: ``F[d, c, s] = sum_k P[d, c, k] T_s[k]`` and ``E[d, c] = sum_k P[d, c, k] relu(b)[k]``, and
  ``y = F flatten(x) + E (1 - sum_s x) + p``: a matrix product over ``cells * S`` inputs and one over
  ``cells``, no per-cell features. The same function (values and
  gradients) for such inputs; wrong for any other, so it checks them (``ValueError``). The input is a
  symbolic observation, each cell's count of each symbol (nonnegative integers): at most one symbol
  is a count of at most 1 per cell, one reduction to check.
* ``"auto"`` (default): folded when the call's cells are at most one-hot and it has at least
  ``FOLD_MIN_ROWS`` observations (a learner's replay, not an acting step), else the reference (Ballet's
  grid can hold two symbols in a cell; pixels never are symbols). Under ``torch.compile`` the check
  would break the graph, so there "auto" is the reference, and "folded" trusts its input.

``tests/test_ops_cell_map.py`` checks the folded path against the reference (values, gradients) and the
fallback; ``benchmarks/cell_map.py`` times both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CELL_IMPLS = ("auto", "folded", "reference")
# "auto" folds a call of at least this many observations: for fewer (an agent's step for 16 envs) building
# the folded weights costs more than it saves (benchmarks/cell_map.py)
FOLD_MIN_ROWS = 64


def check_cell_impl(cell_impl: str) -> str:
    if cell_impl not in CELL_IMPLS:
        raise ValueError(f"cell_impl must be one of {CELL_IMPLS}, got {cell_impl!r}")
    return cell_impl


def cell_map_reference(x: Tensor, weight: Tensor, bias: Tensor, project_weight: Tensor, project_bias: Tensor,
                       extra: Tensor | None = None) -> Tensor:
    """``[.., dim]`` from ``x [.., cells, S]``; ``extra [.., E]`` (an instruction's embedding) is read by
    the last ``E`` columns of ``project_weight``."""
    features = torch.relu(F.linear(x, weight, bias)).flatten(-2)
    return F.linear(features if extra is None else torch.cat([features, extra], -1), project_weight, project_bias)


def cell_map_folded(x: Tensor, weight: Tensor, bias: Tensor, project_weight: Tensor, project_bias: Tensor,
                    extra: Tensor | None = None, counts: Tensor | None = None) -> Tensor:
    """``cell_map_reference`` for cells that hold at most one symbol, each 0 or 1 (unchecked: ``cell_map``
    checks); ``counts``: ``x.sum(-1)`` if the caller has it."""
    cells, K, dim = x.shape[-2], weight.shape[0], project_weight.shape[0]
    per_cell = project_weight[:, : cells * K].reshape(dim, cells, K)
    table = torch.relu(weight.t() + bias)  # [S, K]: T_s
    symbols = (per_cell.reshape(dim * cells, K) @ table.t()).reshape(dim, -1)  # F, [dim, cells * S]
    empty = per_cell @ torch.relu(bias)  # [dim, cells]: what an empty cell adds
    counts = x.sum(-1) if counts is None else counts
    y = torch.addmm(project_bias, x.flatten(-2).flatten(0, -2), symbols.t()).view(*x.shape[:-2], dim)
    y = y + F.linear(1 - counts, empty)
    if extra is not None:
        y = y + F.linear(extra, project_weight[:, cells * K :])
    return y


def cell_map(x: Tensor, weight: Tensor, bias: Tensor, project_weight: Tensor, project_bias: Tensor,
             extra: Tensor | None = None, impl: str = "auto") -> Tensor:
    """The per-cell encoder by ``impl`` (module docstring) of ``x [.., cells, S]``, each cell's count of
    each symbol (nonnegative integers, as floats: a symbolic observation)."""
    check_cell_impl(impl)
    compiling = torch.compiler.is_compiling()
    rows = x[..., 0, 0].numel()
    if impl == "reference" or (impl == "auto" and (compiling or rows < FOLD_MIN_ROWS)):
        return cell_map_reference(x, weight, bias, project_weight, project_bias, extra)
    counts = x.sum(-1)  # symbols per cell: with nonnegative integers, at most 1 means one-hot or empty
    if compiling or bool(counts.max() <= 1):
        return cell_map_folded(x, weight, bias, project_weight, project_bias, extra, counts)
    if impl == "folded":
        raise ValueError("cell_impl='folded' needs cells of at most one symbol; use 'auto' or 'reference' "
                         "for this input")
    return cell_map_reference(x, weight, bias, project_weight, project_bias, extra)
