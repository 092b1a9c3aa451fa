"""The agent contract (docs/design.md) for TLB with causal=True: episode ends inside a call, streaming
at any split (one token at a time included), select + concat; with the default options and the
authors' preset, chunk sizes that do and do not divide the length."""

import pytest
import torch

from chronomem.layers import concat_states
from chronomem.tlb import TLB, TLBState
from contract import (
    check_done_trials,
    check_select_concat,
    check_split_trials,
    jitter_layer_norms_,
    randn64,
    random_dones,
)

torch.set_num_threads(1)

D = 8
OURS = dict(dim=D, num_heads=2, num_state=3, self_per_cross=1, depth=2, ff_mult=2.0)
# The authors' forward pass (slot encoding written into the state, zero I_0, no attention biases, ...)
# at a small size; dropout is off in eval mode.
AUTHORS = dict(preset="authors", dim=D, qkv_dim=6, num_heads=2, num_state=3, self_per_cross=2, depth=1)
CONFIGS = {"ours": OURS, "authors": AUTHORS, "truncated": {**OURS, "truncate_every": 2, "self_per_cross": 0}}
STEPS = 16


def make(config: str, chunk_size: int, seed: int = 0) -> TLB:
    torch.manual_seed(seed)
    model = TLB(**CONFIGS[config], chunk_size=chunk_size, causal=True).double().eval()
    return jitter_layer_norms_(model)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("chunk_size", [4, 5])  # divides STEPS, and does not
def test_done_inside_a_call_equals_reset_between_calls(config, chunk_size):
    check_done_trials(make(config, chunk_size, seed=1), STEPS, D)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("chunk_size", [4, 5])
@pytest.mark.parametrize("with_done", [False, True])
def test_any_split_equals_one_call(config, chunk_size, with_done):
    check_split_trials(make(config, chunk_size, seed=4), STEPS, D, with_done, trials=3)


@pytest.mark.parametrize("config", ["ours", "authors"])
def test_select_concat(config):
    model = make(config, 5, seed=7)
    check_select_concat(model, randn64(4, 13, D, seed=8), concat_states)  # the halves stop mid-chunk


def test_any_split_with_padding_and_dones():
    """Masked steps occupy their slots wherever the call is cut; outputs there are zero."""
    model = make("ours", 4, seed=9)
    generator = torch.Generator().manual_seed(10)
    x = randn64(3, STEPS, D, seed=11)
    mask = torch.rand(3, STEPS, generator=generator) > 0.3
    mask[2, 3:9] = False  # a whole chunk of padding
    done = random_dones(3, STEPS, generator)
    with torch.no_grad():
        whole, state = model(x, mask=mask, done=done)
        assert whole[~mask].abs().max() == 0
        for cuts in ([3, 7, 8, 13, STEPS], list(range(1, STEPS + 1))):
            outputs, start, s = [], 0, None
            for end in cuts:
                y, s = model(x[:, start:end], s, mask[:, start:end], done[:, start:end])
                outputs.append(y)
                start = end
            torch.testing.assert_close(torch.cat(outputs, 1), whole, atol=1e-10, rtol=0)
            torch.testing.assert_close(s.memory, state.memory, atol=1e-10, rtol=0)
            assert torch.equal(s.cache.fill, state.cache.fill)
            assert torch.equal(s.cache.slot_valid, state.cache.slot_valid)


def test_no_gradient_crosses_an_episode_end():
    model = make("ours", 4, seed=12)
    x = randn64(2, STEPS, D, seed=13).requires_grad_(True)
    done = torch.zeros(2, STEPS, dtype=torch.bool)
    done[0, 6] = True  # mid-chunk: the partial chunk of the first episode is dropped
    y, _ = model(x, done=done)
    y[0, 7:].sum().backward()
    assert x.grad[0, :7].abs().max() == 0 and x.grad[0, 7:].abs().amax() > 0
    assert x.grad[1].abs().max() == 0


def test_the_state_carries_the_partial_chunk():
    model = make("ours", 4, seed=14)
    x = randn64(2, 6, D, seed=15)
    _, state = model(x)
    cache = state.cache
    assert cache.fill.tolist() == [2, 2] and state.chunks.tolist() == [1, 1]
    assert cache.slot_valid[:, :2].all() and not cache.slot_valid[:, 2:].any()
    assert cache.outputs[:, 2:].abs().max() == 0
    assert len(cache.chunk_keys) == len(cache.chunk_values) == 2  # depth 2 x R = 1 self-attention layers
    assert cache.chunk_keys[0].shape == (2, 2, 4, D // 2) and cache.chunk_keys[0][:, :, 2:].abs().max() == 0
    # The cached keys/values of the cross-attention's context LN(I + P), one per group.
    for group, keys, values in zip(model.groups, cache.memory_keys, cache.memory_values, strict=True):
        want_k, want_v = group.cross.attn.heads_kv(group.cross.norm_context(state.memory + model.slot_encoding))
        torch.testing.assert_close(keys, want_k, atol=1e-12, rtol=0)
        torch.testing.assert_close(values, want_v, atol=1e-12, rtol=0)
    # The pending chunk updates the state once it is complete, as in one call.
    z = randn64(2, 2, D, seed=16)
    _, after = model(z, state)
    _, whole = model(torch.cat([x, z], 1))
    assert after.cache.fill.tolist() == [0, 0] and after.chunks.tolist() == [2, 2]
    torch.testing.assert_close(after.memory, whole.memory, atol=1e-10, rtol=0)
    # A state made by hand without the chunk cache (e.g. only memory) starts an empty chunk.
    bare = TLBState(after.memory, after.chunks, after.fresh)
    torch.testing.assert_close(model(x, bare)[0], model(x, after)[0], atol=1e-12, rtol=0)
    # reset empties it (the row starts a new chunk from I_0), as init_state does.
    cleared = state.reset(torch.tensor([True, False]))
    assert cleared.cache.fill.tolist() == [0, 2] and not cleared.cache.slot_valid[0].any()
    y, _ = model(z, cleared)
    torch.testing.assert_close(y[:1], model(z[:1])[0], atol=1e-10, rtol=0)


def test_bad_done():
    model = make("ours", 4)
    x = randn64(2, 5, D)
    with pytest.raises(TypeError, match="done"):
        model(x, done=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="done"):
        model(x, done=torch.zeros(2, 4, dtype=torch.bool))
    non_causal = TLB(**OURS, chunk_size=4).double()
    with pytest.raises(ValueError, match="causal"):
        non_causal(x, done=torch.zeros(2, 5, dtype=torch.bool))
    _, state = model(x)  # a partial chunk, which a non-causal TLB cannot continue
    with pytest.raises(ValueError, match="partial chunk"):
        non_causal(x, state)
    other = make("ours", 5)  # another chunk size: the partial chunk does not fit
    with pytest.raises(ValueError, match="state.cache.slot_valid"):
        other(x, state)



@pytest.mark.parametrize("config", ["ours", "authors"])
def test_gradients_through_the_carried_chunk_equal_one_call(config):
    """Fed one token at a time (state not detached), gradients into the input and every parameter
    flow through the cached keys/values, outputs and state as in one call."""
    model = make(config, 4, seed=19)
    x = randn64(2, 11, D, seed=20)
    weights = randn64(2, 11, D, seed=21)
    grads = []
    for one_token in (False, True):
        model.zero_grad()
        xg = x.clone().requires_grad_(True)
        if one_token:
            outputs, state = [], None
            for t in range(x.shape[1]):
                y, state = model(xg[:, t:t + 1], state)
                outputs.append(y)
            y = torch.cat(outputs, 1)
        else:
            y, state = model(xg)
        ((y * weights).sum() + model.latest_memory(state).sum()).backward()
        grads.append([xg.grad] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
