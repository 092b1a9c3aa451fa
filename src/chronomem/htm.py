"""Hierarchical Transformer Memory (HTM; Lampinen et al. 2021, paper 001, Section 2 and App. A).

Read top to bottom next to the paper:

1. ``HierarchicalMemory``  the memory state. The past is cut into chunks of ``C`` steps; each chunk is
   stored in detail (``contents [B, M, C, D]``) with one summary key (``keys [B, M, D]``, the mean of
   the chunk's steps, Section 2 "average-pool across the chunk"). ``write`` appends steps, commits a
   chunk when it is full, starts a new chunk at an episode boundary and evicts the oldest chunk past
   the capacity ``M`` (a ring buffer).
2. ``HTMAttention``  the hierarchical read of Section 2:
   ``R = softmax(Q(normed input) . S)`` over the chunk summaries, top-k chunks,
   ``sum_{i in top-k} R_i * MHA(normed input, C_i)``.
3. ``HTMLayer`` / ``HTMTransformer``  the agent memory of Fig. 1d: each layer is pre-LN causal local
   self-attention (with Transformer-XL's relative positions, as in the GTrXL agent it is built from),
   then a pre-LN HTM block over the memory of that layer's past *inputs*, then a pre-LN feed-forward
   block, all residual, without GTrXL gating (App. D.6).

What the paper specifies: chunks with mean summaries, the two-level read above, each layer storing
its inputs, stop-gradient into memory (Section 2); the layer (Fig. 1d, App. D.6); chunk overlap
(App. A); memory cleared between episodes unless kept (Section 3.3).

Where the paper leaves gaps, DeepMind's released attention module settles them (docs/htm.md):
single-head relevance with bias-free projections scaled by ``1/sqrt(D)``; masking with a large
negative value *before* top-k; softmax over the k selected logits only; one multi-head attention
(with biases) shared by all chunks, queried by the normed input itself; a sinusoid position
encoding over the ``C`` slots of a chunk (reversed: the newest slot is position 0) added to the
contents only; the relevance and within-chunk projections initialised with ``VarianceScaling(2)``
(variance 2/fan-in, zero biases; ``init_scale``). No memory-writing code was released.

Where neither says, our choices:

* a query with no visible chunk reads zeros (the released module averages arbitrary chunks); a
  query with fewer than k visible chunks gives the missing ones zero weight;
* chunks committed early at an episode boundary carry a slot mask, so empty slots are never read;
  the position encoding stays indexed by slot (slot ``C-1`` = position 0);
* ``top_k`` larger than the memory is an error, not a silent failure;
* the visibility rule below, which makes step-by-step, window-by-window and whole-sequence runs
  agree. A query at time t (steps since the stream or episode began) reads, in local attention, the
  keys s with ``floor(t / window) * window - extra_length <= s <= t`` (Transformer-XL: the current
  window plus ``extra_length`` earlier steps), and in the HTM block the chunks that were *complete*
  before t (last step < t), among them only the newest ``memory_size`` (the ring buffer at time t).
  Every call of ``HTMTransformer.forward`` builds the chunks that complete inside the call once,
  reads them with the stored ones under a per-query mask that applies the rule, and stores them.
  Outputs agree across call splits to float tolerance, and so do gradients: the local-attention cache
  carries the gradient from call to call like an RNN state until ``state.detach()`` (the memory stays
  detached, Section 2);
* episode ends inside a call (``done [B, N]``, True at an episode's last step): time restarts after
  the end, so the local window restarts at the episode's first step and sees no earlier episode's
  steps, and the HTM block reads only the episode's own chunks; the partial chunk is committed, then
  the memory cleared, exactly as ``state.reset(done[:, t])`` between two calls. With
  ``keep_across_episodes`` the memory persists across the boundary by design (Section 3.3), the
  local window still restarts (a window of the past steps is the local attention's, not memory's).
  No gradient crosses a boundary.

Options that depart from the paper (off by default; docs/htm.md gives the measurements):

* ``memory_gradient=True`` lets gradients flow into the chunks a call builds from its own inputs
  (the stored memory of earlier calls stays detached, like truncated backpropagation through time).
  It changes no output. For supervised tasks whose only loss is at the end of a sequence: with the
  stop-gradient nothing trains the layers below to write what a later query needs. The paper's RL
  agent has a loss at every step and a reconstruction loss (App. D.4) to shape what it stores.
* ``memory_norm=True`` reads the memory through a LayerNorm without learned parameters: the
  relevance scores LN(summary) and the within-chunk attention reads LN(step). Each layer stores the
  residual stream, whose scale grows in training; read raw, the relevance logits saturate and the
  top-1 chunk is picked by scale, not content. Pre-LN Transformer-XL, the agent memory HTM replaces
  (Sec. 2 "Agents"), likewise reads LN(memory). Stored values and summaries are unchanged.
* ``output_steps=r`` computes only the last ``r`` outputs of a call (a probe or questions read out
  at the end: App. B.4's PAI model, supervised Ballet), and the layers only what those need: the
  last layer's other steps are needed by no one (memory and cache store *inputs*), and with one
  shared memory and a window of one step (App. B.4) no layer reads another step's output. The ``r``
  outputs and their gradients equal the plain forward's (tested); the other outputs are zeros.

How it is computed (the same function as the literal read, tested against it): the within-chunk
attention runs in content space (key projection moved onto the query, value and output projections
after the k chunks are mixed), so only detached chunk contents are gathered; the mix itself is one
of ``chronomem.ops.htm_mix``'s kernels, chosen by ``read_impl``; a call longer than a window runs
its local attention window by window (``LocalLayout``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import (
    check_done,
    check_heads,
    check_mask,
    check_positive,
    check_state_batch,
    check_tensor,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.layers import (
    FeedForward,
    MultiHeadAttention,
    RecurrentState,
    RelativeAttention,
    sinusoid_encoding,
    variance_scaling_,
)
from chronomem.ops.htm_mix import NEG, check_read_impl, mix_chunks
from chronomem.registry import register_model

# =============================================================================================
# 1. The memory: chunk summaries (keys) and chunk contents, a ring buffer of M chunks
# =============================================================================================


@dataclass(frozen=True)
class HierarchicalMemory(RecurrentState):
    """Hierarchical memory of ``M`` chunks of ``C`` steps of width ``D`` (batch-first).

    * ``keys [B, M, D]``        chunk summaries: mean of the chunk's stored steps (no position encoding)
    * ``contents [B, M, C, D]`` the chunks in detail, oldest step in slot 0
    * ``slot_valid [B, M, C]``  which slots hold a step (a chunk cut short by an episode end has holes)
    * ``valid [B, M]``          which chunks hold anything
    * ``chunk_id [B, M]``       commit order of each chunk (0, 1, 2, ...): the age bookkeeping
    * ``accumulator [B, C, D]`` the chunk being filled, ``fill [B]`` steps of it are used
    * ``carried [B]``           how many leading accumulator steps were carried over by chunk overlap
                                (they are already in memory)
    * ``committed [B]``         number of chunks committed so far; the next one goes to slot
                                ``committed % M`` (evicting the oldest)

    ``overlap`` (App. A, Table 1: 1 for one task) makes consecutive chunks share their boundary steps.
    ``keep_across_episodes`` keeps the memory at episode boundaries (Section 3.3); otherwise it is
    cleared, as in the paper's main experiments. Gradients never flow into memory: ``write`` stores
    detached steps.
    """

    keys: Tensor
    contents: Tensor
    slot_valid: Tensor
    valid: Tensor
    chunk_id: Tensor
    accumulator: Tensor
    fill: Tensor
    carried: Tensor
    committed: Tensor
    overlap: int = 0
    keep_across_episodes: bool = False

    @classmethod
    def empty(
        cls,
        batch_size: int,
        capacity: int,
        chunk_size: int,
        dim: int,
        *,
        overlap: int = 0,
        keep_across_episodes: bool = False,
        device=None,
        dtype=torch.float32,
    ) -> HierarchicalMemory:
        check_positive(batch_size, "batch_size")
        check_positive(capacity, "capacity")
        check_positive(chunk_size, "chunk_size")
        check_positive(dim, "dim")
        check_positive(overlap, "overlap", minimum=0)
        if overlap >= chunk_size:
            raise ValueError(f"overlap must be < chunk_size={chunk_size}, got {overlap}")
        B, M, C, D = batch_size, capacity, chunk_size, dim
        zeros_long = torch.zeros(B, dtype=torch.long, device=device)
        return cls(
            keys=torch.zeros(B, M, D, device=device, dtype=dtype),
            contents=torch.zeros(B, M, C, D, device=device, dtype=dtype),
            slot_valid=torch.zeros(B, M, C, dtype=torch.bool, device=device),
            valid=torch.zeros(B, M, dtype=torch.bool, device=device),
            chunk_id=torch.zeros(B, M, dtype=torch.long, device=device),
            accumulator=torch.zeros(B, C, D, device=device, dtype=dtype),
            fill=zeros_long,
            carried=zeros_long.clone(),
            committed=zeros_long.clone(),
            overlap=overlap,
            keep_across_episodes=keep_across_episodes,
        )

    # -- shapes ---------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.keys.shape[0]

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    @property
    def chunk_size(self) -> int:
        return self.contents.shape[2]

    @property
    def dim(self) -> int:
        return self.keys.shape[2]

    # -- chunks that complete while writing a block of steps --------------------------------------
    def new_chunks(self, x: Tensor, lengths: Tensor, detach: bool = True) -> NewChunks:
        """The chunks that complete when the first ``lengths[b]`` steps of ``x [B, N, D]`` are appended.

        The stream of row b is ``accumulator[b, :fill[b]]`` followed by ``x[b, :lengths[b]]``; chunk i
        covers stream steps ``[i*s, i*s + C)`` with stride ``s = C - overlap``. Whole-chunk tensor ops,
        no loop over steps. ``detach=False`` keeps the graph (``HTMTransformer(memory_gradient=True)``).
        """
        B, N, D = x.shape
        C, s = self.chunk_size, self.chunk_size - self.overlap
        if detach:
            x = x.detach()  # Section 2: stop gradients flowing into the memory
        fill = self.fill
        total = fill + lengths  # [B] stream length per row
        count = torch.where(total >= C, torch.div(total - C, s, rounding_mode="floor") + 1, 0)  # [B]
        k_max = int(count.max()) if B else 0
        j = torch.arange(C, device=x.device)[None, :]
        if k_max == 0:  # no chunk completes (most steps of an agent): the steps only join the accumulator
            if N == 1:  # any slot index reads the one step
                steps = x.expand(B, C, D)
            else:
                steps = x.gather(1, (j - fill[:, None]).clamp(0, N - 1)[..., None].expand(B, C, D))
            new_slot = ((j >= fill[:, None]) & (j < total[:, None]))[..., None]
            accumulator = torch.where(new_slot, steps, self.accumulator * (j < fill[:, None])[..., None])
            empty = x.new_zeros(B, 0)
            return NewChunks(x.new_zeros(B, 0, D), x.new_zeros(B, 0, C, D), empty.bool(), empty.long(),
                             count=count, accumulator=accumulator, fill=total,
                             carried=torch.minimum(self.carried, total))
        # Stream [B, C + N, D]: accumulator steps then the new steps, zeros past the end.
        p = torch.arange(C + N, device=x.device)[None, :]
        src = torch.cat([self.accumulator, x, x.new_zeros(B, 1, D)], dim=1)
        idx = torch.where(p < fill[:, None], p, C + p - fill[:, None])
        idx = torch.where(p < total[:, None], idx, C + N)  # past the end -> the zero row
        stream = src.gather(1, idx[..., None].expand(B, C + N, D))
        # chunk i = stream[i*s : i*s + C]
        contents = stream[:, : (k_max - 1) * s + C].unfold(1, C, s)[:, :k_max].permute(0, 1, 3, 2)
        i = torch.arange(k_max, device=x.device)[None, :]
        valid = i < count[:, None]  # [B, K]
        contents = contents * valid[..., None, None].to(contents.dtype)
        keys = contents.mean(2)  # Section 2: the summary is the average over the (full) chunk
        # The call index of each chunk's last step (the step that commits it).
        end = i * s + C - 1 - fill[:, None]
        start = count * s  # where the next accumulator begins in the stream
        new_fill = total - start
        acc_idx = (start[:, None] + j).clamp(max=C + N - 1)
        accumulator = stream.gather(1, acc_idx[..., None].expand(B, C, D))
        accumulator = accumulator * (j < new_fill[:, None])[..., None].to(x.dtype)
        carried = torch.where(count > 0, torch.full_like(count, self.overlap), self.carried)
        carried = torch.minimum(carried, new_fill)
        return NewChunks(keys, contents, valid, end, count=count, accumulator=accumulator, fill=new_fill,
                         carried=carried)

    def _commit(
        self, keys: Tensor, contents: Tensor, slot_valid: Tensor, valid: Tensor
    ) -> HierarchicalMemory:
        """Put ``K`` new chunks per row (``valid [B, K]`` marks real ones, in commit order) into the ring
        buffer."""
        B, M = self.batch_size, self.capacity
        K = keys.shape[1]
        if K == 0:
            return self
        count = valid.sum(1)  # [B]
        i = valid.long().cumsum(1) - 1  # commit rank of each valid chunk
        # Only the newest M of this call's chunks survive; the rest would be evicted at once.
        keep = valid & (i >= count[:, None] - M)
        slot = torch.where(keep, (self.committed[:, None] + i) % M, M)  # M = a scratch slot, dropped
        ids = self.committed[:, None] + i

        def put(old: Tensor, new: Tensor) -> Tensor:
            buf = torch.cat([old, old.new_zeros((B, 1) + tuple(old.shape[2:]))], dim=1)
            index = slot.view(B, K, *([1] * (old.dim() - 2))).expand((B, K) + tuple(old.shape[2:]))
            return buf.scatter(1, index, new.to(old.dtype)).narrow(1, 0, M)

        return replace(
            self,
            keys=put(self.keys, keys),
            contents=put(self.contents, contents),
            slot_valid=put(self.slot_valid, slot_valid),
            valid=put(self.valid, keep),
            chunk_id=put(self.chunk_id, ids),
            committed=self.committed + count,
        )

    def _store(self, new: NewChunks) -> HierarchicalMemory:
        """Commit ``new`` (from ``new_chunks``) and keep its accumulator; stored detached (Section 2)."""
        slot_valid = new.valid[..., None].expand(-1, -1, self.chunk_size)
        mem = self._commit(new.keys.detach(), new.contents.detach(), slot_valid, new.valid)
        return replace(mem, accumulator=new.accumulator.detach(), fill=new.fill, carried=new.carried)

    def _partial_chunk(self, done: Tensor, accumulator: Tensor | None = None) -> NewChunks:
        """The partial chunk of the rows in ``done [B]`` as one chunk per row, committed at an episode end:
        its empty slots masked, its key the mean of the stored steps, ``valid`` where it holds a step not
        yet in memory. ``accumulator``: the accumulator's values with their graph (default: the state's)."""
        C = self.chunk_size
        acc = self.accumulator if accumulator is None else accumulator
        slots = torch.arange(C, device=done.device)[None, :] < self.fill[:, None]  # [B, C]
        w = slots.to(acc.dtype)[..., None]
        key = (acc * w).sum(1) / w.sum(1).clamp_min(1.0)  # mean of the stored steps
        fresh = done & (self.fill > self.carried)
        return NewChunks(key[:, None], (acc * w)[:, None], fresh[:, None], slots=slots[:, None])

    def end_episode(self, done: Tensor, partial: NewChunks | None = None) -> HierarchicalMemory:
        """Episode boundary for the rows in ``done [B]``: commit their partial chunk, then clear them.

        The partial chunk (``_partial_chunk``, or ``partial`` when already built) is committed with its
        empty slots masked (and its key the mean of the stored steps) when it holds a step not yet in
        memory. Rows are then cleared unless ``keep_across_episodes``; either way the next episode starts
        a new chunk.
        """
        if not bool(done.any()):
            return self
        partial = self._partial_chunk(done) if partial is None else partial
        mem = self._commit(partial.keys.detach(), partial.contents.detach(), partial.slots, partial.valid)
        d = done.view(-1, 1, 1)
        mem = replace(
            mem,
            accumulator=torch.where(d, 0.0, mem.accumulator),  # select: a NaN row comes back clean
            fill=torch.where(done, 0, mem.fill),
            carried=torch.where(done, 0, mem.carried),
        )
        if self.keep_across_episodes:
            return mem
        return RecurrentState.reset(mem, done)  # clear the rows: an empty memory

    def write(self, x: Tensor, done: Tensor | None = None, mask: Tensor | None = None) -> HierarchicalMemory:
        """Append ``x [B, N, D]`` (detached) and return the new memory.

        ``done [B, N]`` (optional): True where a step is the last of its episode; after that step
        the partial chunk is committed and (unless ``keep_across_episodes``) the row is cleared.
        ``mask [B, N]`` (optional): valid steps, a prefix of each row (right padding is not stored).
        """
        B = self.batch_size
        x = check_tensor(x, "x", 3, self.dim, "[B, N, D]", dtype=self.keys.dtype)
        check_state_batch(B, x.shape[0], "memory")
        N = x.shape[1]
        check_mask(done, "done", (B, N))
        lengths = _prefix_lengths(mask, B, N, x.device)
        return self.write_chunks(x, lengths, done)[0]

    def write_chunks(
        self, x: Tensor, lengths: Tensor, done: Tensor | None = None, detach: bool = True
    ) -> tuple[HierarchicalMemory, list[NewChunks]]:
        """``write`` on checked inputs (``lengths [B]`` valid steps per row), and every chunk it commits, in
        commit order, with the call index of the step that commits it (``NewChunks.end``): what a call
        reads besides the stored chunks (``HTMTransformer``). Each chunk is built once. The loop runs
        only over the distinct steps at which some row's episode ends."""
        N = x.shape[1]
        ends = [] if done is None or not bool(done.any()) else done.any(0).nonzero().flatten().tolist()
        if not ends:
            new = self.new_chunks(x, lengths, detach)
            return self._store(new), [new]
        # Build the chunks episode piece by piece (only the accumulator carries from piece to piece),
        # then commit them all at once: as end_episode after each piece would, but one copy of memory.
        acc, begin, chunks, episodes = self, 0, [], []
        episode = torch.zeros_like(self.fill)  # [B] episode ends so far in each row
        for t, episode_end in [*((t, True) for t in ends), (N - 1, False)]:
            if begin > t:  # the last episode end was at the call's last step
                break
            new = acc.new_chunks(x[:, begin : t + 1], (lengths - begin).clamp(0, t + 1 - begin), detach)
            chunks.append(replace(new, end=new.end + begin))
            episodes.append(episode[:, None].expand_as(new.valid))
            acc = replace(acc, accumulator=new.accumulator.detach(), fill=new.fill, carried=new.carried)
            if episode_end:  # some rows' episode ends after step t: commit the partial chunk, restart
                ended = done[:, t] & (t < lengths)
                partial = acc._partial_chunk(ended, new.accumulator)
                chunks.append(replace(partial, end=torch.full_like(partial.valid, t, dtype=torch.long)))
                episodes.append(episode[:, None])
                acc = replace(acc, accumulator=torch.where(ended[:, None, None], 0.0, acc.accumulator),
                              fill=torch.where(ended, 0, acc.fill), carried=torch.where(ended, 0, acc.carried))
                episode = episode + ended.long()
            begin = t + 1
        valid = torch.cat([c.valid for c in chunks], 1)
        mem = self
        if not self.keep_across_episodes:  # cleared at each end: only the last episode's chunks stay
            mem = RecurrentState.reset(self, episode > 0)
            valid = valid & (torch.cat(episodes, 1) == episode[:, None])
        C = self.chunk_size
        slot_valid = torch.cat([c.valid[..., None].expand(-1, -1, C) if c.slots is None else c.slots
                                for c in chunks], 1)
        mem = mem._commit(torch.cat([c.keys for c in chunks], 1).detach(),
                          torch.cat([c.contents for c in chunks], 1).detach(), slot_valid, valid)
        return replace(mem, accumulator=acc.accumulator, fill=acc.fill, carried=acc.carried), chunks

    def reset(self, done: Tensor) -> HierarchicalMemory:
        """Episode boundary between calls (``done [B]``); see ``end_episode``."""
        if not isinstance(done, Tensor) or done.dtype != torch.bool or done.shape != (self.batch_size,):
            raise TypeError(f"done must be a boolean tensor of shape [{self.batch_size}]")
        return self.end_episode(done)


@dataclass(frozen=True)
class NewChunks:
    """Chunks committed by one write: ``keys [B, K, D]``, ``contents [B, K, C, D]``, ``valid [B, K]``,
    ``end [B, K]`` (the call index of the step that commits each), ``slots [B, K, C]`` (the stored
    slots; None: all). From ``new_chunks`` also ``count [B]`` (valid chunks, a prefix per row) and the
    accumulator after the write (``accumulator [B, C, D]``, ``fill [B]``, ``carried [B]``)."""

    keys: Tensor
    contents: Tensor
    valid: Tensor
    end: Tensor | None = None
    slots: Tensor | None = None
    count: Tensor | None = None
    accumulator: Tensor | None = None
    fill: Tensor | None = None
    carried: Tensor | None = None


def _prefix_lengths(mask: Tensor | None, batch: int, n: int, device) -> Tensor:
    """Number of valid steps per row; a mask must be a prefix (right padding)."""
    if mask is None:
        return torch.full((batch,), n, dtype=torch.long, device=device)
    check_mask(mask, "mask", (batch, n))
    lengths = mask.sum(1)
    prefix = torch.arange(n, device=mask.device)[None, :] < lengths[:, None]
    if not bool((prefix == mask).all()):
        raise ValueError("mask must mark a prefix of each row as valid (right padding only)")
    return lengths


# =============================================================================================
# 2. The hierarchical read (Section 2)
# =============================================================================================


class HTMAttention(nn.Module):
    """``read = attn(queries [B, Q, D], memory, mask=None) -> [B, Q, D]``.

    ``queries`` are the normed inputs (the layer applies the LayerNorm). ``mask [B, Q, M]`` hides
    chunks per query (True = may read). Cost: relevance O(Q*M), detail O(Q*k*C).

    The within-chunk attention is computed in content space (see ``read``), and the mix of the
    selected chunks by one of ``chronomem.ops.htm_mix``'s implementations of the same function:
    ``read_impl="auto"`` (default), ``"gather"``, ``"dense"`` or ``"reference"`` (module docstring).

    ``memory_gradient=True`` (off by default; a deviation from Section 2's stop-gradient) lets
    gradients flow into the keys and contents it reads; see ``HTMTransformer``.
    ``memory_norm=True`` (off by default; a deviation) reads LN(summaries) and LN(steps), LayerNorm
    without learned parameters, applied before the slot position encoding; see the module docstring.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        top_k: int = 8,
        chunk_size: int = 16,
        *,
        position_encoding: bool = True,
        dropout: float = 0.0,
        memory_gradient: bool = False,
        init_scale: float | None = 2.0,
        memory_norm: bool = False,
        read_impl: str = "auto",
    ):
        super().__init__()
        check_heads(dim, num_heads)
        self.dim, self.top_k, self.chunk_size = (
            dim,
            check_positive(top_k, "top_k"),
            check_positive(chunk_size, "chunk_size"),
        )
        self.position_encoding = position_encoding
        self.memory_gradient = memory_gradient
        self.memory_norm = memory_norm
        self.read_impl = check_read_impl(read_impl)
        if position_encoding and dim % 2:
            raise ValueError(
                f"dim must be even for the sinusoid position encoding of the chunk slots, got {dim}"
            )
        # Relevance: single head, bias-free projections (released module).
        self.to_query = nn.Linear(dim, dim, bias=False)
        self.to_key = nn.Linear(dim, dim, bias=False)
        # Within-chunk attention: one MHA with biases shared by all chunks.
        self.within = MultiHeadAttention(dim, num_heads, dropout=dropout)
        if init_scale is not None:  # the released module's initialisation: VarianceScaling(init_scale=2)
            for linear in (self.to_query, self.to_key, self.within.to_q, self.within.to_kv, self.within.to_out):
                variance_scaling_(linear, init_scale)
        if position_encoding:  # reversed sinusoids over the C slots: the newest slot is position 0
            self.register_buffer(
                "slot_encoding", sinusoid_encoding(chunk_size, dim, reverse=True), persistent=False
            )

    def forward(self, queries: Tensor, memory: HierarchicalMemory, mask: Tensor | None = None) -> Tensor:
        if not isinstance(memory, HierarchicalMemory):
            raise TypeError(f"memory must be a HierarchicalMemory, got {type(memory).__name__}")
        queries = check_tensor(queries, "queries", 3, self.dim, "[B, Q, D]", dtype=parameter_dtype(self))
        B, Q, _ = queries.shape
        check_state_batch(memory.batch_size, B, "memory")
        if memory.chunk_size != self.chunk_size:
            raise ValueError(f"memory has chunk_size {memory.chunk_size}, the attention {self.chunk_size}")
        if memory.dim != self.dim:
            raise ValueError(f"memory has dim {memory.dim}, the attention {self.dim}")
        check_mask(mask, "mask", (B, Q, memory.capacity))
        keys, contents = memory.keys.to(queries.dtype), memory.contents.to(queries.dtype)
        return self.read(queries, keys, contents, memory.slot_valid, memory.valid, mask)

    def read(
        self,
        queries: Tensor,
        keys: Tensor,
        contents: Tensor,
        slot_valid: Tensor,
        valid: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """The read on raw tensors: ``keys [B, M, D]``, ``contents [B, M, C, D]``, ``slot_valid [B, M, C]``,
        ``valid [B, M]``, ``mask [B, Q, M]``."""
        B, Q, D = queries.shape
        M = keys.shape[1]
        k = self.top_k
        if k > M:
            raise ValueError(f"top_k={k} is larger than the memory capacity M={M}")
        if not self.memory_gradient:  # Section 2: stop gradients into memory
            keys, contents = keys.detach(), contents.detach()
        if self.memory_norm:  # deviation (option): read LN(summary) and LN(step), as pre-LN TrXL reads LN(memory)
            keys = F.layer_norm(keys, (D,))  # LN(step): in the mix, with the slot encoding
        visible = valid[:, None, :].expand(B, Q, M)
        if mask is not None:
            visible = visible & mask

        # Relevance R = (W_q LN(x)) . (W_k S)^T / sqrt(D)   (Section 2; scale from the released module).
        # W_k is applied on whichever side has fewer rows: (W_q x) . (W_k s) = (W_k^T W_q x) . s, so a
        # few queries (an agent's step) score the raw summaries instead of projecting all M of them.
        if Q < M:
            logits = (self.to_query(queries) @ self.to_key.weight) @ keys.transpose(1, 2) / math.sqrt(D)
        else:
            logits = self.to_query(queries) @ self.to_key(keys).transpose(1, 2) / math.sqrt(D)
        logits = logits.masked_fill(~visible, NEG)  # hide chunks BEFORE top-k
        top_logits, top_idx = logits.topk(k, dim=-1)  # [B, Q, k]
        top_visible = visible.gather(-1, top_idx)
        # Softmax over the k selected logits only; hidden ones get zero weight, no chunk -> all zero.
        weights = torch.softmax(top_logits.masked_fill(~top_visible, float("-inf")), dim=-1)
        weights = torch.where(top_visible, weights, torch.zeros_like(weights))  # also clears NaN rows

        # Within-chunk attention MHA(LN(x), C_i), computed in content space. The released module
        # projects every chunk to K/V and attends per selected chunk; that is linear in the
        # contents, so we move the key and value projections onto the query side instead:
        #   score_h(x, c) = (W_q^h x + b_q^h) . (W_k^h c + b_k^h) / sqrt(Dh)
        #                 = q~_h . c + (a term constant over the chunk, which the softmax cancels),
        #                   with q~_h = (W_k^h)^T (W_q^h x + b_q^h) / sqrt(Dh);
        #   MHA(x, C_i) = W_o concat_h[W_v^h (sum_s p_hs c_s) + b_v^h] + b_o,
        # and the sum over the k chunks weighted by R_i is taken before W_v and W_o. The same
        # function (tested against the per-chunk loop), but only detached contents are gathered.
        mha = self.within
        H, Dh = mha.num_heads, mha.head_dim
        w_k, w_v = mha.to_kv.weight.view(2, H, Dh, D).unbind(0)  # [H, Dh, D] each
        q = mha.to_q(queries).view(B, Q, H, Dh)  # the query is the normed input itself
        q_content = torch.einsum("bqhe,hed->bqhd", q, w_k) / math.sqrt(Dh)  # q~ [B, Q, H, D]
        # Memory query result = sum_i R_i * MHA(LN(x), C_i)   (Section 2), mixed before W_v, W_o
        mixed = mix_chunks(
            q_content,
            weights,
            top_idx,
            contents,
            slot_valid,
            visible,
            impl=self.read_impl,
            norm=self.memory_norm,
            slot_encoding=self.slot_encoding if self.position_encoding else None,
            dropout=mha.dropout if self.training else 0.0,
        )  # [B, Q, H, D]
        heads = torch.einsum("bqhd,hed->bqhe", mixed, w_v).reshape(B, Q, D)
        total = weights.sum(-1, keepdim=True)  # sum_i R_i: 1, or 0 for a query with no visible chunk
        if mha.to_kv.bias is not None:
            heads = heads + mha.to_kv.bias[D:] * total  # b_v, weighted like the chunks
        out = F.linear(heads, mha.to_out.weight)
        if mha.to_out.bias is not None:
            out = out + mha.to_out.bias * total  # b_o, weighted like the chunks
        return out


# =============================================================================================
# 3. The HTM transformer: the agent memory of Fig. 1d
# =============================================================================================


@dataclass(frozen=True)
class HTMTransformerState(RecurrentState):
    """Per-layer memories (one shared memory with ``shared_memory``), per-layer local-attention
    caches ``[B, L, D]`` of the last ``L = window - 1 + extra_length`` layer inputs (zeros before the
    episode's first step; they carry the gradient until ``detach()``), and ``position [B]`` (steps
    since the episode began)."""

    memories: tuple
    caches: tuple
    position: Tensor

    def reset(self, done: Tensor) -> HTMTransformerState:
        if not isinstance(done, Tensor) or done.dtype != torch.bool or done.dim() != 1:
            raise TypeError("done must be a boolean tensor of shape [B]")
        check_state_batch(self.position.shape[0], done.shape[0])
        keep = (~done).view(-1, 1, 1)
        return HTMTransformerState(
            memories=tuple(m.reset(done) for m in self.memories),
            caches=tuple(torch.where(keep, c, 0.0) for c in self.caches),  # select, never multiply
            position=torch.where(done, 0, self.position),
        )


@dataclass
class HTMConfig:
    """The options of ``HTMTransformer`` (also ``HTMTransformer.Config``), passed whole to each
    ``HTMLayer``; serialises to JSON (``dataclasses.asdict``). Paper defaults: docs/htm.md."""

    dim: int = 512
    depth: int = 4
    num_heads: int = 8
    top_k: int = 8
    chunk_size: int = 32
    memory_size: int = 64
    window: int = 64
    extra_length: int = 0
    overlap: int = 0
    keep_across_episodes: bool = False
    shared_memory: bool = False
    ff_mult: float = 4.0
    dropout: float = 0.0
    position_encoding: bool = True
    memory_gradient: bool = False
    relative_positions: bool = True
    init_scale: float | None = 2.0  # HTMAttention's initialisation (released module); None: PyTorch's
    memory_norm: bool = False  # deviation: relevance and within-chunk attention read LN'd memory
    output_steps: int | None = None  # compute only the last r outputs of a call (module docstring)
    read_impl: str = "auto"  # how the selected chunks are mixed: "auto", "gather", "dense", "reference"


class HTMLayer(nn.Module):
    """Pre-LN local causal self-attention, pre-LN HTM block, pre-LN FFN; residual, no gating."""

    def __init__(self, config: HTMConfig | None = None, **kwargs):
        """``HTMLayer(config)`` with the model's ``HTMConfig`` (the fields of one layer are read from it:
        width, heads, the HTM block's options, local attention, FFN), or the same fields as keywords."""
        super().__init__()
        cfg = build_config(HTMConfig, config, kwargs)
        dim, heads = cfg.dim, cfg.num_heads
        self.norm_local = nn.LayerNorm(dim)
        # Fig. 1d: the agent memory is the (gated) Transformer-XL's with the XL memory replaced by the
        # HTM block, so its local attention keeps Transformer-XL's relative positions (Dai et al. 2019).
        if cfg.relative_positions:
            self.local = RelativeAttention(dim, heads, dropout=cfg.dropout)
        else:
            self.local = MultiHeadAttention(dim, heads, dropout=cfg.dropout)
        self.norm_memory = nn.LayerNorm(dim)
        self.memory = HTMAttention(
            dim,
            heads,
            cfg.top_k,
            cfg.chunk_size,
            position_encoding=cfg.position_encoding,
            dropout=cfg.dropout,
            memory_gradient=cfg.memory_gradient,
            init_scale=cfg.init_scale,
            memory_norm=cfg.memory_norm,
            read_impl=cfg.read_impl,
        )
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, cfg.ff_mult, cfg.dropout)

    def forward(self, x: Tensor, context: Tensor, local: LocalLayout, chunks: tuple) -> Tensor:
        """``x [B, N, D]``; ``context [B, L + N, D]`` = cache then x; ``local`` the blocks of the local
        attention; ``chunks`` = (keys, contents, slot_valid, valid, mask [B, N, M']) for the HTM read."""
        normed = self.norm_local(context)  # LN is per step: LN([cache; x]) = [LN(cache); LN(x)]
        B, N, D = x.shape
        G, Wq = local.queries.shape
        if G == 1:  # one block: every context step is a key, the last Wq are the queries
            queries, keys = normed[:, -Wq:], normed
        else:  # each block's queries are its last keys, consecutive steps
            queries = normed[:, local.queries.flatten()].view(B * G, Wq, D)
            keys = normed[:, local.keys.flatten()].view(B * G, -1, D)
        mask = local.mask.flatten(0, 1)  # [B * G, Wq, Wk], causality included
        read = self.local(queries, keys, attn_mask=mask[:, None])  # causal local self-attention
        x = x + read.view(B, G * Wq, D)[:, local.offset : local.offset + N]
        x = x + self.memory.read(self.norm_memory(x), *chunks)  # HTM block: x + sum_i R_i MHA(LN(x), C_i)
        return x + self.ff(self.norm_ff(x))


class HTMTransformer(nn.Module):
    """Stack of ``HTMLayer``; ``y, state = model(x [B, N, D], state=None, mask=None, done=None)``.

    ``done [B, N]`` (boolean, True where a step is the last of its episode; ignored at padded steps):
    after such a step the row continues from the initial state (its partial chunk committed, then its
    memory cleared unless ``keep_across_episodes``; its local window restarted), as ``state.reset``
    between two calls would, and no output or gradient crosses the boundary (module docstring).

    Each layer stores its own inputs in its memory (Section 2, "initial layer inputs"); with
    ``shared_memory=True`` every layer reads one memory of the model's inputs instead (the paper's
    PAI setup, App. B.4). ``mask [B, N]`` marks valid steps, a prefix of each row; padded steps are
    neither attended to nor stored. See the module docstring for the visibility rule and for
    ``memory_gradient`` (gradients into the chunks built within a call; default off, as in the paper).
    """

    Config = HTMConfig

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_heads(cfg.dim, cfg.num_heads)
        check_positive(cfg.depth, "depth")
        check_positive(cfg.chunk_size, "chunk_size")
        check_positive(cfg.memory_size, "memory_size")
        check_positive(cfg.top_k, "top_k")
        check_positive(cfg.window, "window")
        check_positive(cfg.extra_length, "extra_length", minimum=0)
        check_positive(cfg.overlap, "overlap", minimum=0)
        if cfg.overlap >= cfg.chunk_size:
            raise ValueError(f"overlap must be < chunk_size={cfg.chunk_size}, got {cfg.overlap}")
        if cfg.top_k > cfg.memory_size:
            raise ValueError(
                f"top_k={cfg.top_k} is larger than the memory capacity memory_size={cfg.memory_size}"
            )
        if cfg.output_steps is not None:
            check_positive(cfg.output_steps, "output_steps")
        check_read_impl(cfg.read_impl)
        self.dim = self.out_dim = cfg.dim
        self.cache_length = cfg.window - 1 + cfg.extra_length
        self.layers = nn.ModuleList(HTMLayer(cfg) for _ in range(cfg.depth))

    def init_state(self, batch_size: int, device=None, dtype=None) -> HTMTransformerState:
        """The empty state; ``dtype`` defaults to the parameters' dtype."""
        check_positive(batch_size, "batch_size")
        dtype = parameter_dtype(self) if dtype is None else dtype
        cfg = self.config
        n_mem = 1 if cfg.shared_memory else cfg.depth
        memories = tuple(
            HierarchicalMemory.empty(
                batch_size,
                cfg.memory_size,
                cfg.chunk_size,
                cfg.dim,
                overlap=cfg.overlap,
                keep_across_episodes=cfg.keep_across_episodes,
                device=device,
                dtype=dtype,
            )
            for _ in range(n_mem)
        )
        caches = tuple(
            torch.zeros(batch_size, self.cache_length, cfg.dim, device=device, dtype=dtype)
            for _ in range(cfg.depth)
        )
        return HTMTransformerState(memories, caches, torch.zeros(batch_size, dtype=torch.long, device=device))

    # -- masks for one call --------------------------------------------------------------------
    def _local_layout(self, position: Tensor, lengths: Tensor, n: int, cache: int | None = None,
                      steps: Episodes | None = None) -> LocalLayout:
        """Which context steps each query's local attention reads: query t sees step s iff
        ``floor(t/W)*W - E <= s <= t`` (steps counted from the episode's start), s is a real step and of
        the query's episode. The context is ``cache`` steps (default: the cache length) and then the
        ``n`` queries, the first at ``position``; ``steps`` (with episode ends inside the call) gives the
        position and the episode of every context step instead.

        When every row is at the same offset in its window, no episode ends inside the call and the
        call is longer than a window, the queries are cut into their windows of W and each window reads
        only its W + E keys (O(N * (W + E)) scores). Otherwise one block holds every query and every
        key ([N, L + N]).
        """
        cfg, W, device = self.config, self.config.window, position.device
        L = self.cache_length if cache is None else cache
        offset = position % W
        if steps is None and n > W and bool((offset == offset[0]).all()):
            o = int(offset[0])
            blocks = (o + n + W - 1) // W
            q_call = torch.arange(blocks * W, device=device).view(blocks, W) - o  # [G, W] call index
            # window j starts at call index j*W - o; it reads E earlier steps: context index + L - E
            k_index = (torch.arange(blocks, device=device)[:, None] * W - o + L - cfg.extra_length
                       + torch.arange(W + cfg.extra_length, device=device)[None, :])  # [G, W + E]
        else:
            o, q_call = 0, torch.arange(n, device=device)[None, :]
            k_index = torch.arange(L + n, device=device)[None, :]
        if steps is None:
            key_pos = position[:, None, None] + k_index[None] - L  # [B, G, Wk]
            q_pos = position[:, None, None] + q_call[None]  # [B, G, Wq]
        else:  # one block: the keys are the whole context, the queries its last n steps
            key_pos, q_pos = steps.position[:, None, :], steps.position[:, None, L:]
        key_ok = (key_pos >= 0) & (k_index[None] - L < lengths[:, None, None]) & (k_index[None] < L + n)
        q_ok = (q_call >= 0) & (q_call < n)
        lo = torch.div(q_pos, W, rounding_mode="floor") * W - cfg.extra_length
        kp = key_pos[:, :, None, :]
        mask = key_ok[:, :, None, :] & q_ok[None, :, :, None] & (kp <= q_pos[..., None]) & (kp >= lo[..., None])
        if steps is not None:  # only the query's own episode
            mask = mask & (steps.episode[:, None, L:, None] == steps.episode[:, None, None, :])
        return LocalLayout(o, q_call.clamp(0, n - 1) + L, k_index.clamp(0, L + n - 1), mask)

    def _read_and_store(self, memory: HierarchicalMemory, x: Tensor, lengths: Tensor, done: Tensor | None,
                        episode: Tensor | None):
        """Build the chunks this call commits once; return what the call reads (``_chunks``) and the
        memory after storing them (what ``memory.write(x, done=done, mask=mask)`` returns)."""
        stored, new = memory.write_chunks(x, lengths, done, detach=not self.config.memory_gradient)
        return self._chunks(memory, new, x.shape[1], episode), stored

    def _chunks(self, memory: HierarchicalMemory, new: list[NewChunks], N: int, episode: Tensor | None):
        """Stored chunks plus the ``new`` chunks committed in this call of ``N`` steps, and the per-query
        visibility mask: a chunk committed before the query (its last step earlier), among the newest
        ``M`` (the ring buffer at the query's time), and, unless ``keep_across_episodes``, of the query's
        episode (``episode [B, N]``, the number of episode ends before each step; stored chunks belong
        to episode 0)."""
        M, C, device = memory.capacity, memory.chunk_size, memory.keys.device
        dtype = memory.keys.dtype
        if episode is None and all(c.valid.shape[1] == 0 for c in new):
            # Nothing committed in the call (an agent's step, mostly): the stored chunks are the ring
            # buffer at every query's time, so validity alone is the mask.
            return memory.keys, memory.contents, memory.slot_valid, memory.valid, None
        valid_new = torch.cat([c.valid for c in new], 1)  # [B, K]
        end = torch.cat([c.end for c in new], 1)
        n = torch.arange(N, device=device)[None, :, None]  # query index in the call
        # Chunks committed before query n: the stored ones plus new chunks whose last step < n.
        new_seen = valid_new[:, None, :] & (end[:, None, :] < n)  # [B, N, K]
        before = memory.committed[:, None] + new_seen.sum(-1)  # [B, N]
        oldest = (before - M)[..., None]  # the ring buffer holds chunk ids >= before - M
        old_seen = memory.valid[:, None, :] & (memory.chunk_id[:, None, :] >= oldest)
        counted = valid_new.long()
        new_ids = memory.committed[:, None] + counted.cumsum(1) - counted  # commit order of the valid ones
        new_seen = new_seen & (new_ids[:, None, :] >= oldest)
        if episode is not None and not memory.keep_across_episodes:  # the memory was cleared at each end
            old_seen = old_seen & (episode == 0)[..., None]
            chunk_episode = episode.gather(1, end.clamp(0, N - 1))  # the episode that committed the chunk
            new_seen = new_seen & (chunk_episode[:, None, :] == episode[..., None])
        keys = torch.cat([memory.keys, *(c.keys.to(dtype) for c in new)], 1)
        contents = torch.cat([memory.contents, *(c.contents.to(dtype) for c in new)], 1)
        slot_valid = torch.cat([memory.slot_valid, *(
            c.valid[..., None].expand(-1, -1, C) if c.slots is None else c.slots for c in new)], 1)
        valid = torch.cat([memory.valid, valid_new], 1)
        return keys, contents, slot_valid, valid, torch.cat([old_seen, new_seen], -1)

    def forward(self, x: Tensor, state: HTMTransformerState | None = None, mask: Tensor | None = None,
                done: Tensor | None = None):
        cfg = self.config
        x = check_tensor(x, "x", 3, cfg.dim, "[B, N, dim]", dtype=parameter_dtype(self))
        B, N, _ = x.shape
        if state is None:
            state = self.init_state(B, x.device, x.dtype)
        if not isinstance(state, HTMTransformerState):
            raise TypeError(f"state must be an HTMTransformerState, got {type(state).__name__}")
        check_state_batch(state.position.shape[0], B)
        lengths = _prefix_lengths(mask, B, N, x.device)
        steps = None
        done = check_done(done, (B, N))
        if done is not None:
            done = done & (torch.arange(N, device=x.device)[None, :] < lengths[:, None])  # padding: ignored
            if bool(done.any()):
                steps = Episodes.of(done, state.position, self.cache_length)
            else:
                done = None
        episode = None if steps is None else steps.episode[:, self.cache_length :]
        # output_steps: the steps from `start` on are all that is read out. The last layer computes only
        # those queries (over the full context of keys and the same chunks). With one shared memory and a
        # window of one step (App. B.4) each query reads only itself and the memory, so every layer does.
        start = 0 if cfg.output_steps is None else max(0, N - cfg.output_steps)
        if start and mask is not None and not bool(mask.all()):
            raise ValueError("output_steps reads the last steps of each call; mask must not pad any step")
        if cfg.shared_memory:  # App. B.4: every layer reads the same memory of the model's inputs
            shared, stored = self._read_and_store(state.memories[0], x, lengths, done, episode)
            memories = [stored]
        else:
            memories = []
        tail_everywhere = bool(start) and cfg.shared_memory and self.cache_length == 0
        if tail_everywhere:  # only the tail enters the layers (the memory above holds every step)
            x, shared = x[:, start:], _tail_chunks(shared, start)
            local = self._local_layout(state.position + start, lengths - start, N - start,
                                       steps=None if steps is None else steps.tail(N - start))
        else:
            local = self._local_layout(state.position, lengths, N, steps=steps)
        caches = []
        for i, layer in enumerate(self.layers):
            cache = state.caches[i]
            context = torch.cat([cache.to(x.dtype), x], 1)
            if cfg.shared_memory:
                chunks = shared
            else:  # each layer stores its input
                chunks, stored = self._read_and_store(state.memories[i], x, lengths, done, episode)
                memories.append(stored)
            caches.append(_last_steps(context, lengths + self.cache_length, self.cache_length))
            if start and not tail_everywhere and i == len(self.layers) - 1:
                tail = self._local_layout(state.position + start, lengths - start, N - start,
                                          cache=context.shape[1] - (N - start), steps=steps)
                x = layer(x[:, start:], context, tail, _tail_chunks(chunks, start))
            else:
                x = layer(x, context, local, chunks)
        position = state.position + lengths
        if steps is not None:  # after an episode end the row continues from the initial state
            position, caches = steps.after(state.position, lengths, caches)
        new_state = HTMTransformerState(tuple(memories), tuple(caches), position)
        if start:
            x = torch.cat([x.new_zeros(B, start, x.shape[-1]), x], 1)
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        return x, new_state


@dataclass(frozen=True)
class Episodes:
    """Episode ends inside one call: ``done [B, N]`` (valid steps only), and per context step (the ``L``
    cached steps, then the call's ``N``) ``episode [B, L + N]``, the number of episode ends before the
    step (the cache and the episode running when the call starts are episode 0), and ``position
    [B, L + N]``, the step's time since its episode began (negative for cache slots from before it)."""

    done: Tensor
    episode: Tensor
    position: Tensor

    @classmethod
    def of(cls, done: Tensor, position: Tensor, cache: int) -> Episodes:
        """From ``done [B, N]`` and the state's ``position [B]`` at the call's start."""
        B, N = done.shape
        t = torch.arange(N, device=done.device)[None, :]
        d = done.long()
        episode = d.cumsum(1) - d
        last_end = torch.where(done, t, -1).cummax(1).values  # the last episode end at or before t
        previous = torch.cat([last_end.new_full((B, 1), -1), last_end[:, :-1]], 1)  # strictly before t
        steps = torch.where(previous < 0, position[:, None] + t, t - previous - 1)
        cached = position[:, None] + torch.arange(-cache, 0, device=done.device)[None, :]
        return cls(done, torch.cat([torch.zeros_like(cached), episode], 1), torch.cat([cached, steps], 1))

    def tail(self, n: int) -> Episodes:
        """The last ``n`` steps alone (a model without cache that runs only its last steps)."""
        return Episodes(self.done[:, -n:], self.episode[:, -n:], self.position[:, -n:])

    def after(self, position: Tensor, lengths: Tensor, caches: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """The state's ``position [B]`` and ``caches`` after the call (``position`` at its start, ``lengths``
        valid steps): time and steps of the episode running at its end; cache slots of ended episodes
        are zeros, as ``reset`` leaves them."""
        N = self.done.shape[1]
        last_end = torch.where(self.done, torch.arange(N, device=lengths.device)[None, :], -1).max(1).values
        position = torch.where(last_end >= 0, lengths - 1 - last_end, position + lengths)
        cache = self.episode.shape[1] - N
        if cache == 0:
            return position, caches
        slot = lengths[:, None] + torch.arange(cache, device=lengths.device)[None, :]  # as _last_steps
        keep = (self.episode.gather(1, slot) == self.done.sum(1, keepdim=True))[..., None]
        return position, [torch.where(keep, c, 0.0) for c in caches]


@dataclass(frozen=True)
class LocalLayout:
    """The local attention of one call as ``G`` blocks: block g's queries are the context steps
    ``queries[g] [Wq]`` and it reads the context steps ``keys[g] [Wk]`` (its queries are its last
    ``Wq`` keys); ``mask [B, G, Wq, Wk]`` applies the visibility rule. Block outputs, flattened, hold
    the call's N queries in order from index ``offset`` on (earlier and later slots are padding)."""

    offset: int
    queries: Tensor
    keys: Tensor
    mask: Tensor


def _tail_chunks(chunks: tuple, start: int) -> tuple:
    """What the queries from ``start`` on read of ``chunks`` (``HTMTransformer._chunks``)."""
    mask = chunks[-1]
    return (*chunks[:-1], None if mask is None else mask[:, start:])


def _last_steps(seq: Tensor, lengths: Tensor, n: int) -> Tensor:
    """The last ``n`` of the first ``lengths[b]`` steps of each row of ``seq [B, T, D]``."""
    B, T, D = seq.shape
    if n == 0 or bool((lengths == T).all()):  # no padding: a slice
        return seq[:, T - n :]
    idx = lengths[:, None] - n + torch.arange(n, device=seq.device)[None, :]
    return seq.gather(1, idx[..., None].expand(B, n, D))


@register_model("htm")
def build_htm(
    dim: int,
    depth: int,
    num_heads: int,
    causal: bool = True,
    *,
    top_k: int = 8,
    chunk_size: int = 32,
    memory_size: int = 64,
    **options,
) -> HTMTransformer:
    """Registry builder. HTM is causal by construction; ``causal=False`` is accepted (a classifier
    then reads the last step, which has seen the whole sequence)."""
    return HTMTransformer(
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        top_k=top_k,
        chunk_size=chunk_size,
        memory_size=memory_size,
        **options,
    )
