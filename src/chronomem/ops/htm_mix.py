"""The inner loop of HTM's read: score the slots of each query's k chunks, mix them.

``chronomem.htm.HTMAttention`` computes the within-chunk attention in content space (the key
projection moved onto the query, the value and output projections applied after the mix), so what is
left is, for every query ``q`` (one row per head) and its k selected chunks ``i`` with relevance
weights ``R_i``::

    mixed = sum_i R_i sum_s p_is c_is,    p_i = softmax_s(q . c_is) over the stored slots of chunk i

where ``c = LN(contents)`` with ``norm`` (``memory_norm``) and ``+ slot_encoding`` when given.

Four implementations of that one function, chosen by name (``mix_chunks(..., impl=)``; ``read_impl``
on ``HTMAttention`` / ``HTMLayer`` / ``HTMTransformer``):

* ``"reference"``: ``mix_chunks_reference``, a gather and two einsums in plain autograd (it keeps
  the gathered chunks for backward). The only one with attention dropout, so the read uses it
  whenever dropout is active.
* ``"gather"``: ``mix_selected_chunks``, the same gather in blocks of queries with a backward that
  gathers again instead of keeping the gathered chunks (saves only ``p``).
* ``"grouped"``: ``chronomem.ops.htm_grouped.mix_chunks_grouped``, the (query, chunk) pairs sorted by
  chunk: each tile of pairs reads its chunk once, in one matrix product, and adds into its queries.
* ``"dense"``: ``mix_chunks_dense``, every query scored against every chunk its group of queries may
  read, one matrix product per batch row, the unselected chunks weighted zero: no per-query gather.
* ``"auto"``: for a call of at least ``DENSE_MIN_QUERIES`` queries, dense when they read at most
  ``DENSE_CHUNKS_PER_K * top_k`` chunks in all (a long call over a short memory), else grouped when
  the call has at least ``GROUPED_MIN_PAIRS`` (query, chunk) pairs and their tiles would be full
  enough (``grouped_pays``: a learner's replay, a long call, whose queries select the same chunks);
  gather otherwise (an agent's step, or choices spread so thin that the tiles would be mostly
  padding). Under ``torch.compile`` "auto" and "grouped" are gather, and dense scores every chunk:
  a graph has static shapes, and the chunks the others keep are picked by value (docs/rl.md,
  "Compiled").

``tests/test_ops_htm_mix.py`` checks each fast path against the reference (values, gradients,
gradcheck); timings are in docs/htm.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from chronomem.ops.htm_grouped import NEG, mix_chunks_grouped, tile_fill, tile_pairs

READ_IMPLS = ("auto", "gather", "grouped", "dense", "reference")

# Bytes of gathered slots per block of queries: small enough for the allocator to reuse the buffer
# (on a CPU, page-faulting a fresh multi-MB buffer per call costs more than the copy).
BLOCK_BYTES = 8 * 2**20
# "auto" picks dense from this many queries per call, if they read at most this many chunks per k in
# all (benchmarks/htm_ballet_step.py: dense is still faster at 2 * top_k).
DENSE_MIN_QUERIES = 16
DENSE_CHUNKS_PER_K = 2
DENSE_QUERY_GROUP = 64  # queries per group in mix_chunks_dense: early queries skip later chunks
GROUPED_MIN_PAIRS = 1024  # (query, chunk) pairs: "auto" groups no smaller call (grouped_pays)


def check_read_impl(read_impl: str) -> str:
    if read_impl not in READ_IMPLS:
        raise ValueError(f"read_impl must be one of {READ_IMPLS}, got {read_impl!r}")
    return read_impl


def grouped_pays(rows: Tensor, n_rows: int, heads: int) -> bool:
    """Whether the grouped path beats the gather for a call whose queries read table rows ``rows [..., k]``
    (of ``n_rows``) with ``heads`` rows each, as measured on one CPU thread (``benchmarks/htm_read_impl.py``;
    docs/htm.md, "Which read a call takes"). The gather scores each (query, chunk) pair in matrix products
    of ``heads`` rows, which a CPU runs at a fraction of its matrix speed when they are few; a tile has
    ``TILE_ROWS`` rows whatever the heads, but is padded where few pairs share its chunk
    (``htm_grouped.tile_fill``), and sorting the pairs costs about what a small call saves. So: at least
    ``GROUPED_MIN_PAIRS`` pairs; with 4 heads or fewer (16 or more pairs a tile) tiles at least 0.4 full
    from 4,096 pairs and 0.6 full below; with more heads, 0.8 full."""
    pairs = rows.numel()
    if pairs < GROUPED_MIN_PAIRS:
        return False
    tile = tile_pairs(heads)
    fill = tile_fill(rows, n_rows, tile)
    if tile < 16:
        return fill >= 0.8
    return fill >= (0.4 if pairs >= 4 * GROUPED_MIN_PAIRS else 0.6)


def prepare_slots(chunks: Tensor, norm: bool, slot_encoding: Tensor | None) -> Tensor:
    """What the within-chunk attention reads of chunks ``[..., C, D]``: LN(step) when ``norm``, plus the
    slot encoding ``[C, D]`` when given. Both act slot by slot, so they may be applied to the whole
    memory or to the gathered chunks of each query, whichever is less work."""
    if norm:
        chunks = F.layer_norm(chunks, chunks.shape[-1:])
    if slot_encoding is not None:
        chunks = chunks + slot_encoding.to(chunks.dtype)
    return chunks


def mix_chunks(
    q: Tensor,
    weights: Tensor,
    top_idx: Tensor,
    contents: Tensor,
    slot_valid: Tensor,
    visible: Tensor,
    *,
    impl: str = "auto",
    norm: bool = False,
    slot_encoding: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """``mixed [B, Q, H, D] = sum_i weights_i sum_s p_is c_is`` over each query's chunks ``top_idx``.

    ``q [B, Q, H, D]`` (content-space queries, a row per head), ``weights [B, Q, k]`` (``R_i``, zero for
    a hidden chunk), ``top_idx [B, Q, k]``, ``contents [B, M, C, D]``, ``slot_valid [B, M, C]``,
    ``visible [B, Q, M]`` (the chunks each query may read; dense scores only those). ``impl`` names the
    implementation (module docstring); ``dropout`` on ``p`` always runs the reference.
    """
    B, Q, k = top_idx.shape
    M, C, D = contents.shape[1:]
    H = q.shape[2]
    if dropout:  # the fused kernels have no attention dropout
        impl = "reference"
    readable = None
    if torch.compiler.is_compiling():  # static shapes: each query's k chunks, or every chunk if asked (dense)
        impl = "gather" if impl in ("auto", "grouped") else impl
    elif impl == "dense" or (impl == "auto" and Q >= DENSE_MIN_QUERIES):
        readable = visible.any(1).any(0).nonzero()[:, 0]  # the chunks some query may read
    rows = torch.arange(B, device=q.device)[:, None, None] * M + top_idx  # [B, Q, k] into B*M
    if impl == "auto":
        if readable is not None and len(readable) <= DENSE_CHUNKS_PER_K * k:
            impl = "dense"
        elif Q >= DENSE_MIN_QUERIES and grouped_pays(rows, B * M, H):
            impl = "grouped"
        else:
            impl = "gather"
    if impl == "dense":
        dense_weights = weights.new_zeros(B, Q, M).scatter(-1, top_idx, weights)
        if readable is not None and len(readable) < M:
            contents, slot_valid = contents[:, readable], slot_valid[:, readable]
            dense_weights, visible = dense_weights[..., readable], visible[..., readable]
        slots = prepare_slots(contents, norm, slot_encoding)
        return mix_chunks_dense(q, dense_weights, slots, slot_valid, visible)
    if Q * k >= M or impl == "grouped":  # queries outnumber chunks: transform the whole memory once
        contents, norm, slot_encoding = prepare_slots(contents, norm, slot_encoding), False, None
    if impl == "reference":
        return mix_chunks_reference(q, weights, top_idx, contents, slot_valid, norm, slot_encoding, dropout)
    if impl == "grouped":
        mixed = mix_chunks_grouped(q.reshape(B * Q, H, D), weights.reshape(B * Q, k), contents.reshape(B * M, C, D),
                                   slot_valid.reshape(B * M, C), rows.view(B * Q, k))
        return mixed.view(B, Q, H, D)
    mixed = mix_selected_chunks(
        q.reshape(B * Q, H, D),
        weights.reshape(B * Q, k),
        contents.reshape(B * M, C, D),
        slot_valid.reshape(B * M, C),
        rows.view(B * Q, k),
        norm,
        slot_encoding,
    )
    return mixed.view(B, Q, H, D)


def mix_chunks_reference(
    q: Tensor,
    weights: Tensor,
    top_idx: Tensor,
    contents: Tensor,
    slot_valid: Tensor,
    norm: bool = False,
    slot_encoding: Tensor | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """The naive reference of ``mix_chunks`` (same arguments, ``visible`` aside): gather each query's k
    chunks, softmax over the valid slots within each chunk, weight by ``R_i``, sum; plain autograd."""
    batch = torch.arange(top_idx.shape[0], device=top_idx.device)[:, None, None]
    chunks = prepare_slots(contents[batch, top_idx], norm, slot_encoding)  # [B, Q, k, C, D]
    slots = slot_valid[batch, top_idx]  # [B, Q, k, C]
    scores = torch.einsum("bqhd,bqkcd->bqhkc", q, chunks)
    p = torch.softmax(scores.masked_fill(~slots[:, :, None], NEG), dim=-1)  # within each chunk
    if dropout:
        p = F.dropout(p, dropout)  # the within-chunk MHA's attention dropout
    return torch.einsum("bqk,bqhkc,bqkcd->bqhd", weights, p, chunks)


# =============================================================================================
# The fused kernels: blocks of rows, backward recomputed rather than saved
# =============================================================================================


def _within_chunk_softmax(q: Tensor, flat: Tensor, slots: Tensor) -> Tensor:
    """``q [n, R, D]`` (R query rows: the H heads of one query, or of several), ``flat [n, k*C, D]`` (k
    chunks of C slots), ``slots [n, k, C]`` (valid slots) -> ``p [n, R, k, C]``, each row's softmax within
    each chunk over its stored slots (a finite fill: an empty chunk, which only an invalid chunk can be,
    gets uniform weights and then R_i = 0)."""
    n, k, C = slots.shape
    scores = torch.bmm(q, flat.transpose(1, 2)).view(n, -1, k, C)
    return torch.softmax(scores.masked_fill(~slots[:, None], NEG), dim=-1)


def _mix_block(q: Tensor, weights: Tensor, chunks: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
    """One block: ``q [n, R, D]``, ``weights [n, k]`` (shared by the R rows) or ``[n, R, k]``,
    ``chunks [n, k, C, D]``, ``slots [n, k, C]`` -> the within-chunk softmax ``p [n, R, k, C]`` and
    ``mixed [n, R, D] = sum_{i,s} R_i p_is c_is``."""
    n, k, C, D = chunks.shape
    flat = chunks.view(n, k * C, D)
    p = _within_chunk_softmax(q, flat, slots)
    w = weights[:, None, :, None] if weights.dim() == 2 else weights[..., None]
    mixed = torch.bmm((p * w).view(n, -1, k * C), flat)
    return p, mixed


def _mix_backward(
    p: Tensor, w: Tensor, flat: Tensor, grad_mixed: Tensor, q: Tensor, slot_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Backward of ``_mix_block``: ``p [n, R, k, C]``, ``w`` the weights as ``[n, 1 or R, k, 1]``,
    ``flat [n, k*C, D]``, ``grad_mixed`` and ``q [n, R, D]`` -> the gradient of the weights per row
    ``[n, R, k]`` (sum it over rows that share a weight), of ``q`` ``[n, R, D]``, and of ``flat`` (or
    None unless ``slot_grad``)."""
    n, R, k, C = p.shape
    # mixed = sum_{i,s} a_is c_is with a = R_i p_is
    grad_a = torch.bmm(grad_mixed, flat.transpose(1, 2)).view(n, R, k, C)
    grad_w = (grad_a * p).sum(-1)
    grad_p = grad_a * w
    grad_scores = (p * (grad_p - (grad_p * p).sum(-1, keepdim=True))).view(n, R, k * C)  # softmax backward
    grad_q = torch.bmm(grad_scores, flat)
    if not slot_grad:
        return grad_w, grad_q, None
    # c_is enters through mixed (weight a_is) and the scores (q . c_is)
    coeff = torch.cat([(p * w).view(n, R, k * C), grad_scores], 1).transpose(1, 2)  # [n, k*C, 2R]
    return grad_w, grad_q, torch.bmm(coeff, torch.cat([grad_mixed, q], 1))


class _MixSelectedChunks(torch.autograd.Function):
    """Blockwise forward, and a backward that gathers the chunks again instead of saving them.

    Saves only the within-chunk softmax ``p [N, H, k, C]`` (a few numbers per selected slot), not the
    gathered contents ``[N, k, C, D]``: memory stays O(N*k*C*H) and the gather buffers are small and
    reused. ``table`` (the chunk contents) gets a gradient only when it requires one
    (``memory_gradient=True``): scattered back to its rows with ``index_add_``. The slots are read
    through ``prepare_slots`` after the gather (and again in the backward).
    """

    @staticmethod
    def forward(ctx, q, weights, table, slot_table, rows, block, norm, slot_encoding):
        N, H, D = q.shape
        k = rows.shape[1]
        C = table.shape[1]
        p = q.new_empty(N, H, k, C)
        mixed = q.new_empty(N, H, D)
        for start in range(0, N, block):
            end = min(N, start + block)
            r = rows[start:end].flatten()
            chunks = prepare_slots(table.index_select(0, r).view(end - start, k, C, D), norm, slot_encoding)
            slots = slot_table.index_select(0, r).view(end - start, k, C)
            p[start:end], mixed[start:end] = _mix_block(q[start:end], weights[start:end], chunks, slots)
        ctx.save_for_backward(q, weights, table, rows, p)
        ctx.block, ctx.norm, ctx.slot_encoding = block, norm, slot_encoding
        return mixed

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mixed):
        q, weights, table, rows, p = ctx.saved_tensors
        N, H, k, C = p.shape
        D = q.shape[-1]
        grad_q, grad_w = torch.empty_like(q), torch.empty_like(weights)
        grad_table = torch.zeros_like(table) if ctx.needs_input_grad[2] else None
        for start in range(0, N, ctx.block):
            end = min(N, start + ctx.block)
            n = end - start
            raw = table.index_select(0, rows[start:end].flatten()).view(n, k * C, D)
            flat = prepare_slots(raw.view(n, k, C, D), ctx.norm, ctx.slot_encoding).view(n, k * C, D)
            wb = weights[start:end][:, None, :, None]
            grad_w_rows, grad_q[start:end], grad_flat = _mix_backward(
                p[start:end], wb, flat, grad_mixed[start:end], q[start:end], grad_table is not None
            )
            grad_w[start:end] = grad_w_rows.sum(1)  # one weight per chunk, shared by the H heads
            if grad_table is not None:
                if ctx.norm:  # back through the LayerNorm of the slots (the encoding adds a constant)
                    with torch.enable_grad():
                        raw = raw.detach().requires_grad_()
                        normed = F.layer_norm(raw, (D,))
                    grad_flat = torch.autograd.grad(normed, raw, grad_flat)[0]
                grad_table.index_add_(0, rows[start:end].flatten(), grad_flat.view(n * k, C, D))
        return grad_q, grad_w, grad_table, None, None, None, None, None


def mix_selected_chunks(
    q: Tensor,
    weights: Tensor,
    table: Tensor,
    slot_table: Tensor,
    rows: Tensor,
    norm: bool = False,
    slot_encoding: Tensor | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> Tensor:
    """``mix_chunks``'s gather path on flat rows: ``mixed[n, h] = sum_i weights[n, i] sum_s p[n, h, i, s]
    c[rows[n, i], s]`` with ``p = softmax_s(q[n, h] . c[rows[n, i], s])`` over the valid slots
    (``slot_table``), ``c = LN(table)`` if ``norm`` else ``table``, plus ``slot_encoding [C, D]`` if given.

    ``q [N, H, D]``, ``weights [N, k]``, ``table [R, C, D]`` (chunk contents; usually detached),
    ``slot_table [R, C]``, ``rows [N, k]`` (each query's chunks). Runs in blocks of queries whose
    gathered slots take about ``block_bytes``, with a recomputing backward (``_MixSelectedChunks``).
    """
    k, C, D = rows.shape[1], table.shape[1], table.shape[2]
    block = max(1, block_bytes // (k * C * D * table.element_size()))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, weights, table))
    if not needs_grad and len(rows) <= block:  # one block, nothing to save for backward (acting)
        r = rows.flatten()
        chunks = prepare_slots(table.index_select(0, r).view(-1, k, C, D), norm, slot_encoding)
        return _mix_block(q, weights, chunks, slot_table.index_select(0, r).view(-1, k, C))[1]
    return _MixSelectedChunks.apply(q, weights, table, slot_table, rows, block, norm, slot_encoding)


class _MixChunksDense(torch.autograd.Function):
    """``mix_chunks_dense`` in blocks of batch rows, through ``_mix_block`` with the Q*H query rows of a
    batch row as its rows; the backward recomputes the softmax (saves no ``[Q, H, M, C]`` tensor).
    ``slots`` gets a gradient only when it requires one."""

    @staticmethod
    def forward(ctx, q, weights, slots, slot_valid, block):
        B, Q, H, D = q.shape
        mixed = q.new_empty(B, Q, H, D)
        for start in range(0, B, block):
            rows = slice(start, min(B, start + block))
            _, mixed_rows = _mix_block(_rows(q[rows]), _rows(weights[rows], H), slots[rows], slot_valid[rows])
            mixed[rows] = mixed_rows.view(-1, Q, H, D)
        ctx.save_for_backward(q, weights, slots, slot_valid)
        ctx.block = block
        return mixed

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_mixed):
        q, weights, slots, slot_valid = ctx.saved_tensors
        B, Q, H, D = q.shape
        M, C = slots.shape[1:3]
        grad_q, grad_w = torch.empty_like(q), torch.empty_like(weights)
        grad_slots = torch.empty_like(slots) if ctx.needs_input_grad[2] else None
        for start in range(0, B, ctx.block):
            rows = slice(start, min(B, start + ctx.block))
            q_rows, flat = _rows(q[rows]), slots[rows].reshape(-1, M * C, D)
            p = _within_chunk_softmax(q_rows, flat, slot_valid[rows])
            grad_w_rows, grad_q_rows, grad_flat = _mix_backward(
                p, _rows(weights[rows], H)[..., None], flat, _rows(grad_mixed[rows]), q_rows, grad_slots is not None
            )
            grad_w[rows] = grad_w_rows.view(-1, Q, H, M).sum(2)  # a query's weight is shared by its heads
            grad_q[rows] = grad_q_rows.view(-1, Q, H, D)
            if grad_slots is not None:
                grad_slots[rows] = grad_flat.view(-1, M, C, D)
        return grad_q, grad_w, grad_slots, None, None


def _rows(t: Tensor, heads: int | None = None) -> Tensor:
    """``[b, Q, H, D] -> [b, Q*H, D]`` (query rows), or with ``heads``: weights ``[b, Q, M]`` repeated for
    each head, ``[b, Q*H, M]``."""
    if heads is not None:
        t = t[:, :, None].expand(-1, -1, heads, -1)
    return t.reshape(t.shape[0], -1, t.shape[-1])


def mix_chunks_dense(
    q: Tensor,
    weights: Tensor,
    slots: Tensor,
    slot_valid: Tensor,
    visible: Tensor,
    *,
    query_group: int = DENSE_QUERY_GROUP,
    block_bytes: int = BLOCK_BYTES,
) -> Tensor:
    """``mix_chunks``'s dense path, with every chunk a query may read at once: ``q [B, Q, H, D]``,
    ``weights [B, Q, M]`` (``R_i`` of each query for every chunk of its row, zero for the unselected),
    ``slots [B, M, C, D]`` (already read through ``prepare_slots``), ``slot_valid [B, M, C]``,
    ``visible [B, Q, M]`` (the chunks each query may read) -> ``mixed [B, Q, H, D] = sum_i weights_i
    sum_s p_is slots_is``.

    The scores of a query with every slot are one matrix product per row instead of a gather of k
    chunks per query; the unselected chunks cost arithmetic and get weight zero. The queries go in
    groups of ``query_group``, each scored only against the chunks one of its queries may read: with
    the causal chunk mask of a long call, the early queries skip the later chunks.
    """
    H = q.shape[2]
    mixed = []
    # split, not a slice per group: the backward of a slice zero-fills a gradient the size of all of q
    groups = zip(*(t.split(query_group, dim=1) for t in (q, weights, visible)), strict=True)
    for g_q, g_weights, g_visible in groups:
        g_slots, g_valid = slots, slot_valid
        if not torch.compiler.is_compiling():  # (a graph has static shapes: it scores every chunk)
            chunks = g_visible.any(1).any(0).nonzero()[:, 0]  # the chunks this group may read
            if len(chunks) == 0:  # nothing to read: a zero read
                mixed.append(torch.zeros_like(g_q))
                continue
            if len(chunks) < slots.shape[1]:
                g_weights, g_slots, g_valid = g_weights[..., chunks], slots[:, chunks], slot_valid[:, chunks]
        M, C = g_slots.shape[1:3]
        block = max(1, block_bytes // (g_q.shape[1] * H * M * C * q.element_size()))
        mixed.append(_MixChunksDense.apply(g_q, g_weights, g_slots, g_valid, block))
    return torch.cat(mixed, dim=1)
