"""HTM's per-call layout of steps against its naive references: episode numbering, the local attention's
blocks (mask and attention, values and gradients), the cache a call leaves."""

import pytest
import torch

from chronomem.layers import MultiHeadAttention, RelativeAttention
from chronomem.ops.htm_local import (
    Episodes,
    call_episodes,
    episodes_reference,
    last_steps,
    last_steps_reference,
    local_attention_reference,
    local_layout,
    local_layout_reference,
    prefix_lengths,
    step_layout,
)

torch.set_num_threads(1)


def random_dones(B, N, generator, p=0.2):
    done = torch.rand(B, N, generator=generator) < p
    done[0, N // 2] = True  # at least one end
    return done


def as_dense(layout, n, cache):
    """The blocks of a ``LocalLayout`` as one dense mask ``[B, n, cache + n]`` (query i may read context
    step j); padding slots of a block see nothing, so they add nothing."""
    B = layout.mask.shape[0]
    dense = torch.zeros(B, n, cache + n, dtype=torch.bool)
    G, Wq = layout.queries.shape
    for g in range(G):
        for a in range(Wq):
            i = int(layout.queries[g, a]) - cache
            for c in range(layout.keys.shape[1]):
                dense[:, i, int(layout.keys[g, c])] |= layout.mask[:, g, a, c]
    return dense


@pytest.mark.parametrize("cache", [0, 3])
def test_episodes_match_the_reference(cache):
    """``Episodes`` (cumsum and cummax over the call) == a loop over the steps: the episode and the time
    since its start of every context step, the episode running at the end, and the state after the call
    (``after``: position, cache slots of ended episodes zeroed). Dones at padded steps are ignored."""
    g = torch.Generator().manual_seed(0)
    B, N, D = 4, 13, 3
    lengths = torch.tensor([13, 9, 13, 5])
    done = random_dones(B, N, g)
    done[1, 8] = True  # an end at a row's last valid step
    position = torch.tensor([0, 4, 11, 2])
    episodes = call_episodes(done, lengths, position, cache)
    valid_done = done & (torch.arange(N)[None] < lengths[:, None])
    want = episodes_reference(valid_done, position, cache, lengths)
    assert torch.equal(episodes.done, valid_done)
    for name in ("episode", "position", "last"):
        assert torch.equal(getattr(episodes, name), want[name]), name
    assert torch.equal(episodes.in_call, want["episode"][:, cache:])
    caches = [torch.randn(B, cache, D, generator=g) for _ in range(2)]
    position_after, kept = episodes.after(position, lengths, caches)
    assert torch.equal(position_after, want["position_after"])
    for got, before in zip(kept, caches, strict=True):
        assert torch.equal(got, torch.where(want["cache_kept"][..., None], before, 0.0))
    # No valid step ends an episode: nothing to number.
    assert call_episodes(None, lengths, position, cache) is None
    assert call_episodes(torch.arange(N)[None].expand(B, N) >= lengths[:, None] + 20, lengths, position, cache) is None


@pytest.mark.parametrize(
    ("start", "lengths", "n", "with_done"),
    [
        ([5, 5, 5], [11, 7, 11], 11, False),  # rows at one offset in their window, longer than a window: blocked
        ([0, 0, 0], [11, 11, 11], 11, False),
        ([5, 2, 9], [11, 7, 11], 11, False),  # different offsets: blocks on the call's grid
        ([3, 3, 3], [3, 2, 3], 3, False),  # shorter than a window: one block
        ([5, 2, 9], [11, 7, 11], 11, True),  # episode ends inside the call: blocks on the call's grid
    ],
)
@pytest.mark.parametrize("extra_length", [0, 3])
def test_local_layout_matches_the_reference(start, lengths, n, with_done, extra_length):
    """``local_layout``'s blocks, as a dense mask, == the visibility rule applied step by step
    (``floor(t/W)*W - E <= s <= t``, s a real step of the query's episode)."""
    W = 4
    cache = W - 1 + extra_length
    position, lengths = torch.tensor(start), torch.tensor(lengths)
    done = episodes = None
    if with_done:
        done = random_dones(3, n, torch.Generator().manual_seed(1), p=0.25)
        episodes = call_episodes(done, lengths, position, cache)
        done = episodes.done
    layout = local_layout(position, lengths, n, window=W, extra_length=extra_length, cache=cache, episodes=episodes)
    windows = start[0] == start[1] == start[2] and not with_done  # the blocks are the windows
    keys_per_block = cache + n if n <= W else (W + extra_length if windows else 2 * W - 1 + extra_length)
    assert (layout.queries.shape[0] > 1) == (n > W) and layout.keys.shape[1] == keys_per_block
    want = local_layout_reference(position, lengths, n, window=W, extra_length=extra_length, cache=cache, done=done)
    assert torch.equal(as_dense(layout, n, cache), want)
    assert want.any()


@pytest.mark.parametrize(("window", "extra_length"), [(4, 0), (4, 3), (1, 0), (5, 2)])
def test_step_layout_matches_the_reference(window, extra_length):
    """``step_layout`` (a one-step call, built directly) == the visibility rule for one query, at positions
    before, at and after window starts, the episode's first steps included."""
    cache = window - 1 + extra_length
    position = torch.arange(0, 3 * window + 2)
    layout = step_layout(position, window=window, extra_length=extra_length, cache=cache)
    want = local_layout_reference(position, torch.ones_like(position), 1, window=window, extra_length=extra_length,
                                  cache=cache)
    assert torch.equal(as_dense(layout, 1, cache), want)
    general = local_layout(position, torch.ones_like(position), 1, window=window, extra_length=extra_length,
                           cache=cache)
    assert torch.equal(as_dense(general, 1, cache), want)
    assert not want[0, 0, :cache].any() and want[:, 0, cache].all()  # the first step sees itself alone


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize(("start", "with_done"), [([5, 5], False), ([5, 2], False), ([5, 2], True)])
def test_local_attention_matches_the_reference(relative, start, with_done):
    """``LocalLayout.attend`` (blocks of queries, each reading its window) == one block of every query
    against every context step under the reference mask, with Transformer-XL's relative positions or
    without: values and gradients into the context and the parameters (float64)."""
    torch.manual_seed(2)
    B, n, W, E, D = 2, 11, 4, 2, 8
    cache = W - 1 + E
    attention = (RelativeAttention(D, 2) if relative else MultiHeadAttention(D, 2)).double()
    position, lengths = torch.tensor(start), torch.tensor([11, 8])
    done = episodes = None
    if with_done:
        done = torch.zeros(B, n, dtype=torch.bool)
        done[0, 4] = done[1, 6] = True
        episodes = call_episodes(done, lengths, position, cache)
    layout = local_layout(position, lengths, n, window=W, extra_length=E, cache=cache, episodes=episodes)
    mask = local_layout_reference(position, lengths, n, window=W, extra_length=E, cache=cache, done=done)
    context = torch.randn(B, cache + n, D, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(B, n, D, dtype=torch.float64)
    got = layout.attend(attention, context[:, cache:], attention.keys_values(context))  # keys projected once
    want = local_attention_reference(attention, context, mask)
    torch.testing.assert_close(got, want)
    inputs = (context, *attention.parameters())
    grads_got = torch.autograd.grad((got * upstream).sum(), inputs)
    grads_want = torch.autograd.grad((want * upstream).sum(), inputs)
    for a, b in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b)
    assert grads_want[0].abs().max() > 0


@pytest.mark.parametrize("lengths", [[9, 9, 9], [9, 4, 7]])
@pytest.mark.parametrize("n", [0, 3])
def test_last_steps_match_the_reference(lengths, n):
    """``last_steps`` (a slice without padding, else one gather) == a slice per row, gradients included."""
    g = torch.Generator().manual_seed(3)
    seq = torch.randn(3, 9 + n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor(lengths) + n  # as the model calls it: valid steps + cache length
    got, want = last_steps(seq, lengths, n), last_steps_reference(seq, lengths, n)
    assert torch.equal(got, want)
    if n:
        upstream = torch.randn(want.shape, generator=g, dtype=torch.float64)
        grad_got, = torch.autograd.grad((got * upstream).sum(), seq)
        grad_want, = torch.autograd.grad((want * upstream).sum(), seq)
        assert torch.equal(grad_got, grad_want)


def test_prefix_lengths():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert prefix_lengths(mask, 2, 3, "cpu").tolist() == [2, 3]
    assert prefix_lengths(None, 2, 3, "cpu").tolist() == [3, 3]
    with pytest.raises(ValueError, match="prefix"):
        prefix_lengths(torch.tensor([[True, False, True]] * 2), 2, 3, "cpu")


def test_tail_keeps_the_last_steps():
    done = torch.tensor([[False, True, False, False]])
    episodes = Episodes.of(done, torch.tensor([2]), cache=0)
    tail = episodes.tail(2)
    assert tail.episode.tolist() == [[1, 1]] and tail.position.tolist() == [[0, 1]] and tail.last.tolist() == [1]
