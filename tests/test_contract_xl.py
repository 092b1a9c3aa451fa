"""The agent contract (docs/design.md) for Transformer-XL and GTrXL with ``memory_mode="sliding"``.

Each query sees the ``mem_len`` steps before it and itself; ``done`` inside a call equals
``state.reset`` between calls; any split equals one call; states split and join along the batch. The
sliding attention is compared with a plain loop over query steps, each attending to its own window.
"""

from __future__ import annotations

import pytest
import torch

from chronomem.baselines import TransformerXL, XLState
from chronomem.layers import concat_states
from chronomem.registry import get_model
from contract import check_any_split, check_done_equals_reset, check_select_concat, random_dones

torch.set_num_threads(1)

B, N, D = 3, 13, 8


def sliding(gated: bool, mem_len: int = 4, segment_len: int = 3, **kw) -> TransformerXL:
    torch.manual_seed(mem_len * 10 + segment_len + gated)
    return TransformerXL(dim=D, depth=2, num_heads=2, segment_len=segment_len, mem_len=mem_len, gated=gated,
                         memory_mode="sliding", **kw).double().eval()


def inputs(seed: int, batch: int = B, steps: int = N) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, steps, D, generator=generator, dtype=torch.float64)
    return x, random_dones(batch, steps, generator), generator


def naive_sliding(model: TransformerXL, x: torch.Tensor, done: torch.Tensor | None) -> torch.Tensor:
    """Layer by layer, one query at a time: step t attends to the layer's inputs at the steps
    ``max(t - mem_len, start of t's episode) .. t`` (the window, then the query itself)."""
    batch, steps, _ = x.shape
    out = torch.zeros_like(x)
    for b in range(batch):
        episode_start, start = [], 0
        for t in range(steps):
            episode_start.append(start)
            if done is not None and done[b, t]:
                start = t + 1
        h = x[b]
        for layer in model.layers:
            rows = []
            for t in range(steps):
                first = max(t - model.mem_len, episode_start[t])
                window = h[first:t][None]  # [1, w, D]: the keys before the query
                valid = torch.ones(1, t - first + 1, dtype=torch.bool)
                rows.append(layer(h[t : t + 1][None], window, valid, True)[0, 0])
            h = torch.stack(rows)
        out[b] = model.norm(h)
    return out


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("mem_len,segment_len", [(4, 3), (2, 5), (0, 3), (6, 1)])
def test_sliding_matches_the_per_query_window(gated, mem_len, segment_len):
    model = sliding(gated, mem_len, segment_len)
    x, done, _ = inputs(1)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], naive_sliding(model, x, None), atol=1e-10, rtol=0)
        torch.testing.assert_close(model(x, done=done)[0], naive_sliding(model, x, done), atol=1e-10, rtol=0)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("mem_len,segment_len", [(4, 3), (2, 5), (0, 2), (6, 20)])
def test_done_equals_reset(gated, mem_len, segment_len):
    x, done, _ = inputs(2)
    check_done_equals_reset(sliding(gated, mem_len, segment_len).train(), x, done)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("with_done", [False, True])
@pytest.mark.parametrize("mem_len,segment_len", [(4, 3), (2, 5), (5, 1)])
def test_any_split(gated, with_done, mem_len, segment_len):
    x, done, generator = inputs(3)
    check_any_split(sliding(gated, mem_len, segment_len), x, done if with_done else None, generator)


@pytest.mark.parametrize("gated", [False, True])
def test_select_concat(gated):
    x, _, _ = inputs(4)
    check_select_concat(sliding(gated), x, concat_states)


@pytest.mark.parametrize("gated", [False, True])
def test_segment_len_sets_only_the_computation(gated):
    """Sliding: the block of queries computed together changes neither outputs nor gradients (the keys
    of the call carry gradients across blocks)."""
    x, done, _ = inputs(5)
    grads = []
    for segment_len in (2, 13):
        model = sliding(gated, 4, segment_len)
        model.load_state_dict(sliding(gated, 4, 2).state_dict())
        x_in = x.clone().requires_grad_(True)
        y, _ = model(x_in, done=done)
        (g,) = torch.autograd.grad(y.square().sum(), x_in)
        grads.append((y.detach(), g))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-10, rtol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-9, rtol=0)
    assert grads[0][1][:, :-1].abs().max() > 0  # earlier steps of the call do receive gradients


def test_no_gradient_crosses_an_episode_end():
    model = sliding(True, mem_len=6, segment_len=20)
    x = torch.randn(2, 10, D, dtype=torch.float64, requires_grad=True)
    done = torch.zeros(2, 10, dtype=torch.bool)
    done[:, 4] = True
    y, state = model(x, done=done)
    (grad,) = torch.autograd.grad(y[:, 5:].square().sum(), x, retain_graph=True)
    assert (grad[:, :5] == 0).all() and grad[:, 5:].abs().max() > 0
    assert int(state.valid.sum(1).max()) == 5  # only the new episode's steps are held
    (grad,) = torch.autograd.grad(state.memory.square().sum(), x)  # the state carries the new episode's
    assert (grad[:, :5] == 0).all() and grad[:, 5:].abs().max() > 0  # gradients only


def test_state_holds_the_last_steps_of_the_episode():
    """The memory of a sliding core is the layer inputs of the last mem_len steps (layer 0: x itself),
    valid only for the running episode; slots of the ended one are zeroed, as reset leaves them."""
    model = sliding(False, mem_len=4, segment_len=3)
    x, _, _ = inputs(6, batch=2, steps=9)
    done = torch.zeros(2, 9, dtype=torch.bool)
    done[1, 6] = True
    _, state = model(x, done=done)
    torch.testing.assert_close(state.memory[0, 0], x[0, -4:], atol=0, rtol=0)
    assert state.valid[0].all() and state.valid[1].tolist() == [False, False, True, True]
    assert (state.memory[1, :, :2] == 0).all()
    torch.testing.assert_close(state.memory[1, 0, 2:], x[1, -2:], atol=0, rtol=0)


def test_output_steps_in_sliding_mode():
    x, done, _ = inputs(7)
    plain = sliding(True, 4, 3)
    fast = sliding(True, 4, 3, output_steps=5)
    fast.load_state_dict(plain.state_dict())
    with torch.no_grad():
        (y, s), (y_fast, s_fast) = plain(x, done=done), fast(x, done=done)
    torch.testing.assert_close(y_fast[:, -5:], y[:, -5:], atol=1e-10, rtol=0)
    assert not y_fast[:, :-5].any()
    torch.testing.assert_close(s_fast.memory, s.memory, atol=1e-10, rtol=0)


def test_modes_and_done_validation():
    x, done, _ = inputs(8)
    segment = TransformerXL(dim=D, depth=1, num_heads=2, segment_len=3, mem_len=4)
    with pytest.raises(ValueError, match="memory_mode='sliding'"):
        segment(x, done=done)
    model = sliding(False)
    with pytest.raises(TypeError, match="done"):
        model(x, done=done.long())
    with pytest.raises(TypeError, match="done"):
        model(x, done=[[True]])
    with pytest.raises(ValueError, match="done"):
        model(x, done=done[:, :-1])
    with pytest.raises(ValueError, match="memory_mode"):
        TransformerXL(dim=D, depth=1, num_heads=2, memory_mode="window")
    with pytest.raises(ValueError, match="causal"):
        TransformerXL(dim=D, depth=1, num_heads=2, memory_mode="sliding", causal=False)


@pytest.mark.parametrize("name", ["transformer-xl", "gtrxl"])
def test_registry_builders_pass_memory_mode(name):
    model = get_model(name)(dim=D, depth=1, num_heads=2, causal=True, mem_len=3, memory_mode="sliding")
    assert model.sliding and model.config.memory_mode == "sliding"
    assert model.config.gated == (name == "gtrxl")
    assert not get_model(name)(dim=D, depth=1, num_heads=2, causal=True).sliding


@pytest.mark.parametrize("memory_mode", ["segment", "sliding"])
def test_cached_keys_equal_recomputed_ones(memory_mode):
    """Without gradients a call reads the state's cached keys and values; with gradients, from a state
    without a cache, or after the parameters changed, it recomputes them from the memory: same outputs
    and states either way (but for the tag: a call with gradients leaves its keys and values tagged 0,
    to be recomputed), and a stale cache is never read."""
    torch.manual_seed(9)
    model = TransformerXL(dim=D, depth=2, num_heads=2, segment_len=2, mem_len=5, gated=True,
                          memory_mode=memory_mode).double()
    x, _, _ = inputs(9, steps=9)
    mask = torch.ones(B, 9, dtype=torch.bool)
    mask[0, 6:] = False  # padded slots are cached as zeros
    with torch.no_grad():
        _, state = model(x[:, :6], mask=mask[:, :6])
        y_cached, s_cached = model(x[:, 6:], state, mask=mask[:, 6:])
        y_plain, _ = model(x[:, 6:], XLState(state.memory, state.valid), mask=mask[:, 6:])
    y_grad, s_grad = model(x[:, 6:], state, mask=mask[:, 6:])
    torch.testing.assert_close(y_cached, y_grad.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(y_plain, y_grad.detach(), atol=1e-10, rtol=0)
    for a, b in zip(s_cached.kv, s_grad.kv, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert (s_cached.kv_version > 0).all() and not s_grad.kv_version.any()  # learning leaves nothing to read
    with torch.no_grad():  # an optimiser step: the cache in `state` is stale now
        model.layers[1].attn.attn.to_kv.weight.add_(0.5)
        model.layers[0].norm_attn.bias.add_(0.5)
        y_after, s_after = model(x[:, 6:], state, mask=mask[:, 6:])
    y_recomputed, _ = model(x[:, 6:], state, mask=mask[:, 6:])
    torch.testing.assert_close(y_after, y_recomputed.detach(), atol=1e-10, rtol=0)
    assert (y_after - y_cached).abs().max() > 1e-3
    assert not torch.equal(s_after.kv_version, s_cached.kv_version)

    def stale(change, moves: float = 1e-4) -> None:
        """After ``change`` of the parameters, a call without gradients from a state cached just before
        it recomputes (a stale cache would be off by at least ``moves``, 1e-10 at least)."""
        with torch.no_grad():
            _, fresh = model(x[:, :6], mask=mask[:, :6])  # cached with the present parameters
            before, _ = model(x[:, 6:], fresh, mask=mask[:, 6:])
            change()
            after, _ = model(x[:, 6:], fresh, mask=mask[:, 6:])
        recomputed, _ = model(x[:, 6:], XLState(fresh.memory, fresh.valid), mask=mask[:, 6:])
        torch.testing.assert_close(after, recomputed.detach(), atol=1e-10, rtol=0)
        assert (after - before).abs().max() > moves, "the change must move the outputs"

    for kernel in ({"fused": True}, {"foreach": True}, {"foreach": False}):  # each of Adam's CPU kernels
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05, **kernel)
        model(x[:, 6:], XLState(state.memory, state.valid), mask=mask[:, 6:])[0].square().sum().backward()
        stale(optimizer.step)
        model.zero_grad()
    other = TransformerXL(dim=D, depth=2, num_heads=2, segment_len=2, mem_len=5, gated=True,
                          memory_mode=memory_mode).double()
    with torch.no_grad():  # values that float32 cannot hold, so that a round trip through it moves them
        for p in other.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    stale(lambda: model.load_state_dict(other.state_dict()))
    stale(lambda: setattr(model.layers[0].attn.attn.to_kv.weight, "data", other.layers[1].attn.attn.to_kv.weight))
    stale(lambda: model.float().double(), moves=1e-9)  # new tensors (rounded), perhaps at the old addresses


@pytest.mark.parametrize("name", ["blrp", "transformer"])
def test_non_causal_modules_refuse_done(name):
    from chronomem.registry import get_model

    # BLRP has no causal variant; the Transformer keeps no state even when causal.
    module = get_model(name)(dim=16, depth=1, num_heads=2, causal=name == "transformer")
    x = torch.randn(2, 8, 16)
    with pytest.raises(ValueError, match="done must be None"):
        module(x, done=torch.zeros(2, 8, dtype=torch.bool))
    module(x)  # without done it runs as before
