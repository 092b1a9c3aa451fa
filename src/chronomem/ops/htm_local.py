"""The steps of one HTM call: which are valid, which episode each belongs to, what each query's local
attention reads, and what the cache keeps.

``chronomem.htm.HTMTransformer`` runs each layer of a call over a context of ``L`` cached layer inputs
followed by the call's ``N`` steps. This module turns the visibility rule of ``chronomem.htm``'s module
docstring into indices and masks, once per call:

* ``prefix_lengths``: the valid steps of each row (a mask must mark a prefix).
* ``Episodes`` (``call_episodes``): the episode ends inside a call, numbered once: the episode of every
  context step, its time since its episode began, and the episode running at the call's end. The local
  layout, the memory's chunks and the state after the call all read this one numbering.
  ``episodes_reference`` numbers the steps with a plain loop.
* ``LocalLayout`` (``local_layout``): the local attention as blocks of queries and the keys they read,
  with a mask. A call longer than a window is cut into blocks of W queries: its windows (W + E keys
  each) when every row is at the same offset in its window and no episode ends in the call, else
  blocks on the call's grid (2W - 1 + E keys each); O(N * W) scores either way. A shorter call is one
  block of every query and every key. ``step_layout`` is the one-step call's layout (an agent acting), built
  directly. ``local_layout_reference`` is the rule itself as a dense mask, a loop over queries and keys,
  and ``local_attention_reference`` the attention under it.
* ``last_steps``: the cache a call leaves, the last ``L`` valid steps of each row; ``last_steps_reference``.

``tests/test_ops_htm_local.py`` checks each against its reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from chronomem.checks import check_mask
from chronomem.layers import any_or_compiling


def prefix_lengths(mask: Tensor | None, batch: int, n: int, device) -> Tensor:
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
# Episode numbering
# =============================================================================================


@dataclass(frozen=True)
class Episodes:
    """Episode ends inside one call: ``done [B, N]`` (valid steps only); per context step (the ``L``
    cached steps, then the call's ``N``) ``episode [B, L + N]``, the number of episode ends before the
    step (the cache and the episode running when the call starts are episode 0), and ``position
    [B, L + N]``, the step's time since its episode began (negative for cache slots from before it);
    ``last [B]``, the episode running at the call's end (the number of ends in the call)."""

    done: Tensor
    episode: Tensor
    position: Tensor
    last: Tensor

    @classmethod
    def of(cls, done: Tensor, position: Tensor, cache: int) -> Episodes:
        """From ``done [B, N]`` (valid steps only) and the state's ``position [B]`` at the call's start."""
        B, N = done.shape
        t = torch.arange(N, device=done.device)[None, :]
        d = done.long()
        episode = d.cumsum(1) - d
        last_end = torch.where(done, t, -1).cummax(1).values  # the last episode end at or before t
        previous = torch.cat([last_end.new_full((B, 1), -1), last_end[:, :-1]], 1)  # strictly before t
        steps = torch.where(previous < 0, position[:, None] + t, t - previous - 1)
        cached = position[:, None] + torch.arange(-cache, 0, device=done.device)[None, :]
        return cls(done, torch.cat([torch.zeros_like(cached), episode], 1), torch.cat([cached, steps], 1),
                   d.sum(1))

    @property
    def in_call(self) -> Tensor:
        """``episode`` of the call's own steps, ``[B, N]``."""
        return self.episode[:, self.episode.shape[1] - self.done.shape[1] :]

    def tail(self, n: int) -> Episodes:
        """The last ``n`` steps alone (a model without cache that runs only its last steps)."""
        return Episodes(self.done[:, -n:], self.episode[:, -n:], self.position[:, -n:], self.last)

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
        slot = lengths[:, None] + torch.arange(cache, device=lengths.device)[None, :]  # as last_steps
        keep = (self.episode.gather(1, slot) == self.last[:, None])[..., None]
        return position, [torch.where(keep, c, 0.0) for c in caches]


def call_episodes(done: Tensor | None, lengths: Tensor, position: Tensor, cache: int) -> Episodes | None:
    """The ``Episodes`` of a call with ``done [B, N]`` (checked), ``lengths [B]`` valid steps, ``position
    [B]`` at its start and ``cache`` cached steps; a done at a padded step is ignored. None when no
    valid step ends an episode (the common case: nothing to number; under ``torch.compile`` numbered anyway)."""
    if done is None:
        return None
    done = done & (torch.arange(done.shape[1], device=done.device)[None, :] < lengths[:, None])
    if not any_or_compiling(done):
        return None
    return Episodes.of(done, position, cache)


def episodes_reference(done: Tensor, position: Tensor, cache: int, lengths: Tensor) -> dict[str, Tensor]:
    """The naive reference of ``Episodes`` (a loop over the steps of each row): ``episode``, ``position``
    and ``last`` as in ``Episodes.of``, and what ``Episodes.after`` gives: ``position_after [B]`` and
    ``cache_kept [B, L]`` (which slots of the cache after the call belong to the running episode)."""
    B, N = done.shape
    episode = torch.zeros(B, cache + N, dtype=torch.long)
    steps = torch.zeros(B, cache + N, dtype=torch.long)
    last = torch.zeros(B, dtype=torch.long)
    position_after = torch.zeros(B, dtype=torch.long)
    for b in range(B):
        ends, time = 0, int(position[b])
        for s in range(cache):  # the cached steps: before the call, episode 0
            steps[b, s] = time - cache + s
        for t in range(N):
            episode[b, cache + t], steps[b, cache + t] = ends, time
            time += 1
            if t < int(lengths[b]):
                position_after[b] = time
            if done[b, t]:
                ends, time = ends + 1, 0
                position_after[b] = 0
        last[b] = ends
    # the cache after the call holds context steps lengths .. lengths + L - 1 (as last_steps)
    kept = torch.stack([episode[b, int(lengths[b]) : int(lengths[b]) + cache] == last[b] for b in range(B)])
    return {"episode": episode, "position": steps, "last": last, "position_after": position_after,
            "cache_kept": kept}


# =============================================================================================
# Local attention: blocks of queries and the keys they read
# =============================================================================================


@dataclass(frozen=True)
class LocalLayout:
    """The local attention of one call as ``G`` blocks: block g's queries are the context steps
    ``queries[g] [Wq]`` and it reads the context steps ``keys[g] [Wk]`` (its queries are its last
    ``Wq`` keys); ``mask [B, G, Wq, Wk]`` applies the visibility rule. Block outputs, flattened, hold
    the call's queries in order from index ``offset`` on (earlier and later slots are padding)."""

    offset: int
    queries: Tensor
    keys: Tensor
    mask: Tensor

    def attend(self, attention, queries: Tensor, keys_values: Tensor) -> Tensor:
        """``attention.forward_projected(queries, keys_values, attn_mask=)`` (causality in the mask) of the
        call's ``n`` normed steps ``queries [B, n, D]`` over the keys and values of the context
        (``attention.keys_values`` of the normed context, ``[B, L + n, 2 D]``: projected once per call or
        cached, never per block), block by block -> ``[B, n, D]``."""
        B, n, D = queries.shape
        G, Wq = self.queries.shape
        if G == 1:  # one block: every context step is a key, the last Wq are the queries
            queries = queries[:, n - Wq :]
        else:  # each block's queries are its last keys, consecutive steps (context index - L: call index)
            cache = keys_values.shape[1] - n
            queries = queries[:, self.queries.flatten() - cache].view(B * G, Wq, D)
            keys_values = keys_values[:, self.keys.flatten()].view(B * G, -1, keys_values.shape[-1])
        read = attention.forward_projected(queries, keys_values, attn_mask=self.mask.flatten(0, 1)[:, None])
        return read.view(B, G * Wq, D)[:, self.offset : self.offset + n]


def local_layout(position: Tensor, lengths: Tensor, n: int, *, window: int, extra_length: int, cache: int,
                 episodes: Episodes | None = None) -> LocalLayout:
    """Which context steps each query's local attention reads: query t sees step s iff
    ``floor(t/W)*W - E <= s <= t`` (steps counted from the episode's start), s is a real step and of
    the query's episode. The context is ``cache`` steps and then the ``n`` queries, the first at
    ``position [B]``, ``lengths [B]`` of them valid; ``episodes`` (with episode ends inside the call)
    gives the position and the episode of every context step instead.

    A call longer than a window is cut into blocks of W consecutive queries. When every row is at the
    same offset in its window and no episode ends inside the call, the blocks are the windows and each
    reads only its W + E keys. Otherwise (rows at different offsets, episode ends, which restart a
    row's windows) block j holds the queries at call indices ``[j*W, (j+1)*W)`` and reads the ``W - 1 +
    E`` steps before them too, the most any of them may see (``floor(t/W)*W - E >= t - (W - 1) - E``):
    ``2W - 1 + E`` keys, the rule in the mask. A call of at most W steps is one block of every query and
    every key ([n, cache + n]).
    """
    W, E, L, device = window, extra_length, cache, position.device
    offset = position % W
    if episodes is None and n > W and bool((offset == offset[0]).all()):
        o = int(offset[0])
        blocks = (o + n + W - 1) // W
        q_call = torch.arange(blocks * W, device=device).view(blocks, W) - o  # [G, W] call index
        # window j starts at call index j*W - o; it reads E earlier steps: context index + L - E
        k_index = (torch.arange(blocks, device=device)[:, None] * W - o + L - E
                   + torch.arange(W + E, device=device)[None, :])  # [G, W + E]
    elif n > W:  # blocks on the call's own grid, each with the W - 1 + E steps before it
        o, blocks = 0, (n + W - 1) // W
        q_call = torch.arange(blocks * W, device=device).view(blocks, W)
        k_index = q_call[:, :1] + L - (W - 1) - E + torch.arange(2 * W - 1 + E, device=device)[None, :]
    else:
        o, q_call = 0, torch.arange(n, device=device)[None, :]
        k_index = torch.arange(L + n, device=device)[None, :]
    queries, keys = q_call.clamp(0, n - 1) + L, k_index.clamp(0, L + n - 1)  # context indices
    if episodes is None:
        key_pos = position[:, None, None] + k_index[None] - L  # [B, G, Wk]
        q_pos = position[:, None, None] + q_call[None]  # [B, G, Wq]
    else:  # each step's own time since its episode began
        key_pos, q_pos = episodes.position[:, keys], episodes.position[:, queries]
    key_ok = ((key_pos >= 0) & (k_index[None] >= 0) & (k_index[None] - L < lengths[:, None, None])
              & (k_index[None] < L + n))
    q_ok = (q_call >= 0) & (q_call < n)
    lo = torch.div(q_pos, W, rounding_mode="floor") * W - E
    kp = key_pos[:, :, None, :]
    mask = key_ok[:, :, None, :] & q_ok[None, :, :, None] & (kp <= q_pos[..., None]) & (kp >= lo[..., None])
    if episodes is not None:  # only the query's own episode
        mask = mask & (episodes.episode[:, queries][..., None] == episodes.episode[:, keys][:, :, None, :])
    return LocalLayout(o, queries, keys, mask)


def step_layout(position: Tensor, *, window: int, extra_length: int, cache: int) -> LocalLayout:
    """``local_layout`` of a one-step call without padding or episode end (an agent acting), built
    directly: one block, the query is the last context step and reads the cached step ``j`` (time
    ``position - cache + j``) iff it is a real step (time >= 0) of the query's window, ``time >=
    floor(position / W) * W - E``. The same layout as ``local_layout(position, ones, 1, ...)`` (tested
    against ``local_layout_reference``), without the general case's index bookkeeping."""
    time = position[:, None] + torch.arange(-cache, 1, device=position.device)[None, :]  # [B, cache + 1]
    lo = torch.div(position, window, rounding_mode="floor") * window - extra_length
    mask = (time >= 0) & (time >= lo[:, None])
    index = torch.arange(cache + 1, device=position.device)[None, :]
    return LocalLayout(0, index[:, cache:], index, mask[:, None, None, :])


def local_layout_reference(position: Tensor, lengths: Tensor, n: int, *, window: int, extra_length: int,
                           cache: int, done: Tensor | None = None) -> Tensor:
    """The naive reference of ``local_layout``: the rule as a dense mask ``[B, n, cache + n]`` (query i of
    the call may read context step j), a loop over queries and keys. ``done [B, n]`` marks episode ends
    (valid steps only): time restarts after each, and a query reads only its own episode's steps."""
    B, W, L = position.shape[0], window, cache
    mask = torch.zeros(B, n, L + n, dtype=torch.bool)
    for b in range(B):
        # (episode, time since the episode began) of each context step; the cache and the running
        # episode's steps are episode 0, its time counted from the cache's first step
        time, episode = [int(position[b]) - L + j for j in range(L)], [0] * L
        ends, t = 0, int(position[b])
        for i in range(n):
            time.append(t)
            episode.append(ends)
            t += 1
            if done is not None and done[b, i]:
                ends, t = ends + 1, 0
        for i in range(n):
            q = L + i
            for j in range(L + n):
                real = time[j] >= 0 and j - L < int(lengths[b])
                lo = (time[q] // W) * W - extra_length
                if real and episode[j] == episode[q] and lo <= time[j] <= time[q]:
                    mask[b, i, j] = True
    return mask


def local_attention_reference(attention, context: Tensor, mask: Tensor) -> Tensor:
    """The naive reference of ``LocalLayout.attend``: every query of the call against every context step
    under the dense ``mask [B, n, L + n]`` of ``local_layout_reference``, in one block."""
    n = mask.shape[1]
    return attention(context[:, -n:], context, attn_mask=mask[:, None])


# =============================================================================================
# The cache a call leaves
# =============================================================================================


def last_steps(seq: Tensor, lengths: Tensor, n: int) -> Tensor:
    """The last ``n`` of the first ``lengths[b]`` steps of each row of ``seq [B, T, D]``."""
    B, T, D = seq.shape
    if n == 0 or not any_or_compiling(lengths != T):  # no padding: a slice
        return seq[:, T - n :]
    idx = lengths[:, None] - n + torch.arange(n, device=seq.device)[None, :]
    return seq.gather(1, idx[..., None].expand(B, n, D))


def last_steps_reference(seq: Tensor, lengths: Tensor, n: int) -> Tensor:
    """The naive reference of ``last_steps``: a slice per row."""
    return torch.stack([seq[b, int(lengths[b]) - n : int(lengths[b])] for b in range(seq.shape[0])])
