"""Shared primitives: attention over SDPA, feed-forward, position encodings, masks and state.

Every model in chronomem is built from these pieces, so each idea is written once:

* ``MultiHeadAttention``  self- or cross-attention on ``F.scaled_dot_product_attention`` with
  boolean masks (``True`` = may attend), a causal option and an additive float bias (used by the
  relative positions of Transformer-XL). Its three steps (``heads_q``, ``heads_kv``, ``attend``) are
  public so that a model can project keys/values once and reuse them (BLRP's Theta_L, the local
  attention cache of HTM, Transformer-XL's relative attention).
* ``RelativeAttention``: Transformer-XL's relative positions (Dai et al. 2019, Sec. 3.3) on top of
  ``MultiHeadAttention`` (Transformer-XL and HTM's local attention).
* ``FeedForward`` (GELU MLP), ``SelfAttentionBlock`` and ``CrossAttentionBlock`` (pre-LN residual).
* ``sinusoid_encoding``: sin and cos halves concatenated, optionally with reversed positions.
* Mask and padding helpers; the argument checks are ``chronomem.checks``.
* ``RecurrentState``: ``detach()`` and ``reset(done)`` for dataclass states of batch-first tensors;
  ``concat_states``, ``copy_state``, and ``state_donated`` (calls that may write into their input state).

Input rules shared by every public module (each checks its inputs at its entry with ``check_tensor``
or ``check_token_ids``, so a bad input never fails inside a matmul):

* dtype: features must be a floating-point tensor. A float16, bfloat16, float32 or float64 input is
  cast to the module's parameter dtype (``parameter_dtype``) at the entry, so the output has the
  parameters' dtype whatever the input's. An integer or boolean tensor where features are expected
  is a ``TypeError`` naming the argument and its dtype; integers belong on a head's token-ids path
  (``vocab_size``), whose ids must lie in ``[0, vocab_size)`` (``ValueError`` otherwise).
* batch: a batch of size 0 is a ``ValueError`` naming the argument (``init_state(0)`` too): no
  module returns an empty output.
* reset: ``RecurrentState.reset(done)`` restores the rows of ``done`` by selection
  (``torch.where``), never by multiplying with ``1 - done``, so a row that held NaN or inf comes
  back exactly as the initial state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_ended_rows, check_even_dim, check_heads, check_positive

# --------------------------------------------------------------------------------------------
# Masks and padding
# --------------------------------------------------------------------------------------------


def causal_mask(n_query: int, n_key: int | None = None, device=None) -> Tensor:
    """``[n_query, n_key]`` boolean mask, ``True`` where key j <= query i (queries are the last keys)."""
    n_key = n_query if n_key is None else n_key
    q = torch.arange(n_query, device=device)[:, None] + (n_key - n_query)
    return torch.arange(n_key, device=device)[None, :] <= q


def pad_to_multiple(x: Tensor, multiple: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Pad ``x [B, N, ...]`` along N to a multiple of ``multiple``; return it and its ``[B, N']`` mask."""
    batch, n = x.shape[:2]
    if mask is None:
        mask = torch.ones(batch, n, dtype=torch.bool, device=x.device)
    pad = (-n) % multiple
    if pad:
        x = torch.cat([x, x.new_zeros(batch, pad, *x.shape[2:])], dim=1)
        mask = torch.cat([mask, mask.new_zeros(batch, pad)], dim=1)
    return x, mask


def split_chunks(x: Tensor, size: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Cut ``x [B, N, D]`` into chunks ``[B, T, size, D]`` (the last one padded) with their mask ``[B, T, size]``."""
    xp, m = pad_to_multiple(x, size, mask)
    batch, n = xp.shape[:2]
    return xp.view(batch, n // size, size, *xp.shape[2:]), m.view(batch, n // size, size)


def masked_mean(x: Tensor, mask: Tensor | None, dim: int = 1) -> Tensor:
    """Mean of ``x`` over ``dim`` counting only positions where ``mask`` is True (zero if none)."""
    if mask is None:
        return x.mean(dim)
    weights = mask.to(x.dtype).unsqueeze(-1)
    return (x * weights).sum(dim) / weights.sum(dim).clamp_min(1.0)


# Haiku's truncated normal keeps values within 2 standard deviations; dividing by this constant (the
# standard deviation of a unit normal truncated to [-2, 2]) gives the truncated draw the intended variance.
TRUNCATED_NORMAL_STD = 0.87962566103423978


def dropout_layer(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or ``nn.Identity()`` at ``p = 0``: the same function, without an op to dispatch at
    every call (an agent's acting step is mostly such small ops)."""
    return nn.Dropout(p) if p else nn.Identity()


@torch.no_grad()
def variance_scaling_(linear: nn.Linear, scale: float) -> nn.Linear:
    """Initialise ``linear`` like Haiku's ``VarianceScaling(scale)`` (fan-in mode, truncated normal):
    weights with variance ``scale / fan_in``, biases zero. Used where a paper's released code sets
    the initialisation (e.g. HTM's attention module, ``init_scale=2``)."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    std = math.sqrt(scale / linear.in_features) / TRUNCATED_NORMAL_STD
    nn.init.trunc_normal_(linear.weight, std=std, a=-2 * std, b=2 * std)
    if linear.bias is not None:
        linear.bias.zero_()
    return linear


# --------------------------------------------------------------------------------------------
# Position encodings
# --------------------------------------------------------------------------------------------


def sinusoid_encoding(
    length: int, dim: int, *, reverse: bool = False, device=None, dtype=torch.float32
) -> Tensor:
    """``[length, dim]`` sinusoids of Vaswani et al. (2017) with the sin and cos halves concatenated.

    ``reverse=True`` numbers the positions from the end (the newest position is 0), as HTM does for
    the slots of a chunk.
    """
    check_positive(length, "length")
    check_positive(dim, "dim")
    if dim % 2:
        raise ValueError(f"dim of a sinusoid encoding must be even (sin and cos halves), got {dim}")
    # A fixed table: computed once in float64 on the CPU, then rounded, so its float32 values are the
    # correctly rounded sinusoids (a float32 angle at position 100 is already off by ~1e-5).
    pos = torch.arange(length, dtype=torch.float64)
    if reverse:
        pos = pos.flip(0)
    return sinusoid_from_positions(pos, dim).to(device=device, dtype=dtype)


def sinusoid_from_positions(pos: Tensor, dim: int) -> Tensor:
    """Sinusoids ``[*pos.shape, dim]`` for arbitrary (possibly negative or fractional) positions,
    computed in float64 if ``pos`` is float64, else in float32."""
    compute = torch.float64 if pos.dtype == torch.float64 else torch.float32
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, device=pos.device, dtype=compute) / dim)
    angles = pos.to(compute)[..., None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Multi-head attention over ``F.scaled_dot_product_attention``.

    ``forward(query, key_value=None, key_mask=None, attn_mask=None, causal=False)``:

    * ``query [B, Nq, D]``; ``key_value [B, Nk, kv_dim]`` for cross-attention, ``None`` for self.
    * ``key_mask [B, Nk]`` and ``attn_mask`` (boolean, broadcastable to ``[B, H, Nq, Nk]``), ``True`` =
      may attend. A query with no visible key reads zeros (SDPA would return NaN).
    * ``causal``: query i sees keys up to ``i + Nk - Nq`` (queries aligned with the last keys).

    ``qkv_dim`` is the width the heads work at (queries, keys and values; ``num_heads`` divides it),
    ``dim`` by default; the output projection returns to ``dim`` (Flax's ``qkv_features``, as in the
    Long Range Arena models). ``bias=False`` drops the biases of all four projections.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        kv_dim: int | None = None,
        qkv_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.qkv_dim = dim if qkv_dim is None else qkv_dim
        check_heads(dim, num_heads)
        check_heads(self.qkv_dim, num_heads)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, self.qkv_dim // num_heads
        self.kv_dim = dim if kv_dim is None else kv_dim
        self.dropout = dropout
        self.to_q = nn.Linear(dim, self.qkv_dim, bias=bias)
        self.to_kv = nn.Linear(self.kv_dim, 2 * self.qkv_dim, bias=bias)
        self.to_out = nn.Linear(self.qkv_dim, dim, bias=bias)

    def _split(self, x: Tensor) -> Tensor:  # [B, N, D] -> [B, H, N, Dh]
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    def heads_q(self, query: Tensor) -> Tensor:
        """Project queries to heads: ``[..., Nq, D] -> [..., H, Nq, Dh]``."""
        return self._split(self.to_q(query))

    def heads_kv(self, key_value: Tensor) -> tuple[Tensor, Tensor]:
        """Project keys and values to heads: ``[..., Nk, kv_dim] -> 2 x [..., H, Nk, Dh]``."""
        return self.split_kv(self.to_kv(key_value))

    def keys_values(self, key_value: Tensor) -> Tensor:
        """The projected keys and values ``forward_projected`` reads: ``to_kv(key_value)``, ``[..., Nk, 2 qkv_dim]``."""
        return self.to_kv(key_value)

    @property
    def kv_projection(self) -> nn.Linear:
        """The layer ``keys_values`` applies: what a cache of its output depends on."""
        return self.to_kv

    def split_kv(self, keys_values: Tensor) -> tuple[Tensor, Tensor]:
        """Projected keys and values (``to_kv``'s output, ``[..., Nk, 2 qkv_dim]``, e.g. from a cache)
        to heads: ``2 x [..., H, Nk, Dh]``."""
        k, v = keys_values.chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """Attention of projected heads, merged and output-projected: ``[..., Nq, D]``.

        ``mask`` is boolean (``True`` = may attend), ``bias`` an additive float term on the logits;
        both broadcast to ``[..., H, Nq, Nk]``.
        """
        n_q, n_k = q.shape[-2], k.shape[-2]
        dropout = self.dropout if self.training else 0.0
        if causal and (mask is not None or bias is not None or n_q != n_k):
            cm = causal_mask(n_q, n_k, device=q.device)
            mask = cm if mask is None else mask & cm
            causal = False
        empty_rows = None
        if mask is not None:
            # SDPA gives NaN for a row with no visible key: let such rows see everything, then zero them.
            empty_rows = ~mask.any(-1, keepdim=True)
            mask = mask | empty_rows
        if bias is not None:
            attn = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        else:
            attn = mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, dropout_p=dropout, is_causal=causal)
        if empty_rows is not None and any_or_compiling(empty_rows):
            out = out.masked_fill(empty_rows.expand(out.shape[:-1] + (1,)), 0.0)
        return self.to_out(out.transpose(-3, -2).flatten(-2))

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        return self.forward_projected(query, self.to_kv(query if key_value is None else key_value),
                                      key_mask=key_mask, attn_mask=attn_mask, causal=causal)

    def forward_projected(
        self,
        query: Tensor,
        keys_values: Tensor,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """``forward`` from keys and values already projected (``to_kv``'s output ``[B, Nk, 2 qkv_dim]``,
        e.g. cached across an agent's steps): the same numbers as ``forward(query, key_value)`` when
        ``keys_values = to_kv(key_value)``."""
        k, v = self.split_kv(keys_values)
        return self.attend(self.heads_q(query), k, v, mask=merge_masks(key_mask, attn_mask), causal=causal)


def merge_masks(key_mask: Tensor | None, attn_mask: Tensor | None) -> Tensor | None:
    """One boolean mask for ``attend`` from ``key_mask [B, Nk]`` and ``attn_mask`` (broadcastable to
    ``[B, H, Nq, Nk]``); either may be None."""
    if key_mask is None:
        return attn_mask
    km = key_mask[:, None, None, :]  # [B, 1, 1, Nk]
    return km if attn_mask is None else attn_mask & km


def relative_shift(scores: Tensor, n_key: int) -> Tensor:
    """Index scores by relative distance: ``[..., Nq, Nk + Nq - 1] -> [..., Nq, Nk]``.

    Column ``p`` of ``scores`` holds relative distance ``Nk - 1 - p`` (from ``Nk - 1`` down to
    ``-(Nq - 1)``). Query ``i`` sits at key position ``Nk - Nq + i``, so its score for key ``j`` is
    column ``p = Nq - 1 - i + j``: row ``i`` shifted left by ``Nq - 1 - i``. This is the "relative shift"
    of Dai et al. (2019, App. B): pad one column, read the flat buffer with row stride ``Nk + Nq - 1``
    starting ``Nq - 1`` elements in, so no index tensor is built.
    """
    n_q, width = scores.shape[-2:]
    if width != n_key + n_q - 1:
        raise ValueError(f"scores must have {n_key + n_q - 1} columns for n_key={n_key}, got {width}")
    flat = F.pad(scores, (0, 1)).flatten(-2)  # rows of width + 1
    # element (i, j) of the result is flat[(n_q - 1) + i * width + j] = scores[i, j + n_q - 1 - i]
    shifted = flat[..., n_q - 1 : n_q - 1 + n_q * width].unflatten(-1, (n_q, width))
    return shifted[..., :n_key]


class RelativeAttention(nn.Module):
    """Multi-head attention with the relative positions of Dai et al. (2019, Sec. 3.3).

    For query ``i`` and key ``j`` at relative distance ``d = pos(i) - pos(j)``::

        score(i, j) = (q_i + u)^T k_j  +  (q_i + v)^T W_kr R_d        (terms (a)+(c), (b)+(d))

    with ``R`` the sinusoid encoding of ``d``, ``W_kr`` a bias-free projection and ``u``, ``v``
    learned per-head biases (one pair per layer: the paper does not say whether they are shared
    across layers; the authors' code has both, as the ``untie_r`` option). The
    content term goes through ``F.scaled_dot_product_attention`` as ``q + u`` against ``k``; the
    position term is computed once per call and passed as an additive bias (scaled by
    ``1/sqrt(head_dim)`` like the content term). Its ``W_kr R`` (or ``W_kr R_{i-j}`` per (query, key)
    pair) is kept between calls of one shape outside autograd (``projected_distances``): an agent's step
    or a generated byte does not recompute it.
    """

    def __init__(self, dim: int, num_heads: int, *, dropout: float = 0.0):
        super().__init__()
        check_heads(dim, num_heads)
        check_even_dim(dim)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.attn = MultiHeadAttention(dim, num_heads, dropout=dropout)
        self.to_r = nn.Linear(dim, dim, bias=False)  # W_{k,R}
        self.u = nn.Parameter(torch.randn(num_heads, self.head_dim) * 0.02)  # global content bias
        self.v = nn.Parameter(torch.randn(num_heads, self.head_dim) * 0.02)  # global position bias
        self._distances_cache: tuple | None = None  # (key, W_kr R) of the last call outside autograd
        self._to_r_values = ParameterVersion()

    def projected_distances(self, n_key: int, n_q: int, dtype: torch.dtype, device, table: bool = False) -> Tensor:
        """``W_kr R_d`` for the distances ``d = Nk - 1, ..., -(Nq - 1)``: ``[Nk + Nq - 1, H, Dh]``; with
        ``table``, gathered for every (query, key) pair, ``W_kr R_{i-j}`` as ``[Nq, Nk, H, Dh]``.

        It depends only on the shape and ``W_kr``, so outside autograd (an agent acting, generation:
        the same ``Nk`` and ``Nq`` at every step) the last one is kept and reused while the shape, form,
        dtype, device and ``W_kr``'s values (``ParameterVersion``) are the same; under autograd it is always
        computed.

        Under ``torch.compile`` it is always computed too: the compiled graph holds it, and a key made of
        a weight's address would break the graph and recompile for every layer."""
        if torch.compiler.is_compiling():
            return self._project_distances(n_key, n_q, dtype, device, table)
        key = (n_key, n_q, table, dtype, str(device), self._to_r_values(self.to_r.parameters()))
        if not torch.is_grad_enabled() and self._distances_cache is not None and self._distances_cache[0] == key:
            return self._distances_cache[1]
        r = self._project_distances(n_key, n_q, dtype, device, table)
        self._distances_cache = None if torch.is_grad_enabled() else (key, r)
        return r

    def _project_distances(self, n_key: int, n_q: int, dtype: torch.dtype, device, table: bool) -> Tensor:
        dist = torch.arange(n_key - 1, -n_q, -1, device=device)  # Nk - 1, ..., -(Nq - 1)
        r = self.to_r(sinusoid_from_positions(dist, self.dim).to(dtype)).unflatten(-1, (self.num_heads, self.head_dim))
        if not table:
            return r
        i = torch.arange(n_q, device=device)[:, None]
        j = torch.arange(n_key, device=device)[None, :]
        return r[n_q - 1 - i + j]  # distance (Nk - Nq + i) - j

    def _apply(self, fn, *args, **kwargs):
        self._distances_cache = None  # .to(), .double(), ...: new weights, possibly at the same address
        return super()._apply(fn, *args, **kwargs)

    def position_bias(self, q: Tensor, n_key: int, table: bool | None = None) -> Tensor:
        """``(q + v)^T W_kr R_{i-j}`` scaled: ``[..., H, Nq, Nk]`` for queries aligned with the last keys.

        Two ways to the same numbers. ``table=True``: gather ``W_kr R_{i-j}`` for every (query, key) pair
        (``[Nq, Nk, D]``, shared by the batch) and take one dot product per pair, the formula as written.
        ``table=False``: score each query against every distance (``[..., Nq, Nk + Nq - 1]``) and realign
        with ``relative_shift``. The default takes the table when it is no larger than those scores, as
        for windowed attention over a batch: there it is ~4x faster forward + backward, since the shift's
        pad-and-slice views cost a zero-filled copy each in backward."""
        n_q = q.shape[-2]
        qv = q + self.v[:, None, :]
        if table is None:
            table = n_q * n_key * self.dim <= qv[..., 0].numel() * (n_key + n_q - 1)
        r = self.projected_distances(n_key, n_q, q.dtype, q.device, table)  # W_kr R: [Nq, Nk, H, Dh] or [P, H, Dh]
        if table:
            scores = torch.einsum("...hid,ijhd->...hij", qv, r)
        else:
            scores = relative_shift(qv @ r.permute(1, 2, 0), n_key)  # [..., H, Nq, P] -> [..., H, Nq, Nk]
        return scores * self.head_dim**-0.5

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """``query [B, Nq, D]`` (normed), ``key_value [B, Nk, D]`` (normed ``[memory; query]``: the queries
        are the last ``Nq`` keys, at consecutive positions). Masks as in ``MultiHeadAttention.forward``
        (``key_mask [B, Nk]``, ``attn_mask`` broadcastable to ``[B, H, Nq, Nk]``), so the two are
        interchangeable. Causal = each query sees the memory and the segment up to itself."""
        return self.forward_projected(query, self.keys_values(key_value), key_mask=key_mask, attn_mask=attn_mask,
                                      causal=causal)

    def keys_values(self, key_value: Tensor) -> Tensor:
        """The projected keys and values ``forward_projected`` reads: ``attn.to_kv(key_value)``, ``[B, Nk, 2 D]``."""
        return self.attn.to_kv(key_value)

    @property
    def kv_projection(self) -> nn.Linear:
        """The layer ``keys_values`` applies: what a cache of its output depends on."""
        return self.attn.to_kv

    def forward_projected(
        self,
        query: Tensor,
        keys_values: Tensor,
        *,
        key_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        causal: bool = False,
    ) -> Tensor:
        """``forward`` from keys and values already projected (``attn.to_kv`` of the normed keys,
        ``[B, Nk, 2 D]``, e.g. cached across an agent's steps, as Transformer-XL's memory and HTM's local
        attention cache them). Terms (a)-(d) of Dai et al. Sec. 3.3."""
        q = self.attn.heads_q(query)  # [B, H, Nq, Dh]
        k, v = self.attn.split_kv(keys_values)  # [B, H, Nk, Dh]
        bias = self.position_bias(q, k.shape[-2])
        mask = merge_masks(key_mask, attn_mask)
        return self.attn.attend(q + self.u[:, None, :], k, v, mask=mask, bias=bias, causal=causal)


class FeedForward(nn.Module):
    """Position-wise MLP ``Linear -> GELU -> Linear`` (hidden = ``mult * dim``).

    ``gelu_approximate``: ``"none"`` (exact GELU) or ``"tanh"`` (the tanh approximation, the default
    of ``jax.nn.gelu`` and so of the Flax models of Long Range Arena)."""

    def __init__(
        self,
        dim: int,
        mult: float = 4.0,
        dropout: float = 0.0,
        hidden: int | None = None,
        *,
        gelu_approximate: str = "none",
    ):
        super().__init__()
        if gelu_approximate not in ("none", "tanh"):
            raise ValueError(f"gelu_approximate must be 'none' or 'tanh', got {gelu_approximate!r}")
        hidden = int(dim * mult) if hidden is None else hidden
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.GELU(approximate=gelu_approximate),
            dropout_layer(dropout),
            nn.Linear(hidden, dim),
            dropout_layer(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SelfAttentionBlock(nn.Module):
    """Pre-LN Transformer layer: ``x + MHA(LN(x))`` then ``x + FFN(LN(x))``.

    ``qkv_dim`` and ``attn_bias`` go to ``MultiHeadAttention`` (``qkv_dim``, ``bias``),
    ``gelu_approximate`` to ``FeedForward``, ``norm_eps`` to the LayerNorms."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        ff_mult: float = 4.0,
        dropout: float = 0.0,
        qkv_dim: int | None = None,
        attn_bias: bool = True,
        norm_eps: float = 1e-5,
        gelu_approximate: str = "none",
    ):
        super().__init__()
        self.norm_attn = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(dim, num_heads, qkv_dim=qkv_dim, bias=attn_bias, dropout=dropout)
        self.norm_ff = nn.LayerNorm(dim, eps=norm_eps)
        self.ff = FeedForward(dim, ff_mult, dropout, gelu_approximate=gelu_approximate)

    def forward(
        self, x: Tensor, key_mask: Tensor | None = None, attn_mask: Tensor | None = None, causal: bool = False
    ) -> Tensor:
        x = x + self.attn(self.norm_attn(x), key_mask=key_mask, attn_mask=attn_mask, causal=causal)
        return x + self.ff(self.norm_ff(x))


class CrossAttentionBlock(nn.Module):
    """Pre-LN cross-attention layer: ``x + MHA(LN(x), LN(context))`` then ``x + FFN(LN(x))``.

    ``qkv_dim``, ``attn_bias``, ``norm_eps`` and ``gelu_approximate`` as in ``SelfAttentionBlock``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        context_dim: int | None = None,
        ff_mult: float = 4.0,
        dropout: float = 0.0,
        qkv_dim: int | None = None,
        attn_bias: bool = True,
        norm_eps: float = 1e-5,
        gelu_approximate: str = "none",
    ):
        super().__init__()
        context_dim = dim if context_dim is None else context_dim
        self.norm_query = nn.LayerNorm(dim, eps=norm_eps)
        self.norm_context = nn.LayerNorm(context_dim, eps=norm_eps)
        self.attn = MultiHeadAttention(
            dim, num_heads, kv_dim=context_dim, qkv_dim=qkv_dim, bias=attn_bias, dropout=dropout
        )
        self.norm_ff = nn.LayerNorm(dim, eps=norm_eps)
        self.ff = FeedForward(dim, ff_mult, dropout, gelu_approximate=gelu_approximate)

    def forward(
        self, x: Tensor, context: Tensor, context_mask: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        x = x + self.attn(
            self.norm_query(x), self.norm_context(context), key_mask=context_mask, attn_mask=attn_mask
        )
        return x + self.ff(self.norm_ff(x))


# --------------------------------------------------------------------------------------------
# Recurrent state and configs
# --------------------------------------------------------------------------------------------


# Numbers naming parameter values across every module, so that keys and values cached in a state are
# read only by a module whose parameters still have the values they were computed with.
_parameter_versions = itertools.count(1)
_fixed_stretches = itertools.count(1)


class ParameterVersion:
    """``version(parameters) -> int``: a number naming the parameters' current values, a new one whenever
    they changed since the last call (Transformer-XL's memory and HTM's local attention tag the keys and
    values they cache in a state with it, and read them back only under the same number).

    A change is found by comparing the values with a copy kept from the last change (a few thousand
    numbers for the layers' key-value projections and LayerNorms; ``torch.equal``, a few microseconds
    each). Neither storage addresses nor version counters are enough: torch's fused Adam (PPO's
    optimiser) writes parameters in place without bumping their version counters, and ``.to()`` may
    reuse an address. Numbers are unique across instances, so one module never reads keys and values
    another cached; 0 names nothing.

    Inside ``parameters_fixed(stretch)`` (a stretch of calls that changes no parameter: an acting loop,
    ``rl.acting.Acting``) each instance compares once, at its first call of the stretch, and returns that
    number to the stretch's end: an acting step then skips a comparison per parameter tensor. ``parameters``
    is read only when compared (a generator costs nothing otherwise)."""

    _stretch = 0  # the fixed stretch being run (parameters_fixed), 0 outside any
    _continued = False  # the block's calls start from a state an earlier block of the stretch left

    def __init__(self):
        self._values: list[Tensor] = []
        self._number = 0
        self._checked_in = 0  # the fixed stretch whose first call compared

    def __call__(self, parameters) -> int:
        if self._checked_in and self._checked_in == ParameterVersion._stretch:
            return self._number
        parameters = list(parameters)
        same = self._number and len(parameters) == len(self._values) and all(
            p.dtype == v.dtype and p.device == v.device and p.shape == v.shape and torch.equal(p, v)
            for p, v in zip(parameters, self._values, strict=True))
        if not same:
            self._values = [p.detach().clone() for p in parameters]
            self._number = next(_parameter_versions)
        self._checked_in = ParameterVersion._stretch
        return self._number


def fixed_stretch() -> int:
    """A new number for a stretch of calls in which no parameter changes (``parameters_fixed``)."""
    return next(_fixed_stretches)


@contextlib.contextmanager
def parameters_fixed(stretch: int, continued: bool = False):
    """Run the block as part of stretch ``stretch`` (``fixed_stretch()``), whose calls change no parameter
    of any module: each ``ParameterVersion`` compares its parameters' values at its first call of the
    stretch only. A stretch may be entered many times (one acting step each); changing a parameter
    between its first and last block is a mistake nothing detects (cached keys and values made with the
    old values would be read). Blocks nest: the inner stretch holds inside it.

    ``continued``: the block's calls start from a state that an earlier block of the same stretch left (an
    acting loop's steps after its first, ``rl.acting.Acting``), so the keys and values cached in it were
    made with the present parameters, or the row holds none (``reset``). A compiled call then reads them
    unchecked (``reads_cached_kv``); an eager one checks their version as always."""
    outer = ParameterVersion._stretch, ParameterVersion._continued
    ParameterVersion._stretch, ParameterVersion._continued = stretch, continued
    try:
        yield
    finally:
        ParameterVersion._stretch, ParameterVersion._continued = outer


def cache_version(parameter_version, like: Tensor) -> Tensor:
    """The number a call tags the keys and values it caches in its state with, a 0-d tensor on ``like``'s
    device: ``parameter_version()`` (a core's ``ParameterVersion`` number, read eagerly) in an eager call
    without gradients; 0 (names nothing) with gradients or under ``torch.compile``, decided without
    reading a value, so that the call compiles whole. Such a call reads no cached keys and values
    (``reads_cached_kv``) and the next eager call without gradients projects what it leaves again: with
    gradients, the gradient flows through their projection and the parameters are about to change (an
    optimiser step); compiled, the parameters' version is not a value a graph can read."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return like.new_zeros((), dtype=torch.long)
    return torch.tensor(parameter_version(), device=like.device)


def reads_cached_kv() -> bool:
    """Whether a call may read the keys and values a core cached in its state. Eagerly without gradients (an
    agent acting, an evaluation): yes, after checking their version. A call with gradients projects them again
    for the gradient. A compiled call cannot check a version (a value) without breaking its graph: it reads
    them, unchecked, only where its state continues a fixed stretch (``parameters_fixed(..., continued=True)``:
    an acting loop's steps after its first, whose caches are current by construction), and projects them
    again elsewhere. The graph is specialised on that flag (dynamo guards it): two graphs per acting step,
    each whole, which CUDA graphs can replay (docs/rl.md, "Compiled")."""
    if torch.is_grad_enabled():
        return False
    return ParameterVersion._continued if torch.compiler.is_compiling() else True


class _Donation:
    """Whether the calls being run may write into their input state (``state_donated``)."""

    on = False


@contextlib.contextmanager
def state_donated():
    """Run the block's calls on states that nothing reads after them: each call may write its new state
    into its input state's tensors (``donates_state``), where a call otherwise leaves its input as it was
    and makes new tensors. An acting loop owns its state so (``rl.acting.Acting``: each step's input state
    is dropped when it returns), and a core whose state holds a large buffer then writes only what the step
    changes: HTM's ring buffer of chunks takes one chunk per completing row, not a copy of every chunk (the
    donation of JAX's ``donate_argnums``). A caller that keeps such a state past the next call keeps a copy
    (``copy_state``)."""
    outer, _Donation.on = _Donation.on, True
    try:
        yield
    finally:
        _Donation.on = outer


def donates_state() -> bool:
    """Whether a call may write into its input state (inside ``state_donated``, without gradients: a call
    with gradients keeps its input for the backward). Under ``torch.compile`` dynamo guards the flag, so
    a core has a graph for each."""
    return _Donation.on and not torch.is_grad_enabled()


def _map_tensors(value: Any, fn) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return type(value)(*(_map_tensors(v, fn) for v in value)) if hasattr(value, "_fields") else tuple(
            _map_tensors(v, fn) for v in value
        )
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **fields)
    return value


def any_or_compiling(flags: Tensor) -> bool:
    """Whether some element of ``flags`` is True, for code that skips work no row needs; always True under
    ``torch.compile``, where a graph does not branch on a value and takes the path that handles every row."""
    return torch.compiler.is_compiling() or bool(flags.any())


def clear_rows(t: Tensor, done: Tensor) -> Tensor:
    """``t`` (batch first) with the rows of ``done [B]`` set to zero (``False``) by selection, never by
    multiplying: a row that held NaN or inf comes back clean, and no gradient reaches the old rows."""
    keep = ~done.view(-1, *([1] * (t.dim() - 1)))
    return torch.where(keep, t, t.new_zeros(()))


class RecurrentState:
    """Mixin for a frozen dataclass whose tensors all have the batch as their first dimension.

    ``detach()`` stops gradients through every tensor; ``reset(done)`` sets the rows whose episode
    ended to zero (``False`` for boolean fields, 0 for counters), which is the empty / initial state of
    every chronomem module unless the module documents otherwise. It selects (``torch.where``) rather
    than multiplies, so a row holding NaN or inf comes back clean.
    """

    def detach(self):
        return _map_tensors(self, lambda t: t.detach())

    def reset(self, done: Tensor):
        def clear(t: Tensor) -> Tensor:
            return clear_rows(t, check_ended_rows(done, t.shape[0]))

        return _map_tensors(self, clear)

    def select(self, rows: Tensor | Sequence[int]):
        """The state of the batch rows ``rows`` (indices or a boolean mask of shape [B]), in that order:
        with ``concat_states`` this lets a learner form minibatches of environments."""
        if not isinstance(rows, Tensor):
            rows = torch.as_tensor(list(rows), dtype=torch.long)
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        elif rows.dtype != torch.long or rows.dim() != 1:
            raise TypeError(f"rows must be a 1-D long tensor of indices or a boolean mask, got {rows.dtype} "
                            f"of shape {tuple(rows.shape)}")
        return _map_tensors(self, lambda t: t[rows.to(t.device)])

    @classmethod
    def joinable(cls, states: Sequence[Any]) -> Sequence[Any]:
        """``states`` made ready for ``concat_states`` to join along the batch: as they are, unless the
        state's size varies in another dimension (``relevance.MemState``'s memory grows with time)."""
        return states


def _concat_tree(values: Sequence[Any]) -> Any:
    """Several values of one structure joined tensor by tensor along the batch (``concat_states``)."""
    first = values[0]
    if isinstance(first, Tensor):
        return torch.cat(values, dim=0)
    if isinstance(first, (tuple, list)):
        parts = [_concat_tree([v[i] for v in values]) for i in range(len(first))]
        if hasattr(first, "_fields"):
            return type(first)(*parts)
        return type(first)(parts)
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        if isinstance(first, RecurrentState):
            values = type(first).joinable(values)
        fields = {f.name: _concat_tree([getattr(v, f.name) for v in values]) for f in dataclasses.fields(first)}
        return dataclasses.replace(first, **fields)
    return first


def copy_state(state: Any) -> Any:
    """``state`` with every tensor copied: a state that stays as it is while the original is donated to
    later calls (``state_donated``)."""
    return _map_tensors(state, torch.clone)


def concat_states(states: Sequence[Any]):
    """Join states of one module along the batch (the inverse of ``state.select``)."""
    states = list(states)
    if not states:
        raise ValueError("states must hold at least one state, got none")
    kinds = {type(s) for s in states}
    if len(kinds) != 1:
        raise TypeError(f"states must all be of one type, got {sorted(k.__name__ for k in kinds)}")
    return _concat_tree(states)
