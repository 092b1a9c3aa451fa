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
* ``relevance_floor=f`` (0 < f < 1) mixes the relevance with a uniform weight over the selected visible
  chunks: ``R'_i = (1 - f) R_i + f / n``, n the number of them. Each chunk a query reads then keeps a
  weight of at least ``f / n``, so its within-chunk read keeps a gradient however the single relevance
  head drifts. Without it, on Visual Match the relevance can take the chunk holding the cue to weight 0
  before the read has learned what the chunk holds, and the read then never learns it. The floor ends
  that in a supervised probe, not in the RL agent's failing seeds (docs/rl.md, "What decides HTM's seeds").
* ``read_gate=a0`` scales the HTM block's read by a learned scalar per layer, starting at ``a0``:
  ``x + a * sum_i R_i MHA(LN(x), C_i)``. At ``a0 = 0`` (ReZero, Bachlechner et al. 2021) each layer
  starts as Transformer-XL's local attention and FFN, and the read enters only as its gradient opens
  the gate. App. D.6's GTrXL gating of every sublayer is a different thing (the paper found it slower).
  On RL Visual Match it keeps the relevance from leaving the cue's chunk; the seeds that fail without it
  still fail, the one that learns learns sooner, and over five seeds it is no better than the paper's
  layer (docs/rl.md, "What decides HTM's seeds").
* ``final_norm=True`` passes the last layer's output through a LayerNorm, as chronomem's pre-LN
  Transformer-XL and GTrXL do (and GPT-2's final LayerNorm): without it the heads read the raw residual
  stream, whose scale the encoder, the read and the FFNs set. The paper's agent puts its memory inside
  Transformer-XL's (Sec. 2 "Agents") and does not say how its output is normalised. On RL Key-to-Door
  the quick agent with it credits the key in seeds where the plain output does not (docs/rl.md, "The
  experiment: key-to-door").
* ``output_steps=r`` computes only the last ``r`` outputs of a call (a probe or questions read out
  at the end: App. B.4's PAI model, supervised Ballet), and the layers only what those need: the
  last layer's other steps are needed by no one (memory and cache store *inputs*), and with one
  shared memory and a window of one step (App. B.4) no layer reads another step's output. The ``r``
  outputs and their gradients equal the plain forward's (tested); the other outputs are zeros.

How it is computed (the same function as the literal read, tested against it): the within-chunk
attention runs in content space (key projection moved onto the query, value and output projections
after the k chunks are mixed), so only detached chunk contents are gathered; the mix itself is one
of ``chronomem.ops.htm_mix``'s kernels, chosen by ``read_impl``. The per-call bookkeeping lives in
``chronomem.ops``, each fast path beside a naive reference: ``ops.htm_chunks`` builds the chunks a
call completes once (``call_chunks``), commits them into the ring buffer (``commit_chunks``) and masks
what each query may read (``chunks_to_read``); ``ops.htm_local`` numbers a call's episodes once
(``Episodes``), lays out the local attention (in blocks of a window for a call longer than a window,
``LocalLayout``) and keeps the cache (``last_steps``). A one-step call without padding (an agent
acting) skips that bookkeeping (``HTMTransformer._step``: its query reads every stored chunk, its local
window is ``step_layout``'s); it is the same function, tested against the general path. Each layer's
local attention projects a call's context to keys and values once, and the state keeps those of its
cache (``HTMTransformerState.keys_values``), so a call without gradients (acting) projects only its
own steps, as Transformer-XL's sliding memory does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import (
    check_done,
    check_ended_rows,
    check_fraction,
    check_heads,
    check_mask,
    check_number,
    check_positive,
    check_state_batch,
    check_tensor,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.core import CausalCore
from chronomem.layers import (
    FeedForward,
    MultiHeadAttention,
    ParameterVersion,
    RecurrentState,
    RelativeAttention,
    any_or_compiling,
    cache_version,
    donates_state,
    reads_cached_kv,
    sinusoid_encoding,
    variance_scaling_,
)
from chronomem.ops.htm_chunks import (
    Accumulator,
    NewChunks,
    ReadChunks,
    RingBuffer,
    append_step,
    append_step_and_commit,
    call_chunks,
    chunks_to_read,
    commit_chunks,
    partial_chunk,
)
from chronomem.ops.htm_local import (
    Episodes,
    LocalLayout,
    call_episodes,
    last_steps,
    local_layout,
    prefix_lengths,
    step_layout,
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
    def empty(cls, batch_size: int, capacity: int, chunk_size: int, dim: int, *, overlap: int = 0,
              keep_across_episodes: bool = False, device=None, dtype=torch.float32) -> HierarchicalMemory:
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
            fill=zeros_long, carried=zeros_long.clone(), committed=zeros_long.clone(),
            overlap=overlap, keep_across_episodes=keep_across_episodes,
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

    @property
    def ring(self) -> RingBuffer:
        """The stored chunks, what ``ops.htm_chunks`` reads and writes (its ``RingBuffer``)."""
        return RingBuffer(self.keys, self.contents, self.slot_valid, self.valid, self.chunk_id, self.committed)

    @property
    def filling(self) -> Accumulator:
        """The chunk being filled: ``accumulator``, ``fill``, ``carried``."""
        return Accumulator(self.accumulator, self.fill, self.carried)

    # -- writing: chunks of C steps into a ring buffer of M ---------------------------------------
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
        check_done(done, (B, N))
        lengths = prefix_lengths(mask, B, N, x.device)
        episodes = call_episodes(done, lengths, torch.zeros_like(lengths), cache=0)
        return self.write_chunks(x, lengths, episodes)[0]

    def write_chunks(
        self, x: Tensor, lengths: Tensor, episodes: Episodes | None = None, detach: bool = True
    ) -> tuple[HierarchicalMemory, NewChunks]:
        """``write`` on checked inputs (``lengths [B]`` valid steps per row, ``episodes`` the episode ends
        inside the call), and every chunk it commits (``NewChunks``, built once, in commit order, each
        with the call index of the step that commits it): what a call reads besides the stored chunks
        (``HTMTransformer``). ``detach=False`` keeps the graph in the returned chunks only."""
        new, filling = call_chunks(self.filling, x, lengths, self.overlap, episodes, detach)
        mem, valid = self, new.valid
        if episodes is not None and not self.keep_across_episodes:
            # cleared at each episode end: only the last episode's chunks stay
            mem = RecurrentState.reset(self, episodes.last > 0)
            valid = valid & (new.episode == episodes.last[:, None])
        mem = mem.commit(new._replace(valid=valid))
        filling = filling._replace(accumulator=filling.accumulator.detach())  # the state holds no graph
        return replace(mem, **filling._asdict()), new

    def append_step(self, x: Tensor, completes: bool | None = None, in_place: bool = False) -> HierarchicalMemory:
        """``write_chunks(x, ones)`` of one step per row, ``x [B, 1, D]`` without padding or episode end (an
        agent acting): a step that completes no row's chunk only joins the accumulator
        (``ops.htm_chunks.append_step``); one that completes a chunk in some row commits those rows' chunks
        as one column (``ops.htm_chunks.append_step_and_commit``). ``completes``: whether a row's chunk may
        complete (None: read from ``fill``; True is always correct), for a caller that decides once for
        several memories (``HTMTransformer``'s step). ``in_place``: the column is written into this
        memory's ring buffer, which the returned memory then shares (a donated state,
        ``layers.state_donated``)."""
        if completes is None:
            completes = bool((self.fill >= self.chunk_size - 1).any())
        if not completes:
            return replace(self, **append_step(self.filling, x)._asdict())
        filling, ring = append_step_and_commit(self.filling, self.ring, x, self.overlap, in_place)
        return replace(self, **filling._asdict(), **ring._asdict())

    def commit(self, chunks: NewChunks) -> HierarchicalMemory:
        """Put the valid ``chunks`` into the ring buffer, in order (``ops.htm_chunks.commit_chunks``):
        chunk number ``committed`` goes to slot ``committed % M``, evicting the oldest. Stored detached:
        gradients never flow into memory (Section 2)."""
        chunks = chunks._replace(keys=chunks.keys.detach(), contents=chunks.contents.detach())
        return replace(self, **commit_chunks(self.ring, chunks)._asdict())

    def end_episode(self, done: Tensor) -> HierarchicalMemory:
        """Episode boundary for the rows in ``done [B]``: commit their partial chunk, then clear them.

        The partial chunk is committed with its empty slots masked (and its key the mean of the stored
        steps) when it holds a step not yet in memory. Rows are then cleared unless
        ``keep_across_episodes``; either way the next episode starts a new chunk.
        """
        if not any_or_compiling(done):
            return self
        mem = self.commit(partial_chunk(self.filling, done))
        mem = replace(mem, **mem.filling.cleared(done)._asdict())
        if self.keep_across_episodes:
            return mem
        return RecurrentState.reset(mem, done)  # clear the rows: an empty memory

    def reset(self, done: Tensor) -> HierarchicalMemory:
        """Episode boundary between calls (``done [B]``); see ``end_episode``."""
        return self.end_episode(check_ended_rows(done, self.batch_size))


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
    relevance_floor: float = 0.0  # deviation: R' = (1 - f) R + f / n over the n selected visible chunks
    read_gate: float | None = None  # deviation: x + a * read, a learned scalar per layer starting here (0: shut)
    final_norm: bool = False  # deviation: a LayerNorm on the output, as Transformer-XL's (baselines.py)
    output_steps: int | None = None  # compute only the last r outputs of a call (module docstring)
    read_impl: str = "auto"  # how the selected chunks are mixed: auto, gather, grouped, dense, reference


# =============================================================================================
# 2. The hierarchical read (Section 2)
# =============================================================================================


class HTMAttention(nn.Module):
    """``read = attn(queries [B, Q, D], memory, mask=None) -> [B, Q, D]``.

    ``queries`` are the normed inputs (the layer applies the LayerNorm). ``mask [B, Q, M]`` hides
    chunks per query (True = may read). Cost: relevance O(Q*M), detail O(Q*k*C).

    The within-chunk attention is computed in content space (see ``read``), and the mix of the
    selected chunks by one of ``chronomem.ops.htm_mix``'s implementations of the same function:
    ``read_impl="auto"`` (default), ``"gather"``, ``"grouped"``, ``"dense"`` or ``"reference"`` (module
    docstring).

    ``memory_gradient=True`` (off by default; a deviation from Section 2's stop-gradient) lets
    gradients flow into the keys and contents it reads; see ``HTMTransformer``.
    ``memory_norm=True`` (off by default; a deviation) reads LN(summaries) and LN(steps), LayerNorm
    without learned parameters, applied before the slot position encoding; see the module docstring.
    ``relevance_floor=f`` (0 by default; a deviation) mixes the relevance weights with a uniform weight
    over the selected visible chunks, ``(1 - f) R_i + f / n``; see the module docstring.
    """

    def __init__(self, dim: int, num_heads: int = HTMConfig.num_heads, top_k: int = HTMConfig.top_k,
                 chunk_size: int = HTMConfig.chunk_size, *,
                 position_encoding: bool = True, dropout: float = 0.0, memory_gradient: bool = False,
                 init_scale: float | None = 2.0, memory_norm: bool = False, relevance_floor: float = 0.0,
                 read_impl: str = "auto"):
        super().__init__()
        check_heads(dim, num_heads)
        self.dim, self.top_k = dim, check_positive(top_k, "top_k")
        self.chunk_size = check_positive(chunk_size, "chunk_size")
        self.position_encoding = position_encoding
        self.memory_gradient = memory_gradient
        self.memory_norm = memory_norm
        self.relevance_floor = check_fraction(relevance_floor, "relevance_floor")
        self.read_impl = check_read_impl(read_impl)
        if position_encoding and dim % 2:
            raise ValueError(f"dim must be even for the sinusoid position encoding of the chunk slots, got {dim}")
        # Relevance: single head, bias-free projections (released module).
        self.to_query = nn.Linear(dim, dim, bias=False)
        self.to_key = nn.Linear(dim, dim, bias=False)
        # Within-chunk attention: one MHA with biases shared by all chunks.
        self.within = MultiHeadAttention(dim, num_heads, dropout=dropout)
        if init_scale is not None:  # the released module's initialisation: VarianceScaling(init_scale=2)
            for linear in (self.to_query, self.to_key, self.within.to_q, self.within.to_kv, self.within.to_out):
                variance_scaling_(linear, init_scale)
        if position_encoding:  # reversed sinusoids over the C slots: the newest slot is position 0
            self.register_buffer("slot_encoding", sinusoid_encoding(chunk_size, dim, reverse=True), persistent=False)

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

    def read(self, queries: Tensor, keys: Tensor, contents: Tensor, slot_valid: Tensor, valid: Tensor,
             mask: Tensor | None = None) -> Tensor:
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
        # Softmax over the k selected logits only. A hidden chunk's logit is NEG, whose weight underflows
        # to exactly 0 beside a visible one; the product zeroes a query's weights when none is visible.
        weights = torch.softmax(top_logits, dim=-1) * top_visible
        if self.relevance_floor:  # deviation (option): every selected chunk keeps at least f / n of the read
            uniform = top_visible.to(weights.dtype)
            uniform = uniform / uniform.sum(-1, keepdim=True).clamp(min=1)
            weights = (1 - self.relevance_floor) * weights + self.relevance_floor * uniform

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
        mixed = mix_chunks(q_content, weights, top_idx, contents, slot_valid, visible, impl=self.read_impl,
                           norm=self.memory_norm, slot_encoding=self.slot_encoding if self.position_encoding else None,
                           dropout=mha.dropout if self.training else 0.0)  # [B, Q, H, D]
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
    since the episode began).

    ``keys_values`` (one ``[B, L, 2 D]`` per layer) holds the local attention's keys and values of each
    cache (``W_kv LN(cache)``, detached; zeros before the episode's first step), and ``kv_version [B]``
    the number of the parameter values they were computed with (``layers.ParameterVersion``; 0 for a
    row with no step of its episode yet, or when a call with gradients or a compiled one made them:
    ``layers.cache_version``). An eager call without gradients reads them instead of projecting the cache
    again when every row's number is the module's present one; a compiled call reads them unchecked where it
    continues an acting stretch (``layers.reads_cached_kv``) and projects the cache again elsewhere; a call
    with gradients (the gradient flows through ``W_kv LN(cache)`` into
    the parameters and the cache), or after the parameters changed, projects the cache. Same numbers
    either way. None (a state built by hand): projected."""

    memories: tuple
    caches: tuple
    position: Tensor
    keys_values: tuple | None = None
    kv_version: Tensor | None = None

    def reset(self, done: Tensor) -> HTMTransformerState:
        check_ended_rows(done, self.position.shape[0])
        keep = (~done).view(-1, 1, 1)
        cached = self.keys_values is not None
        return HTMTransformerState(
            memories=tuple(m.reset(done) for m in self.memories),
            caches=tuple(torch.where(keep, c, 0.0) for c in self.caches),  # select, never multiply
            position=torch.where(done, 0, self.position),
            keys_values=tuple(torch.where(keep, kv, 0.0) for kv in self.keys_values) if cached else None,
            kv_version=torch.where(done, 0, self.kv_version) if cached else None,
        )


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
        self.memory = HTMAttention(dim, heads, cfg.top_k, cfg.chunk_size, position_encoding=cfg.position_encoding,
                                   dropout=cfg.dropout, memory_gradient=cfg.memory_gradient,
                                   init_scale=cfg.init_scale, memory_norm=cfg.memory_norm,
                                   relevance_floor=cfg.relevance_floor, read_impl=cfg.read_impl)
        # read_gate (a deviation, option): the read enters the residual stream scaled by a learned scalar,
        # ReZero's (Bachlechner et al. 2021) at 0: the layer starts as Transformer-XL's (module docstring).
        gate = check_number(cfg.read_gate, "read_gate", none=True)
        self.read_gate = None if gate is None else nn.Parameter(torch.tensor(gate))
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, cfg.ff_mult, cfg.dropout)

    def forward(self, x: Tensor, context: Tensor, local: LocalLayout, chunks: ReadChunks,
                cache_kv: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x [B, n, D]`` (the call's last n steps); ``context [B, L + N, D]`` = cache then the call's
        steps; ``local`` the blocks of the local attention; ``chunks`` what the HTM block reads (stored and
        new chunks, per-query mask); ``cache_kv [B, L, 2 D]`` the local attention's keys and values of the
        cache, if cached (then only the call's steps are projected). Returns the output and the keys and
        values of the whole context, ``[B, L + N, 2 D]``."""
        if cache_kv is None:
            normed = self.norm_local(context)  # LN is per step: LN([cache; x]) = [LN(cache); LN(x)]
            keys_values = self.local.keys_values(normed)
        else:
            normed = self.norm_local(context[:, cache_kv.shape[1] :])
            keys_values = torch.cat([cache_kv.to(normed.dtype), self.local.keys_values(normed)], 1)
        queries = normed[:, normed.shape[1] - x.shape[1] :]  # the steps this call computes
        x = x + local.attend(self.local, queries, keys_values)  # causal local self-attention
        read = self.memory.read(self.norm_memory(x), chunks.keys, chunks.contents, chunks.slot_valid, chunks.valid,
                                chunks.mask)
        if self.read_gate is not None:
            read = self.read_gate * read
        x = x + read  # HTM block: x + sum_i R_i MHA(LN(x), C_i)
        return x + self.ff(self.norm_ff(x)), keys_values


class HTMTransformer(CausalCore):
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
            raise ValueError(f"top_k={cfg.top_k} is larger than the memory capacity memory_size={cfg.memory_size}")
        if cfg.output_steps is not None:
            check_positive(cfg.output_steps, "output_steps")
        check_read_impl(cfg.read_impl)
        check_fraction(cfg.relevance_floor, "relevance_floor")
        check_number(cfg.read_gate, "read_gate", none=True)
        self.dim = self.out_dim = cfg.dim
        self.cache_length = cfg.window - 1 + cfg.extra_length
        self.layers = nn.ModuleList(HTMLayer(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim) if cfg.final_norm else None  # the heads read LN(x) (module docstring)
        self._kv_parameters = ParameterVersion()  # names the values the local keys and values were cached with

    def init_state(self, batch_size: int, device=None, dtype=None) -> HTMTransformerState:
        """The empty state; ``dtype`` defaults to the parameters' dtype."""
        check_positive(batch_size, "batch_size")
        dtype = parameter_dtype(self) if dtype is None else dtype
        cfg = self.config
        memories = tuple(
            HierarchicalMemory.empty(batch_size, cfg.memory_size, cfg.chunk_size, cfg.dim, overlap=cfg.overlap,
                                     keep_across_episodes=cfg.keep_across_episodes, device=device, dtype=dtype)
            for _ in range(1 if cfg.shared_memory else cfg.depth)
        )
        caches = tuple(torch.zeros(batch_size, self.cache_length, cfg.dim, device=device, dtype=dtype)
                       for _ in range(cfg.depth))
        keys_values = tuple(torch.zeros(batch_size, self.cache_length, 2 * cfg.dim, device=device, dtype=dtype)
                            for _ in range(cfg.depth))
        position = torch.zeros(batch_size, dtype=torch.long, device=device)
        return HTMTransformerState(memories, caches, position, keys_values, torch.zeros_like(position))

    def _parameter_version(self) -> int:
        """The number naming the present values of the parameters the local keys and values depend on
        (each layer's ``norm_local`` and key-value projection; ``layers.ParameterVersion``; read eagerly,
        ``layers.cache_version``)."""
        return self._kv_parameters(p for layer in self.layers for m in (layer.norm_local, layer.local.kv_projection)
                                   for p in m.parameters())

    @torch.compiler.disable
    def _cached_kv(self, state: HTMTransformerState, version: Tensor) -> tuple | None:
        """The state's local keys and values if a call may read them: without gradients, and every row's
        computed with the present parameters (or holding no step of its episode yet). It reads values, so
        only an eager call gets this far (``layers.reads_cached_kv``)."""
        if state.keys_values is None or not reads_cached_kv():
            return None
        if not bool(((state.kv_version == version) | (state.position == 0)).all()):
            return None
        return state.keys_values

    def _kept_kv(self, keys_values: list[Tensor], position: Tensor, version: Tensor) -> tuple[tuple, Tensor]:
        """The state's ``keys_values`` and ``kv_version`` from each layer's keys and values of the cache it
        leaves (``[B, L, 2 D]``; the running episode's steps are the last ``position`` slots): detached,
        zeros at the slots before the episode, as ``reset`` leaves them."""
        L = self.cache_length
        episode = (torch.arange(L, device=position.device)[None, :] >= L - position[:, None])[..., None]
        kept = tuple(torch.where(episode, kv.detach(), 0.0) for kv in keys_values)
        return kept, torch.where(position > 0, version, 0)

    def _store_and_read(self, memory: HierarchicalMemory, x: Tensor, lengths: Tensor, episodes: Episodes | None):
        """Build the chunks this call commits once; return the memory after storing them (what
        ``memory.write(x, done=done, mask=mask)`` returns) and what the call's queries read (``ReadChunks``)."""
        stored, new = memory.write_chunks(x, lengths, episodes, detach=not self.config.memory_gradient)
        return stored, chunks_to_read(memory.ring, new, x.shape[1], episodes, memory.keep_across_episodes)

    def check_state(self, state, batch: int) -> HTMTransformerState:
        if not isinstance(state, HTMTransformerState):
            raise TypeError(f"state must be an HTMTransformerState, got {type(state).__name__}")
        check_state_batch(state.position.shape[0], batch)
        return state

    def scan(self, x: Tensor, state: HTMTransformerState, mask: Tensor | None, done: Tensor | None):
        """``forward`` (``CausalCore``) on checked inputs; ``done`` the episode ends before the last step."""
        cfg, L = self.config, self.cache_length
        B, N, _ = x.shape
        if N == 1 and mask is None:  # an agent acting: the one-step path, the same function
            return self._step(x, state)
        lengths = prefix_lengths(mask, B, N, x.device)
        # Episode ends inside the call, numbered once for the local windows, the memories and the state.
        episodes = call_episodes(done, lengths, state.position, L)
        # output_steps: the steps from `start` on are all that is read out. The last layer computes only
        # those queries (over the full context of keys and the same chunks). With one shared memory and a
        # window of one step (App. B.4) each query reads only itself and the memory, so every layer does.
        start = 0 if cfg.output_steps is None else max(0, N - cfg.output_steps)
        if start and mask is not None and not bool(mask.all()):
            raise ValueError("output_steps reads the last steps of each call; mask must not pad any step")
        window = dict(window=cfg.window, extra_length=cfg.extra_length)
        version = cache_version(self._parameter_version, state.position)
        # (a learning call reads no cache, a compiled one reads it unchecked where it may: decided here, not
        # in the disabled _cached_kv, so that its graph is whole)
        cached = None if not reads_cached_kv() else (
            state.keys_values if torch.compiler.is_compiling() else self._cached_kv(state, version))
        memories, caches, keys_values = [], [], []
        if cfg.shared_memory:  # App. B.4: every layer reads the same memory of the model's inputs
            stored, shared = self._store_and_read(state.memories[0], x, lengths, episodes)
            memories.append(stored)
        tail_everywhere = bool(start) and cfg.shared_memory and L == 0
        if tail_everywhere:  # only the tail enters the layers (the memory above holds every step)
            x, shared = x[:, start:], shared.tail(N - start)
            local = local_layout(state.position + start, lengths - start, N - start, cache=L, **window,
                                 episodes=None if episodes is None else episodes.tail(N - start))
        else:
            local = local_layout(state.position, lengths, N, cache=L, **window, episodes=episodes)
        for i, layer in enumerate(self.layers):
            context = torch.cat([state.caches[i].to(x.dtype), x], 1)
            if cfg.shared_memory:
                chunks = shared
            else:  # each layer stores its input
                stored, chunks = self._store_and_read(state.memories[i], x, lengths, episodes)
                memories.append(stored)
            caches.append(last_steps(context, lengths + L, L))
            cache_kv = None if cached is None else cached[i]
            if start and not tail_everywhere and i == len(self.layers) - 1:  # the last layer: the tail only
                tail = local_layout(state.position + start, lengths - start, N - start, cache=L + start, **window,
                                    episodes=episodes)
                x, context_kv = layer(x[:, start:], context, tail, chunks.tail(N - start), cache_kv)
            else:
                x, context_kv = layer(x, context, local, chunks, cache_kv)
            keys_values.append(last_steps(context_kv, lengths + L, L))
        position = state.position + lengths
        if episodes is not None:  # after an episode end the row continues from the initial state
            position, caches = episodes.after(state.position, lengths, caches)
        new_state = HTMTransformerState(tuple(memories), tuple(caches), position,
                                        *self._kept_kv(keys_values, position, version))
        if self.norm is not None:
            x = self.norm(x)
        if start:
            x = torch.cat([x.new_zeros(B, start, x.shape[-1]), x], 1)
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        return x, new_state

    def _step_choices(self, state: HTMTransformerState) -> tuple[Tensor, tuple | None, bool]:
        """The choices of an acting step: the parameters' version, the cached keys and values if the step
        may read them (``_cached_kv``), and whether a chunk completes in some row of some memory (then every
        memory takes the write that commits, ``ops.htm_chunks.append_step_and_commit``). Eagerly they read
        values (``_read_step_choices``); compiled, the step takes the write that commits, which is always
        correct, and reads the cache unchecked where it continues an acting stretch, else none, so that its
        graph is whole (``layers.reads_cached_kv``; docs/rl.md, "Compiled")."""
        if torch.compiler.is_compiling():  # the tag cache_version gives a compiled call (0), and a write
            cached = state.keys_values if reads_cached_kv() else None
            return cache_version(self._parameter_version, state.position), cached, True
        return self._read_step_choices(state)

    @torch.compiler.disable
    def _read_step_choices(self, state: HTMTransformerState) -> tuple[Tensor, tuple | None, bool]:
        """``_step_choices`` made eagerly, reading values together (outside any graph)."""
        version = cache_version(self._parameter_version, state.position)
        completes = bool((torch.stack([m.fill for m in state.memories]) >= self.config.chunk_size - 1).any())
        return version, self._cached_kv(state, version), completes

    def _step(self, x: Tensor, state: HTMTransformerState):
        """``forward`` of one step per row without padding (an agent acting), with the per-call
        bookkeeping cut to what one step needs (the visibility rule of the module docstring, specialised):
        the query reads every stored chunk (a chunk its own step completes is committed after it), the
        local attention reads the visible cached steps (``ops.htm_local.step_layout``), and the cache drops
        its oldest step; an episode end at the step is ``state.reset`` after it (``CausalCore.forward``).
        The same outputs, state and gradients as the general path (tests/test_htm.py)."""
        cfg = self.config
        version, cached, completes = self._step_choices(state)
        local = step_layout(state.position, window=cfg.window, extra_length=cfg.extra_length, cache=self.cache_length)
        stored, caches, keys_values = [], [], []
        for i, layer in enumerate(self.layers):
            memory = state.memories[0 if cfg.shared_memory else i]
            if i == 0 or not cfg.shared_memory:  # each layer stores its input (shared: the model's input)
                stored.append((memory, x))
            chunks = ReadChunks(memory.keys, memory.contents, memory.slot_valid, memory.valid, None)
            context = torch.cat([state.caches[i].to(x.dtype), x], 1)
            caches.append(context[:, 1:])
            x, context_kv = layer(x, context, local, chunks, None if cached is None else cached[i])
            keys_values.append(context_kv[:, 1:])
        # Stored after every layer has read: a donated state's ring buffer takes the step's chunks in place.
        in_place = donates_state()
        memories = [memory.append_step(step, completes, in_place) for memory, step in stored]
        position = state.position + 1
        if self.norm is not None:
            x = self.norm(x)
        if cached is not None:  # the cached slots before the episode are zeros already; the step is real
            return x, HTMTransformerState(tuple(memories), tuple(caches), position, tuple(keys_values),
                                          torch.zeros_like(position) + version)
        return x, HTMTransformerState(tuple(memories), tuple(caches), position,
                                      *self._kept_kv(keys_values, position, version))


@register_model("htm")
def build_htm(dim: int, depth: int, num_heads: int, causal: bool = True, **options) -> HTMTransformer:
    """Registry builder; ``options`` are ``HTMConfig`` fields (its defaults otherwise). HTM is causal by
    construction; ``causal=False`` is accepted (a classifier then reads the last step, which has seen the
    whole sequence)."""
    return HTMTransformer(dim=dim, depth=depth, num_heads=num_heads, **options)
