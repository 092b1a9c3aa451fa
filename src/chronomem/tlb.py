"""Temporal Latent Bottleneck (TLB; Didolkar et al. 2022, paper 003, Section 2.2).

A fast stream (the *perceptual module*, a Transformer) reads the input chunk by chunk; a slow stream
(the *temporal latent bottleneck*, a set of ``N`` state vectors ``I``) is updated once per chunk and
conditions the fast stream top-down. The only way a chunk learns about other chunks is through ``I``.

Read top to bottom next to the paper (our copy lost its equations; docs/tlb.md restates
them from the authors' Long Range Arena code, and the numbers (1)-(7) below are the paper's):

1. Chunking (Sec. 2.2 "We chunk this input into chunks of size K"): ``x [B, L, D]`` is cut into
   ``ceil(L / K)`` chunks; the last one is padded and the padding masked. A sinusoid encoding of the
   position *within the chunk* is added to the tokens.
2. Perceptual module ``F`` (Eq. 5, 6): ``depth`` repetitions of ``[R x (pre-LN self-attention + FFN),
   1 x (pre-LN cross-attention + FFN)]``; the cross-attention's keys/values are the state
   ``I_{l-1}`` (top-down conditioning, Eq. 6), with a fixed sinusoid encoding over the ``N`` slots.
   ``top_down=False`` is paper 003's ablation "w/o Top-Down Condn." (Sec. 4.1, Table 2): the groups
   have no cross-attention + FFN layer, so the fast stream never reads the state; the state is
   still updated (Eq. 7) and read out.
3. Bottleneck update ``G`` (Eq. 7), once per chunk, queries from the state, keys/values from the
   chunk's perceptual outputs ``H_l``::

       U   = I_{l-1} + CrossAttn(q = LN(I_{l-1} + P), kv = LN(H_l))      (padding masked)
       I_l = U + FFN(LN(U))

   (with ``slot_encoding="state"``, the authors' code, ``P`` is written into the state first:
   ``I_{l-1} <- I_{l-1} + P``, so the residual carries it and it accumulates over chunks.)

4. Readout for classification (Sec. 4.3 "We take the mean across the temporal latent bottleneck
   state vectors"): ``summary = mean_n LN(I_last)[n]``; the Classifier head adds the MLP.

How it is computed (``chronomem.ops.tlb_chunks``, each piece beside a naive reference; timings in
docs/tlb.md): the ``R`` self-attention layers that precede the first cross-attention do not depend on
the state, so they run on all chunks at once as one ``[B * chunks, K, D]`` call; only the
cross-attentions, the later ``[R x self]`` groups and the state update loop over chunks, in *waves*
(wave ``c`` = the ``c``-th chunk of every row, all independent). In a call with episode ends or rows
mid-chunk, each episode part of a row is a *virtual row* with its own chunks, so episode ends add
chunks but not sequential steps. A one-token call (an agent acting) runs the same equations
(``perceive``, ``update_state``) on its one token against the cached keys/values of its chunk.

Where our defaults differ from the authors' LRA code (google-research/long-range-arena,
``models/transformer_tlb``; docs/tlb.md gives each reason), and the option that gives theirs:

* ``slot_encoding="read"``: ``P`` is added to the state whenever it is *read* (keys/values of the
  perceptual cross-attention, queries of the update) and never written into it, so it does not
  accumulate over chunks. Theirs adds it to the state before every chunk: ``"state"``.
* Exact GELU (theirs: tanh approximation, ``gelu_approximate="tanh"``); LayerNorm eps 1e-5 (theirs
  1e-6, ``norm_eps``); attention projections with biases (theirs without, ``attn_bias=False``);
  attention width = ``dim`` (theirs ``qkv_dim``, an option); a learned initial state ``I_0``
  (``N x D``, N(0, 0.02)) where theirs is zeros (``learned_init=False``).
* ``TLB(preset="authors")`` (``Config.authors``) sets all of these and the authors' ListOps sizes.
  ``tests/test_tlb_authors.py`` pins it to a transcription of their forward pass.

Choices the paper leaves open (documented, not silent):

* A chunk that is all padding (for a row) leaves that row's state unchanged, so padding at the
  end of a sequence (or whole padded chunks) changes neither valid outputs nor the final state.
  Positions inside a chunk count slots, so padding *inside* a chunk shifts nothing either. (The
  authors' code adds ``P`` to the state even for such chunks; neither mode copies that.)
* Gradients flow through the state across chunks (and across calls while the state is not
  detached); ``truncate_every=n`` detaches the state after every ``n``-th chunk of a row.
* ``causal=True`` (language modelling, decision making): causal self-attention inside a chunk;
  chunk ``l`` reads only ``I_{l-1}``, which summarises chunks ``< l``, so no position sees the future.
  The non-causal variant is identical except for bidirectional attention inside the chunk.
* Pre-LN blocks with a final LayerNorm on the token outputs (the paper writes Eq. 5 with LN but does
  not say pre or post; the authors' LRA code is pre-LN).

Streaming and episodes (docs/design.md, the agent contract): ``y, state = tlb(x, state, mask, done)``.

* ``causal=True``: calls of any length, one token included, give the same outputs and final state as
  one call (to float tolerance). The state carries the chunk being filled (``state.cache``): its
  slots so far, their outputs ``H`` and, per self-attention layer, their keys and values, so the state
  still updates once per complete chunk, and a one-token call costs O(K) (attention to the cached
  keys/values), not a recomputation of the partial chunk. ``done [B, L]`` ends episodes inside a
  call: after a done step the row continues from the initial state (``I_0``, an empty chunk; the
  unfinished chunk of the ended episode is dropped) and no gradient crosses the boundary.
  ``latest_memory(state)`` is ``I`` including the pending partial chunk (what ``summary`` reads).
* ``causal=False``: a token sees its whole chunk, so a call ends its last chunk: calls split at
  multiples of ``chunk_size`` equal one call; a call of another length updates the state with its
  partial last chunk and the next call starts a new chunk. ``done`` is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from chronomem.checks import (
    check_dropout,
    check_even_dim,
    check_heads,
    check_positive,
    check_state_batch,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.core import CausalCore
from chronomem.layers import (
    CrossAttentionBlock,
    RecurrentState,
    SelfAttentionBlock,
    dropout_layer,
    sinusoid_encoding,
)
from chronomem.ops.tlb_chunks import (
    SCAN_IMPLS,
    ChunkCache,
    ContinuedChunk,
    KeysValues,
    Perceived,
    SlowState,
    assemble_cache,
    layout_chunks,
    row_states,
    scan_chunks,
    to_chunks,
    to_tokens,
    virtual_row_states,
)
from chronomem.registry import register_model

__all__ = ["TLB", "TLBState", "ChunkCache"]


# =============================================================================================
# 1. The slow stream's state
# =============================================================================================


@dataclass(frozen=True)
class TLBState(RecurrentState):
    """The temporal latent bottleneck state of a batch.

    * ``memory [B, N, D]``: the state vectors ``I`` after the last *complete* chunk (without the slot
      encoding); with ``causal=False`` every call ends its last chunk, so it is ``I`` after every token.
    * ``chunks [B]`` (long): chunks with at least one valid token seen since the row (re)started;
      drives ``truncate_every``.
    * ``fresh [B]`` (bool): rows that start from the module's initial state ``I_0`` at the next call.
      The module substitutes its own (possibly learned) ``I_0`` for these rows, so gradients reach
      the learned initial state after a reset too.
    * ``cache``: the chunk being filled (``causal=True`` only; ``None`` for the non-causal TLB, whose
      calls end at chunk boundaries), so that a call may stop anywhere inside a chunk and the next one
      continues it: its filled slots, their outputs ``H`` and keys/values, and the keys/values of
      ``LN(I + P)`` (a ``ChunkCache``, ``chronomem.ops.tlb_chunks``).

    ``reset(done)`` restores the *initial* state of the finished rows (not zeros): it marks them fresh
    and zeroes everything else of theirs (an empty chunk; their ``memory`` rows are replaced by ``I_0``
    at the next call).
    """

    memory: Tensor
    chunks: Tensor
    fresh: Tensor
    cache: ChunkCache | None = None

    def reset(self, done: Tensor) -> TLBState:
        cleared = super().reset(done)  # checks ``done``; zeroes memory, counter and the chunk cache
        return replace(cleared, fresh=self.fresh | done)


# =============================================================================================
# 2. The model: perceptual module (fast) + bottleneck update (slow), chunk by chunk
# =============================================================================================

# merge(layer, k, v) -> (k, v): puts into a self-attention layer's keys/values those of slots that an
# earlier call computed (the chunk cache).
Merge = Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]


class PerceptualGroup(nn.Module):
    """``R`` pre-LN self-attention + FFN layers (Eq. 5), then one pre-LN cross-attention + FFN layer
    whose keys/values are the state (Eq. 6). ``block`` holds the blocks' keywords (``ff_mult``,
    ``dropout``, ``qkv_dim``, ``attn_bias``, ``norm_eps``, ``gelu_approximate``)."""

    def __init__(self, dim: int, num_heads: int, self_per_cross: int, top_down: bool = True, **block):
        super().__init__()
        self.self_blocks = nn.ModuleList(SelfAttentionBlock(dim, num_heads, **block) for _ in range(self_per_cross))
        # top_down=False (paper 003 Table 2's ablation): no cross-attention to the state.
        self.cross = CrossAttentionBlock(dim, num_heads, **block) if top_down else None

    def self_attend(self, h: Tensor, key_mask: Tensor | None, causal: bool, merge: Merge | None = None,
                    first_layer: int = 0, sees_itself: bool = False) -> Perceived:
        """Eq. 5 within the chunk, keeping each layer's keys and values. ``merge`` puts in those of
        slots an earlier call filled (``first_layer``: the number of this group's first layer).
        ``sees_itself``: every query may attend at least to its own key, so ``attend``'s guard for rows
        without a visible key is not needed (one-token calls without padding: a step saves a few ops)."""
        mask = None if key_mask is None else key_mask[:, None, None, :]
        keys, values = [], []
        for index, block in enumerate(self.self_blocks):
            attn = block.attn
            normed = block.norm_attn(h)
            q, (k, v) = attn.heads_q(normed), attn.heads_kv(normed)
            if merge is not None:
                k, v = merge(first_layer + index, k, v)
            if sees_itself and not causal:
                dropout = attn.dropout if attn.training else 0.0
                read = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
                h = h + attn.to_out(read.transpose(-3, -2).flatten(-2))
            else:
                h = h + attn.attend(q, k, v, mask=mask, causal=causal)
            h = h + block.ff(block.norm_ff(h))
            keys.append(k)
            values.append(v)
        return Perceived(h, keys, values)

    def read_state(self, h: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """Eq. 6: pre-LN cross-attention + FFN to the state, given its keys/values (``TLB.memory_kv``)."""
        block = self.cross
        h = h + block.attn.attend(block.attn.heads_q(block.norm_query(h)), keys, values)
        return h + block.ff(block.norm_ff(h))


class BottleneckUpdate(nn.Module):
    """Eq. 7: ``U = S + CrossAttn(q=LN(I + P), kv=LN(H))``, ``I' = U + FFN(LN(U))``, where the residual
    ``S`` is ``I`` (``slot_encoding="read"``) or ``I + P`` (``"state"``, the authors' code)."""

    def __init__(self, dim: int, num_heads: int, **block):
        super().__init__()
        self.block = CrossAttentionBlock(dim, num_heads, **block)

    def forward(self, residual: Tensor, query: Tensor, h: Tensor, key_mask: Tensor | None) -> Tensor:
        b = self.block
        u = residual + b.attn(b.norm_query(query), b.norm_context(h), key_mask=key_mask)
        return u + b.ff(b.norm_ff(u))


class TLB(CausalCore):
    """Transformer + Temporal Latent Bottleneck: ``y [B, L, D], state = TLB(...)(x [B, L, D], state, mask)``.

    ``mask [B, L]`` (True = valid); outputs at padded positions are zero. ``state=None`` starts from
    the initial state ``I_0``. ``summary(y, state, mask)`` is the classification readout (mean of the
    normalised final state vectors). Defaults: the authors' LRA ListOps setting ``R=2, N=100, K=100``,
    one ``[R x self, 1 x cross]`` group, width 64 (our size). See the module docstring for the
    equations and the choices the paper leaves open.

    ``TLB(preset="authors", **overrides)`` (or ``TLB(config=TLB.Config.authors(**overrides))``) is the
    authors' LRA model: their forward pass (``Config.authors``) and their ListOps sizes.
    """

    @dataclass
    class Config:
        dim: int = 64
        num_heads: int = 8
        chunk_size: int = 100  # K
        num_state: int = 100  # N
        self_per_cross: int = 2  # R
        depth: int = 1  # repetitions of [R x self, 1 x cross]
        causal: bool = False
        top_down: bool = True  # False: the fast stream never reads the state (paper 003 Table 2 ablation)
        learned_init: bool = True
        truncate_every: int | None = None  # detach the state every n chunks (None: never)
        ff_mult: float = 4.0
        dropout: float = 0.0
        # Details in which the authors' code differs from our defaults (docs/tlb.md says why):
        slot_encoding: str = "read"  # "read": P added when the state is read; "state": written into it
        qkv_dim: int | None = None  # width of the attention heads (None: dim)
        attn_bias: bool = True  # biases on the attention projections
        norm_eps: float = 1e-5  # LayerNorm epsilon
        gelu_approximate: str = "none"  # "none" (exact GELU) or "tanh"
        # How the chunked forward runs the recurrence over chunks (chronomem.ops.tlb_chunks.scan_chunks):
        # "waves" (batched) or "loop", one chunk at a time (its naive reference). Same function.
        scan_impl: str = "waves"

        @classmethod
        def authors(cls, **overrides) -> TLB.Config:
            """The authors' LRA TLB (google-research/long-range-arena: ``models/transformer_tlb``,
            ``listops/configs/transformer_tlb_base.py`` on ``base_listops_config.py``): P written into
            the state before every chunk, tanh GELU, LayerNorm eps 1e-6, bias-free attention
            projections, a zero initial state, and their ListOps sizes (width 512, attention width 512,
            FFN 1024, 8 heads, ``R=2, N=K=100``, dropout 0.1). ``overrides`` replace any field."""
            authors = dict(
                dim=512, qkv_dim=512, ff_mult=2.0, num_heads=8, chunk_size=100, num_state=100,
                self_per_cross=2, depth=1, dropout=0.1, learned_init=False, slot_encoding="state",
                attn_bias=False, norm_eps=1e-6, gelu_approximate="tanh",
            )
            return build_config(cls, None, {**authors, **overrides})

    PRESETS = ("authors",)

    def __init__(self, config: Config | None = None, *, preset: str | None = None, **kwargs):
        super().__init__()
        if preset is not None:
            if preset not in self.PRESETS:
                raise ValueError(f"preset must be one of {self.PRESETS} (or None), got {preset!r}")
            if config is not None:
                raise TypeError("give either config or preset, not both")
            config = self.Config.authors()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_heads(cfg.dim, cfg.num_heads)
        check_even_dim(cfg.dim)
        qkv_dim = cfg.dim if cfg.qkv_dim is None else check_positive(cfg.qkv_dim, "qkv_dim")
        if qkv_dim % cfg.num_heads:
            raise ValueError(f"num_heads={cfg.num_heads} must divide qkv_dim={qkv_dim}")
        if cfg.scan_impl not in SCAN_IMPLS:
            raise ValueError(f"scan_impl must be one of {SCAN_IMPLS}, got {cfg.scan_impl!r}")
        if cfg.slot_encoding not in ("read", "state"):
            raise ValueError(f"slot_encoding must be 'read' or 'state', got {cfg.slot_encoding!r}")
        if not cfg.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {cfg.norm_eps!r}")
        check_positive(cfg.chunk_size, "chunk_size")
        check_positive(cfg.num_state, "num_state")
        check_positive(cfg.self_per_cross, "self_per_cross", minimum=0 if cfg.top_down else 1)
        check_positive(cfg.depth, "depth")
        if cfg.truncate_every is not None:
            check_positive(cfg.truncate_every, "truncate_every")
        check_dropout(cfg.dropout)
        self.dim = self.out_dim = cfg.dim
        self.chunk_size, self.num_state, self.causal = cfg.chunk_size, cfg.num_state, bool(cfg.causal)

        # I_0: learned (default) or zeros (the authors' LRA code).
        if cfg.learned_init:
            self.initial = nn.Parameter(torch.randn(cfg.num_state, cfg.dim) * 0.02)
        else:
            self.register_buffer("initial", torch.zeros(cfg.num_state, cfg.dim))
        # Fixed sinusoids: over the N slots of the state (P) and over the K positions of a chunk.
        self.register_buffer("slot_encoding", sinusoid_encoding(cfg.num_state, cfg.dim), persistent=False)
        self.register_buffer("chunk_encoding", sinusoid_encoding(cfg.chunk_size, cfg.dim), persistent=False)

        self.drop = dropout_layer(cfg.dropout)
        block = dict(
            ff_mult=cfg.ff_mult, dropout=cfg.dropout, qkv_dim=qkv_dim, attn_bias=cfg.attn_bias,
            norm_eps=cfg.norm_eps, gelu_approximate=cfg.gelu_approximate,
        )
        self.groups = nn.ModuleList(
            PerceptualGroup(cfg.dim, cfg.num_heads, cfg.self_per_cross, bool(cfg.top_down), **block)
            for _ in range(cfg.depth)
        )
        self.update = BottleneckUpdate(cfg.dim, cfg.num_heads, **block)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)  # final LN of the token outputs (pre-LN stack)
        self.norm_state = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)  # LN(I_last) of the readout

    # ---- state ----------------------------------------------------------------------------------

    def init_state(self, batch_size: int, device=None) -> TLBState:
        """``I_0`` for every row (marked fresh, so the module's live ``I_0`` is used at the next call);
        with ``causal=True`` also an empty chunk cache."""
        check_positive(batch_size, "batch_size")
        device = self.initial.device if device is None else device
        memory = self.initial.detach().to(device).expand(batch_size, -1, -1).clone()
        chunks = torch.zeros(batch_size, dtype=torch.long, device=device)
        fresh = torch.ones(batch_size, dtype=torch.bool, device=device)
        cache = self._empty_cache(batch_size, device, memory.dtype) if self.causal else None
        return TLBState(memory, chunks, fresh, cache)

    def _cache_shapes(self) -> dict[str, tuple]:
        """Per-row shapes of the chunk cache's fields (tuples: one per self-attention layer or group)."""
        K, N, D = self.chunk_size, self.num_state, self.dim
        chunk_kv = tuple((b.attn.num_heads, K, b.attn.head_dim) for g in self.groups for b in g.self_blocks)
        memory_kv = tuple((g.cross.attn.num_heads, N, g.cross.attn.head_dim) for g in self.groups
                          if g.cross is not None)
        return dict(fill=(), slot_valid=(K,), outputs=(K, D), chunk_keys=chunk_kv, chunk_values=chunk_kv,
                    memory_keys=memory_kv, memory_values=memory_kv)

    def _empty_cache(self, batch: int, device, dtype) -> ChunkCache:
        """All zeros, as ``reset`` leaves it (a fresh row's ``memory_keys`` / ``memory_values`` are
        computed from ``I_0`` at its next call)."""
        return ChunkCache.zeros(batch, self._cache_shapes(), device, dtype)

    def check_state(self, state, batch: int) -> TLBState:
        if not isinstance(state, TLBState):
            raise TypeError(f"state must be a TLBState (or None), got {type(state).__name__}")
        check_state_batch(state.memory.shape[0], batch)
        expected = (batch, self.num_state, self.dim)
        if tuple(state.memory.shape) != expected:
            raise ValueError(f"state.memory must have shape {expected}, got {tuple(state.memory.shape)}")
        if not self.causal:
            if state.cache is not None and bool(state.cache.fill.any()):
                raise ValueError("state holds a partial chunk (state.cache.fill > 0), which only a causal TLB "
                                 "continues")
            return state
        if state.cache is None:  # a state without a chunk cache (made by hand, or by a non-causal TLB)
            device, dtype = state.memory.device, parameter_dtype(self)
            memory_kv = self.memory_kv(self._start(state, dtype).memory)
            cache = replace(self._empty_cache(batch, device, dtype), memory_keys=memory_kv.keys,
                            memory_values=memory_kv.values)
            return replace(state, cache=cache)
        got = state.cache.row_shapes()
        for name, wanted in self._cache_shapes().items():
            if got[name] != wanted:
                raise ValueError(f"state.cache.{name} must have per-row shape {wanted}, got {got[name]}")
        return state

    def _start(self, state: TLBState, dtype) -> SlowState:
        """``I`` and the chunk counter of each row at the start of a call (fresh rows: the live ``I_0``)."""
        initial = self.initial.to(dtype).expand_as(state.memory)
        memory = torch.where(state.fresh[:, None, None], initial, state.memory.to(dtype))
        chunks = torch.where(state.fresh, torch.zeros_like(state.chunks), state.chunks)
        return SlowState(memory, chunks)

    # ---- the two streams (one implementation, for chunks and for one-token steps) ------------------

    def memory_kv(self, memory: Tensor) -> KeysValues:
        """Per group, the keys and values of the perceptual cross-attention's context ``LN(I + P)``
        (none with ``top_down=False``)."""
        context = memory + self.slot_encoding.to(memory.dtype)
        kv = [group.cross.attn.heads_kv(group.cross.norm_context(context)) for group in self.groups
              if group.cross is not None]
        return KeysValues(tuple(k for k, _ in kv), tuple(v for _, v in kv))

    def perceive(self, h: Tensor, key_mask: Tensor | None, memory_kv: KeysValues, merge: Merge | None = None, *,
                 causal: bool, sees_itself: bool = False, first_group_attended: bool = False) -> Perceived:
        """The perceptual module (Eqs. 5, 6) on chunks ``h [chunks, K, D]``, or on one token of each
        row's chunk ``[B, 1, D]`` (then ``merge`` puts in the keys/values of the chunk's earlier slots).
        ``memory_kv``: the keys/values of ``LN(I_{l-1} + P)`` (``memory_kv``).
        ``first_group_attended``: ``h`` has been through the first group's self-attention layers (they
        do not read the state, so the chunked forward runs them on all chunks at once).
        Returns ``H`` and the keys/values of the self-attention layers run."""
        keys, values = [], []
        for index, group in enumerate(self.groups):
            if index > 0 or not first_group_attended:
                attended = group.self_attend(h, key_mask, causal, merge, index * len(group.self_blocks),
                                             sees_itself)
                h = attended.outputs
                keys += attended.keys
                values += attended.values
            if group.cross is not None:  # Eq. 6, reading I_{l-1}
                h = group.read_state(h, memory_kv.keys[index], memory_kv.values[index])
        return Perceived(h, keys, values)

    def slow_update(self, memory: Tensor, h: Tensor, key_mask: Tensor | None, valid: Tensor) -> Tensor:
        """Eq. 7 for one chunk; rows whose chunk is all padding (``valid`` False) keep their state.

        The queries read ``I + P``; the residual stream is ``I`` (``slot_encoding="read"``) or ``I + P``
        (``"state"``: the authors add P to the state before every chunk, so it accumulates).
        """
        context = memory + self.slot_encoding.to(memory.dtype)
        residual = context if self.config.slot_encoding == "state" else memory
        new = self.update(residual, context, h, key_mask)
        return torch.where(valid[:, None, None], new, memory)

    def update_state(self, state: SlowState, h: Tensor, key_mask: Tensor | None, updated: Tensor) -> SlowState:
        """Eq. 7 for the rows whose chunk ends (``updated``), counted; ``truncate_every``: detach the
        state after every n-th chunk of a row (truncated backprop through the state)."""
        memory = self.slow_update(state.memory, h, key_mask, updated)
        chunks = state.chunks + updated.long()
        if self.config.truncate_every is not None:
            cut = updated & (chunks % self.config.truncate_every == 0)
            memory = torch.where(cut[:, None, None], memory.detach(), memory)
        return SlowState(memory, chunks)

    def done_refused(self) -> str | None:
        if self.causal:
            return None
        return ("done (episode ends inside a call) needs causal=True: a non-causal TLB lets a token see the later "
                "tokens of its chunk, which may belong to the next episode")

    def scan(self, x: Tensor, state: TLBState, mask: Tensor | None, done: Tensor | None):
        """``y [B, L, D], state`` (``forward``: ``CausalCore``). ``done`` (``causal=True`` only): the episode
        ends before the call's last step; a row's next step starts from the initial state (an empty chunk
        and ``I_0``)."""
        if self.causal and x.shape[1] == 1:
            return self._step(x, state, mask)
        return self._chunks(x, state, mask, done)

    # ---- a call of several tokens: chunk by chunk (chronomem.ops.tlb_chunks) ------------------------

    def _chunks(self, x: Tensor, state: TLBState, mask: Tensor | None, done: Tensor | None):
        # 1. Chunks of K (padded and masked), with the position within the chunk. A row continuing a
        #    chunk that an earlier call began, and each episode that begins inside the call, is a
        #    virtual row with chunks of its own.
        continued = ContinuedChunk.of(state.cache, x.dtype)  # None unless some row is mid-chunk
        fill = None if continued is None else continued.cache.fill
        layout = layout_chunks(x.shape[0], x.shape[1], self.chunk_size, self.causal, fill, done, x.device)
        chunk_inputs = to_chunks(layout, x, mask)
        slow = virtual_row_states(layout, self._start(state, x.dtype), self.initial.to(x.dtype))
        m = chunk_inputs.mask if continued is None else continued.mask(chunk_inputs.mask, layout.continued())
        h = self.drop(chunk_inputs.tokens + self.chunk_encoding.to(x.dtype))

        # 2. Eq. 5 of the first group does not read the state: all chunks at once.
        merge = None if continued is None else continued.merge(layout.continued())
        first = self.groups[0].self_attend(h, None if bool(m.all()) else m, self.causal, merge)

        # 3. The recurrence: perceptual cross-attention(s) reading I_{l-1} (Eq. 6) and the later groups,
        #    then the bottleneck update (Eq. 7) for the chunks that end inside this call.
        def perceive_chunks(h, key_mask, memory, at):
            merge = None if continued is None or at is None else continued.merge(at)
            out = self.perceive(h, key_mask, self.memory_kv(memory), merge, causal=self.causal,
                                first_group_attended=True)
            return out if merge is None else out._replace(outputs=continued.outputs(out.outputs, at))

        updated = layout.complete & m.any(1)  # an all-padding chunk leaves the state unchanged
        scan = scan_chunks(layout, first.outputs, m, updated, slow, perceive_chunks, self.update_state,
                           self.config.scan_impl)

        y = self.norm(to_tokens(layout, scan.outputs))
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        end = row_states(layout, scan.state)  # each row continues from its last episode
        fresh = torch.zeros_like(state.fresh)
        if not self.causal:
            return y, TLBState(end.memory, end.chunks, fresh)
        cache = assemble_cache(layout, scan.outputs, m, first.keys + scan.keys(), first.values + scan.values(),
                               self.memory_kv(end.memory))
        return y, TLBState(end.memory, end.chunks, fresh, cache)

    # ---- a call of one token (an agent acting): O(K) work with the chunk's keys/values cached -------

    def _step(self, x: Tensor, state: TLBState, mask: Tensor | None):
        cache = state.cache.to(x.dtype)
        if bool(state.fresh.any()):  # rows that (re)start read I_0
            slow = self._start(state, x.dtype)
            memory_kv = self.memory_kv(slow.memory)
        else:
            slow = SlowState(state.memory.to(x.dtype), state.chunks)
            memory_kv = KeysValues(cache.memory_keys, cache.memory_values)
        fill = cache.fill
        here = torch.arange(self.chunk_size, device=x.device) == fill[:, None]  # [B, K]: this token's slot
        slot_valid = cache.slot_valid | (here if mask is None else here & mask)

        def write(layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:  # the token's k, v into its slot
            slot = fill[:, None, None, None].expand_as(k)
            return cache.chunk_keys[layer].scatter(2, slot, k), cache.chunk_values[layer].scatter(2, slot, v)

        # Eqs. 5, 6: the token attends to its chunk's valid slots so far, itself included (the later
        # slots are empty, so this is causal), and reads I_{l-1}.
        h = self.drop(x + self.chunk_encoding.to(x.dtype)[fill][:, None])
        out = self.perceive(h, slot_valid, memory_kv, write, causal=False, sees_itself=mask is None)
        outputs = cache.outputs.scatter(1, fill[:, None, None].expand(-1, 1, h.shape[-1]), out.outputs)
        y = self.norm(out.outputs)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        cache = ChunkCache(fill=fill + 1, slot_valid=slot_valid, outputs=outputs, chunk_keys=tuple(out.keys),
                           chunk_values=tuple(out.values), memory_keys=memory_kv.keys, memory_values=memory_kv.values)
        ended = cache.fill == self.chunk_size
        if bool(ended.any()):  # these rows' chunk is complete: Eq. 7 for them, then they start a new one
            rows = ended.nonzero().flatten()
            valid = slot_valid[rows]
            new = self.update_state(slow.take(rows), outputs[rows], valid, valid.any(1))
            slow = slow.put(rows, new)
            cache = cache.restart(rows, self.memory_kv(new.memory))
        return y, TLBState(slow.memory, slow.chunks, torch.zeros_like(state.fresh), cache)

    # ---- readout ----------------------------------------------------------------------------------

    def latest_memory(self, state: TLBState) -> Tensor:
        """``I`` after every token seen so far ``[B, N, D]``: ``state.memory`` with the update (Eq. 7) of
        the partial chunk applied (causal TLB), as if the sequence ended here. Rows marked fresh (just
        reset, not yet run) read the initial state ``I_0``. The state itself is unchanged: the chunk
        goes on at the next call."""
        memory = torch.where(state.fresh[:, None, None], self.initial.to(state.memory.dtype), state.memory)
        cache = state.cache
        if cache is None or not bool(cache.slot_valid.any()):
            return memory
        return self.slow_update(memory, cache.outputs, cache.slot_valid, cache.slot_valid.any(1))

    def summary(self, y: Tensor, state: TLBState, mask: Tensor | None = None) -> Tensor:
        """Classification readout (Sec. 4.3): mean over the N state vectors of ``LN(I_last)``, with
        ``I_last = latest_memory(state)`` (a partial chunk counts)."""
        return self.norm_state(self.latest_memory(state)).mean(dim=1)


@register_model("tlb")
def build_tlb(
    dim: int,
    depth: int,
    num_heads: int,
    causal: bool = False,
    **options,
) -> TLB:
    """Registry builder. ``depth`` = repetitions of ``[R x self, 1 x cross]`` (the authors' LRA model is
    ``depth=1, self_per_cross=2``). ``options`` are ``TLB.Config`` fields (its defaults otherwise):
    ``chunk_size``, ``num_state``, ``self_per_cross``, ``preset="authors"`` (then the options given here
    override the preset's sizes), ``top_down``, ``learned_init``, ``truncate_every``, ``ff_mult``, ``dropout``,
    ``slot_encoding``, ``qkv_dim``, ``attn_bias``, ``norm_eps``, ``gelu_approximate``."""
    return TLB(
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        causal=causal,
        **options,
    )
