"""The chunks an HTM call completes: built once from the steps it appends, then read and stored.

``chronomem.htm.HierarchicalMemory`` appends each step to the chunk being filled (``Accumulator``) and
commits a chunk when it holds ``C`` steps, or early at an episode end. ``HTMTransformer`` reads, at each
query of a call, the chunks committed before it: the stored ones and those the call itself completes.
This module builds those chunks and the mask of what each query may read:

* ``complete_chunks``: the chunks that complete when a block of steps is appended, with whole-chunk
  tensor ops (no loop over steps).
* ``append_step``: ``complete_chunks``'s accumulator for one step per row that completes no chunk (an agent's
  step, most of them), in a few ops.
* ``append_step_and_commit``: ``complete_chunks`` then ``commit_chunks`` for one step per row without an
  episode end, where a row's chunk may complete (an agent's step whose envs are out of phase): the full
  chunks committed as one column, without the stream of ``complete_chunks``.
* ``partial_chunk``: the chunk being filled, committed early at an episode end (empty slots masked).
* ``call_chunks``: every chunk a call commits, in commit order, with the step that commits it and that
  step's episode: ``complete_chunks`` without episode ends; with them, every step's offset in its
  episode's stream says whether a chunk (full, or partial at an end) ends there, all steps at once.
  ``call_chunks_reference`` is a plain loop over the steps of each row.
* ``commit_chunks``: the ring buffer after committing chunks in order (chunk number ``committed`` goes to
  slot ``committed % M``, evicting the oldest) as one indexed write per field (under ``torch.compile``,
  ``commit_chunks_select``: one select per chunk column); ``commit_chunks_reference`` puts them one by one.
  ``commit_column_`` writes one column into the ring buffer's own tensors (a donated state's).
* ``chunks_to_read``: the stored chunks and the call's new ones, with the per-query mask of the
  visibility rule (``chronomem.htm``'s module docstring). ``chunks_to_read_reference`` replays the ring
  buffer for each query.

``tests/test_ops_htm_chunks.py`` checks each against its reference (values, and gradients into the steps).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from chronomem.layers import any_or_compiling
from chronomem.ops.htm_local import Episodes


class Accumulator(NamedTuple):
    """The chunk being filled: ``accumulator [B, C, D]`` of which ``fill [B]`` steps are used, the first
    ``carried [B]`` of them carried over by chunk overlap (already in memory)."""

    accumulator: Tensor
    fill: Tensor
    carried: Tensor

    def cleared(self, rows: Tensor) -> Accumulator:
        """Empty for the rows in ``rows [B]``: an episode ended there. Selects, so a NaN row comes back clean."""
        return Accumulator(torch.where(rows[:, None, None], 0.0, self.accumulator),
                           torch.where(rows, 0, self.fill), torch.where(rows, 0, self.carried))


class RingBuffer(NamedTuple):
    """The stored chunks of a ``chronomem.htm.HierarchicalMemory`` (its ``ring``): ``keys [B, M, D]``,
    ``contents [B, M, C, D]``, ``slot_valid [B, M, C]``, ``valid [B, M]``, ``chunk_id [B, M]`` (each slot's
    chunk number) and ``committed [B]`` (chunks committed so far; the next goes to slot ``committed % M``)."""

    keys: Tensor
    contents: Tensor
    slot_valid: Tensor
    valid: Tensor
    chunk_id: Tensor
    committed: Tensor


class NewChunks(NamedTuple):
    """Chunks committed by a call, ``K`` per row in commit order: ``keys [B, K, D]`` (the mean of the
    stored steps), ``contents [B, K, C, D]``, ``slots [B, K, C]`` (which slots hold a step), ``valid
    [B, K]`` (which are real chunks), ``end [B, K]`` (the call index of the step that commits each) and
    ``episode [B, K]`` (that step's episode, ``Episodes`` numbering; None in a call without episode ends)."""

    keys: Tensor
    contents: Tensor
    slots: Tensor
    valid: Tensor
    end: Tensor | None = None
    episode: Tensor | None = None


class ReadChunks(NamedTuple):
    """What the queries of a call read: ``keys [B, M', D]``, ``contents [B, M', C, D]``, ``slot_valid
    [B, M', C]`` and ``valid [B, M']`` of the stored chunks then the call's new ones, and ``mask
    [B, N, M']``, the chunks each query may read (None: every valid chunk)."""

    keys: Tensor
    contents: Tensor
    slot_valid: Tensor
    valid: Tensor
    mask: Tensor | None

    def tail(self, n: int) -> ReadChunks:
        """What the last ``n`` queries read."""
        return self if self.mask is None else self._replace(mask=self.mask[:, -n:])


# =============================================================================================
# Building the chunks
# =============================================================================================


def complete_chunks(acc: Accumulator, x: Tensor, lengths: Tensor, overlap: int,
                    detach: bool = True) -> tuple[NewChunks, Accumulator]:
    """The chunks that complete when the first ``lengths[b]`` steps of ``x [B, N, D]`` are appended to
    ``acc``, and the accumulator after.

    The stream of row b is ``accumulator[b, :fill[b]]`` followed by ``x[b, :lengths[b]]``; chunk i
    covers stream steps ``[i*s, i*s + C)`` with stride ``s = C - overlap``. ``detach=False`` keeps the
    graph (``HTMTransformer(memory_gradient=True)``).
    """
    B, N, D = x.shape
    C = acc.accumulator.shape[1]
    s = C - overlap
    if detach:
        x = x.detach()  # Section 2: stop gradients flowing into the memory
    fill = acc.fill
    total = fill + lengths  # [B] stream length per row
    count = torch.where(total >= C, torch.div(total - C, s, rounding_mode="floor") + 1, 0)  # [B]
    if torch.compiler.is_compiling():  # a graph has static shapes: the most chunks N steps can complete
        k_max = (N - 1) // s + 1 if B and N else 0  # (every fill < C on entry), the rest of them invalid
    else:
        k_max = int(count.max()) if B else 0
    j = torch.arange(C, device=x.device)[None, :]
    if k_max == 0:  # no chunk completes (most steps of an agent): the steps only join the accumulator
        if N == 1:  # any slot index reads the one step
            steps = x.expand(B, C, D)
        else:
            steps = x.gather(1, (j - fill[:, None]).clamp(0, N - 1)[..., None].expand(B, C, D))
        new_slot = ((j >= fill[:, None]) & (j < total[:, None]))[..., None]
        accumulator = torch.where(new_slot, steps, acc.accumulator * (j < fill[:, None])[..., None])
        valid = x.new_zeros(B, 0, dtype=torch.bool)
        new = NewChunks(x.new_zeros(B, 0, D), x.new_zeros(B, 0, C, D), valid[..., None].expand(B, 0, C), valid,
                        end=x.new_zeros(B, 0, dtype=torch.long))
        return new, Accumulator(accumulator, total, torch.minimum(acc.carried, total))
    # Stream [B, C + N, D]: accumulator steps then the new steps, zeros past the end.
    p = torch.arange(C + N, device=x.device)[None, :]
    src = torch.cat([acc.accumulator, x, x.new_zeros(B, 1, D)], dim=1)
    idx = torch.where(p < fill[:, None], p, C + p - fill[:, None])
    idx = torch.where(p < total[:, None], idx, C + N)  # past the end -> the zero row
    stream = src.gather(1, idx[..., None].expand(B, C + N, D))
    # chunk i = stream[i*s : i*s + C]
    contents = stream[:, : (k_max - 1) * s + C].unfold(1, C, s)[:, :k_max].permute(0, 1, 3, 2)
    i = torch.arange(k_max, device=x.device)[None, :]
    valid = i < count[:, None]  # [B, K]
    contents = contents * valid[..., None, None].to(contents.dtype)
    keys = contents.mean(2)  # Section 2: the summary is the average over the (full) chunk
    end = i * s + C - 1 - fill[:, None]  # the call index of each chunk's last step (the one committing it)
    start = count * s  # where the next accumulator begins in the stream
    new_fill = total - start
    acc_idx = (start[:, None] + j).clamp(max=C + N - 1)
    accumulator = stream.gather(1, acc_idx[..., None].expand(B, C, D))
    accumulator = accumulator * (j < new_fill[:, None])[..., None].to(x.dtype)
    carried = torch.where(count > 0, torch.full_like(count, overlap), acc.carried)
    carried = torch.minimum(carried, new_fill)
    new = NewChunks(keys, contents, valid[..., None].expand(-1, -1, C), valid, end=end)
    return new, Accumulator(accumulator, new_fill, carried)


def append_step(acc: Accumulator, x: Tensor) -> Accumulator:
    """The accumulator after appending one step per row, ``x [B, 1, D]`` (detached), when no row's chunk
    completes (every ``fill < C - 1``): ``complete_chunks(acc, x, ones, overlap)``'s, written as one
    select into slot ``fill``. The slots past ``fill`` hold zeros already (every write leaves them so)
    and ``carried <= fill`` stays."""
    slot = torch.arange(acc.accumulator.shape[1], device=x.device) == acc.fill[:, None]  # [B, C]
    return Accumulator(torch.where(slot[..., None], x.detach(), acc.accumulator), acc.fill + 1, acc.carried)


def append_step_and_commit(acc: Accumulator, memory: RingBuffer, x: Tensor, overlap: int,
                           in_place: bool = False) -> tuple[Accumulator, RingBuffer]:
    """The accumulator and ring buffer after appending one step per row, ``x [B, 1, D]`` (detached), where
    any row's chunk may complete (``fill == C - 1``; an agent's step whose envs are out of phase, or any
    compiled one): ``complete_chunks`` then ``commit_chunks`` for one step, without the stream a call of
    many steps builds. A step completes at most one chunk per row: its accumulator with the step in slot
    ``fill``, committed whole (every slot valid, its key the mean) as one column; where it completes, the
    accumulator keeps its last ``overlap`` steps (carried). ``in_place``: the column is written into
    ``memory``'s tensors (``commit_column_``), which then hold the returned ring buffer."""
    C = acc.accumulator.shape[1]
    x = x.detach()  # Section 2: stop gradients flowing into the memory
    slots = torch.arange(C, device=x.device)
    chunk = torch.where((slots == acc.fill[:, None])[..., None], x, acc.accumulator)  # [B, C, D]
    completes = acc.fill == C - 1  # [B]
    column = NewChunks(chunk.mean(1)[:, None], chunk[:, None], completes[:, None, None].expand(-1, 1, C),
                       completes[:, None])
    # The next chunk begins with the completed one's last `overlap` steps (App. A), already in memory.
    carried_over = chunk.roll(overlap - C, 1) * (slots < overlap)[:, None].to(chunk.dtype) if overlap else 0.0
    filled = Accumulator(torch.where(completes[:, None, None], carried_over, chunk),
                         torch.where(completes, overlap, acc.fill + 1),
                         torch.where(completes, overlap, acc.carried))
    return filled, commit_column_(memory, column) if in_place else commit_chunks(memory, column)


def partial_chunk(acc: Accumulator, done: Tensor) -> NewChunks:
    """The chunk being filled of the rows in ``done [B]`` as one chunk per row, committed at an episode
    end: its empty slots masked, its key the mean of the stored steps, ``valid`` where it holds a step
    not yet in memory."""
    C = acc.accumulator.shape[1]
    slots = torch.arange(C, device=done.device)[None, :] < acc.fill[:, None]  # [B, C]
    w = slots.to(acc.accumulator.dtype)[..., None]
    key = (acc.accumulator * w).sum(1) / w.sum(1).clamp_min(1.0)  # mean of the stored steps
    fresh = done & (acc.fill > acc.carried)
    return NewChunks(key[:, None], (acc.accumulator * w)[:, None], slots[:, None], fresh[:, None])


def call_chunks(acc: Accumulator, x: Tensor, lengths: Tensor, overlap: int, episodes: Episodes | None = None,
                detach: bool = True) -> tuple[NewChunks, Accumulator]:
    """Every chunk a call commits when it appends the first ``lengths[b]`` steps of ``x [B, N, D]`` to
    ``acc``, in commit order, each built once, and the accumulator after the call.

    Without episode ends this is ``complete_chunks``. With ``episodes`` (episode ends inside the call),
    each row's stream restarts after each end: at an end the partial chunk is committed (when it holds
    a step not yet in memory) and the accumulator emptied, as ``HierarchicalMemory.end_episode`` does.
    Every step then commits at most one chunk (a full one, or the partial one at an end), so the chunks
    are found step by step with whole-call tensor ops, no loop: each step's offset in its episode's
    stream (the first episode's stream begins with the accumulator) says whether a chunk ends there, and
    where it begins. Each row's chunks are then moved to the front, in commit order; there are as many
    columns as the row with the most chunks needs. With ``detach=False`` every chunk and the accumulator
    keep the graph of the steps (and incoming accumulator) they hold.
    """
    if episodes is None:
        return complete_chunks(acc, x, lengths, overlap, detach)
    if detach:
        x = x.detach()  # Section 2: stop gradients flowing into the memory
    B, N, D = x.shape
    C = acc.accumulator.shape[1]
    s = C - overlap
    done = episodes.done
    t = torch.arange(N, device=x.device)[None, :]
    # Each step's episode stream: it begins after the last end before the step (a), and in the call's
    # first episode with the accumulator's f0 = fill steps; u = the step's offset in it.
    last_end = torch.where(done, t, -1).cummax(1).values
    first = torch.cat([last_end.new_full((B, 1), -1), last_end[:, :-1]], 1) < 0  # in the first episode
    a = torch.cat([last_end.new_zeros(B, 1), last_end[:, :-1] + 1], 1)
    f0 = torch.where(first, acc.fill[:, None], 0)
    u = f0 + t - a
    full_so_far = torch.where(u + 1 >= C, torch.div(u + 1 - C, s, rounding_mode="floor") + 1, 0)
    carried = torch.where(full_so_far > 0, overlap, torch.where(first, acc.carried[:, None], 0))
    real = t < lengths[:, None]
    full = real & (u + 1 >= C) & ((u + 1 - C) % s == 0)  # chunk i = stream [i*s, i*s + C) ends here
    partial_start = full_so_far * s
    partial = done & (u + 1 - partial_start > carried) & ~full  # the episode ends with fresh steps
    commits = full | partial
    chunk_start = torch.where(full, u + 1 - C, partial_start)
    chunk_length = torch.where(full, C, u + 1 - partial_start)

    source = torch.cat([acc.accumulator, x, x.new_zeros(B, 1, D)], 1)  # the zero row: empty slots

    def stream_index(offset: Tensor, first: Tensor, a: Tensor, f0: Tensor, used: Tensor) -> Tensor:
        """Index into ``source`` of stream offsets ``offset``: the accumulator's steps, then the call's."""
        index = torch.where(first & (offset < f0), offset, C + a + offset - f0)
        return torch.where(used, index, C + N)

    # The chunks, each row's first, in commit order (a stable sort keeps the steps' order).
    # (under torch.compile every step's column, the non-committing ones invalid: a graph has static shapes)
    most = N if torch.compiler.is_compiling() else int(commits.sum(1).max())
    order = torch.sort((~commits).to(torch.uint8), dim=1, stable=True).indices[:, :most]
    valid, length = commits.gather(1, order), chunk_length.gather(1, order)
    j = torch.arange(C, device=x.device)
    slots = valid[..., None] & (j < length[..., None])  # [B, K, C]
    index = stream_index(chunk_start.gather(1, order)[..., None] + j, first.gather(1, order)[..., None],
                         a.gather(1, order)[..., None], f0.gather(1, order)[..., None], slots)
    K = order.shape[1]
    contents = source.gather(1, index.view(B, K * C, 1).expand(B, K * C, D)).view(B, K, C, D)
    keys = contents.sum(2) / length.clamp_min(1)[..., None].to(contents.dtype)  # the mean of the stored steps
    new = NewChunks(keys, contents, slots, valid, order, episodes.in_call.gather(1, order))

    # The accumulator after: what the last real step's episode has not committed (nothing if it ended).
    last = (lengths - 1).clamp_min(0)[:, None]
    ended = done.gather(1, last)[:, 0] | (lengths == 0)
    fill = torch.where(ended, 0, (u + 1 - full_so_far * s).gather(1, last)[:, 0])
    kept = j[None, :] < fill[:, None]
    index = stream_index((full_so_far * s).gather(1, last) + j, first.gather(1, last), a.gather(1, last),
                         f0.gather(1, last), kept)
    accumulator = source.gather(1, index[..., None].expand(B, C, D))
    filled = Accumulator(accumulator, fill, torch.where(ended, 0, torch.minimum(carried.gather(1, last)[:, 0], fill)))
    empty = lengths == 0  # no step appended: the accumulator as it was
    if any_or_compiling(empty):
        filled = Accumulator(torch.where(empty[:, None, None], acc.accumulator, filled.accumulator),
                             torch.where(empty, acc.fill, filled.fill), torch.where(empty, acc.carried, filled.carried))
    return new, filled


def call_chunks_reference(acc: Accumulator, x: Tensor, lengths: Tensor, overlap: int,
                          done: Tensor | None = None) -> tuple[list[list[dict]], list[dict]]:
    """The naive reference of ``call_chunks``: per row, a loop over the steps, appended to a list; a
    chunk is committed when it holds ``C`` steps (keeping the last ``overlap`` for the next) and at an
    episode end (``done [B, N]``) when it holds a step not yet in memory. Returns, per row, the committed
    chunks in order (``contents [C, D]`` with empty slots zero, ``slots [C]``, ``key [D]``, ``end``,
    ``episode``) and the accumulator after (``steps [fill, D]``, ``carried``)."""
    B, N, D = x.shape
    C = acc.accumulator.shape[1]

    def chunk(steps: list[Tensor], end: int, episode: int) -> dict:
        stacked = torch.stack(steps)
        contents = torch.cat([stacked, stacked.new_zeros(C - len(steps), D)])
        return {"contents": contents, "slots": torch.arange(C) < len(steps), "key": stacked.mean(0),
                "end": end, "episode": episode}

    chunks, after = [], []
    for b in range(B):
        steps = list(acc.accumulator[b, : int(acc.fill[b])])
        carried, episode, row = int(acc.carried[b]), 0, []
        for t in range(int(lengths[b])):
            steps.append(x[b, t])
            if len(steps) == C:
                row.append(chunk(steps, t, episode))
                steps, carried = steps[C - overlap :], overlap
            if done is not None and done[b, t]:
                if len(steps) > carried:
                    row.append(chunk(steps, t, episode))
                steps, carried, episode = [], 0, episode + 1
        chunks.append(row)
        after.append({"steps": torch.stack(steps) if steps else x.new_zeros(0, D), "carried": carried})
    return chunks, after


# =============================================================================================
# Committing them into the ring buffer
# =============================================================================================


def commit_chunks(memory: RingBuffer, chunks: NewChunks) -> RingBuffer:
    """The ring buffer ``memory`` after the valid ``chunks`` (``keys``, ``contents``, ``slots``, ``valid``;
    in commit order) are put into it."""
    M = memory.valid.shape[1]
    if chunks.valid.shape[1] == 0:
        return memory
    if torch.compiler.is_compiling():  # the indexed write's shape depends on values: selects instead
        return commit_chunks_select(memory, chunks)
    valid = chunks.valid
    count = valid.sum(1)  # [B]
    i = valid.long().cumsum(1) - 1  # commit rank of each valid chunk
    # Only the newest M of this call's chunks survive; the rest would be evicted at once.
    keep = valid & (i >= count[:, None] - M)
    ids = memory.committed[:, None] + i
    # The kept chunks of a row go to distinct slots (at most M of them, consecutive ids mod M), so one
    # indexed write per field puts them all. The fields stay contiguous: the read gathers chunk rows from
    # a [B * M, C, D] view of them at every step, which would otherwise copy the whole memory each time.
    rows, j = keep.nonzero(as_tuple=True)
    slot = ids[rows, j] % M

    def put(old: Tensor, new: Tensor) -> Tensor:
        out = old.clone()
        out[rows, slot] = new[rows, j].to(old.dtype)
        return out

    return RingBuffer(put(memory.keys, chunks.keys), put(memory.contents, chunks.contents),
                      put(memory.slot_valid, chunks.slots), put(memory.valid, keep), put(memory.chunk_id, ids),
                      memory.committed + count)


def commit_chunks_select(memory: RingBuffer, chunks: NewChunks) -> RingBuffer:
    """``commit_chunks`` without a shape that depends on values (what ``torch.compile`` runs): each column
    of ``chunks`` in turn is selected into slot ``committed % M`` of the rows where it is valid. Every
    column rewrites the whole ring, so it suits the few columns of an acting step (one)."""
    keys, contents, slot_valid, valid, chunk_id, committed = memory
    slots = torch.arange(valid.shape[1], device=valid.device)
    for j in range(chunks.valid.shape[1]):
        at = (slots == (committed % valid.shape[1])[:, None]) & chunks.valid[:, j, None]  # [B, M]: column j's slot
        keys = torch.where(at[..., None], chunks.keys[:, j, None].to(keys.dtype), keys)
        contents = torch.where(at[..., None, None], chunks.contents[:, j, None].to(contents.dtype), contents)
        slot_valid = torch.where(at[..., None], chunks.slots[:, j, None], slot_valid)
        valid = valid | at
        chunk_id = torch.where(at, committed[:, None], chunk_id)
        committed = committed + chunks.valid[:, j]
    return RingBuffer(keys, contents, slot_valid, valid, chunk_id, committed)


def commit_column_(memory: RingBuffer, column: NewChunks) -> RingBuffer:
    """``commit_chunks`` of one column of chunks (an acting step's, ``append_step_and_commit``) written into
    ``memory``'s tensors in place: each row's slot ``committed % M`` is read, selected with the row's chunk
    where it is valid, and written back, a chunk per row and field instead of a new ring buffer (``memory``
    must be donated: ``layers.state_donated``). Returns the ring buffer, its tensors ``memory``'s but
    ``committed``. No shape depends on values, so it compiles as it runs eagerly."""
    B, M = memory.valid.shape
    rows, slot = torch.arange(B, device=memory.valid.device), memory.committed % M
    valid = column.valid[:, 0]

    def put_(stored: Tensor, new: Tensor) -> None:
        kept = stored[rows, slot]
        stored[rows, slot] = torch.where(valid.view(B, *[1] * (kept.dim() - 1)), new.to(stored.dtype), kept)

    put_(memory.keys, column.keys[:, 0])
    put_(memory.contents, column.contents[:, 0])
    put_(memory.slot_valid, column.slots[:, 0])
    put_(memory.valid, valid)
    put_(memory.chunk_id, memory.committed)
    return memory._replace(committed=memory.committed + valid)


def commit_chunks_reference(memory: RingBuffer, chunks: NewChunks) -> RingBuffer:
    """The naive reference of ``commit_chunks``: the valid chunks put one by one, chunk number
    ``committed`` into slot ``committed % M``."""
    fields = {name: t.clone() for name, t in memory._asdict().items()}
    B, M = memory.valid.shape
    for b in range(B):
        for j in range(chunks.valid.shape[1]):
            if not chunks.valid[b, j]:
                continue
            n = int(fields["committed"][b])
            slot = n % M
            fields["keys"][b, slot] = chunks.keys[b, j]
            fields["contents"][b, slot] = chunks.contents[b, j]
            fields["slot_valid"][b, slot] = chunks.slots[b, j]
            fields["valid"][b, slot] = True
            fields["chunk_id"][b, slot] = n
            fields["committed"][b] = n + 1
    return RingBuffer(**fields)


# =============================================================================================
# What each query may read
# =============================================================================================


def chunks_to_read(memory: RingBuffer, new: NewChunks, n: int, episodes: Episodes | None = None,
                   keep_across_episodes: bool = False) -> ReadChunks:
    """The stored chunks (``memory``, the ring buffer before the call) and the ``new`` chunks its call of
    ``n`` steps commits (``call_chunks``), with the per-query visibility mask: a chunk committed before the
    query (its last step earlier), among the newest ``M`` (the ring buffer at the query's time), and,
    unless ``keep_across_episodes``, of the query's episode (stored chunks belong to episode 0)."""
    M, device, dtype = memory.valid.shape[1], memory.keys.device, memory.keys.dtype
    if episodes is None and new.valid.shape[1] == 0:
        # Nothing committed in the call (an agent's step, mostly): the stored chunks are the ring
        # buffer at every query's time, so validity alone is the mask.
        return ReadChunks(memory.keys, memory.contents, memory.slot_valid, memory.valid, None)
    query = torch.arange(n, device=device)[None, :, None]  # query index in the call
    # Chunks committed before the query: the stored ones plus new chunks whose last step is earlier.
    new_seen = new.valid[:, None, :] & (new.end[:, None, :] < query)  # [B, n, K]
    before = memory.committed[:, None] + new_seen.sum(-1)  # [B, n]
    oldest = (before - M)[..., None]  # the ring buffer holds chunk ids >= before - M
    old_seen = memory.valid[:, None, :] & (memory.chunk_id[:, None, :] >= oldest)
    counted = new.valid.long()
    new_ids = memory.committed[:, None] + counted.cumsum(1) - counted  # commit order of the valid ones
    new_seen = new_seen & (new_ids[:, None, :] >= oldest)
    if episodes is not None and not keep_across_episodes:  # the memory was cleared at each end
        episode = episodes.in_call
        old_seen = old_seen & (episode == 0)[..., None]
        new_seen = new_seen & (new.episode[:, None, :] == episode[..., None])
    return ReadChunks(
        torch.cat([memory.keys, new.keys.to(dtype)], 1),
        torch.cat([memory.contents, new.contents.to(dtype)], 1),
        torch.cat([memory.slot_valid, new.slots], 1),
        torch.cat([memory.valid, new.valid], 1),
        torch.cat([old_seen, new_seen], -1),
    )


def chunks_to_read_reference(memory: RingBuffer, new: NewChunks, n: int, episodes: Episodes | None = None,
                             keep_across_episodes: bool = False) -> Tensor:
    """The naive reference of ``chunks_to_read``'s mask ``[B, n, M + K]``: for each query, replay the
    ring buffer: the stored chunks oldest first, then the call's chunks committed before the query,
    keeping the newest ``M``, emptied at each episode end unless ``keep_across_episodes``."""
    B, M = memory.valid.shape
    K = new.valid.shape[1]
    keep = keep_across_episodes
    mask = torch.zeros(B, n, M + K, dtype=torch.bool)
    for b in range(B):
        stored = [m for _, m in sorted((int(memory.chunk_id[b, m]), m) for m in range(M) if memory.valid[b, m])]
        for q in range(n):
            buffer, episode = list(stored), 0
            for j in range(K):  # the call's chunks, in commit order
                if not new.valid[b, j] or int(new.end[b, j]) >= q:
                    continue
                chunk_episode = 0 if new.episode is None else int(new.episode[b, j])
                if not keep and chunk_episode != episode:  # cleared at the episode end
                    buffer, episode = [], chunk_episode
                buffer = (buffer + [M + j])[-M:]
            if not keep and episodes is not None and int(episodes.in_call[b, q]) != episode:
                buffer = []  # the query's episode has committed nothing yet
            mask[b, q, buffer] = True
    return mask
