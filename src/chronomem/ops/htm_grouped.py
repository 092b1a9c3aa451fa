"""HTM's chunk mix grouped by chunk: each selected chunk read once for every query that selected it.

``chronomem.ops.htm_mix`` defines the mix: for every query ``n`` (one row per head) and its ``k``
selected chunks ``i`` with relevance weights ``R_i``, ``mixed = sum_i R_i sum_s p_is c_is`` with
``p_i = softmax_s(q . c_is)`` over the stored slots of chunk ``i``. Its gather path copies the ``k``
chunks of every query (``k * C * D`` numbers per query) and scores them in matrix products of ``H``
rows each; in a long call many queries select the same chunks, so most of those copies repeat.

``mix_chunks_grouped`` turns the loop around. The ``N * k`` (query, chunk) pairs are sorted by chunk
and cut into tiles of ``tile`` pairs of one chunk (``group_pairs``); a tile gathers its chunk once and
its ``tile`` queries (``H * D`` numbers each), scores them in one ``[tile * H, D] x [D, C]`` product,
takes the softmax within the chunk, weights each pair by its ``R_i`` and mixes the chunk's slots back
in one ``[tile * H, C] x [C, D]`` product; the results are added to their queries (``index_add``).
The same function as the gather path, in fewer and larger matrix products, with ``C * D`` numbers
gathered per tile instead of per pair. A tile holds ``tile_pairs(H)`` pairs (``TILE_ROWS`` query rows);
the last tile of each chunk is padded with pairs of weight zero that read a zero query and add into a
dropped row. Tiles run in blocks of about ``BLOCK_BYTES``; the backward gathers each block again and
saves only the within-chunk softmax ``p``, and gives the table a gradient only when it requires one.

``tests/test_ops_htm_mix.py`` checks it against ``mix_chunks_reference`` (values, gradients, gradcheck).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

NEG = -1e9  # "large negative" logit for hidden chunks and empty slots (released HTM module: -1e6)
TILE_ROWS = 64  # query rows (pairs x heads) per tile: large enough for an efficient matrix product
BLOCK_BYTES = 8 * 2**20  # gathered bytes per block of tiles (as htm_mix.BLOCK_BYTES)


class Tiles(NamedTuple):
    """The (query, chunk) pairs of a read sorted by chunk and cut into ``G`` tiles of ``T`` pairs:
    ``pair [G, T]`` (flat pair index ``n * k + i``; ``N * k`` for padding), ``query [G, T]`` (``n``; ``N``
    for padding) and ``row [G]`` (the table row of each tile's chunk)."""

    pair: Tensor
    query: Tensor
    row: Tensor


def tile_pairs(heads: int, tile_rows: int = TILE_ROWS) -> int:
    """Pairs per tile: ``tile_rows`` query rows of ``heads`` rows each."""
    return max(1, tile_rows // heads)


def tile_fill(rows: Tensor, n_rows: int, tile: int) -> float:
    """The share of the tiles' ``tile`` places that real pairs would fill if ``rows [N, k]`` (each query's
    table rows, of ``n_rows``) were cut into tiles (``group_pairs``): 1 when every chunk's pairs fill
    whole tiles, near ``1 / tile`` when each chunk is chosen once. Reads a value (one count per row)."""
    counts = torch.bincount(rows.flatten(), minlength=n_rows)
    tiles = int(torch.div(counts + tile - 1, tile, rounding_mode="floor").sum())
    return rows.numel() / max(1, tiles * tile)


def group_pairs(rows: Tensor, n_rows: int, tile: int) -> Tiles:
    """Sort the pairs of ``rows [N, k]`` (each query's table rows) by row and cut each row's pairs into
    tiles of ``tile``; the last tile of a row is padded."""
    N, k = rows.shape
    flat = rows.flatten()
    order = torch.argsort(flat, stable=True)  # pairs of row 0 first, then row 1, ...
    counts = torch.bincount(flat, minlength=n_rows)
    tiles = torch.div(counts + tile - 1, tile, rounding_mode="floor")
    row = torch.repeat_interleave(torch.arange(n_rows, device=rows.device), tiles)  # [G]
    first_tile = tiles.cumsum(0) - tiles
    start = counts.cumsum(0) - counts  # where each row's pairs begin in ``order``
    g = torch.arange(len(row), device=rows.device)
    pos = (start[row] + (g - first_tile[row]) * tile)[:, None] + torch.arange(tile, device=rows.device)
    real = pos < (start + counts)[row][:, None]
    pair = torch.where(real, order[pos.clamp(max=N * k - 1)], N * k)
    query = torch.where(real, torch.div(pair, k, rounding_mode="floor"), N)
    return Tiles(pair, query, row)


def _pad_row(t: Tensor) -> Tensor:
    """``t`` with one zero row appended (the padding pairs' query, weight, gradient)."""
    return torch.cat([t, t.new_zeros((1,) + tuple(t.shape[1:]))])


def _tile_block(q_padded: Tensor, table: Tensor, slot_table: Tensor, w_padded: Tensor, tiles: Tiles):
    """What one block of tiles reads: its chunks ``[g, C, D]`` (once per tile), their valid slots ``[g, C]``,
    its queries ``[g, T*H, D]`` and its pairs' weights ``[g, T, 1, 1]``."""
    g, T = tiles.pair.shape
    H, D = q_padded.shape[1:]
    chunks = table.index_select(0, tiles.row)
    slots = slot_table.index_select(0, tiles.row)
    q_tiles = q_padded.index_select(0, tiles.query.flatten()).view(g, T * H, D)
    w = w_padded.index_select(0, tiles.pair.flatten()).view(g, T, 1, 1)
    return chunks, slots, q_tiles, w


class _MixChunksGrouped(torch.autograd.Function):
    """Blocks of ``block`` tiles (their gathered queries and chunks about ``BLOCK_BYTES``); saves the
    within-chunk softmax ``p [G, T*H, C]`` (as the gather path saves its ``p``), gathers again in backward."""

    @staticmethod
    def forward(ctx, q, weights, table, slot_table, tiles, block):
        N, H, D = q.shape
        G, T = tiles.pair.shape
        C = table.shape[1]
        q_padded, w_padded = _pad_row(q), _pad_row(weights.flatten())
        p = q.new_empty(G, T * H, C)
        mixed = q.new_zeros(N + 1, H, D)
        for start in range(0, G, block):
            part = Tiles(*(t[start : start + block] for t in tiles))
            chunks, slots, q_tiles, w = _tile_block(q_padded, table, slot_table, w_padded, part)
            g = len(part.row)
            scores = torch.bmm(q_tiles, chunks.transpose(1, 2))  # [g, T*H, C]
            scores = scores.masked_fill(~slots[:, None, :], NEG)
            p[start : start + g] = torch.softmax(scores, dim=-1)  # within the chunk
            a = (p[start : start + g].view(g, T, H, C) * w).view(g, T * H, C)  # R_i p_is
            mixed.index_add_(0, part.query.flatten(), torch.bmm(a, chunks).view(g * T, H, D))
        ctx.save_for_backward(q, weights, table, slot_table, p, *tiles)
        ctx.block = block
        return mixed[:N]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mixed):
        q, weights, table, slot_table, p, *tiles = ctx.saved_tensors
        tiles = Tiles(*tiles)
        N, H, D = q.shape
        G, T = tiles.pair.shape
        C = table.shape[1]
        q_padded, w_padded, grad_padded = _pad_row(q), _pad_row(weights.flatten()), _pad_row(grad_mixed)
        grad_q = q.new_zeros(N + 1, H, D)
        grad_weights = weights.new_zeros(weights.numel() + 1)
        grad_table = torch.zeros_like(table) if ctx.needs_input_grad[2] else None
        for start in range(0, G, ctx.block):
            part = Tiles(*(t[start : start + ctx.block] for t in tiles))
            chunks, _, q_tiles, w = _tile_block(q_padded, table, slot_table, w_padded, part)
            g = len(part.row)
            p4 = p[start : start + g].view(g, T, H, C)
            grad_tiles = grad_padded.index_select(0, part.query.flatten()).view(g, T * H, D)
            # mixed = sum a_is c_is with a = R_i p_is
            grad_a = torch.bmm(grad_tiles, chunks.transpose(1, 2)).view(g, T, H, C)
            grad_weights.index_add_(0, part.pair.flatten(), (grad_a * p4).sum((2, 3)).flatten())  # shared by heads
            grad_p = grad_a * w
            grad_scores = (p4 * (grad_p - (grad_p * p4).sum(-1, keepdim=True))).view(g, T * H, C)  # softmax backward
            grad_q.index_add_(0, part.query.flatten(), torch.bmm(grad_scores, chunks).view(g * T, H, D))
            if grad_table is not None:  # c_is enters through the mix (weight a_is) and the scores (q . c_is)
                a = (p4 * w).view(g, T * H, C)
                grad_chunks = torch.bmm(a.transpose(1, 2), grad_tiles) + torch.bmm(grad_scores.transpose(1, 2), q_tiles)
                grad_table.index_add_(0, part.row, grad_chunks)
        return grad_q[:N], grad_weights[:-1].view_as(weights), grad_table, None, None, None


def mix_chunks_grouped(q: Tensor, weights: Tensor, table: Tensor, slot_table: Tensor, rows: Tensor, *,
                       tile_rows: int = TILE_ROWS, block_bytes: int = BLOCK_BYTES) -> Tensor:
    """``mix_chunks``'s grouped path on flat rows (the arguments of ``htm_mix.mix_selected_chunks``, the
    slots already read through ``prepare_slots``): ``q [N, H, D]``, ``weights [N, k]``, ``table [R, C, D]``,
    ``slot_table [R, C]``, ``rows [N, k]`` -> ``mixed [N, H, D] = sum_i weights[n, i] sum_s p[n, h, i, s]
    table[rows[n, i], s]``. Tiles hold ``tile_pairs(H, tile_rows)`` pairs; they run in blocks whose
    gathered queries, chunks and products take about ``block_bytes``."""
    H, D = q.shape[1:]
    T = tile_pairs(H, tile_rows)
    tiles = group_pairs(rows, table.shape[0], T)
    tile_bytes = (2 * T * H * D + table.shape[1] * D) * q.element_size()  # queries, products, chunk
    return _MixChunksGrouped.apply(q, weights, table, slot_table, tiles, max(1, block_bytes // tile_bytes))
