"""Bidirectional Long-Range Parser (BLRP; Leotescu, Voinea, Popa 2024, paper 002, Section 3).

A latent block ``L`` of ``l`` vectors is carried *forward* over the segments of a sequence and then
*backward*; its last state ``L_FINAL`` summarises the whole sequence for the classifier. Read top to
bottom next to Section 3 of the paper:

1. Segments (Sec. 3): ``x [B, N, D]`` is cut into ``T = ceil(N / t)`` segments ``X_1..X_T`` of size
   ``t`` (the last one padded and masked), each with a 1D sinusoid position encoding *within* the
   segment ("following Didolkar et al. (2022)", as in TLB).
2. Dynamic projection ``L_INIT = Phi(X)`` (Sec. 3, after Transformer-LS, Zhu et al. 2021): a learned
   basis ``P = softmax_over_sequence(X W_P)`` (padding at -inf), ``L_INIT = LN(P^T X)``. One ``Phi``
   for the forward pass and another for the backward pass (the paper's best ablation, Table 4).
3. ``Theta_SELF``: self-attention within each segment (two pre-LN layers in the paper). It does not
   depend on the latent block, so all segments go through it in one batched call.
4. Forward pass, ``i = 1..T``::

       X~F_i = Theta_X(Theta_SELF(X_i), L_INIT            if i = 1 else L^F_{i-1})
       L^F_i = Theta_L(L_INIT, X~F_i)                     if i = 1
             = Theta_L(L^F_{i-1}, [X~F_i ; L_INIT])       if i > 1

5. Backward pass, ``i = T..1`` (``L_INIT`` now from the backward ``Phi``)::

       X~B_i = Theta_X(Theta_SELF(X_i), L_INIT            if i = T else L^B_{i+1})
       L^B_i = Theta_L(L^F_T, [X~F_i ; X~B_i])            if i = T
             = Theta_L(L^B_{i+1}, [X~F_i ; X~B_i ; L_INIT]) if i < T

6. ``L_FINAL = L^B_1``; the classifier reads ``mean_l LN(L_FINAL)`` (``summary``) through its MLP.

``Theta_X`` (segment queries, latent keys/values) and ``Theta_L`` (latent queries, keys/values from
the concatenation) are the paper's two cross-attention layers; like TLB's (Sec. 4: "two
self-attention layers, one cross-attention layer to update the segment embedding and one
cross-attention layer to update the latent block states") they are pre-LN residual blocks with a
feed-forward layer, shared by both passes.

Choices the paper leaves open (documented, not silent):

* Token outputs: ``y = LN(X~B)``, the backward pass's segment embeddings; segment ``i`` has read
  ``L^B_{i+1}``, which has seen every segment, so every token output depends on the whole sequence.
* ``Phi`` reads the input as given (no segment position encoding: "a projection of the raw
  sequence"). ``projection="separate"`` (default, Table 4 best): two ``Phi``; ``"siamese"``: one
  shared basis ``W_P`` with a LayerNorm per pass; ``"identical"``: one ``Phi``, one ``L_INIT`` for both.
* Padding: a segment with no valid token (for a row) leaves that row's latent block unchanged, and
  the "first segment" cases of the equations apply at the row's own first / last valid segment, so
  ``L_FINAL`` does not depend on padding (tested).
* BLRP reads a whole sequence in both directions: it has no streaming state and no causal variant.

Speed (docs/blrp.md): ``Theta_SELF`` runs once, on all segments, in one batched call; the
keys/values of ``X~F_i`` are projected once in the forward pass and reused by the backward pass, and
those of ``L_INIT`` once per pass. Only the two latent recurrences loop over segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from chronomem.checks import (
    check_dropout,
    check_even_dim,
    check_heads,
    check_mask,
    check_positive,
    check_tensor,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.layers import (
    CrossAttentionBlock,
    RecurrentState,
    SelfAttentionBlock,
    dropout_layer,
    sinusoid_encoding,
    split_chunks,
)
from chronomem.registry import register_model

__all__ = ["BLRP", "BLRPLatents", "DynamicProjection", "LatentUpdate"]

PROJECTIONS = ("separate", "siamese", "identical")


@dataclass(frozen=True)
class BLRPLatents(RecurrentState):
    """What BLRP returns in place of a recurrent state: ``final = L_FINAL = L^B_1 [B, l, D]`` and
    ``forward = L^F_T [B, l, D]`` (the block at the end of the forward pass)."""

    final: Tensor
    forward: Tensor


# =============================================================================================
# 1. The pieces: Phi, Theta_L
# =============================================================================================


class DynamicProjection(nn.Module):
    """``Phi``: ``L_INIT = LN(P^T X)`` with ``P = softmax_over_sequence(X W_P)`` (Sec. 3, Transformer-LS).

    ``basis`` may be shared with another ``DynamicProjection`` (the siamese option).
    """

    def __init__(self, dim: int, latent_size: int, basis: nn.Linear | None = None):
        super().__init__()
        self.basis = nn.Linear(dim, latent_size) if basis is None else basis  # W_P
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        logits = self.basis(x)  # [B, N, l]
        if mask is not None:  # padding at -inf; a row without any valid token gets zero weights
            keep = (mask | ~mask.any(1, keepdim=True))[..., None]
            logits = logits.masked_fill(~keep, float("-inf"))
        # softmax over the sequence: each of the l latent vectors is a convex mix of the tokens.
        weights = torch.softmax(logits, dim=1)
        if mask is not None:
            weights = weights * mask[..., None]
        return self.norm(weights.transpose(1, 2) @ x)  # [B, l, D]


class LatentUpdate(CrossAttentionBlock):
    """``Theta_L``: latent queries; keys/values from a concatenation of token sets (Sec. 3).

    ``LN`` and the key/value projection act token by token, so the keys/values of the concatenation
    ``[X~F_i ; X~B_i ; L_INIT]`` are the concatenation of each part's (``project``): BLRP projects each
    part once and reuses it. ``forward_projected`` equals ``CrossAttentionBlock.forward`` on the
    concatenated context (tested).
    """

    def project(self, context: Tensor) -> tuple[Tensor, Tensor]:
        return self.attn.heads_kv(self.norm_context(context))  # 2 x [B, H, n, Dh]

    def forward_projected(self, latent: Tensor, kv: list[tuple[Tensor, Tensor]], key_mask: Tensor | None):
        """The block on the concatenation of the projected parts ``kv``; ``key_mask [B, n]`` or None."""
        k = torch.cat([k for k, _ in kv], dim=-2)
        v = torch.cat([v for _, v in kv], dim=-2)
        q = self.attn.heads_q(self.norm_query(latent))
        mask = None if key_mask is None else key_mask[:, None, None, :]
        latent = latent + self.attn.attend(q, k, v, mask=mask)
        return latent + self.ff(self.norm_ff(latent))


# =============================================================================================
# 2. The model
# =============================================================================================


class BLRP(nn.Module):
    """BLRP encoder: ``y [B, N, D], latents = BLRP(...)(x [B, N, D], state=None, mask=None)``.

    ``mask [B, N]`` (True = valid); outputs at padded positions are zero. ``latents.final`` is
    ``L_FINAL``; ``summary(y, latents, mask)`` is the classification readout. Defaults: paper 002
    Table 2 (ListOps): emb 64, FFN hidden 128, 8 heads, segment 100, latent 100, two ``Theta_SELF``
    layers.
    """

    @dataclass
    class Config:
        dim: int = 64
        num_heads: int = 8
        segment_size: int = 100  # t
        latent_size: int = 100  # l
        depth: int = 2  # Theta_SELF layers
        projection: str = "separate"  # Phi for the two passes: separate | siamese | identical
        ff_mult: float = 2.0  # FFN hidden = 128 at emb 64 (Table 2)
        dropout: float = 0.0

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_heads(cfg.dim, cfg.num_heads)
        check_even_dim(cfg.dim)
        check_positive(cfg.segment_size, "segment_size")
        check_positive(cfg.latent_size, "latent_size")
        check_positive(cfg.depth, "depth", minimum=0)
        if cfg.projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, got {cfg.projection!r}")
        check_dropout(cfg.dropout)
        self.dim = self.out_dim = cfg.dim
        self.segment_size, self.latent_size = cfg.segment_size, cfg.latent_size
        block = dict(ff_mult=cfg.ff_mult, dropout=cfg.dropout)

        # Phi for the forward and the backward pass (Table 4).
        self.phi_forward = DynamicProjection(cfg.dim, cfg.latent_size)
        if cfg.projection == "separate":
            self.phi_backward = DynamicProjection(cfg.dim, cfg.latent_size)
        elif cfg.projection == "siamese":
            self.phi_backward = DynamicProjection(cfg.dim, cfg.latent_size, basis=self.phi_forward.basis)
        else:
            self.phi_backward = self.phi_forward
        encoding = sinusoid_encoding(cfg.segment_size, cfg.dim)  # 1D positions within a segment
        self.register_buffer("segment_encoding", encoding, persistent=False)
        self.drop = dropout_layer(cfg.dropout)
        self.theta_self = nn.ModuleList(
            SelfAttentionBlock(cfg.dim, cfg.num_heads, **block) for _ in range(cfg.depth)
        )
        self.theta_x = CrossAttentionBlock(cfg.dim, cfg.num_heads, **block)  # segment <- latent
        self.theta_l = LatentUpdate(cfg.dim, cfg.num_heads, **block)  # latent <- [segments ; L_INIT]
        self.norm = nn.LayerNorm(cfg.dim)  # final LN of the token outputs
        self.norm_latent = nn.LayerNorm(cfg.dim)  # LN(L_FINAL) of the readout

    def segments(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """``Theta_SELF`` on every segment at once: ``[B, T, t, D]`` and the segment mask ``[B, T, t]``."""
        segments, m = split_chunks(x, self.segment_size, mask)
        h = self.drop(segments + self.segment_encoding.to(x.dtype)).flatten(0, 1)  # [B * T, t, D]
        flat_mask = None if bool(m.all()) else m.flatten(0, 1)
        for block in self.theta_self:
            h = block(h, key_mask=flat_mask)
        return h.view_as(segments), m

    def forward(
        self, x: Tensor, state=None, mask: Tensor | None = None, done: Tensor | None = None
    ) -> tuple[Tensor, BLRPLatents]:
        if done is not None:  # the backward pass reads every segment: there is no episode boundary to respect
            raise ValueError("BLRP is bidirectional (its backward pass reads the whole sequence), so it takes no "
                             "episode ends inside a call: done must be None; use a causal core for agents")
        x = check_tensor(x, "x", 3, self.dim, "[B, N, dim]", dtype=parameter_dtype(self))
        if state is not None:
            raise ValueError("BLRP reads the whole sequence in both directions and keeps no state between "
                             f"calls: state must be None, got {type(state).__name__}")
        batch, n = x.shape[:2]
        mask = check_mask(mask, "mask", (batch, n))

        # Sec. 3: L_INIT = Phi(X) for each pass; Theta_SELF(X_i) for all segments at once.
        init_f = self.phi_forward(x, mask)
        init_b = init_f if self.phi_backward is self.phi_forward else self.phi_backward(x, mask)
        h, m = self.segments(x, mask)
        num_segments = h.shape[1]
        seg_valid = m.any(2)  # [B, T]: a row's segment holding at least one valid token
        seg_valid_all = seg_valid.all(0).tolist()  # segments valid in every row need no torch.where
        seg_full = m.all(2).all(0).tolist()  # segments without padding in any row need no mask
        seg_mask = [None if seg_full[i] else m[:, i] for i in range(num_segments)]

        # Forward pass, i = 1..T. ``started``: rows past their first valid segment (the i > 1 case).
        latent, started = init_f, torch.zeros(batch, dtype=torch.bool, device=x.device)
        kv_init = self.theta_l.project(init_f)
        kv_forward = []
        for i in range(num_segments):
            x_f = self.theta_x(h[:, i], latent)  # X~F_i = Theta_X(Theta_SELF(X_i), L^F_{i-1} or L_INIT)
            kv_forward.append(self.theta_l.project(x_f))
            # L^F_i = Theta_L(L^F_{i-1}, [X~F_i ; L_INIT]), or Theta_L(L_INIT, X~F_i) at the first segment
            new = self._update(latent, [kv_forward[i]], seg_mask[i], kv_init, started)
            latent = new if seg_valid_all[i] else torch.where(seg_valid[:, i, None, None], new, latent)
            started = started | seg_valid[:, i]
        latent_forward = latent  # L^F_T

        # Backward pass, i = T..1, starting from L^F_T; L_INIT now from the backward Phi.
        started = torch.zeros_like(started)
        kv_init = kv_init if init_b is init_f else self.theta_l.project(init_b)
        outputs = [None] * num_segments
        for i in reversed(range(num_segments)):
            # X~B_i = Theta_X(Theta_SELF(X_i), L^B_{i+1}), or L_INIT at the row's last segment
            context = torch.where(started[:, None, None], latent, init_b)
            x_b = self.theta_x(h[:, i], context)
            outputs[i] = x_b
            # L^B_i = Theta_L(L^B_{i+1}, [X~F_i ; X~B_i ; L_INIT]), or Theta_L(L^F_T, [X~F_T ; X~B_T])
            kv_segments = [kv_forward[i], self.theta_l.project(x_b)]
            new = self._update(latent, kv_segments, seg_mask[i], kv_init, started)
            latent = new if seg_valid_all[i] else torch.where(seg_valid[:, i, None, None], new, latent)
            started = started | seg_valid[:, i]

        y = self.norm(torch.stack(outputs, dim=1).flatten(1, 2)[:, :n])
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, BLRPLatents(final=latent, forward=latent_forward)

    def _update(self, latent: Tensor, segments: list, segment_mask: Tensor | None, kv_init, started: Tensor):
        """``Theta_L`` of ``latent`` over ``[segments ; L_INIT]`` (projected); ``L_INIT`` is among the keys
        only for ``started`` rows (the ``i > 1`` / ``i < T`` cases of the equations)."""
        if not bool(started.any()):  # every row at its first segment: no L_INIT among the keys
            masks, kv = [segment_mask] * len(segments), segments
        else:
            init_mask = None if bool(started.all()) else started[:, None].expand(-1, kv_init[0].shape[-2])
            masks, kv = [segment_mask] * len(segments) + [init_mask], segments + [kv_init]
        key_mask = None
        if any(m is not None for m in masks):
            every_key = lambda k: torch.ones_like(started)[:, None].expand(-1, k.shape[-2])
            parts = [every_key(k) if m is None else m for (k, _), m in zip(kv, masks, strict=True)]
            key_mask = torch.cat(parts, dim=1)
        return self.theta_l.forward_projected(latent, kv, key_mask)

    def summary(self, y: Tensor, state: BLRPLatents, mask: Tensor | None = None) -> Tensor:
        """Classification readout (Sec. 3, ``L_FINAL`` to the head): mean of the l vectors of LN(L_FINAL)."""
        return self.norm_latent(state.final).mean(dim=1)


@register_model("blrp")
def build_blrp(dim: int, depth: int, num_heads: int, causal: bool = False, **options) -> BLRP:
    """Registry builder. ``depth`` = Theta_SELF layers (2 in the paper). Options: ``segment_size``,
    ``latent_size``, ``projection``, ``ff_mult``, ``dropout``."""
    if causal:
        raise ValueError("BLRP is bidirectional (a backward pass over the segments) and has no causal "
                         "variant: use it on classification tasks (causal=False)")
    return BLRP(dim=dim, depth=depth, num_heads=num_heads, **options)
