"""Temporal Latent Bottleneck (TLB; Didolkar et al. 2022, paper 003, Section 2.2).

A fast stream (the *perceptual module*, a Transformer) reads the input chunk by chunk; a slow stream
(the *temporal latent bottleneck*, a set of ``N`` state vectors ``I``) is updated once per chunk and
conditions the fast stream top-down. The only way a chunk learns about other chunks is through ``I``.

Read top to bottom next to the paper (our copy lost its equations; DESIGN.md section 3.2 restates
them from the authors' Long Range Arena code, and the numbers (1)-(7) below are the paper's):

1. Chunking (Sec. 2.2 "We chunk this input into chunks of size K"): ``x [B, L, D]`` is cut into
   ``ceil(L / K)`` chunks; the last one is padded and the padding masked. A sinusoid encoding of the
   position *within the chunk* is added to the tokens.
2. Perceptual module ``F`` (Eq. 5, 6): ``depth`` repetitions of ``[R x (pre-LN self-attention + FFN),
   1 x (pre-LN cross-attention + FFN)]``; the cross-attention's keys/values are the state
   ``I_{l-1}`` (top-down conditioning, Eq. 6), with a fixed sinusoid encoding over the ``N`` slots.
3. Bottleneck update ``G`` (Eq. 7), once per chunk, queries from the state, keys/values from the
   chunk's perceptual outputs ``H_l``::

       U   = I_{l-1} + CrossAttn(q = LN(I_{l-1} + P), kv = LN(H_l))      (padding masked)
       I_l = U + FFN(LN(U))

   (with ``slot_encoding="state"``, the authors' code, ``P`` is written into the state first:
   ``I_{l-1} <- I_{l-1} + P``, so the residual carries it and it accumulates over chunks.)

4. Readout for classification (Sec. 4.3 "We take the mean across the temporal latent bottleneck
   state vectors"): ``summary = mean_n LN(I_last)[n]``; the Classifier head adds the MLP.

Speed (DESIGN.md 3.2 and 6): the ``R`` self-attention layers that precede the first cross-attention
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

Streaming: ``y, state = tlb(x, state)``; calls split at multiples of ``chunk_size`` give the same
outputs and final state as one call (to float tolerance). A call whose length is not a multiple of
``chunk_size`` updates the state with its partial last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from chronomem.layers import (
    CrossAttentionBlock,
    RecurrentState,
    SelfAttentionBlock,
    build_config,
    check_dropout,
    check_even_dim,
    check_heads,
    check_mask,
    check_positive,
    check_state_batch,
    check_tensor,
    parameter_dtype,
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

    * ``memory [B, N, D]``: the state vectors ``I`` (without the slot encoding).
    * ``chunks [B]`` (long): chunks with at least one valid token seen since the row (re)started;
      drives ``truncate_every``.
    * ``fresh [B]`` (bool): rows that start from the module's initial state ``I_0`` at the next call.
      The module substitutes its own (possibly learned) ``I_0`` for these rows, so gradients reach
      the learned initial state after a reset too.

    ``reset(done)`` restores the *initial* state of the finished rows (not zeros): it marks them
    fresh, zeroes their counter (and their ``memory`` rows, which the next call replaces by ``I_0``).
    """

    memory: Tensor
    chunks: Tensor
    fresh: Tensor

    def reset(self, done: Tensor) -> TLBState:
        cleared = super().reset(done)  # checks ``done``; zeroes memory and counter rows
        return replace(cleared, fresh=self.fresh | done)


# =============================================================================================
# 2. The model: perceptual module (fast) + bottleneck update (slow), chunk by chunk
# =============================================================================================


class PerceptualGroup(nn.Module):
    """``R`` pre-LN self-attention + FFN layers (Eq. 5), then one pre-LN cross-attention + FFN layer
    whose keys/values are the state (Eq. 6). ``block`` holds the blocks' keywords (``ff_mult``,
    ``dropout``, ``qkv_dim``, ``attn_bias``, ``norm_eps``, ``gelu_approximate``)."""

    def __init__(self, dim: int, num_heads: int, self_per_cross: int, **block):
        super().__init__()
        self.self_blocks = nn.ModuleList(SelfAttentionBlock(dim, num_heads, **block) for _ in range(self_per_cross))
        self.cross = CrossAttentionBlock(dim, num_heads, **block)

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
        check_positive(cfg.self_per_cross, "self_per_cross", minimum=0)
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
            PerceptualGroup(cfg.dim, cfg.num_heads, cfg.self_per_cross, **block) for _ in range(cfg.depth)
        )
        self.update = BottleneckUpdate(cfg.dim, cfg.num_heads, **block)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)  # final LN of the token outputs (pre-LN stack)
        self.norm_state = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)  # LN(I_last) of the readout

    # ---- state ----------------------------------------------------------------------------------

    def init_state(self, batch_size: int, device=None) -> TLBState:
        """``I_0`` for every row (marked fresh, so the module's live ``I_0`` is used at the next call)."""
        check_positive(batch_size, "batch_size")
        device = self.initial.device if device is None else device
        memory = self.initial.detach().to(device).expand(batch_size, -1, -1).clone()
        chunks = torch.zeros(batch_size, dtype=torch.long, device=device)
        return TLBState(memory, chunks, torch.ones(batch_size, dtype=torch.bool, device=device))

    def _check_state(self, state, batch: int, device) -> TLBState:
        if state is None:
            return self.init_state(batch, device)
        if not isinstance(state, TLBState):
            raise TypeError(f"state must be a TLBState (or None), got {type(state).__name__}")
        check_state_batch(state.memory.shape[0], batch)
        expected = (batch, self.num_state, self.dim)
        if tuple(state.memory.shape) != expected:
            raise ValueError(f"state.memory must have shape {expected}, got {tuple(state.memory.shape)}")
        return state

    # ---- the two streams --------------------------------------------------------------------------

    def perceive(self, h: Tensor, context: Tensor, key_mask: Tensor | None, first_self_done: bool) -> Tensor:
        """The perceptual module on one chunk ``h [B, K, D]`` reading ``context = I_{l-1} + P`` (Eq. 5, 6).

        ``first_self_done``: the first group's self-attention layers were already applied (the batched
        fast path); only its cross-attention and the later groups remain.
        """
        for index, group in enumerate(self.groups):
            if index > 0 or not first_self_done:
                h = group.self_attend(h, key_mask, self.causal)  # Eq. 5, within the chunk
            h = group.cross(h, context)  # Eq. 6: top-down conditioning on I_{l-1}
        return h

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

    def forward(self, x: Tensor, state: TLBState | None = None, mask: Tensor | None = None):
        x = check_tensor(x, "x", 3, self.dim, "[B, L, dim]", dtype=parameter_dtype(self))
        batch, n = x.shape[:2]
        given_mask = check_mask(mask, "mask", (batch, n))
        state = self._check_state(state, batch, x.device)
        K, D = self.chunk_size, self.dim

        # 1. Chunks of K (the last padded and masked), position encoding within the chunk.
        h, m = split_chunks(x, K, given_mask)
        num_chunks = h.shape[1]
        h = self.drop(h + self.chunk_encoding.to(x.dtype))
        any_padding = not bool(m.all())

        # 2a. Fast path: the self-attention layers before the first cross-attention do not depend on
        #     the state; run them on all chunks as one batch [B * chunks, K, D].
        flat_mask = m.reshape(batch * num_chunks, K) if any_padding else None
        h = self.groups[0].self_attend(h.reshape(batch * num_chunks, K, D), flat_mask, self.causal)
        h = h.view(batch, num_chunks, K, D)

        # 2b. The recurrence over chunks: perceptual cross-attention(s) reading I_{l-1}, then Eq. 7.
        initial = self.initial.to(x.dtype).expand_as(state.memory)  # rows (re)starting use the live I_0
        memory = torch.where(state.fresh[:, None, None], initial, state.memory.to(x.dtype))
        chunks = torch.where(state.fresh, torch.zeros_like(state.chunks), state.chunks)
        chunk_valid = m.any(2)  # [B, chunks]: rows whose chunk holds at least one valid token
        full = m.all(2).all(0).tolist()  # chunks without any padding need no mask
        slots = self.slot_encoding.to(x.dtype)  # P
        outputs = []
        for index in range(num_chunks):
            key_mask = None if full[index] else m[:, index]
            context = memory + slots  # the state I_{l-1} read with its slot encoding
            out = self.perceive(h[:, index], context, key_mask, first_self_done=True)
            valid = chunk_valid[:, index]
            memory = self.slow_update(memory, context, out, key_mask, valid)
            chunks = chunks + valid.long()
            if self.config.truncate_every is not None:  # truncated backprop through the state
                cut = valid & (chunks % self.config.truncate_every == 0)
                memory = torch.where(cut[:, None, None], memory.detach(), memory)
            outputs.append(out)

        y = self.norm(torch.stack(outputs, dim=1).view(batch, num_chunks * K, D)[:, :n])
        if given_mask is not None:
            y = y.masked_fill(~given_mask[..., None], 0.0)
        new_state = TLBState(memory, chunks, torch.zeros_like(state.fresh))
        return y, new_state

    def summary(self, y: Tensor, state: TLBState, mask: Tensor | None = None) -> Tensor:
        """Classification readout (Sec. 4.3): mean over the N state vectors of ``LN(I_last)``.

        Rows marked fresh (just reset, not yet run) read the initial state ``I_0``."""
        memory = torch.where(state.fresh[:, None, None], self.initial.to(state.memory.dtype), state.memory)
        return self.norm_state(memory).mean(dim=1)


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
    override the preset's sizes), ``learned_init``, ``truncate_every``, ``ff_mult``, ``dropout``,
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
