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

Speed (docs/tlb.md): the ``R`` self-attention layers that precede the first cross-attention
do not depend on the state, so they run on all chunks at once as one ``[B * chunks, K, D]`` call;
only the cross-attentions, the later ``[R x self]`` groups and the state update loop over chunks.

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
  one call (to float tolerance). The state carries the chunk being filled: its slots so far, their
  outputs ``H`` and, per self-attention layer, their keys and values, so the state still updates
  once per complete chunk, and a one-token call costs O(K) (attention to the cached keys/values),
  not a recomputation of the partial chunk. ``done [B, L]`` ends episodes inside a call: after a
  done step the row continues from the initial state (``I_0``, an empty chunk; the unfinished chunk
  of the ended episode is dropped) and no gradient crosses the boundary. ``latest_memory(state)`` is
  ``I`` including the pending partial chunk (what ``summary`` reads).
* ``causal=False``: a token sees its whole chunk, so a call ends its last chunk: calls split at
  multiples of ``chunk_size`` equal one call; a call of another length updates the state with its
  partial last chunk and the next call starts a new chunk. ``done`` is an error.

Speed of a call with dones or rows mid-chunk: each episode part of a row is a *virtual row* with its
own chunks; the chunks are computed in *waves* (wave ``c`` = the ``c``-th chunk of every virtual row,
all independent), so episode ends add chunks but not sequential steps. Without them (the common
case) the chunks are the plain reshape of the input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from chronomem.checks import (
    check_done,
    check_dropout,
    check_even_dim,
    check_heads,
    check_mask,
    check_positive,
    check_state_batch,
    check_tensor,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.layers import (
    CrossAttentionBlock,
    RecurrentState,
    SelfAttentionBlock,
    sinusoid_encoding,
    split_chunks,
)
from chronomem.registry import register_model

__all__ = ["TLB", "TLBState"]


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

    The chunk being filled (``causal=True`` only; ``None`` for the non-causal TLB, whose calls end at
    chunk boundaries), so that a call may stop anywhere inside a chunk and the next one continues it:

    * ``fill [B]`` (long): slots of the current chunk filled so far, ``0 <= fill < K``.
    * ``slot_valid [B, K]`` (bool): those of them holding a valid (unpadded) token.
    * ``partial [B, K, D]``: their perceptual outputs ``H`` (Eq. 7 reads them when the chunk completes).
    * ``chunk_keys``, ``chunk_values``: one ``[B, heads, K, head_dim]`` tensor per self-attention layer
      (``depth * R`` of them): their keys and values, so that a new token attends to the chunk's
      earlier tokens without recomputing them.
    * ``memory_keys``, ``memory_values``: one ``[B, heads, N, head_dim]`` tensor per group: the keys
      and values of ``LN(I + P)`` that the perceptual cross-attention reads (Eq. 6); ``I`` changes
      once per chunk, so a one-token call does not recompute them.

    Slots at and after ``fill`` hold zeros. Like any key/value cache, the cached tensors were computed
    with the parameters of the call that made them. ``reset(done)`` restores the *initial* state of the
    finished rows (not zeros): it marks them fresh and zeroes everything else of theirs (an empty
    partial chunk; their ``memory`` rows are replaced by ``I_0`` at the next call).
    """

    memory: Tensor
    chunks: Tensor
    fresh: Tensor
    fill: Tensor | None = None
    slot_valid: Tensor | None = None
    partial: Tensor | None = None
    chunk_keys: tuple[Tensor, ...] | None = None
    chunk_values: tuple[Tensor, ...] | None = None
    memory_keys: tuple[Tensor, ...] | None = None
    memory_values: tuple[Tensor, ...] | None = None

    def reset(self, done: Tensor) -> TLBState:
        cleared = super().reset(done)  # checks ``done``; zeroes memory, counter and the partial chunk
        return replace(cleared, fresh=self.fresh | done)


# =============================================================================================
# 2. The model: perceptual module (fast) + bottleneck update (slow), chunk by chunk
# =============================================================================================


class PerceptualGroup(nn.Module):
    """``R`` pre-LN self-attention + FFN layers (Eq. 5), then one pre-LN cross-attention + FFN layer
    whose keys/values are the state (Eq. 6). ``block`` holds the blocks' keywords (``ff_mult``,
    ``dropout``, ``qkv_dim``, ``attn_bias``, ``norm_eps``, ``gelu_approximate``)."""

    def __init__(self, dim: int, num_heads: int, self_per_cross: int, top_down: bool = True, **block):
        super().__init__()
        self.self_blocks = nn.ModuleList(SelfAttentionBlock(dim, num_heads, **block) for _ in range(self_per_cross))
        # top_down=False (paper 003 Table 2's ablation): no cross-attention to the state.
        self.cross = CrossAttentionBlock(dim, num_heads, **block) if top_down else None

    def self_attend(self, h: Tensor, key_mask: Tensor | None, causal: bool) -> Tensor:
        for block in self.self_blocks:
            h = block(h, key_mask=key_mask, causal=causal)
        return h


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


class TLB(nn.Module):
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

        self.drop = nn.Dropout(cfg.dropout)
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
        with ``causal=True`` also an empty partial chunk."""
        check_positive(batch_size, "batch_size")
        device = self.initial.device if device is None else device
        memory = self.initial.detach().to(device).expand(batch_size, -1, -1).clone()
        chunks = torch.zeros(batch_size, dtype=torch.long, device=device)
        state = TLBState(memory, chunks, torch.ones(batch_size, dtype=torch.bool, device=device))
        return replace(state, **self._empty_chunk(batch_size, device, memory.dtype)) if self.causal else state

    def _self_layers(self) -> list[SelfAttentionBlock]:
        return [block for group in self.groups for block in group.self_blocks]

    def _chunk_shapes(self) -> dict[str, tuple]:
        """Per-row shapes of the partial-chunk fields of the state (tuples: one per layer or group)."""
        K, N, D = self.chunk_size, self.num_state, self.dim
        chunk_kv = tuple((b.attn.num_heads, K, b.attn.head_dim) for b in self._self_layers())
        memory_kv = tuple((g.cross.attn.num_heads, N, g.cross.attn.head_dim) for g in self.groups
                          if g.cross is not None)
        return dict(fill=(), slot_valid=(K,), partial=(K, D), chunk_keys=chunk_kv, chunk_values=chunk_kv,
                    memory_keys=memory_kv, memory_values=memory_kv)

    def _empty_chunk(self, batch: int, device, dtype) -> dict:
        """The partial-chunk fields of fresh rows: all zeros, as ``reset`` leaves them (a fresh row's
        ``memory_keys`` / ``memory_values`` are computed from ``I_0`` at its next call)."""
        fields = {}
        for name, shape in self._chunk_shapes().items():
            kind = torch.long if name == "fill" else torch.bool if name == "slot_valid" else dtype
            if name.endswith(("_keys", "_values")):  # one tensor per layer or group
                fields[name] = tuple(torch.zeros(batch, *s, device=device, dtype=kind) for s in shape)
            else:
                fields[name] = torch.zeros(batch, *shape, device=device, dtype=kind)
        return fields

    def _check_state(self, state, batch: int, device, dtype) -> TLBState:
        if state is None:
            return self.init_state(batch, device)
        if not isinstance(state, TLBState):
            raise TypeError(f"state must be a TLBState (or None), got {type(state).__name__}")
        check_state_batch(state.memory.shape[0], batch)
        expected = (batch, self.num_state, self.dim)
        if tuple(state.memory.shape) != expected:
            raise ValueError(f"state.memory must have shape {expected}, got {tuple(state.memory.shape)}")
        if not self.causal:
            if state.fill is not None and bool(state.fill.any()):
                raise ValueError("state holds a partial chunk (state.fill > 0), which only a causal TLB continues")
            return state
        if state.fill is None:  # a state without a partial chunk (made by hand, or by a non-causal TLB)
            memory_keys, memory_values = self._memory_kv(self._start(state, dtype)[0])
            return replace(state, **{**self._empty_chunk(batch, device, dtype), "memory_keys": memory_keys,
                                     "memory_values": memory_values})
        for name, wanted in self._chunk_shapes().items():
            got = getattr(state, name)
            shapes = tuple(tuple(t.shape[1:]) for t in got) if isinstance(got, tuple) else tuple(got.shape[1:])
            if shapes != wanted:
                raise ValueError(f"state.{name} must have per-row shape {wanted}, got {shapes}")
        return state

    def _start(self, state: TLBState, dtype) -> tuple[Tensor, Tensor]:
        """``I`` and the chunk counter of each row at the start of a call (fresh rows: the live ``I_0``)."""
        initial = self.initial.to(dtype).expand_as(state.memory)
        memory = torch.where(state.fresh[:, None, None], initial, state.memory.to(dtype))
        chunks = torch.where(state.fresh, torch.zeros_like(state.chunks), state.chunks)
        return memory, chunks

    # ---- the two streams --------------------------------------------------------------------------

    def _self_block(self, block: SelfAttentionBlock, h: Tensor, key_mask: Tensor | None, causal: bool,
                    merge=None, sees_itself: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """One pre-LN self-attention + FFN layer within the chunk (Eq. 5), returning its keys and values
        too. ``merge(k, v) -> (k, v)`` puts in the keys/values of slots filled by an earlier call.
        ``sees_itself``: every query may attend at least to its own key, so ``attend``'s guard for rows
        without a visible key is not needed (one-token calls without padding: a step saves a few ops)."""
        attn = block.attn
        normed = block.norm_attn(h)
        q, (k, v) = attn.heads_q(normed), attn.heads_kv(normed)
        if merge is not None:
            k, v = merge(k, v)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        if sees_itself and not causal:
            dropout = attn.dropout if attn.training else 0.0
            read = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            h = h + attn.to_out(read.transpose(-3, -2).flatten(-2))
        else:
            h = h + attn.attend(q, k, v, mask=mask, causal=causal)
        return h + block.ff(block.norm_ff(h)), k, v

    def _memory_kv(self, memory: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Per group, the keys and values of the perceptual cross-attention's context ``LN(I + P)``
        (none with ``top_down=False``)."""
        context = memory + self.slot_encoding.to(memory.dtype)
        kv = [group.cross.attn.heads_kv(group.cross.norm_context(context)) for group in self.groups
              if group.cross is not None]
        return tuple(k for k, _ in kv), tuple(v for _, v in kv)

    @staticmethod
    def _cross(block: CrossAttentionBlock, h: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Eq. 6: pre-LN cross-attention + FFN (``CrossAttentionBlock``) with the context's keys/values given."""
        attn = block.attn
        h = h + attn.attend(attn.heads_q(block.norm_query(h)), k, v)
        return h + block.ff(block.norm_ff(h))

    def slow_update(
        self, memory: Tensor, context: Tensor, h: Tensor, key_mask: Tensor | None, valid: Tensor
    ) -> Tensor:
        """Eq. 7 for one chunk; rows whose chunk is all padding (``valid`` False) keep their state.

        The queries read ``context = I + P``; the residual stream is ``I`` (``slot_encoding="read"``) or
        ``I + P`` (``"state"``: the authors add P to the state before every chunk, so it accumulates).
        """
        residual = context if self.config.slot_encoding == "state" else memory
        new = self.update(residual, context, h, key_mask)
        return torch.where(valid[:, None, None], new, memory)

    def _count(self, memory: Tensor, chunks: Tensor, updated: Tensor) -> tuple[Tensor, Tensor]:
        """Count the rows' updated chunks; ``truncate_every``: detach the state after every n-th one."""
        chunks = chunks + updated.long()
        if self.config.truncate_every is not None:  # truncated backprop through the state
            cut = updated & (chunks % self.config.truncate_every == 0)
            memory = torch.where(cut[:, None, None], memory.detach(), memory)
        return memory, chunks

    def forward(self, x: Tensor, state: TLBState | None = None, mask: Tensor | None = None,
                done: Tensor | None = None):
        """``y [B, L, D], state``. ``done [B, L]`` (``causal=True`` only): True where a step is the last of
        its episode; the row's next step starts from the initial state (an empty chunk and ``I_0``)."""
        x = check_tensor(x, "x", 3, self.dim, "[B, L, dim]", dtype=parameter_dtype(self))
        batch, n = x.shape[:2]
        given_mask = check_mask(mask, "mask", (batch, n))
        done = check_done(done, (batch, n))
        if done is not None and not self.causal:
            raise ValueError("done (episode ends inside a call) needs causal=True: a non-causal TLB lets a "
                             "token see the later tokens of its chunk, which may belong to the next episode")
        state = self._check_state(state, batch, x.device, x.dtype)
        if self.causal and n == 1:
            y, new_state = self._step(x, state, given_mask)
        else:
            y, new_state = self._chunks(x, state, given_mask, done)
        if done is not None and bool(done[:, -1].any()):
            new_state = new_state.reset(done[:, -1])  # the rows whose last step ended an episode
        return y, new_state

    # ---- a call of several tokens: chunk by chunk --------------------------------------------------

    def _chunks(self, x: Tensor, state: TLBState, mask: Tensor | None, done: Tensor | None):
        batch, n, D = x.shape
        K = self.chunk_size
        memory, chunks = self._start(state, x.dtype)
        fill = state.fill if self.causal else None
        prefix = fill is not None and bool(fill.any())  # rows continuing a chunk begun by an earlier call
        starts = None  # [B, L]: True where a step begins a new episode inside the call
        if done is not None and n > 1:
            starts = nn.functional.pad(done[:, :-1], (1, 0))
            starts = starts if bool(starts.any()) else None

        # 1. Chunks of K (padded and masked), position encoding within the chunk. Every chunk of every
        #    row is one entry of a flat list ordered chunk index first ("waves"): the chunks of one
        #    wave have no state dependence between them and run as one batch.
        if prefix or starts is not None:
            lay = _episode_layout(n, K, batch, fill if prefix else None, starts, x.device)
            valid = torch.ones(batch, n, dtype=torch.bool, device=x.device) if mask is None else mask
            h = x.new_zeros(lay.total * K, D).index_copy(0, lay.pos, x.reshape(-1, D)).view(lay.total, K, D)
            m = torch.zeros(lay.total * K, dtype=torch.bool, device=x.device)
            m = m.index_copy(0, lay.pos, valid.flatten()).view(lay.total, K)
            if lay.virtual > batch:  # episodes that begin inside the call start from I_0
                extra = lay.virtual - batch
                memory = torch.cat([memory, self.initial.to(x.dtype).expand(extra, -1, -1)])
                chunks = torch.cat([chunks, chunks.new_zeros(extra)])
            memory, chunks = memory[lay.order], chunks[lay.order]
        else:
            lay = _aligned_layout(n, K, batch, self.causal, x.device)
            h, m = split_chunks(x, K, mask)  # [B, C, K, D]
            h = h.transpose(0, 1).reshape(lay.total, K, D)
            m = m.transpose(0, 1).reshape(lay.total, K)
        slots = torch.arange(K, device=x.device)
        if prefix:  # the slots an earlier call filled: their tokens count as keys of the chunk
            kept = slots < fill[:, None]  # [B, K]
            m = m.index_put((lay.head,), m[lay.head] | (kept & state.slot_valid))
        h = self.drop(h + self.chunk_encoding.to(x.dtype))
        chunk_valid = m.any(1)  # chunks holding at least one valid token
        update = lay.complete & chunk_valid  # chunks that end inside this call and update the state (Eq. 7)
        waves_full = [c == s for c, s in zip(_wave_counts(m.all(1), lay), lay.sizes, strict=True)]
        waves_update = [c > 0 for c in _wave_counts(update, lay)]  # waves in which some chunk ends

        def merge_cached(layer: int):
            if not prefix:
                return None
            ck, cv = state.chunk_keys[layer].to(x.dtype), state.chunk_values[layer].to(x.dtype)
            take = kept[:, None, :, None]

            def merge(k, v):
                k = k.index_put((lay.head,), torch.where(take, ck, k[lay.head]))
                return k, v.index_put((lay.head,), torch.where(take, cv, v[lay.head]))

            return merge

        # 2a. Fast path: the self-attention layers before the first cross-attention do not depend on
        #     the state; run them on every chunk at once as one batch [chunks, K, D].
        key_mask = None if all(waves_full) else m
        kv = []  # per self-attention layer: keys and values of every chunk (for the partial chunk)
        for layer, block in enumerate(self.groups[0].self_blocks):
            h, k, v = self._self_block(block, h, key_mask, self.causal, merge_cached(layer))
            kv.append(([k], [v]))
        first = len(kv)

        # 2b. The recurrence over chunks, one wave at a time: perceptual cross-attention(s) reading
        #     I_{l-1} (Eq. 6), then the bottleneck update (Eq. 7) for the chunks that end here.
        slot_enc = self.slot_encoding.to(x.dtype)  # P
        outputs = []
        for wave, (start, size) in enumerate(zip(lay.starts, lay.sizes, strict=True)):
            out, wave_mask = h[start:start + size], m[start:start + size]
            key_mask = None if waves_full[wave] else wave_mask
            state_now = memory[:size]  # the rows of this wave come first (layout order)
            context = state_now + slot_enc  # the state I_{l-1} read with its slot encoding
            memory_keys, memory_values = self._memory_kv(state_now)
            layer = first
            for index, group in enumerate(self.groups):
                if index > 0:
                    for block in group.self_blocks:  # Eq. 5, within the chunk
                        merge = merge_cached(layer) if wave == 0 else None
                        out, k, v = self._self_block(block, out, key_mask, self.causal, merge)
                        if wave == 0:
                            kv.append(([], []))
                        kv[layer][0].append(k)
                        kv[layer][1].append(v)
                        layer += 1
                if group.cross is not None:
                    out = self._cross(group.cross, out, memory_keys[index], memory_values[index])  # Eq. 6
            if wave == 0 and prefix:  # the earlier call's outputs of the chunk's first slots
                out = out.index_put((lay.head,), torch.where(kept[..., None], state.partial.to(x.dtype),
                                                             out[lay.head]))
            outputs.append(out)
            if waves_update[wave]:
                updated = update[start:start + size]
                new = self.slow_update(state_now, context, out, key_mask, updated)
                new, counted = self._count(new, chunks[:size], updated)
                memory = new if size == memory.shape[0] else torch.cat([new, memory[size:]])
                chunks = counted if size == chunks.shape[0] else torch.cat([counted, chunks[size:]])

        out = torch.cat(outputs)  # [chunks, K, D], layout order
        if lay.pos is None:
            y = out.view(-1, batch, K, D).transpose(0, 1).reshape(batch, -1, D)[:, :n]
        else:
            y = out.view(-1, D)[lay.pos].view(batch, n, D)
        y = self.norm(y)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)

        fresh = torch.zeros_like(state.fresh)
        if lay.last is not None:  # each row continues from its last episode
            memory, chunks = memory[lay.last], chunks[lay.last]
        if not self.causal:
            return y, TLBState(memory, chunks, fresh)
        # The partial chunk each row ends in (all zeros where the call ended a chunk).
        kept_new = slots < lay.fill[:, None]
        cut = lay.last_chunk

        def keep(t: Tensor, where: Tensor) -> Tensor:
            return torch.where(where, t, t.new_zeros(()))

        partial = dict(
            fill=lay.fill,
            slot_valid=m[cut] & kept_new,
            partial=keep(out[cut], kept_new[..., None]),
            chunk_keys=tuple(keep(torch.cat(k)[cut], kept_new[:, None, :, None]) for k, _ in kv),
            chunk_values=tuple(keep(torch.cat(v)[cut], kept_new[:, None, :, None]) for _, v in kv),
        )
        partial["memory_keys"], partial["memory_values"] = self._memory_kv(memory)
        return y, TLBState(memory, chunks, fresh, **partial)

    # ---- a call of one token (an agent acting): O(K) work with the chunk's keys/values cached -------

    def _step(self, x: Tensor, state: TLBState, mask: Tensor | None):
        K = self.chunk_size
        fresh = bool(state.fresh.any())
        memory, chunks = self._start(state, x.dtype) if fresh else (state.memory.to(x.dtype), state.chunks)
        fill = state.fill
        here = torch.arange(K, device=x.device) == fill[:, None]  # [B, K]: the slot this token takes
        slot_valid = state.slot_valid | (here if mask is None else here & mask)
        key_mask = slot_valid  # the chunk's valid tokens so far, this one included (causal by construction)
        if fresh:  # the cross-attention's keys/values of I_0 for the rows that (re)start
            memory_keys, memory_values = self._memory_kv(memory)
        else:
            memory_keys = tuple(t.to(x.dtype) for t in state.memory_keys)
            memory_values = tuple(t.to(x.dtype) for t in state.memory_values)
        h = self.drop(x + self.chunk_encoding.to(x.dtype)[fill][:, None])
        chunk_keys, chunk_values = [], []
        layer = 0
        for index, group in enumerate(self.groups):
            for block in group.self_blocks:  # Eq. 5: attend to the chunk's earlier tokens and itself
                write = _write_slot(fill, state.chunk_keys[layer].to(x.dtype), state.chunk_values[layer].to(x.dtype))
                h, k, v = self._self_block(block, h, key_mask, False, write, sees_itself=mask is None)
                chunk_keys.append(k)
                chunk_values.append(v)
                layer += 1
            if group.cross is not None:
                h = self._cross(group.cross, h, memory_keys[index], memory_values[index])  # Eq. 6, reading I_{l-1}
        partial = state.partial.to(x.dtype).scatter(1, fill[:, None, None].expand(-1, 1, h.shape[-1]), h)
        y = self.norm(h)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        fill = fill + 1
        ended = fill == K
        if bool(ended.any()):  # these rows' chunk is complete: Eq. 7 for them, then they start a new one
            rows = ended.nonzero().flatten()
            valid = slot_valid[rows]
            context = memory[rows] + self.slot_encoding.to(x.dtype)
            new = self.slow_update(memory[rows], context, partial[rows], valid, valid.any(1))
            new, counted = self._count(new, chunks[rows], valid.any(1))
            memory, chunks = memory.index_put((rows,), new), chunks.index_put((rows,), counted)
            new_keys, new_values = self._memory_kv(new)
            memory_keys = tuple(t.index_put((rows,), n) for t, n in zip(memory_keys, new_keys, strict=True))
            memory_values = tuple(t.index_put((rows,), n) for t, n in zip(memory_values, new_values, strict=True))
            fill, slot_valid = fill.index_fill(0, rows, 0), slot_valid.index_fill(0, rows, False)
            partial = _clear_rows(partial, rows)
            chunk_keys = [_clear_rows(t, rows) for t in chunk_keys]
            chunk_values = [_clear_rows(t, rows) for t in chunk_values]
        return y, TLBState(memory, chunks, torch.zeros_like(state.fresh), fill, slot_valid, partial,
                           tuple(chunk_keys), tuple(chunk_values), tuple(memory_keys), tuple(memory_values))

    # ---- readout ----------------------------------------------------------------------------------

    def latest_memory(self, state: TLBState) -> Tensor:
        """``I`` after every token seen so far ``[B, N, D]``: ``state.memory`` with the update (Eq. 7) of
        the partial chunk applied (causal TLB), as if the sequence ended here. Rows marked fresh (just
        reset, not yet run) read the initial state ``I_0``. The state itself is unchanged: the chunk
        goes on at the next call."""
        memory = torch.where(state.fresh[:, None, None], self.initial.to(state.memory.dtype), state.memory)
        if state.fill is None or not bool(state.slot_valid.any()):
            return memory
        context = memory + self.slot_encoding.to(memory.dtype)
        return self.slow_update(memory, context, state.partial, state.slot_valid, state.slot_valid.any(1))

    def summary(self, y: Tensor, state: TLBState, mask: Tensor | None = None) -> Tensor:
        """Classification readout (Sec. 4.3): mean over the N state vectors of ``LN(I_last)``, with
        ``I_last = latest_memory(state)`` (a partial chunk counts)."""
        return self.norm_state(self.latest_memory(state)).mean(dim=1)


# =============================================================================================
# 3. Where each token goes: chunks of K per row and per episode, in waves
# =============================================================================================


@dataclass(frozen=True)
class _Layout:
    """The flat list of chunks a call computes, ordered by wave (a chunk's index within its episode's
    part of the call) and, within a wave, by the *virtual row* it belongs to: a row's episode that the
    call continues (virtual rows ``0..B-1``) or one that begins inside the call (from ``B`` on).
    Virtual rows are ordered by their number of chunks, longest first, so wave ``c`` is the first
    ``sizes[c]`` of them and the state of wave ``c``'s chunks is a prefix of the state tensor."""

    total: int  # chunks
    starts: list[int]  # first chunk of each wave
    sizes: list[int]  # chunks (= virtual rows) in each wave
    virtual: int  # virtual rows
    order: Tensor | None  # layout position -> virtual row (None: identity)
    pos: Tensor | None  # [B * L]: flat slot (chunk * K + slot) of each token (None: aligned chunks)
    head: Tensor | None  # [B]: the first chunk of each row (its earlier slots come from the state)
    complete: Tensor  # [chunks]: the chunk's last slot is filled inside this call (or causal=False)
    last: Tensor | None  # [B]: layout position of each row's last virtual row (None: identity)
    last_chunk: Tensor  # [B]: the chunk each row's last token is in
    fill: Tensor  # [B]: slots of the chunk each row ends in (0: the call ended a chunk)


def _waves(sizes: list[int], K: int, ends: Tensor, device) -> tuple[list[int], Tensor, Tensor]:
    """Wave starts, their tensor, and per chunk whether the chunk is complete (``ends``: each layout
    position's filled slots in all, chunks before included)."""
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size)
    sizes_t = torch.tensor(sizes, device=device)
    wave = torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes_t)
    row = torch.arange(len(wave), device=device) - torch.tensor(starts, device=device)[wave]
    return starts, torch.tensor(starts, device=device), ends[row] >= (wave + 1) * K


def _aligned_layout(n: int, K: int, batch: int, causal: bool, device) -> _Layout:
    """Every row starts a chunk at the call's first step and no episode ends inside the call."""
    count = -(-n // K)
    sizes = [batch] * count
    # A causal TLB leaves a partial last chunk for the next call; a non-causal one ends it here.
    ends = torch.full((batch,), n if causal else count * K, device=device)
    starts, starts_t, complete = _waves(sizes, K, ends, device)
    rows = torch.arange(batch, device=device)
    fill = torch.full((batch,), n % K if causal else 0, device=device)
    return _Layout(count * batch, starts, sizes, batch, None, None, None, complete, None,
                   starts_t[-1] + rows, fill)


def _episode_layout(n: int, K: int, batch: int, fill: Tensor | None, starts: Tensor | None, device) -> _Layout:
    """Rows continuing a partial chunk (``fill``) and/or episodes beginning inside the call (``starts
    [B, L]``): each token's virtual row, chunk and slot."""
    t = torch.arange(n, device=device)
    rows = torch.arange(batch, device=device)
    offset = torch.zeros(batch, dtype=torch.long, device=device) if fill is None else fill
    if starts is None:
        virtual_row = rows[:, None].expand(batch, n)
        phase = offset[:, None] + t  # the token's slot count within its episode's chunks
        virtual = batch
    else:
        episode = starts.long().cumsum(1)  # 0: the episode the call continues
        begin = torch.where(starts, t, 0).cummax(1).values
        phase = torch.where(episode == 0, offset[:, None] + t, t - begin)
        new = episode[:, -1]
        before = new.cumsum(0) - new
        virtual_row = torch.where(episode == 0, rows[:, None], batch - 1 + before[:, None] + episode)
        virtual = batch + int(new.sum())
    ends = torch.zeros(virtual, dtype=torch.long, device=device)
    ends = ends.scatter_reduce(0, virtual_row.flatten(), (phase + 1).flatten(), "amax")
    count = (ends + K - 1) // K
    order = torch.argsort(count, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(virtual, device=device)
    count_sorted = count[order]
    sizes = (count_sorted[None, :] > torch.arange(int(count_sorted[0]), device=device)[:, None]).sum(1).tolist()
    starts_list, starts_t, complete = _waves(sizes, K, ends[order], device)
    chunk = starts_t[phase // K] + rank[virtual_row]
    last = rank[virtual_row[:, -1]]
    end = ends[virtual_row[:, -1]]
    return _Layout(sum(sizes), starts_list, sizes, virtual, order, (chunk * K + phase % K).flatten(),
                   rank[:batch], complete, last, starts_t[(end - 1) // K] + last, end % K)


def _write_slot(fill: Tensor, cached_k: Tensor, cached_v: Tensor):
    """``merge`` for a one-token call: the token's keys/values ``[B, H, 1, Dh]`` go to slot ``fill [B]``,
    the other slots come from the state."""

    def merge(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        slot = fill[:, None, None, None].expand_as(k)
        return cached_k.scatter(2, slot, k), cached_v.scatter(2, slot, v)

    return merge


def _clear_rows(t: Tensor, rows: Tensor) -> Tensor:
    """``t`` (a tensor this call made) with ``rows`` zeroed; in place when no gradient is recorded
    (acting: saves a copy of the cache), else out of place (autograd saved ``t`` for the attention)."""
    return t.index_fill(0, rows, 0.0) if torch.is_grad_enabled() else t.index_fill_(0, rows, 0.0)


def _wave_counts(flags: Tensor, lay: _Layout) -> list[int]:
    """Per wave, how many of its chunks have ``flags`` set (one host synchronisation)."""
    total = torch.cat([flags.new_zeros(1, dtype=torch.long), flags.long().cumsum(0)])
    bounds = torch.tensor([*lay.starts, lay.total], device=flags.device)
    return (total[bounds[1:]] - total[bounds[:-1]]).tolist()


@register_model("tlb")
def build_tlb(
    dim: int,
    depth: int,
    num_heads: int,
    causal: bool = False,
    *,
    chunk_size: int = 100,
    num_state: int = 100,
    self_per_cross: int = 2,
    **options,
) -> TLB:
    """Registry builder. ``depth`` = repetitions of ``[R x self, 1 x cross]`` (the authors' LRA model is
    ``depth=1, self_per_cross=2``). Other options: ``preset="authors"`` (then the arguments given here
    override the preset's sizes), ``top_down``, ``learned_init``, ``truncate_every``, ``ff_mult``, ``dropout``,
    ``slot_encoding``, ``qkv_dim``, ``attn_bias``, ``norm_eps``, ``gelu_approximate``."""
    return TLB(
        dim=dim,
        depth=depth,
        num_heads=num_heads,
        causal=causal,
        chunk_size=chunk_size,
        num_state=num_state,
        self_per_cross=self_per_cross,
        **options,
    )
