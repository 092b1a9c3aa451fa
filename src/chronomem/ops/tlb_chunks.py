"""The machinery of TLB's chunked forward: where each token goes, in what order the chunks run, and
what a call leaves in the state for the next one.

``chronomem.tlb`` holds the equations: the perceptual module (Eqs. 5-6) and the bottleneck update
(Eq. 7). This module schedules them over a call ``x [B, L, D]``:

* **Layout** (``layout_chunks``): each row's tokens are cut into chunks of ``K``. A row that continues a
  chunk begun by an earlier call (causal TLB) starts mid-chunk, and an episode that begins inside the
  call (``done``) starts a chunk of its own from the initial state: each such part of a row is a
  *virtual row* with its own chunks. The chunks of all virtual rows form one flat list ``[chunks, K,
  D]``, ordered by *wave* (a chunk's index within its virtual row) and, within a wave, by virtual
  row, longest first: the chunks of a wave do not depend on each other, and their states are a
  prefix of the state tensor. Without rows mid-chunk or episode starts (the common case) the layout
  is the plain reshape of the input. Reference: ``layout_chunks_reference``, a loop over tokens.
* **Scan** (``scan_chunks``): the recurrence, ``perceive`` then ``update`` for each chunk, one wave at
  a time (``impl="waves"``), so episode ends add chunks but not sequential steps. Reference:
  ``impl="loop"``, one chunk at a time, each virtual row's chunks in order.
* **Cache** (``ChunkCache``): the chunk each row ends in, which the next call (or a one-token step)
  continues; ``assemble_cache`` cuts it out of a call's chunks, ``ContinuedChunk`` puts it back into
  the next call's first chunk. Reference: ``assemble_cache_reference``, a loop over rows.

``tests/test_ops_tlb_chunks.py`` checks each fast path against its reference (values and gradients),
and the TLB run with either scan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from chronomem.layers import split_chunks

SCAN_IMPLS = ("waves", "loop")


# =============================================================================================
# The state of the slow stream per (virtual) row, and the chunk cache
# =============================================================================================


class KeysValues(NamedTuple):
    """Per group, the keys and values of the state that the perceptual cross-attention reads."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]


class SlowState(NamedTuple):
    """The bottleneck state ``I`` and the chunk counter of a set of rows."""

    memory: Tensor  # [rows, N, D]
    chunks: Tensor  # [rows] (long): chunks with a valid token seen since the row (re)started

    def take(self, index) -> SlowState:
        return SlowState(self.memory[index], self.chunks[index])

    def put(self, rows: Tensor, new: SlowState) -> SlowState:
        """This state with ``rows`` replaced by ``new`` (out of place)."""
        return SlowState(self.memory.index_put((rows,), new.memory), self.chunks.index_put((rows,), new.chunks))


@dataclass(frozen=True)
class ChunkCache:
    """The chunk a causal TLB is filling, carried in its state so that a call may stop anywhere inside
    a chunk and the next one (a one-token step included) continues it:

    * ``fill [B]`` (long): slots of the current chunk filled so far, ``0 <= fill < K``.
    * ``slot_valid [B, K]`` (bool): those of them holding a valid (unpadded) token.
    * ``outputs [B, K, D]``: their perceptual outputs ``H`` (Eq. 7 reads them when the chunk completes).
    * ``chunk_keys``, ``chunk_values``: one ``[B, heads, K, head_dim]`` tensor per self-attention layer:
      their keys and values, so that a new token attends to the chunk's earlier tokens without
      recomputing them.
    * ``memory_keys``, ``memory_values``: one ``[B, heads, N, head_dim]`` tensor per group: the keys and
      values of ``LN(I + P)`` that the perceptual cross-attention reads (Eq. 6); ``I`` changes once per
      chunk, so a one-token call does not recompute them.

    Slots at and after ``fill`` hold zeros. Like any key/value cache, the tensors were computed with
    the parameters of the call that made them.
    """

    fill: Tensor
    slot_valid: Tensor
    outputs: Tensor
    chunk_keys: tuple[Tensor, ...]
    chunk_values: tuple[Tensor, ...]
    memory_keys: tuple[Tensor, ...]
    memory_values: tuple[Tensor, ...]

    @classmethod
    def zeros(cls, batch: int, shapes: dict[str, tuple], device, dtype) -> ChunkCache:
        """An empty chunk for every row; ``shapes`` as ``row_shapes`` gives them."""
        fields = {}
        for name, shape in shapes.items():
            kind = torch.long if name == "fill" else torch.bool if name == "slot_valid" else dtype
            if name.endswith(("_keys", "_values")):  # one tensor per layer or group
                fields[name] = tuple(torch.zeros(batch, *s, device=device, dtype=kind) for s in shape)
            else:
                fields[name] = torch.zeros(batch, *shape, device=device, dtype=kind)
        return cls(**fields)

    def row_shapes(self) -> dict[str, tuple]:
        """Per-row shape of each field (a tuple of shapes for the per-layer and per-group fields)."""
        shapes = {}
        for field in fields(self):
            value = getattr(self, field.name)
            shapes[field.name] = (tuple(tuple(t.shape[1:]) for t in value) if isinstance(value, tuple)
                            else tuple(value.shape[1:]))
        return shapes

    def to(self, dtype) -> ChunkCache:
        """The floating-point fields in ``dtype``."""
        if self.outputs.dtype == dtype:  # (all made together, so all in one dtype)
            return self

        def cast(value):
            return tuple(t.to(dtype) for t in value) if isinstance(value, tuple) else value.to(dtype)

        return replace(self, **{name: cast(getattr(self, name)) for name in
                                ("outputs", "chunk_keys", "chunk_values", "memory_keys", "memory_values")})

    def restart(self, rows: Tensor, memory_kv: KeysValues) -> ChunkCache:
        """``rows``, whose chunk is complete, start an empty one that reads their new state
        (``memory_kv``, its keys and values per group). The chunk's tensors are cleared in place when no
        gradient is recorded (acting: saves a copy of the cache), so they must be ones this call made."""
        return ChunkCache(
            fill=self.fill.index_fill(0, rows, 0),
            slot_valid=self.slot_valid.index_fill(0, rows, False),
            outputs=_clear_rows(self.outputs, rows),
            chunk_keys=tuple(_clear_rows(t, rows) for t in self.chunk_keys),
            chunk_values=tuple(_clear_rows(t, rows) for t in self.chunk_values),
            memory_keys=tuple(t.index_put((rows,), n) for t, n in zip(self.memory_keys, memory_kv.keys, strict=True)),
            memory_values=tuple(t.index_put((rows,), n) for t, n in zip(self.memory_values, memory_kv.values,
                                                                          strict=True)),
        )


def _clear_rows(t: Tensor, rows: Tensor) -> Tensor:
    """``t`` with ``rows`` zeroed; in place when no gradient is recorded, else out of place (autograd
    saved ``t`` for the attention)."""
    return t.index_fill(0, rows, 0.0) if torch.is_grad_enabled() else t.index_fill_(0, rows, 0.0)


# =============================================================================================
# Layout: where each token goes
# =============================================================================================


@dataclass(frozen=True)
class ChunkLayout:
    """The flat list of chunks a call computes (module docstring). Virtual rows ``0..B-1`` are the
    episodes the call continues, one per row; those that begin inside the call follow, row by row."""

    batch: int
    length: int  # L, steps of the call
    chunk_size: int  # K
    chunks: int  # chunks in all
    wave_starts: list[int]  # first chunk of each wave
    wave_sizes: list[int]  # chunks (= virtual rows) in each wave, non-increasing
    virtual_rows: int
    complete: Tensor  # [chunks]: the chunk's last slot is filled inside this call (always, non-causal)
    last_chunks: Tensor  # [B]: the chunk each row's last token is in
    end_fill: Tensor  # [B]: filled slots of that chunk (0: the call ended a chunk)
    # None for the plain reshape (each row one virtual row, chunk c of row b at position c * B + b):
    order: Tensor | None = None  # [virtual rows]: layout position (in a wave) -> virtual row
    token_slots: Tensor | None = None  # [B * L]: flat slot (chunk * K + slot) of each token
    first_chunks: Tensor | None = None  # [B]: each row's first chunk (it may continue a cached chunk)
    last_rows: Tensor | None = None  # [B]: layout position of each row's last virtual row

    def continued(self) -> ContinuedAt | None:
        """Where wave 0 (positions ``0..``) holds each row's first chunk."""
        if self.first_chunks is None:
            return None
        return ContinuedAt(self.first_chunks, torch.arange(self.batch, device=self.first_chunks.device))


class ChunkInputs(NamedTuple):
    tokens: Tensor  # [chunks, K, D], zeros in empty slots
    mask: Tensor  # [chunks, K]: slots holding a valid token


class ContinuedAt(NamedTuple):
    """Chunks of a batch that continue a row's cached chunk: their positions in the batch, and the rows."""

    chunks: Tensor
    rows: Tensor


def layout_chunks(batch: int, length: int, chunk_size: int, causal: bool, fill: Tensor | None = None,
                  done: Tensor | None = None, device=None) -> ChunkLayout:
    """The layout of a call: ``fill [B]`` the slots each row's chunk already holds (None: every row
    starts a chunk), ``done [B, L]`` the episode ends (causal only)."""
    starts = None  # [B, L]: True where a step begins a new episode inside the call
    if done is not None and length > 1:
        starts = F.pad(done[:, :-1], (1, 0))
        starts = starts if bool(starts.any()) else None
    if fill is None and starts is None:
        return _aligned_layout(batch, length, chunk_size, causal, device)
    return _episode_layout(batch, length, chunk_size, fill, starts, device)


def _aligned_layout(batch: int, n: int, K: int, causal: bool, device) -> ChunkLayout:
    """Every row starts a chunk at the call's first step and no episode ends inside the call."""
    count = -(-n // K)
    sizes = [batch] * count
    # A causal TLB leaves a partial last chunk for the next call; a non-causal one ends it here.
    ends = torch.full((batch,), n if causal else count * K, device=device)
    starts = _wave_starts(sizes)
    rows = torch.arange(batch, device=device)
    return ChunkLayout(
        batch=batch, length=n, chunk_size=K, chunks=count * batch, wave_starts=starts, wave_sizes=sizes,
        virtual_rows=batch, complete=_complete(sizes, starts, ends, K, device),
        last_chunks=starts[-1] + rows, end_fill=torch.full((batch,), n % K if causal else 0, device=device),
    )


def _episode_layout(batch: int, n: int, K: int, fill: Tensor | None, starts: Tensor | None, device) -> ChunkLayout:
    """Rows continuing a partial chunk (``fill``) and/or episodes beginning inside the call (``starts``):
    each token's virtual row, chunk and slot. Causal only."""
    t = torch.arange(n, device=device)
    rows = torch.arange(batch, device=device)
    offset = torch.zeros(batch, dtype=torch.long, device=device) if fill is None else fill
    if starts is None:
        virtual_row = rows[:, None].expand(batch, n)
        phase = offset[:, None] + t  # the token's slot count within its virtual row's chunks
        virtual = batch
    else:
        episode = starts.long().cumsum(1)  # 0: the episode the call continues
        begin = torch.where(starts, t, 0).cummax(1).values
        phase = torch.where(episode == 0, offset[:, None] + t, t - begin)
        new = episode[:, -1]
        before = new.cumsum(0) - new
        virtual_row = torch.where(episode == 0, rows[:, None], batch - 1 + before[:, None] + episode)
        virtual = batch + int(new.sum())
    ends = torch.zeros(virtual, dtype=torch.long, device=device)  # filled slots of each virtual row
    ends = ends.scatter_reduce(0, virtual_row.flatten(), (phase + 1).flatten(), "amax")
    count = (ends + K - 1) // K
    order = torch.argsort(count, descending=True, stable=True)
    rank = torch.empty_like(order)  # virtual row -> layout position
    rank[order] = torch.arange(virtual, device=device)
    count_sorted = count[order]
    sizes = (count_sorted[None, :] > torch.arange(int(count_sorted[0]), device=device)[:, None]).sum(1).tolist()
    wave_starts = _wave_starts(sizes)
    starts_t = torch.tensor(wave_starts, device=device)
    chunk = starts_t[phase // K] + rank[virtual_row]
    last = rank[virtual_row[:, -1]]
    end = ends[virtual_row[:, -1]]
    return ChunkLayout(
        batch=batch, length=n, chunk_size=K, chunks=sum(sizes), wave_starts=wave_starts, wave_sizes=sizes,
        virtual_rows=virtual, complete=_complete(sizes, wave_starts, ends[order], K, device),
        last_chunks=starts_t[(end - 1) // K] + last, end_fill=end % K, order=order,
        token_slots=(chunk * K + phase % K).flatten(), first_chunks=rank[:batch], last_rows=last,
    )


def _wave_starts(sizes: list[int]) -> list[int]:
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size)
    return starts


def _complete(sizes: list[int], starts: list[int], ends: Tensor, K: int, device) -> Tensor:
    """Per chunk, whether its last slot is filled (``ends``: filled slots of the virtual row at each
    layout position, chunks before included)."""
    wave = torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device))
    row = torch.arange(len(wave), device=device) - torch.tensor(starts, device=device)[wave]
    return ends[row] >= (wave + 1) * K


def layout_chunks_reference(batch: int, length: int, chunk_size: int, causal: bool, fill: Tensor | None = None,
                            done: Tensor | None = None) -> ChunkLayout:
    """The naive reference of ``layout_chunks``: a plain loop over rows and tokens. Always gives the
    explicit fields (``order``, ``token_slots``, ...), never the plain reshape."""
    K = chunk_size
    virtual_of, phase_of, ends, new_rows = {}, {}, [0] * batch, []
    for b in range(batch):
        virtual, phase = b, 0 if fill is None else int(fill[b])
        for t in range(length):
            if done is not None and t > 0 and bool(done[b, t - 1]):  # an episode begins: a new virtual row
                virtual, phase = batch + len(new_rows), 0
                new_rows.append(b)
                ends.append(0)
            virtual_of[b, t], phase_of[b, t] = virtual, phase
            ends[virtual] = phase + 1
            phase += 1
    if not causal:  # a non-causal call ends its last chunk
        ends = [-(-e // K) * K for e in ends]
    count = [-(-e // K) for e in ends]
    order = sorted(range(len(ends)), key=lambda v: -count[v])  # stable: longest first
    rank = {v: position for position, v in enumerate(order)}
    sizes = [sum(c > wave for c in count) for wave in range(max(count))]
    starts = _wave_starts(sizes)
    complete = [ends[order[p - starts[w]]] >= (w + 1) * K for w in range(len(sizes)) for p in
                range(starts[w], starts[w] + sizes[w])]
    token_slots = [(starts[phase_of[b, t] // K] + rank[virtual_of[b, t]]) * K + phase_of[b, t] % K
                   for b in range(batch) for t in range(length)]
    last = [virtual_of[b, length - 1] for b in range(batch)]
    long = dict(dtype=torch.long)
    return ChunkLayout(
        batch=batch, length=length, chunk_size=K, chunks=sum(sizes), wave_starts=starts, wave_sizes=sizes,
        virtual_rows=len(ends), complete=torch.tensor(complete),
        last_chunks=torch.tensor([starts[(ends[v] - 1) // K] + rank[v] for v in last], **long),
        end_fill=torch.tensor([ends[v] % K for v in last], **long), order=torch.tensor(order, **long),
        token_slots=torch.tensor(token_slots, **long), last_rows=torch.tensor([rank[v] for v in last], **long),
        first_chunks=torch.tensor([rank[b] for b in range(batch)], **long),
    )


def to_chunks(layout: ChunkLayout, x: Tensor, mask: Tensor | None) -> ChunkInputs:
    """``x [B, L, D]`` and ``mask [B, L]`` (None: all valid) laid out as chunks."""
    batch, n, D = x.shape
    K, total = layout.chunk_size, layout.chunks
    if layout.token_slots is None:
        h, m = split_chunks(x, K, mask)  # [B, C, K, D]
        return ChunkInputs(h.transpose(0, 1).reshape(total, K, D), m.transpose(0, 1).reshape(total, K))
    valid = torch.ones(batch, n, dtype=torch.bool, device=x.device) if mask is None else mask
    h = x.new_zeros(total * K, D).index_copy(0, layout.token_slots, x.reshape(-1, D)).view(total, K, D)
    m = torch.zeros(total * K, dtype=torch.bool, device=x.device)
    return ChunkInputs(h, m.index_copy(0, layout.token_slots, valid.flatten()).view(total, K))


def to_tokens(layout: ChunkLayout, outputs: Tensor) -> Tensor:
    """Per-chunk ``outputs [chunks, K, D]`` back at their tokens: ``[B, L, D]``."""
    batch, n, K, D = layout.batch, layout.length, layout.chunk_size, outputs.shape[-1]
    if layout.token_slots is None:
        return outputs.view(-1, batch, K, D).transpose(0, 1).reshape(batch, -1, D)[:, :n]
    return outputs.view(-1, D)[layout.token_slots].view(batch, n, D)


def virtual_row_states(layout: ChunkLayout, state: SlowState, initial: Tensor) -> SlowState:
    """The state of each virtual row in layout order: the call's rows continue ``state``; episodes that
    begin inside the call start from ``initial`` (``I_0``, ``[N, D]``) with no chunk counted."""
    if layout.order is None:
        return state
    extra = layout.virtual_rows - layout.batch
    if extra:
        state = SlowState(torch.cat([state.memory, initial.expand(extra, -1, -1)]),
                          torch.cat([state.chunks, state.chunks.new_zeros(extra)]))
    return state.take(layout.order)


def row_states(layout: ChunkLayout, state: SlowState) -> SlowState:
    """Each row's state after the call: that of its last virtual row."""
    return state if layout.last_rows is None else state.take(layout.last_rows)


# =============================================================================================
# Scan: the recurrence over chunks
# =============================================================================================


class Perceived(NamedTuple):
    """What the perceptual module returns for a batch of chunks."""

    outputs: Tensor  # [chunks, K, D]: H
    keys: list[Tensor]  # per self-attention layer it ran: [chunks, heads, K, head_dim]
    values: list[Tensor]


# perceive(h [c, K, D], key_mask [c, K] | None, memory [c, N, D], continued) -> Perceived
Perceive = Callable[[Tensor, Tensor | None, Tensor, ContinuedAt | None], Perceived]
# update(state of c rows, outputs [c, K, D], key_mask, updated [c]) -> the rows' new state
Update = Callable[[SlowState, Tensor, Tensor | None, Tensor], SlowState]


@dataclass(frozen=True)
class Scanned:
    outputs: Tensor  # [chunks, K, D], layout order
    state: SlowState  # per virtual row (layout order), after its last chunk
    pieces: list[Perceived]  # what ``perceive`` returned, in layout order

    def keys(self) -> list[Tensor]:
        """Per self-attention layer ``perceive`` ran, the keys of every chunk ``[chunks, ...]``."""
        return [torch.cat(layer) for layer in zip(*(piece.keys for piece in self.pieces), strict=True)]

    def values(self) -> list[Tensor]:
        return [torch.cat(layer) for layer in zip(*(piece.values for piece in self.pieces), strict=True)]


def scan_chunks(layout: ChunkLayout, h: Tensor, mask: Tensor, updated: Tensor, state: SlowState,
                perceive: Perceive, update: Update, impl: str = "waves") -> Scanned:
    """Run every chunk ``h [chunks, K, D]`` (``mask [chunks, K]``) through ``perceive``, which reads the
    state of its virtual row, then ``update`` that state with the chunks flagged ``updated [chunks]``.
    ``state``: per virtual row in layout order (``virtual_row_states``). ``perceive`` gets ``key_mask
    = None`` where every slot of its chunks is valid, and ``continued`` where its chunks include rows'
    first chunks (``ContinuedAt``). ``impl``: ``"waves"`` or ``"loop"`` (module docstring)."""
    if impl == "waves":
        return _scan_waves(layout, h, mask, updated, state, perceive, update)
    if impl == "loop":
        return _scan_loop(layout, h, mask, updated, state, perceive, update)
    raise ValueError(f"impl must be one of {SCAN_IMPLS}, got {impl!r}")


def _scan_waves(layout: ChunkLayout, h: Tensor, mask: Tensor, updated: Tensor, state: SlowState,
                perceive: Perceive, update: Update) -> Scanned:
    full = [count == size for count, size in zip(wave_counts(layout, mask.all(1)), layout.wave_sizes, strict=True)]
    updates = [count > 0 for count in wave_counts(layout, updated)]  # waves in which some chunk ends
    pieces = []
    for wave, (start, size) in enumerate(zip(layout.wave_starts, layout.wave_sizes, strict=True)):
        chunks = slice(start, start + size)
        key_mask = None if full[wave] else mask[chunks]
        rows = state.take(slice(None, size))  # the virtual rows of this wave come first (layout order)
        piece = perceive(h[chunks], key_mask, rows.memory, layout.continued() if wave == 0 else None)
        pieces.append(piece)
        if updates[wave]:
            new = update(rows, piece.outputs, key_mask, updated[chunks])
            state = new if size == len(state.chunks) else SlowState(
                torch.cat([new.memory, state.memory[size:]]), torch.cat([new.chunks, state.chunks[size:]]))
    return Scanned(torch.cat([piece.outputs for piece in pieces]), state, pieces)


def _scan_loop(layout: ChunkLayout, h: Tensor, mask: Tensor, updated: Tensor, state: SlowState,
               perceive: Perceive, update: Update) -> Scanned:
    """The naive reference: one chunk at a time, each virtual row's chunks in order, always masked."""
    pieces, finals = {}, []
    for row in range(layout.virtual_rows):  # by layout position
        rows = state.take(slice(row, row + 1))
        virtual = row if layout.order is None else int(layout.order[row])
        for wave, start in enumerate(layout.wave_starts):
            if layout.wave_sizes[wave] <= row:  # this virtual row has no more chunks
                break
            chunk = slice(start + row, start + row + 1)
            continued = None
            if wave == 0 and layout.first_chunks is not None and virtual < layout.batch:
                continued = ContinuedAt(torch.zeros(1, dtype=torch.long, device=h.device),
                                        torch.tensor([virtual], device=h.device))
            pieces[start + row] = piece = perceive(h[chunk], mask[chunk], rows.memory, continued)
            if bool(updated[start + row]):
                rows = update(rows, piece.outputs, mask[chunk], updated[chunk])
        finals.append(rows)
    ordered = [pieces[p] for p in range(layout.chunks)]
    state = SlowState(torch.cat([s.memory for s in finals]), torch.cat([s.chunks for s in finals]))
    return Scanned(torch.cat([piece.outputs for piece in ordered]), state, ordered)


def wave_counts(layout: ChunkLayout, flags: Tensor) -> list[int]:
    """Per wave, how many of its chunks have ``flags [chunks]`` set (one host synchronisation)."""
    total = torch.cat([flags.new_zeros(1, dtype=torch.long), flags.long().cumsum(0)])
    bounds = torch.tensor([*layout.wave_starts, layout.chunks], device=flags.device)
    return (total[bounds[1:]] - total[bounds[:-1]]).tolist()


# =============================================================================================
# Cache: the chunk a call ends in, and the chunk the next call continues
# =============================================================================================


def assemble_cache(layout: ChunkLayout, outputs: Tensor, mask: Tensor, keys: list[Tensor], values: list[Tensor],
                   memory_kv: KeysValues) -> ChunkCache:
    """The chunk each row ends in, cut out of the call's chunks (``outputs``, ``mask`` and, per
    self-attention layer, ``keys`` / ``values``, all in layout order), zero from ``end_fill`` on, with
    the keys/values of the rows' final state ``memory_kv``."""
    kept = torch.arange(layout.chunk_size, device=outputs.device) < layout.end_fill[:, None]  # [B, K]
    last = layout.last_chunks

    def keep(t: Tensor, where: Tensor) -> Tensor:
        return torch.where(where, t, t.new_zeros(()))

    return ChunkCache(
        fill=layout.end_fill,
        slot_valid=mask[last] & kept,
        outputs=keep(outputs[last], kept[..., None]),
        chunk_keys=tuple(keep(k[last], kept[:, None, :, None]) for k in keys),
        chunk_values=tuple(keep(v[last], kept[:, None, :, None]) for v in values),
        memory_keys=memory_kv.keys,
        memory_values=memory_kv.values,
    )


def assemble_cache_reference(layout: ChunkLayout, outputs: Tensor, mask: Tensor, keys: list[Tensor],
                             values: list[Tensor], memory_kv: KeysValues) -> ChunkCache:
    """The naive reference of ``assemble_cache``: a loop over rows, copying the filled slots."""
    B = layout.batch

    def cut(t: Tensor, slot_dim: int) -> Tensor:  # t [chunks, ...], its slots along slot_dim
        rows = []
        for b in range(B):
            chunk, filled = int(layout.last_chunks[b]), int(layout.end_fill[b])
            row = torch.zeros_like(t[chunk])
            index = [slice(None)] * row.dim()
            index[slot_dim - 1] = slice(0, filled)
            row[tuple(index)] = t[chunk][tuple(index)]
            rows.append(row)
        return torch.stack(rows)

    return ChunkCache(fill=layout.end_fill.clone(), slot_valid=cut(mask, 1), outputs=cut(outputs, 1),
                      chunk_keys=tuple(cut(k, 2) for k in keys), chunk_values=tuple(cut(v, 2) for v in values),
                      memory_keys=memory_kv.keys, memory_values=memory_kv.values)


@dataclass(frozen=True)
class ContinuedChunk:
    """Rows' first chunks in a call that continues chunks an earlier call began (``cache.fill > 0`` for
    some row): their first ``fill`` slots were computed then, so those slots' validity, keys and values
    (per self-attention layer) and outputs come from the cache, not from this call's empty slots."""

    cache: ChunkCache
    kept: Tensor  # [B, K]: the slots the earlier call filled

    @classmethod
    def of(cls, cache: ChunkCache | None, dtype) -> ContinuedChunk | None:
        """None unless some row is mid-chunk."""
        if cache is None or not bool(cache.fill.any()):
            return None
        slots = torch.arange(cache.slot_valid.shape[1], device=cache.fill.device)
        return cls(cache.to(dtype), slots < cache.fill[:, None])

    def mask(self, mask: Tensor, at: ContinuedAt) -> Tensor:
        return _take_cached(mask, self.cache.slot_valid, self.kept, at)

    def outputs(self, outputs: Tensor, at: ContinuedAt) -> Tensor:
        return _take_cached(outputs, self.cache.outputs, self.kept[..., None], at)

    def merge(self, at: ContinuedAt) -> Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]:
        """``merge(layer, k, v) -> (k, v)`` for the self-attention layers: cached slots put in."""
        kept = self.kept[:, None, :, None]

        def merge(layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            return (_take_cached(k, self.cache.chunk_keys[layer], kept, at),
                    _take_cached(v, self.cache.chunk_values[layer], kept, at))

        return merge


def _take_cached(t: Tensor, cached: Tensor, kept: Tensor, at: ContinuedAt) -> Tensor:
    """``t [chunks, ...]`` with the ``kept`` slots of chunks ``at.chunks`` taken from rows ``at.rows`` of
    ``cached [B, ...]`` (``kept [B, ...]`` broadcasts to a row of ``t``)."""
    return t.index_put((at.chunks,), torch.where(kept[at.rows], cached[at.rows], t[at.chunks]))
