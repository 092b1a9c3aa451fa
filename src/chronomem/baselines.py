"""The baselines the four papers compare against: Transformer, Transformer-XL / GTrXL, LSTM.

All three follow the chronomem convention ``y, state = module(x [B, N, dim], state=None, mask=None)``
(``mask [B, N]`` boolean, ``True`` = valid) and are registered as models:

* ``Transformer`` ("transformer"): the pre-LN encoder of Vaswani et al. (2017) with sinusoid absolute
  positions added to the input, bidirectional or causal. Stateless (``state`` is always ``None``).
  Used as the "vanilla Transformer" of the TLB and BLRP papers (papers 002, 003). Registered as "vit"
  too: the same encoder with ``positions=False``, for inputs that carry their own positions (image
  patches from ``chronomem.encoders.PatchEncoder``; Dosovitskiy et al. 2020, with mean pooling).
* ``TransformerXL`` ("transformer-xl", "gtrxl"): Dai et al. (2019), *Transformer-XL: Attentive Language
  Models Beyond a Fixed-Length Context*. Segment-level recurrence with a gradient-stopped cache of each
  layer's inputs, and relative position encoding (their Section 3.3). ``gated=True`` replaces every
  residual connection by the GRU-type gate of Parisotto et al. (2020), *Stabilizing Transformers for
  Reinforcement Learning* (GTrXL), the memory of the HTM paper's agents (paper 001, Sec. 2 and Table 1).
  ``memory_mode="sliding"`` (the agents' form) gives every query the last ``mem_len`` steps at any split
  and takes episode ends inside a call (``done``).
* ``LSTM`` ("lstm"): ``torch.nn.LSTM`` with an explicit state and exact padding (padded steps never
  change the state). The recurrent baseline of papers 001 and 004.
* ``Memoryless`` ("mlp"): no memory at all, each step through residual MLPs on its own. The bar an
  agent's memory must clear (docs/rl.md, "Controls and the memoryless agent"); not in the papers.

Deviations from the papers are listed in each class docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from chronomem.checks import (
    check_dropout,
    check_ended_rows,
    check_even_dim,
    check_heads,
    check_mask,
    check_positive,
    check_state_batch,
    check_tensor,
    parameter_dtype,
)
from chronomem.config import build_config
from chronomem.core import CausalCore
from chronomem.layers import (
    FeedForward,
    ParameterVersion,
    RecurrentState,
    RelativeAttention,
    SelfAttentionBlock,
    cache_version,
    dropout_layer,
    reads_cached_kv,
    relative_shift,  # re-exported: it lived here before HTM shared it
    sinusoid_from_positions,
)
from chronomem.registry import register_model

__all__ = [
    "Transformer",
    "KVCache",
    "TransformerXL",
    "XLState",
    "RelativeAttention",
    "GRUGate",
    "relative_shift",
    "LSTM",
    "LSTMState",
    "Memoryless",
    "NoMemory",
]


# ============================================================================================
# Transformer (Vaswani et al. 2017), pre-LN
# ============================================================================================


class Transformer(nn.Module):
    """Pre-LN Transformer encoder with sinusoid absolute positions; bidirectional or causal.

    ``y, None = Transformer(...)(x [B, N, dim], mask=[B, N])``. ``mask`` is a key mask: padded
    positions are never attended to, and positions are counted over valid steps only
    (``position = cumsum(mask) - 1``), so valid outputs do not change with padding anywhere in the
    sequence (left, right or holes). Outputs at padded positions are zero.

    Defaults are the Long Range Arena ListOps Transformer (emb 512, 8 heads, 6 layers, MLP 4x) that
    the TLB and BLRP papers compare against. Deviation: pre-LN with a final LayerNorm (the original is
    post-LN); pre-LN trains without warm-up tuning and is what every chronomem model uses.

    ``positions=False`` adds no position encoding: for inputs that already carry their positions
    (ViT over ``chronomem.encoders.PatchEncoder``, whose 2-D positions follow the image when its
    resolution changes, where 1-D positions of the token index would not).
    """

    @dataclass
    class Config:
        dim: int = 512
        depth: int = 6
        num_heads: int = 8
        causal: bool = False
        ff_mult: float = 4.0
        dropout: float = 0.0
        max_len: int | None = None  # optional guard: longer inputs raise ValueError
        positions: bool = True  # False: the inputs carry their own positions (ViT over image patches)

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_heads(cfg.dim, cfg.num_heads)
        check_even_dim(cfg.dim)
        check_positive(cfg.depth, "depth")
        check_dropout(cfg.dropout)
        if cfg.max_len is not None:
            check_positive(cfg.max_len, "max_len")
        self.dim = self.out_dim = cfg.dim
        self.causal = bool(cfg.causal)
        self.drop = dropout_layer(cfg.dropout)
        self.blocks = nn.ModuleList(
            SelfAttentionBlock(cfg.dim, cfg.num_heads, ff_mult=cfg.ff_mult, dropout=cfg.dropout)
            for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)

    def init_state(self, batch_size: int, device=None) -> None:
        check_positive(batch_size, "batch_size")
        return None  # stateless

    def forward(
        self, x: Tensor, state=None, mask: Tensor | None = None, done: Tensor | None = None
    ) -> tuple[Tensor, None]:
        if done is not None:  # stateless: nothing to reset, and a bidirectional one reads across any boundary
            raise ValueError("the Transformer keeps no state between calls, so it takes no episode ends inside a "
                             "call: done must be None; use a causal core with a state (chronomem list) for agents")
        x = check_tensor(x, "x", 3, self.dim, "[B, N, dim]", dtype=parameter_dtype(self))
        batch, n = x.shape[:2]
        mask = check_mask(mask, "mask", (batch, n))
        if state is not None:
            raise TypeError(f"the Transformer is stateless: state must be None, got {type(state).__name__}")
        if self.config.max_len is not None and n > self.config.max_len:
            raise ValueError(f"x has {n} steps, more than max_len={self.config.max_len}")
        # Absolute positions counted over valid steps (Vaswani et al. Sec. 3.5, sin|cos halves).
        if self.config.positions:
            pos = torch.arange(n, device=x.device) if mask is None else (mask.long().cumsum(1) - 1).clamp_min(0)
            x = x + sinusoid_from_positions(pos, self.dim).to(x.dtype)
        h = self.drop(x)
        for block in self.blocks:
            h = block(h, key_mask=mask, causal=self.causal)
        y = self.norm(h)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, None

    def step(self, x: Tensor, cache: KVCache | None = None, mask: Tensor | None = None) -> tuple[Tensor, KVCache]:
        """Causal decoding: the outputs for the new tokens ``x [B, n, dim]`` that follow the tokens whose
        keys and values are in ``cache`` (None at the start), and the cache with them. The outputs equal
        those of one ``forward`` over the whole sequence (no mask), at O(t) per token instead of a
        recomputation of the prefix; the new keys and values are written after the old ones in place
        (``KVCache``), not concatenated.

        Rows need not move together: ``mask [B, n]`` (True = valid) marks tokens a row skips (a pad where
        another row reads one more token); a skipped token is never attended to, takes no position and
        its output is zero, as in ``forward``. ``cache.reset(done)`` starts the rows of ``done`` afresh
        (an acting loop's episode ends), each row's positions counted from its own episode's start."""
        if not self.causal:
            raise ValueError("step decodes causally: build the Transformer with causal=True")
        x = check_tensor(x, "x", 3, self.dim, "[B, N, dim]", dtype=parameter_dtype(self))
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be the KVCache of the previous step (or None), got {type(cache).__name__}")
        batch, n = x.shape[:2]
        mask = check_mask(mask, "mask", (batch, n))
        heads = self.blocks[0].attn.num_heads
        cache = (cache or KVCache.empty(len(self.blocks), batch, heads, self.dim // heads, x)).room_for(n, mask)
        past, h = cache.length, x
        if cache.valid is None:  # every row valid from the batch's start: one position per token
            key_mask = None
            if self.config.positions:
                pos = torch.arange(past, past + n, device=x.device)
                h = h + sinusoid_from_positions(pos, self.dim).to(x.dtype)
        else:  # positions counted over each row's valid tokens since its episode's start
            key_mask = cache.write_valid(n, mask)[:, None, None, :]  # [B, 1, 1, past + n]
            if self.config.positions:
                new = torch.ones(batch, n, dtype=torch.long, device=x.device) if mask is None else mask.long()
                pos = cache.count[:, None] + (new.cumsum(1) - 1).clamp_min(0)
                h = h + sinusoid_from_positions(pos, self.dim).to(x.dtype)
        h = self.drop(h)
        for i, block in enumerate(self.blocks):
            attn, normed = block.attn, block.norm_attn(h)
            k, v = cache.write(i, *attn.heads_kv(normed))  # every token so far, these included
            h = h + attn.attend(attn.heads_q(normed), k, v, mask=key_mask, causal=True)
            h = h + block.ff(block.norm_ff(h))
        y = self.norm(h)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, cache.advanced(n, mask)


@dataclass(frozen=True)
class KVCache:
    """``Transformer.step``'s keys and values of every token so far: per layer a buffer ``[B, H, capacity,
    Dh]`` whose first ``length`` positions are filled. A step writes its tokens after them in place and
    attends to a view of the filled part, and the buffers double when full, so decoding ``t`` tokens
    copies O(t) numbers, not O(t^2) as concatenating the keys at every step would.

    Only the newest cache of a chain is written in place (``tip``, shared by the chain, holds its
    length). A step from an older cache (a branch), or under autograd (the earlier views are saved for
    the backward pass), first copies the cache's filled part into new buffers, so every cache keeps the
    values it had.

    Rows apart: ``valid [B, capacity]`` marks the filled positions a row may attend to and ``count [B]``
    its valid tokens since its episode began (both None while every row is valid from the batch's
    start, the lockstep case, which then runs without a mask). A skipped token (``Transformer.step``'s
    ``mask``) is written invalid; ``reset(done)`` marks the ended rows' tokens invalid and their count 0."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    length: int
    tip: list[int]  # [length of the chain's newest cache]
    valid: Tensor | None = None
    count: Tensor | None = None

    @classmethod
    def empty(cls, layers: int, batch: int, heads: int, head_dim: int, like: Tensor) -> KVCache:
        zeros = [like.new_empty(batch, heads, 0, head_dim) for _ in range(2 * layers)]
        return cls(tuple(zeros[:layers]), tuple(zeros[layers:]), 0, [0])

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def room_for(self, n: int, mask: Tensor | None = None) -> KVCache:
        """This cache, or a copy of it in new buffers, that ``n`` more tokens (``mask [B, n]``: which of
        them are valid, None: all) may be written into."""
        valid, count = self.valid, self.count
        if valid is None and mask is not None and not bool(mask.all()):  # the first skipped token: rows part
            valid = torch.ones(self.batch_size, self.keys[0].shape[-2], dtype=torch.bool, device=mask.device)
            count = torch.full((self.batch_size,), self.length, dtype=torch.long, device=mask.device)
        capacity, total = self.keys[0].shape[-2], self.length + n
        in_place = self.tip[0] == self.length and total <= capacity and not torch.is_grad_enabled()
        if in_place and writable(self.keys[0]):
            return self if valid is self.valid else replace(self, valid=valid, count=count)
        capacity = max(2 * capacity, total, 16) if total > capacity else capacity

        def copied(t: Tensor) -> Tensor:
            buffer = t.new_empty(*t.shape[:-2], capacity, t.shape[-1])
            buffer[..., : self.length, :] = t[..., : self.length, :]
            return buffer

        if valid is not None:
            grown = torch.ones(self.batch_size, capacity, dtype=torch.bool, device=valid.device)
            grown[:, : self.length] = valid[:, : self.length]
            valid = grown
        return KVCache(tuple(map(copied, self.keys)), tuple(map(copied, self.values)), self.length, [self.length],
                       valid, count)

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write one layer's new keys and values ``[B, H, n, Dh]`` after the filled part; the layer's keys
        and values of every token so far, these included (views of the buffers)."""
        total = self.length + k.shape[-2]
        self.keys[layer][..., self.length : total, :] = k
        self.values[layer][..., self.length : total, :] = v
        return self.keys[layer][..., :total, :], self.values[layer][..., :total, :]

    def write_valid(self, n: int, mask: Tensor | None) -> Tensor:
        """Mark the ``n`` new tokens valid where ``mask [B, n]`` says so (None: all); ``[B, length + n]``,
        which of every token so far a row may attend to."""
        self.valid[:, self.length : self.length + n] = True if mask is None else mask
        return self.valid[:, : self.length + n]

    def advanced(self, n: int, mask: Tensor | None = None) -> KVCache:
        """The cache after a step of ``n`` tokens (``mask [B, n]``, None: all valid) was written (the new
        tip of the chain)."""
        self.tip[0] = self.length + n
        count = self.count
        if count is not None:
            count = count + (n if mask is None else mask.long().sum(1))
        return KVCache(self.keys, self.values, self.length + n, self.tip, self.valid, count)

    def reset(self, done: Tensor) -> KVCache:
        """The cache with the rows of ``done [B]`` (bool) started afresh: their tokens so far are never
        attended to again and their next token takes position 0. Once every row has restarted past a
        prefix of tokens, at least half of the cache, that prefix is dropped, so a long acting loop holds
        only what its rows can still attend to."""
        done = check_ended_rows(done, self.batch_size).to(self.keys[0].device)
        if not bool(done.any()):
            return self
        valid = self.valid
        if valid is None:
            valid = torch.ones(self.batch_size, self.keys[0].shape[-2], dtype=torch.bool, device=done.device)
        valid = valid.clone()
        valid[done, : self.length] = False
        count = torch.full((self.batch_size,), self.length, dtype=torch.long, device=done.device)
        count = (count if self.count is None else self.count).masked_fill(done, 0)
        filled = valid[:, : self.length]
        first = torch.where(filled.any(1), filled.float().argmax(1), torch.full_like(count, self.length))
        cut = int(first.min())
        if cut < max(16, self.length - cut):
            return KVCache(self.keys, self.values, self.length, self.tip, valid, count)
        kept = self.length - cut
        keys = tuple(t[..., cut : self.length, :].clone() for t in self.keys)
        values = tuple(t[..., cut : self.length, :].clone() for t in self.values)
        return KVCache(keys, values, kept, [kept], valid[:, cut : self.length].clone(), count)


# ============================================================================================
# Transformer-XL (Dai et al. 2019) and GTrXL (Parisotto et al. 2020)
# ============================================================================================


class GRUGate(nn.Module):
    """GTrXL's GRU-type gating layer ``g(x, y)`` (Parisotto et al. 2020, Sec. 3.2), replacing ``x + y``::

        r = sigmoid(W_r y + U_r x)
        z = sigmoid(W_z y + U_z x - b_g)
        h = tanh(W_g y + U_g (r * x))
        g = (1 - z) * x + z * h

    ``b_g`` starts at ``bias`` (2 in the paper), so the layer is close to the identity map at init.
    """

    def __init__(self, dim: int, bias: float = 2.0):
        super().__init__()
        self.w = nn.Linear(dim, 3 * dim, bias=False)  # W_r, W_z, W_g on the sublayer output y
        self.u = nn.Linear(dim, 2 * dim, bias=False)  # U_r, U_z on the residual stream x
        self.u_g = nn.Linear(dim, dim, bias=False)  # U_g on r * x
        self.bias = nn.Parameter(torch.full((dim,), float(bias)))  # b_g

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h


class XLLayer(nn.Module):
    """One pre-LN Transformer-XL layer, optionally gated (GTrXL, Parisotto et al. 2020, Eq. in Sec. 3.2)::

        Y = RelAttn(LN([stopgrad(M); E]))        attention over memory and segment
        E' = E + Y            |  gated: E' = g(E, ReLU(Y))
        out = E' + FFN(LN(E')) |  gated: out = g(E', ReLU(FFN(LN(E'))))
    """

    def __init__(
        self, dim: int, num_heads: int, *, ff_mult: float, dropout: float, gated: bool, gate_bias: float
    ):
        super().__init__()
        self.norm_attn = nn.LayerNorm(dim)
        self.attn = RelativeAttention(dim, num_heads, dropout=dropout)
        self.norm_ff = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, ff_mult, dropout)
        self.gated = gated
        if gated:
            self.gate_attn = GRUGate(dim, gate_bias)
            self.gate_ff = GRUGate(dim, gate_bias)

    def forward(
        self,
        h: Tensor,
        memory: Tensor,
        key_valid: Tensor,
        causal: bool,
        queries: int | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """``queries``: compute only the segment's last ``queries`` rows (``output_steps``).
        ``attn_mask`` (``[..., L, M + L]``, True = may attend) narrows what each of the segment's rows sees."""
        return self.step(h, self.memory_kv(memory), key_valid, causal, queries, attn_mask)[0]

    def memory_kv(self, memory: Tensor) -> Tensor:
        """Keys and values of the memory, ``[B, M, 2 dim]``: ``W_kv LN(M)`` (LN and the projection are per
        token, so they are the same whether computed now or when the step was in its own segment)."""
        return self.attn.keys_values(self.norm_attn(memory))

    def step(
        self,
        h: Tensor,
        memory_kv: Tensor,
        key_valid: Tensor | None,
        causal: bool,
        queries: int | None = None,
        attn_mask: Tensor | None = None,
        step_valid: Tensor | None = None,
        into: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The layer from the memory's keys and values (``memory_kv``): the output and the keys and values
        of memory and segment, ``[B, M + L, 2 dim]``, those of invalid steps (``step_valid [B, L]`` False)
        zeroed as in the cache. ``key_valid`` None: every key is valid. ``into`` (acting): a view
        ``[B, M + L, 2 dim]`` of a buffer whose first M rows already hold the memory's keys and values
        (then ``memory_kv`` is not read); the segment's are written after them, in place of a
        concatenation."""
        # LN is per token, so LN([M; E]) = [LN(M); LN(E)]; the queries are the segment's own rows.
        normed = self.norm_attn(h)
        segment_kv = self.attn.keys_values(normed)
        if step_valid is not None:  # never attended (key_valid): zeroed only so that the cache is
            segment_kv = segment_kv.masked_fill(~step_valid[..., None], 0.0)
        if into is None:
            keys_kv = torch.cat([memory_kv, segment_kv], 1)
        else:
            into[:, into.shape[1] - segment_kv.shape[1] :] = segment_kv
            keys_kv = into
        if queries is not None:
            h, normed = h[:, h.shape[1] - queries :], normed[:, h.shape[1] - queries :]
            attn_mask = None if attn_mask is None else attn_mask[..., attn_mask.shape[-2] - queries :, :]
        y = self.attn.forward_projected(normed, keys_kv, key_mask=key_valid, attn_mask=attn_mask,
                                        causal=causal and normed.shape[1] > 1)  # one query sees every key anyway
        h = self.gate_attn(h, F.relu(y)) if self.gated else h + y
        y = self.ff(self.norm_ff(h))
        return self.gate_ff(h, F.relu(y)) if self.gated else h + y, keys_kv


@dataclass(frozen=True)
class XLState(RecurrentState):
    """Transformer-XL memory: the last ``mem_len`` inputs of every layer (gradient-stopped).

    ``memory [B, depth, mem_len, dim]`` (oldest first), ``valid [B, mem_len]`` (``False`` for empty
    slots, for slots that held padding and, after an episode ended inside a call, for the slots of the
    ended episode, whose memory is zeroed as ``reset`` would). ``reset(done)`` empties the rows of
    finished episodes; ``select(rows)`` and ``layers.concat_states`` split and join the batch.

    ``kv`` (one ``[B, mem_len, 2 dim]`` per layer) caches every layer's keys and values of its memory (``W_kv LN(M)``,
    zero at invalid slots) and ``kv_version [B]`` names the parameter values they were computed with
    (0: a row with no valid slot, or a call with gradients or a compiled one made them:
    ``layers.cache_version``). An eager call without gradients (acting) reads them instead of projecting
    the whole memory again, and so does a compiled acting step that continues its stretch (unchecked:
    ``layers.reads_cached_kv``); a call with gradients, any other compiled one, or one after the parameters
    changed recomputes them from ``memory``. Same numbers either way.
    (A state built from ``memory`` and ``valid`` alone has no cache and is recomputed.)
    """

    memory: Tensor
    valid: Tensor
    kv: tuple[Tensor, ...] | None = None
    kv_version: Tensor | None = None


class XLBuffers:
    """Acting without copies: an ``XLState``'s ``memory`` and ``kv`` as windows of longer
    buffers, ``[B, depth, capacity, dim]`` and per layer ``[B, capacity, 2 dim]``. A call writes its
    steps after the state's window, and the next state is the window moved on by them: a step copies one
    step per layer, not the whole memory as ``torch.cat`` did. The buffers hold ``mem_len`` steps and
    as many again to spare; when they are full the window moves into new ones.

    A ``TransformerXL`` holds the buffers of its newest acting state (``frontier``: where that state's
    window ends) and writes in place only from that state. A state whose window ends elsewhere (an
    older state, acted from again), or that is no window of them (made by ``reset``, ``select``, a
    learning call, ``done`` inside a call), is first copied into new buffers, so every state keeps its
    values. Used only without gradients (acting)."""

    def __init__(self, memory: Tensor, kv: list[Tensor], mem_len: int):
        """Buffers whose first ``mem_len`` steps hold the newest window."""
        self.memory, self.kv, self.mem_len, self.frontier = memory, kv, mem_len, mem_len

    @classmethod
    def for_state(cls, state: XLState, length: int, held: XLBuffers | None) -> XLBuffers:
        """Buffers holding ``state``'s window with room for ``length`` more steps: ``held`` if ``state`` is
        its newest window and it has that room, else new ones with the window copied in."""
        mem_len = state.memory.shape[2]
        if (held is not None and held.holds(state) and held.frontier + length <= held.memory.shape[2]
                and writable(held.memory)):
            return held
        capacity = 2 * mem_len + length
        memory = state.memory.new_empty(*state.memory.shape[:2], capacity, state.memory.shape[3])
        memory[:, :, :mem_len] = state.memory
        kv = []
        for layer_kv in state.kv:
            buffer = layer_kv.new_empty(layer_kv.shape[0], capacity, layer_kv.shape[2])
            buffer[:, :mem_len] = layer_kv
            kv.append(buffer)
        return cls(memory, kv, mem_len)

    def holds(self, state: XLState) -> bool:
        """Whether ``state``'s memory and keys and values are the newest windows of these buffers."""
        start = self.frontier - self.mem_len
        return (_is_window(state.memory, self.memory, start)
                and all(_is_window(v, b, start) for v, b in zip(state.kv, self.kv, strict=True)))

    def write_input(self, layer: int, h: Tensor) -> None:
        """The layer's inputs of the call's steps, after the window."""
        self.memory[:, layer, self.frontier : self.frontier + h.shape[1]] = h

    def keys_values(self, layer: int, length: int) -> Tensor:
        """The view ``[B, mem_len + length, 2 dim]`` that the layer writes its steps' keys and values into;
        its first ``mem_len`` rows are the window's."""
        return self.kv[layer][:, self.frontier - self.mem_len : self.frontier + length]

    def advance(self, length: int) -> Tensor:
        """The next state's memory: the window moved on by the call's ``length`` steps (its keys and values
        are ``keys_values(l, length)[:, length:]``); these buffers' new frontier."""
        self.frontier += length
        return self.memory[:, :, self.frontier - self.mem_len : self.frontier]


def writable(buffer: Tensor) -> bool:
    """Whether ``buffer`` may be written in place here: a buffer made under ``torch.inference_mode`` only
    inside it (torch refuses the write elsewhere; it is copied then)."""
    return not buffer.is_inference() or torch.is_inference_mode_enabled()


def _is_window(view: Tensor, buffer: Tensor, start: int) -> bool:
    """Whether ``view`` is ``buffer``'s window of ``view.shape[-2]`` steps from ``start`` (time is the
    second-last axis of both)."""
    return (view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            and view.storage_offset() == buffer.storage_offset() + start * buffer.stride(-2)
            and view.stride() == buffer.stride() and view.shape[:-2] == buffer.shape[:-2])


MEMORY_MODES = ("segment", "sliding")


class TransformerXL(CausalCore):
    """Transformer-XL (Dai et al. 2019) with segment-level recurrence; ``gated=True`` gives GTrXL.

    ``y, state = TransformerXL(...)(x [B, N, dim], state=None, mask=None, done=None)``. ``x`` is cut into
    segments of ``segment_len`` steps (the last one may be shorter) processed in order. Layer ``l`` of a
    segment attends to its cached memory (the last ``mem_len`` inputs layer ``l`` received, Sec. 3.2, with
    ``torch.detach`` = the paper's stop-gradient) followed by the segment itself, with relative positions
    (Sec. 3.3). Padded steps (``mask`` False) are never attended to; they still occupy memory slots
    (marked invalid) and count for relative distances, so padding belongs at the end of a stream.
    Outputs at padded positions are zero. ``memory_mode`` says which keys a query sees:

    * ``"segment"`` (default, Dai et al.'s language model): the whole memory and its segment up to
      itself (causal), so a query's span (``mem_len`` plus its place in the segment) depends on where
      segments were cut. Feeding a sequence in one call or in calls split at multiples of
      ``segment_len`` gives the same outputs; the memory is detached between segments inside a call too.
    * ``"sliding"`` (the agents' form, as CleanRL's PPO-TrXL): query ``t`` sees the ``mem_len`` steps
      before it and itself, a window sliding over the memory and the call (distances ``0 .. mem_len``).
      Calls of any lengths, one step included, give the same outputs, and the same gradients, as one
      call. ``segment_len`` only sets how many queries are computed together (the memory cost). The
      memory is not cut by a stop-gradient: like an LSTM's state it carries the gradient from call to
      call until ``state.detach()`` (a state stored while acting under ``torch.no_grad`` has none, so a
      learning call from it sees a detached memory plus the call's own keys, as in CleanRL). Always
      causal. ``done [B, N]`` (True where a step is the last of its
      episode) is accepted: a query sees only its own episode's keys, and after a done the row continues
      from the empty memory, exactly as ``state.reset(done[:, t])`` between two calls would; no gradient
      crosses an episode boundary. (With segment recurrence an episode end inside a segment has no such
      reference, so ``done`` there is a ValueError.)

    Defaults: dim 512, 4 layers, 8 heads (HTM paper Table 1, the TrXL/GTrXL agent memory), segment
    64 (its unroll length), memory 256 ("TrXL extra length" of Ballet).

    ``output_steps=r`` (a speed-up, same function; default off): only the last ``r`` outputs of a call
    are computed. The last layer then runs only for those steps (its memory stores its inputs, which
    the layers below still compute); the other outputs are zeros. Tested equal to the plain forward.

    Deviations: pre-LN with a final LayerNorm (Dai et al. is post-LN; GTrXL's identity-map reordering
    is pre-LN too). ``causal=False`` (not in the paper, segment mode only) lets a query also see the
    later steps of its own segment, for classification tasks; the memory always holds only the past.
    No adaptive softmax or embeddings: heads do that.
    """

    @dataclass
    class Config:
        dim: int = 512
        depth: int = 4
        num_heads: int = 8
        segment_len: int = 64
        mem_len: int = 256
        causal: bool = True
        gated: bool = False
        gate_bias: float = 2.0
        ff_mult: float = 4.0
        dropout: float = 0.0
        output_steps: int | None = None
        memory_mode: str = "segment"  # or "sliding": every query sees the last mem_len steps

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_heads(cfg.dim, cfg.num_heads)
        check_even_dim(cfg.dim)
        if cfg.output_steps is not None:
            check_positive(cfg.output_steps, "output_steps")
        check_positive(cfg.depth, "depth")
        check_positive(cfg.segment_len, "segment_len")
        check_positive(cfg.mem_len, "mem_len", minimum=0)
        check_dropout(cfg.dropout)
        if cfg.memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {cfg.memory_mode!r}")
        if cfg.memory_mode == "sliding" and not cfg.causal:
            raise ValueError("memory_mode='sliding' is causal (each query sees the steps before it): "
                             "causal=False needs memory_mode='segment'")
        self.dim = self.out_dim = cfg.dim
        self.depth, self.segment_len, self.mem_len = cfg.depth, cfg.segment_len, cfg.mem_len
        self.causal = bool(cfg.causal)
        self.sliding = cfg.memory_mode == "sliding"
        self.drop = dropout_layer(cfg.dropout)
        self.layers = nn.ModuleList(
            XLLayer(cfg.dim, cfg.num_heads, ff_mult=cfg.ff_mult, dropout=cfg.dropout, gated=cfg.gated,
                    gate_bias=cfg.gate_bias)
            for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self._kv_parameters = ParameterVersion()  # names the values W_kv LN(M) was cached with

    def init_state(self, batch_size: int, device=None) -> XLState:
        """The empty memory: zeros, all slots invalid."""
        check_positive(batch_size, "batch_size")
        dtype = self.norm.weight.dtype
        memory = torch.zeros(batch_size, self.depth, self.mem_len, self.dim, device=device, dtype=dtype)
        kv = tuple(torch.zeros(batch_size, self.mem_len, 2 * self.dim, device=device, dtype=dtype)
                   for _ in range(self.depth))
        return XLState(memory, torch.zeros(batch_size, self.mem_len, dtype=torch.bool, device=device), kv,
                       torch.zeros(batch_size, dtype=torch.long, device=device))

    def _parameter_version(self) -> int:
        """The number naming the current values of the parameters the memory's keys and values depend on
        (each layer's ``norm_attn`` and ``to_kv``; ``layers.ParameterVersion``; read eagerly,
        ``layers.cache_version``)."""
        return self._kv_parameters(p for layer in self.layers for m in (layer.norm_attn, layer.attn.kv_projection)
                                   for p in m.parameters())

    def check_state(self, state, batch: int) -> XLState:
        if not isinstance(state, XLState):
            raise TypeError(f"state must be an XLState (or None), got {type(state).__name__}")
        check_state_batch(state.valid.shape[0], batch)
        expected = (batch, self.depth, self.mem_len, self.dim)
        if tuple(state.memory.shape) != expected or tuple(state.valid.shape) != (batch, self.mem_len):
            raise ValueError(
                f"state.memory must have shape {expected} and state.valid {(batch, self.mem_len)}, "
                f"got {tuple(state.memory.shape)} and {tuple(state.valid.shape)}"
            )
        if state.kv is not None:
            expected = (batch, self.mem_len, 2 * self.dim)
            shapes = [tuple(t.shape) for t in state.kv]
            if shapes != [expected] * self.depth or state.kv_version is None or state.kv_version.shape != (batch,):
                raise ValueError(f"state.kv must hold {self.depth} tensors of shape {expected} and "
                                 f"state.kv_version the shape {(batch,)}, got {shapes} and {state.kv_version}")
        return state

    def _visible(self, length: int, episode: Tensor | None, device) -> Tensor | None:
        """Which keys ``[memory; segment]`` each of a segment's ``length`` queries may see beyond the key
        mask, ``[L, M + L]`` or ``[B, 1, L, M + L]`` (None: all). Sliding: query ``i`` (at key position
        ``M + i``) sees distances ``0 .. M`` (keys ``i .. M + i``). ``episode [B, M + L]`` (the episode
        number of every key within the call; the queries are the last L): only keys of the query's own
        episode."""
        visible = None
        if self.sliding and length > 1:  # one query sees its whole window: nothing to narrow
            distance = torch.arange(length, device=device)[:, None] + self.mem_len - torch.arange(
                self.mem_len + length, device=device)[None, :]
            visible = (distance >= 0) & (distance <= self.mem_len)
        if episode is not None:
            same = episode[:, -length:, None] == episode[:, None, :]  # [B, L, M + L]
            visible = (same if visible is None else same & visible)[:, None]
        return visible

    def _segment_choices(self, state: XLState, mask: Tensor | None, version: Tensor) -> tuple[bool, bool, bool]:
        """Whether every step is valid (``mask``), whether every memory slot is too (then no key is masked),
        and whether the cached keys and values may be read (``_read_segment_choices``). A compiled call
        decides without reading a value: the keys masked as the state says, the steps as ``mask`` says, and
        the cache read unchecked where the call continues an acting stretch, else projected again
        (``layers.reads_cached_kv``)."""
        if torch.compiler.is_compiling():
            return mask is None, False, state.kv is not None and reads_cached_kv()
        return self._read_segment_choices(state, mask, version)

    @torch.compiler.disable
    def _read_segment_choices(self, state: XLState, mask: Tensor | None, version: Tensor) -> tuple[bool, bool, bool]:
        """The choices of an eager segment, which read values (made together; a compiled call decides from
        shapes, ``_segment_choices``): whether every step is valid (``mask``), whether every
        memory slot is too (then no key is masked), and whether the cached keys and values may be read:
        without gradients (the parameters' gradient flows through W_kv LN(M)) and when every row's cache
        was made with the present parameter values (``version``)."""
        steps_valid = mask is None or bool(mask.all())
        cached = state.kv is not None and reads_cached_kv() and bool(
            ((state.kv_version == version) | ~state.valid.any(1)).all())
        return steps_valid, steps_valid and bool(state.valid.all()), cached

    def segment(
        self,
        x: Tensor,
        state: XLState,
        mask: Tensor | None,
        outputs: int | None = None,
        episode: Tensor | None = None,
        version: Tensor | int = 0,
    ) -> tuple[Tensor, XLState]:
        """One segment (Dai et al. Sec. 3.2): ``x [B, L, dim]``, ``mask [B, L]`` (None: all valid) -> outputs,
        next memory. ``outputs``: how many of the segment's last steps to compute in the last layer (None:
        all). ``episode [B, M + L]``: episode numbers of the memory slots and the segment's steps (with
        done). ``version``: the parameters' (``_parameter_version``)."""
        batch, length = x.shape[:2]
        key_valid = torch.cat([state.valid, x.new_ones(batch, length, dtype=torch.bool) if mask is None else mask], 1)
        keep = key_valid.shape[1] - self.mem_len  # the last mem_len steps become the next memory
        visible = self._visible(length, episode, x.device)
        all_valid, all_keys_valid, cached = self._segment_choices(state, mask, version)
        attended = None if all_keys_valid else key_valid  # None: no key is masked
        # Acting (cached keys and values, every output read): write the segment after the memory in
        # buffers with room to spare, in place of concatenating memory and segment (XLBuffers). A compiled
        # graph concatenates: the buffers' reuse is decided by their storage, which a graph does not see.
        buffers = None
        if cached and outputs is None and self.mem_len and not torch.compiler.is_compiling():
            buffers = self._acting = XLBuffers.for_state(state, length, getattr(self, "_acting", None))
        h, inputs, kvs = self.drop(x), [], []
        for layer_index, layer in enumerate(self.layers):
            inputs.append(h)
            if buffers is not None:
                buffers.write_input(layer_index, h)
                memory_kv = None
            elif cached:
                memory_kv = state.kv[layer_index]
            else:  # zero at invalid slots, as in the cache (they are never attended)
                memory_kv = layer.memory_kv(state.memory[:, layer_index]).masked_fill(~state.valid[..., None], 0.0)
            last = layer_index == len(self.layers) - 1
            if last and outputs == 0:  # no output of this segment is read: the last layer has no work
                keys_kv = torch.cat([memory_kv, layer.memory_kv(h)], dim=1)
                h = h.new_zeros(h.shape)
            else:
                into = None if buffers is None else buffers.keys_values(layer_index, length)
                h, keys_kv = layer.step(h, memory_kv, attended, self.causal, outputs if last else None, visible,
                                        None if all_valid else mask, into)
            kvs.append(keys_kv[:, keep:].detach())  # a view: the cache costs no copy
        # the next memory: the last mem_len inputs of every layer, gradient-stopped (segment mode, Dai et
        # al.) or carrying gradients like an RNN state until state.detach() (sliding mode)
        if buffers is not None:
            memory = buffers.advance(length)
        else:
            memory = torch.cat([state.memory, torch.stack(inputs, dim=1)], dim=2)[:, :, keep:]
        y = self.norm(h) if outputs != 0 else h
        if y.shape[1] < length:
            y = torch.cat([y.new_zeros(batch, length - y.shape[1], y.shape[2]), y], 1)
        valid = key_valid[:, keep:]
        tag = torch.where(valid.any(1), version, 0)  # a row with no valid slot has nothing cached
        return y, XLState(memory if self.sliding else memory.detach(), valid, tuple(kvs), tag)

    def done_refused(self) -> str | None:
        if self.sliding:
            return None
        return ("done inside a call needs memory_mode='sliding': with segment recurrence a query's span depends "
                "on where segments are cut (call with the steps up to each done, then state.reset(done[:, t]), "
                "instead)")

    def scan(self, x: Tensor, state: XLState, given_mask: Tensor | None, done: Tensor | None):
        """``forward`` (``CausalCore``) on checked inputs: the call segment by segment; ``done`` the
        episode ends before the call's last step."""
        batch, n = x.shape[:2]
        first = 0 if self.config.output_steps is None else max(0, n - self.config.output_steps)
        if first and given_mask is not None and not bool(given_mask.all()):
            raise ValueError("output_steps reads the last steps of each call; mask must not pad any step")
        # Episode number of each step within the call (dones strictly before it); the memory from the
        # state belongs to episode 0, the episode running when the call starts.
        episode = None if done is None else torch.cat(
            [done.new_zeros(batch, self.mem_len, dtype=torch.long), done.long().cumsum(1) - done.long()], 1)
        version = cache_version(self._parameter_version, x)
        outputs = []
        for start in range(0, n, self.segment_len):
            stop = min(n, start + self.segment_len)
            wanted = None if first <= start else max(0, stop - first)  # outputs of this segment read
            keys = None if episode is None else episode[:, start : self.mem_len + stop]
            segment_mask = None if given_mask is None else given_mask[:, start:stop]
            y, state = self.segment(x[:, start:stop], state, segment_mask, wanted, keys, version)
            outputs.append(y)
        y = torch.cat(outputs, dim=1)
        if given_mask is not None:
            y = y.masked_fill(~given_mask[..., None], 0.0)
        if done is not None:  # the slots of ended episodes are emptied, as state.reset would
            current = episode[:, n:] == done.long().sum(1, keepdim=True)  # the memory's slots: [B, M]
            valid, ended = state.valid & current, ~current[..., None]
            state = XLState(state.memory.masked_fill(ended[:, None], 0.0), valid,
                            tuple(kv.masked_fill(ended, 0.0) for kv in state.kv),
                            torch.where(valid.any(1), state.kv_version, 0))
        return y, state


# ============================================================================================
# LSTM
# ============================================================================================


@dataclass(frozen=True)
class LSTMState(RecurrentState):
    """``h``, ``c``: ``[B, depth, hidden]`` (batch-first, unlike ``nn.LSTM``'s ``[depth, B, hidden]``)."""

    h: Tensor
    c: Tensor


class LSTM(CausalCore):
    """``torch.nn.LSTM`` (Hochreiter & Schmidhuber 1997) in the chronomem convention.

    ``y [B, N, hidden], state = LSTM(...)(x [B, N, dim], state=None, mask=None, done=None)``. Padded
    steps (``mask`` False) leave the state unchanged and output zeros: a right-padding mask (valid
    prefix) runs through ``pack_padded_sequence`` (cuDNN / fused kernel); any other mask (left padding,
    holes) steps through time and keeps the old state where the mask is False. Both are exact.

    ``done [B, N]`` (True where a step is the last of its episode; ignored at padded steps): after such
    a step the row continues from the initial (zero) state, so no output and no gradient crosses an
    episode boundary. Without a mask, the call is cut after each step where some episode ends (one
    ``nn.LSTM`` call per stretch, the ended rows reset in between); with a mask it steps through time
    and resets rows after their dones.

    ``forget_bias=b`` starts every layer's forget gates at bias ``b`` (the sum of ``nn.LSTM``'s two bias
    vectors there; the other gates keep torch's initialisation): ``b = 1`` as TensorFlow's LSTM cells
    (``forget_bias=1.0``) and Keras (``unit_forget_bias``) do by default, after Gers et al. (2000) and
    Jozefowicz et al. (2015), so that a new LSTM keeps most of its cell from step to step (a gate of
    ``sigmoid(1) = 0.73`` rather than ``0.5``). None (the default) leaves torch's initialisation, as
    CleanRL's and torch-ac's agents do.

    Defaults: hidden 128 (paper 004's Copy/Denoise LSTM). Always causal.
    """

    @dataclass
    class Config:
        dim: int = 128
        depth: int = 1
        hidden: int | None = None  # defaults to dim
        dropout: float = 0.0  # between stacked layers (nn.LSTM semantics)
        forget_bias: float | None = None  # the forget gates' starting bias (None: torch's initialisation)

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_positive(cfg.dim, "dim")
        check_positive(cfg.depth, "depth")
        if cfg.hidden is not None:
            check_positive(cfg.hidden, "hidden")
        check_dropout(cfg.dropout)
        self.dim, self.depth = cfg.dim, cfg.depth
        self.hidden = self.out_dim = cfg.dim if cfg.hidden is None else cfg.hidden
        self.lstm = nn.LSTM(cfg.dim, self.hidden, num_layers=cfg.depth, batch_first=True,
                            dropout=cfg.dropout if cfg.depth > 1 else 0.0)
        if cfg.forget_bias is not None:
            if isinstance(cfg.forget_bias, bool) or not isinstance(cfg.forget_bias, (int, float)):
                raise TypeError(f"forget_bias must be a number or None, got {cfg.forget_bias!r}")
            forget = slice(self.hidden, 2 * self.hidden)  # nn.LSTM's gates: input, forget, cell, output
            with torch.no_grad():
                for layer in range(cfg.depth):
                    getattr(self.lstm, f"bias_ih_l{layer}")[forget] = float(cfg.forget_bias)
                    getattr(self.lstm, f"bias_hh_l{layer}")[forget] = 0.0

    def init_state(self, batch_size: int, device=None) -> LSTMState:
        check_positive(batch_size, "batch_size")
        dtype = self.lstm.weight_ih_l0.dtype
        zeros = torch.zeros(batch_size, self.depth, self.hidden, device=device, dtype=dtype)
        return LSTMState(zeros, zeros.clone())

    def check_state(self, state, batch: int) -> LSTMState:
        if not isinstance(state, LSTMState):
            raise TypeError(f"state must be an LSTMState (or None), got {type(state).__name__}")
        check_state_batch(state.h.shape[0], batch)
        expected = (batch, self.depth, self.hidden)
        if tuple(state.h.shape) != expected or tuple(state.c.shape) != expected:
            raise ValueError(f"state.h and state.c must have shape {expected}, got "
                             f"{tuple(state.h.shape)} and {tuple(state.c.shape)}")
        return state

    def scan(self, x: Tensor, state: LSTMState, mask: Tensor | None, done: Tensor | None):
        """``forward`` (``CausalCore``) on checked inputs; ``done`` the episode ends before the last step."""
        n = x.shape[1]
        h0, c0 = state.h.transpose(0, 1).contiguous(), state.c.transpose(0, 1).contiguous()  # [depth, B, H]
        if mask is None and done is not None:
            y, (h, c) = self._episodes(x, h0, c0, done)
        elif mask is None:
            y, (h, c) = self.lstm(x, (h0, c0))
        else:
            lengths = mask.sum(1)
            prefix = torch.arange(n, device=x.device)[None, :] < lengths[:, None]
            if done is None and bool((prefix == mask).all()):
                y, (h, c) = self._packed(x, h0, c0, lengths)
            else:
                y, (h, c) = self._stepped(x, h0, c0, mask, done)
        return y, LSTMState(h.transpose(0, 1), c.transpose(0, 1))

    def _packed(self, x: Tensor, h0: Tensor, c0: Tensor, lengths: Tensor):
        """Right padding: run each row for exactly its length. Empty rows keep their state."""
        empty = lengths == 0
        packed = pack_padded_sequence(x, lengths.clamp_min(1).cpu(), batch_first=True, enforce_sorted=False)
        out, (h, c) = self.lstm(packed, (h0, c0))
        y, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        if bool(empty.any()):  # an empty row ran one (padding) step: undo it
            y = y.masked_fill(empty[:, None, None], 0.0)
            h = torch.where(empty[None, :, None], h0, h)
            c = torch.where(empty[None, :, None], c0, c)
        return y, (h, c)

    def _episodes(self, x: Tensor, h: Tensor, c: Tensor, done: Tensor):
        """Episode boundaries inside the call: one ``nn.LSTM`` call per stretch between the steps where
        some row's episode ends, the ended rows set back to the initial state in between (by
        selection, so neither values nor gradients cross the boundary)."""
        outputs, start = [], 0
        for t in done.any(0).nonzero().flatten().tolist():  # never the last step (CausalCore.inner_ends)
            y, (h, c) = self.lstm(x[:, start : t + 1], (h, c))
            outputs.append(y)
            ended = done[None, :, t, None]
            h, c = torch.where(ended, 0.0, h), torch.where(ended, 0.0, c)
            start = t + 1
        y, (h, c) = self.lstm(x[:, start:], (h, c))
        return torch.cat([*outputs, y], dim=1), (h, c)

    def _stepped(self, x: Tensor, h: Tensor, c: Tensor, mask: Tensor, done: Tensor | None = None):
        """Any mask: one step at a time, keeping the previous state where the step is padding and
        restoring the initial state after a done (a valid step's: CausalCore drops padded steps' dones)."""
        outputs = []
        for t in range(x.shape[1]):
            y_t, (h_t, c_t) = self.lstm(x[:, t : t + 1], (h, c))
            keep = mask[:, t]
            h = torch.where(keep[None, :, None], h_t, h)
            c = torch.where(keep[None, :, None], c_t, c)
            if done is not None:
                end = done[None, :, t, None]
                h, c = torch.where(end, 0.0, h), torch.where(end, 0.0, c)
            outputs.append(y_t.masked_fill(~keep[:, None, None], 0.0))
        return torch.cat(outputs, dim=1), (h, c)


# ============================================================================================
# No memory: the agent's control (not in the papers)
# ============================================================================================


@dataclass(frozen=True)
class NoMemory(RecurrentState):
    """``Memoryless``'s state: nothing but the batch size (``rows [B, 0]``), so that the loops that carry,
    select, join and reset states treat it as any other core's."""

    rows: Tensor


class Memoryless(CausalCore):
    """A core without memory: ``y_t = LN(h_t)``, ``h_t`` the input ``x_t`` after ``depth`` pre-LN residual
    MLPs (``h <- h + FFN(LN(h))``, ``chronomem.layers.FeedForward``). Step ``t``'s output depends on
    ``x_t`` alone.

    ``y [B, N, dim], state = Memoryless(...)(x [B, N, dim], state=None, mask=None, done=None)``: the
    core contract (docs/design.md) holds trivially. ``state`` (a ``NoMemory``) carries no information,
    ``done`` changes nothing (there is nothing to reset), and padded steps output zeros. An agent built
    on it sees only the current observation: the memoryless row that every RL table sets beside the
    memory cores (POPGym's MLP baseline; docs/rl.md, "Controls and the memoryless agent").
    """

    @dataclass
    class Config:
        dim: int = 64
        depth: int = 1
        ff_mult: float = 4.0
        dropout: float = 0.0

    def __init__(self, config: Config | None = None, **kwargs):
        super().__init__()
        cfg = self.config = build_config(self.Config, config, kwargs)
        check_positive(cfg.dim, "dim")
        check_positive(cfg.depth, "depth")
        check_dropout(cfg.dropout)
        if not cfg.ff_mult > 0:
            raise ValueError(f"ff_mult must be > 0, got {cfg.ff_mult!r}")
        self.dim = self.out_dim = cfg.dim
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.dim) for _ in range(cfg.depth))
        self.ffs = nn.ModuleList(FeedForward(cfg.dim, cfg.ff_mult, cfg.dropout) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)

    def init_state(self, batch_size: int, device=None) -> NoMemory:
        check_positive(batch_size, "batch_size")
        return NoMemory(torch.zeros(batch_size, 0, device=device, dtype=parameter_dtype(self)))

    def check_state(self, state, batch: int) -> NoMemory:
        if not isinstance(state, NoMemory):
            raise TypeError(f"state must be a NoMemory (or None), got {type(state).__name__}")
        check_state_batch(state.rows.shape[0], batch)
        return state

    def scan(self, x: Tensor, state: NoMemory, mask: Tensor | None, done: Tensor | None):
        """Each step alone: ``done`` changes nothing (``forward``: ``CausalCore``)."""
        h = x
        for norm, ff in zip(self.norms, self.ffs, strict=True):
            h = h + ff(norm(h))
        y = self.norm(h)
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, state


# ============================================================================================
# Registry builders: builder(dim, depth, num_heads, causal, **options) -> backbone
# ============================================================================================


@register_model("transformer")
def build_transformer(dim: int, depth: int, num_heads: int, causal: bool, **options) -> Transformer:
    return Transformer(dim=dim, depth=depth, num_heads=num_heads, causal=causal, **options)


@register_model("vit")
def build_vit(dim: int, depth: int, num_heads: int, causal: bool = False, **options) -> Transformer:
    """ViT's encoder (Dosovitskiy et al. 2020): the Transformer without its own position encoding, for
    patch inputs that carry theirs (``chronomem.encoders.PatchEncoder``); the classifier mean-pools."""
    options.setdefault("positions", False)
    return Transformer(dim=dim, depth=depth, num_heads=num_heads, causal=causal, **options)


@register_model("transformer-xl")
def build_transformer_xl(dim: int, depth: int, num_heads: int, causal: bool, **options) -> TransformerXL:
    """Options: ``segment_len`` (64), ``mem_len`` (256), ``memory_mode`` ("segment" or "sliding"), ``ff_mult``,
    ``dropout``, ``output_steps``."""
    return TransformerXL(dim=dim, depth=depth, num_heads=num_heads, causal=causal, **options)


@register_model("gtrxl")
def build_gtrxl(dim: int, depth: int, num_heads: int, causal: bool, **options) -> TransformerXL:
    """Transformer-XL with GTrXL gating; options as ``transformer-xl`` plus ``gate_bias`` (2)."""
    options.setdefault("gated", True)
    return TransformerXL(dim=dim, depth=depth, num_heads=num_heads, causal=causal, **options)


@register_model("lstm")
def build_lstm(dim: int, depth: int, num_heads: int | None = None, causal: bool = True, **options) -> LSTM:
    """``num_heads`` is ignored and the LSTM is always causal. Options: ``hidden``, ``dropout``."""
    return LSTM(dim=dim, depth=depth, **options)


@register_model("mlp")
def build_mlp(dim: int, depth: int, num_heads: int | None = None, causal: bool = True, **options) -> Memoryless:
    """No memory (each step alone); ``num_heads`` is ignored. Options: ``ff_mult``, ``dropout``."""
    return Memoryless(dim=dim, depth=depth, **options)
