"""The agent contract (docs/design.md) for HTMTransformer: episode ends inside a call (``done``),
streaming at any split (one step at a time included), select + concat; for the default layer and the
``memory_norm`` / ``shared_memory`` / no-relative-positions / ``keep_across_episodes`` / ``overlap`` /
``extra_length`` / ``relevance_floor`` / ``read_gate`` / ``final_norm`` variants, chunk sizes that do and do
not divide the length."""

import dataclasses

import pytest
import torch

from chronomem.htm import HierarchicalMemory, HTMTransformer
from chronomem.layers import concat_states
from chronomem.ops.htm_local import call_episodes
from contract import (
    assert_same_state,
    check_done_trials,
    check_select_concat,
    check_split_trials,
    jitter_layer_norms_,
    randn64,
    random_dones,
)

torch.set_num_threads(1)

D = 8
SMALL = dict(dim=D, depth=2, num_heads=2, top_k=2, memory_size=3, window=3, ff_mult=2.0)
VARIANTS = {
    "default": {},
    "memory_norm": {"memory_norm": True},
    "shared_memory": {"shared_memory": True},
    "no_relative_positions": {"relative_positions": False},
    "keep_across_episodes": {"keep_across_episodes": True, "extra_length": 2},
    "overlap": {"overlap": 1, "memory_size": 2},
    "relevance_floor": {"relevance_floor": 0.25, "top_k": 3},
    "read_gate": {"read_gate": 0.7},
    "final_norm": {"final_norm": True},
}
STEPS = 16


def make(variant: str, chunk_size: int, seed: int = 0, **options) -> HTMTransformer:
    torch.manual_seed(seed)
    model = HTMTransformer(**{**SMALL, **VARIANTS[variant], **options}, chunk_size=chunk_size).double().eval()
    return jitter_layer_norms_(model)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("chunk_size", [4, 3])  # divides STEPS, and does not
def test_done_inside_a_call_equals_reset_between_calls(variant, chunk_size):
    check_done_trials(make(variant, chunk_size, seed=1), STEPS, D)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("chunk_size", [4, 3])
@pytest.mark.parametrize("with_done", [False, True])
def test_any_split_equals_one_call(variant, chunk_size, with_done):
    check_split_trials(make(variant, chunk_size, seed=4), STEPS, D, with_done, trials=2)


@pytest.mark.parametrize("variant", ["default", "shared_memory", "overlap"])
def test_select_concat(variant):
    model = make(variant, 3, seed=7)
    check_select_concat(model, randn64(4, 13, D, seed=8), concat_states)  # the halves stop mid-chunk


def projected(state):
    """``state`` without its cached local keys and values: a call projects the caches (the reference)."""
    return dataclasses.replace(state, keys_values=None, kv_version=None)


@pytest.mark.parametrize("variant", ["default", "no_relative_positions", "shared_memory", "keep_across_episodes"])
def test_cached_local_keys_equal_projected_ones(variant, monkeypatch):
    """Without gradients a call reads the state's local keys and values and projects only its own steps;
    with gradients, from a state without them, or after the parameters changed, it projects the caches:
    the same outputs and states either way (one-step acting with episode ends, a padded general call),
    but for the tag: a call with gradients leaves its keys and values tagged 0, to be projected again;
    the cached values are ``W_kv LN(cache)`` at the episode's slots and zeros before it, and a stale
    cache is never read."""
    model = make(variant, 3, seed=19, extra_length=1)
    B, N, L = 3, 15, model.cache_length
    x = randn64(B, N, D, seed=20)
    done = torch.zeros(B, N, dtype=torch.bool)
    done[0, 3] = done[1, 9] = done[2, N - 1] = True  # in the first call, while acting, at the last step
    first = torch.ones(B, 6, dtype=torch.bool)
    first[2, 4:] = False  # a padded row: the cache it leaves is its last valid steps
    projected_rows = []
    for layer in model.layers:  # count the steps each call projects
        project = layer.local.keys_values
        monkeypatch.setattr(layer.local, "keys_values", lambda t, f=project: projected_rows.append(t.shape[1]) or f(t))
    with torch.no_grad():
        _, state = model(x[:, :6], mask=first, done=done[:, :6])
        cached, reference = state, projected(state)
        for t in range(6, N):  # an agent acting, with episode ends
            projected_rows.clear()
            y_cached, cached = model(x[:, t : t + 1], cached, done=done[:, t : t + 1])
            assert projected_rows == [1] * model.config.depth, "acting projects its own step only"
            y_reference, reference = model(x[:, t : t + 1], projected(reference), done=done[:, t : t + 1])
            torch.testing.assert_close(y_cached, y_reference, atol=1e-10, rtol=0)
        assert_same_state(cached, reference, atol=1e-10)
        y_call, s_call = model(x[:, 6:], state, done=done[:, 6:])  # a general call from the cache
    y_grad, s_grad = model(x[:, 6:], state, done=done[:, 6:])  # with gradients: projected
    torch.testing.assert_close(y_call, y_grad.detach(), atol=1e-10, rtol=0)
    torch.testing.assert_close(y_cached, y_call[:, -1:], atol=1e-10, rtol=0)
    assert (s_call.kv_version > 0).any() and not s_grad.kv_version.any()  # learning leaves nothing to read
    assert_same_state(s_call, dataclasses.replace(s_grad.detach(), kv_version=s_call.kv_version), atol=1e-10)
    assert_same_state(cached, s_call, atol=1e-10)
    for layer, cache, kv in zip(model.layers, cached.caches, cached.keys_values, strict=True):
        episode = (torch.arange(L)[None, :] >= L - cached.position[:, None])[..., None]
        want = torch.where(episode, layer.local.keys_values(layer.norm_local(cache)), 0.0)
        torch.testing.assert_close(kv, want, atol=1e-10, rtol=0)
    assert cached.position.tolist()[2] == 0 and not cached.keys_values[0][2].any()  # ended at the last step
    assert (cached.kv_version[:2] > 0).all() and cached.kv_version[2] == 0

    def stale(change) -> None:
        """After ``change`` of the parameters, a step without gradients from a state cached just before it
        projects again (a stale cache would move the outputs by at least 1e-4)."""
        with torch.no_grad():
            _, fresh = model(x[:, :6])  # cached with the present parameters
            before, _ = model(x[:, 6:7], fresh)
            change()
            after, _ = model(x[:, 6:7], fresh)
            want, _ = model(x[:, 6:7], projected(fresh))
        torch.testing.assert_close(after, want, atol=1e-10, rtol=0)
        assert (after - before).abs().max() > 1e-4, "the change must move the outputs"

    for kernel in ({"fused": True}, {"foreach": True}, {"foreach": False}):  # fused bumps no version counter
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05, **kernel)
        model(x[:, 6:9], projected(state))[0].square().sum().backward()
        stale(optimizer.step)
        model.zero_grad()
    other = make(variant, 3, seed=21, extra_length=1)
    stale(lambda: model.load_state_dict(other.state_dict()))


@pytest.mark.parametrize("options", [{"output_steps": 5}, {"output_steps": 1, "shared_memory": True, "window": 1},
                                     {"output_steps": 4, "extra_length": 2}])
def test_output_steps_with_done(options):
    """``output_steps`` with episode ends inside the call: the last r outputs and the state equal the
    plain forward's."""
    plain = make("default", 3, seed=9, **{**options, "output_steps": None})
    fast = make("default", 3, seed=9, **options)
    x = randn64(3, STEPS, D, seed=10)
    done = random_dones(3, STEPS, torch.Generator().manual_seed(11), p=0.25)
    done[2, -2] = True  # an episode end inside the computed tail
    r = options["output_steps"]
    with torch.no_grad():
        (y, state), (y_fast, state_fast) = plain(x, done=done), fast(x, done=done)
    torch.testing.assert_close(y_fast[:, -r:], y[:, -r:], atol=1e-10, rtol=0)
    assert not y_fast[:, :-r].any()
    for a, b in zip(state_fast.caches, state.caches, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_done_with_padding():
    """A padded row with episode ends equals that row alone over its valid steps; a done at a padded
    step is ignored."""
    model = make("default", 3, seed=12)
    x = randn64(2, STEPS, D, seed=13)
    mask = torch.ones(2, STEPS, dtype=torch.bool)
    mask[1, 11:] = False
    done = torch.zeros(2, STEPS, dtype=torch.bool)
    done[:, 4] = done[1, 10] = done[1, 13] = True  # row 1: an end at its last valid step, one in padding
    with torch.no_grad():
        y, state = model(x, mask=mask, done=done)
        alone, state_alone = model(x[1:, :11], done=done[1:, :11])
    torch.testing.assert_close(y[1:, :11], alone, atol=1e-10, rtol=0)
    assert not y[1, 11:].any()
    assert int(state.position[1]) == 0 and int(state_alone.position[0]) == 0
    assert not state.memories[0].valid[1].any()  # cleared after the episode end at step 10
    torch.testing.assert_close(state.caches[1][1:], state_alone.caches[1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("memory_gradient", [False, True])
def test_no_gradient_crosses_an_episode_end(memory_gradient):
    model = make("default", 3, seed=14, memory_gradient=memory_gradient, extra_length=3)
    x = randn64(2, 12, D, seed=15).requires_grad_(True)
    done = torch.zeros(2, 12, dtype=torch.bool)
    done[:, 6] = True
    y, state = model(x, done=done)
    (grad,) = torch.autograd.grad(y[:, 7:].square().sum(), x, retain_graph=True)
    assert (grad[:, :7] == 0).all() and grad[:, 7:].abs().max() > 0
    (grad,) = torch.autograd.grad(sum(c.square().sum() for c in state.caches), x)  # the caches carry the
    assert (grad[:, :7] == 0).all() and grad[:, 7:].abs().max() > 0  # new episode's gradients only
    with torch.no_grad():  # the steps before the end changed: the new episode's outputs do not
        x2 = x.detach().clone()
        x2[:, :7] = randn64(2, 7, D, seed=16)
        torch.testing.assert_close(model(x2, done=done)[0][:, 7:], y[:, 7:].detach(), atol=1e-10, rtol=0)


def test_keep_across_episodes_keeps_memory_not_the_window():
    """With ``keep_across_episodes`` the new episode reads the old one's chunks (Section 3.3), but its
    local window starts at the episode's first step."""
    model = make("keep_across_episodes", 3, seed=17, extra_length=0)
    x = randn64(1, 12, D, seed=18)
    done = torch.zeros(1, 12, dtype=torch.bool)
    done[0, 7] = True
    with torch.no_grad():
        y, state = model(x, done=done)
        x2 = x.clone()
        x2[:, 0] += 1.0  # in a stored chunk of the first episode
        assert not torch.allclose(model(x2, done=done)[0][:, 9], y[:, 9])
        assert int(state.position[0]) == 4 and state.memories[0].valid.any()
        fresh = make("default", 3, seed=17)  # same weights, memory cleared: the old episode is not read
        torch.testing.assert_close(fresh(x2, done=done)[0][:, 9], fresh(x, done=done)[0][:, 9])


def test_done_is_validated():
    model = make("default", 3)
    x = randn64(2, 5, D)
    with pytest.raises(TypeError, match="done"):
        model(x, done=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="done"):
        model(x, done=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="done"):
        model(x, done=[[True] * 5] * 2)


def test_write_chunks_returns_each_commit_once_with_its_last_step():
    """``HierarchicalMemory.write_chunks``: the chunks a write commits, each once, with the call index of
    the step that commits it (what a call's queries are masked by), partial chunks at episode ends
    included; and the memory ``write`` returns."""
    mem = HierarchicalMemory.empty(2, 3, 3, D, overlap=1, dtype=torch.float64)
    x = randn64(2, 11, D, seed=19)
    done = torch.zeros(2, 11, dtype=torch.bool)
    done[0, 4] = done[1, 5] = True
    lengths = torch.full((2,), 11)
    stored, chunks = mem.write_chunks(x, lengths, call_episodes(done, lengths, torch.zeros_like(lengths), cache=0))
    ends = [sorted(int(e) for e, v in zip(chunks.end[b], chunks.valid[b], strict=True) if v) for b in range(2)]
    # chunks of 3 steps with stride 2 restarting after each end; row 1's step 5 ends a partial chunk [4, 5]
    assert ends == [[2, 4, 7, 9], [2, 4, 5, 8, 10]]
    written = mem.write(x, done=done)
    for name, want in written.__dict__.items():
        got = getattr(stored, name)
        assert torch.equal(got, want) if torch.is_tensor(want) else got == want


def test_layers_are_built_from_the_model_config():
    """``HTMTransformer`` hands its Config to every ``HTMLayer`` whole; a config read back from JSON
    builds the same model."""
    import dataclasses
    import json

    from chronomem.htm import HTMConfig, HTMLayer
    from chronomem.layers import MultiHeadAttention

    assert HTMTransformer.Config is HTMConfig
    model = make("default", 3, relative_positions=False, memory_norm=True, top_k=3, init_scale=None)
    layer = model.layers[0]
    assert isinstance(layer.local, MultiHeadAttention) and layer.memory.memory_norm
    assert layer.memory.top_k == 3 and layer.memory.chunk_size == 3
    assert layer.ff.net[0].out_features == int(SMALL["ff_mult"] * D)
    config = HTMConfig(**json.loads(json.dumps(dataclasses.asdict(model.config))))
    assert config == model.config
    again = HTMTransformer(config=config).double()
    again.load_state_dict(model.state_dict())  # the same modules and shapes
    x = randn64(2, 7, D, seed=20)
    with torch.no_grad():
        torch.testing.assert_close(again(x)[0], model(x)[0], atol=0, rtol=0)
    keywords = HTMLayer(**dataclasses.asdict(config))
    assert [n for n, _ in keywords.named_parameters()] == [n for n, _ in layer.named_parameters()]
