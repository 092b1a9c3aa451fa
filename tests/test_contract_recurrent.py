"""The agent contract (docs/design.md) for the recurrent cores: LSTM, RelevanceRNN / RelevanceLSTM,
MemRNN / MemLSTM, and the memoryless core (``mlp``), for which it holds trivially. Episode ends inside
a call == resets between calls, any split == one call, states split and join along the batch, and a
bad ``done`` is a clear error. float64 throughout."""

import pytest
import torch

from chronomem.baselines import LSTM, Memoryless
from chronomem.layers import concat_states
from chronomem.relevance import MemLSTM, MemRNN, RelevanceLSTM, RelevanceRNN
from contract import (
    assert_same_state,
    check_any_split,
    check_done_equals_reset,
    check_select_concat,
    random_dones,
)

torch.set_num_threads(1)

DIM, BATCH, STEPS = 3, 4, 15
CORES = ["lstm", "relevance-rnn", "relevance-lstm", "mem-rnn", "mem-lstm", "mlp"]


def make(name: str, seed: int = 0):
    """A small float64 core; the relevance cores with a buffer of 2 and a relevant set of 2, so that
    states enter (and are replaced in) the relevant set within a few steps."""
    torch.manual_seed(seed)
    if name == "lstm":
        return LSTM(dim=DIM, hidden=4, depth=2).double()
    if name == "mlp":
        return Memoryless(dim=DIM, depth=2).double()
    cls = {"relevance-rnn": RelevanceRNN, "relevance-lstm": RelevanceLSTM, "mem-rnn": MemRNN,
           "mem-lstm": MemLSTM}[name]
    options = {"buffer_size": 2, "relevant_size": 2} if cls in (RelevanceRNN, RelevanceLSTM) else {}
    return cls(input_size=DIM, hidden_size=4, **options).double()


def inputs(seed: int, batch: int = BATCH, steps: int = STEPS):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, steps, DIM, generator=generator, dtype=torch.double)
    return x, random_dones(batch, steps, generator, p=0.2), generator


@pytest.mark.parametrize("name", CORES)
@pytest.mark.parametrize("seed", [0, 1])
def test_done_equals_reset(name, seed):
    x, done, _ = inputs(seed)
    assert bool(done[:, 0].any()) and bool(done[:, -1].any())
    assert int(done.sum(1).max()) >= 2  # a row with several episodes
    check_done_equals_reset(make(name, seed), x, done)


@pytest.mark.parametrize("name", CORES)
@pytest.mark.parametrize("with_done", [False, True])
def test_any_split(name, with_done):
    x, done, generator = inputs(2)
    check_any_split(make(name), x, done if with_done else None, generator)


@pytest.mark.parametrize("name", CORES)
def test_select_concat(name):
    x, _, _ = inputs(3)
    check_select_concat(make(name), x, concat_states)


@pytest.mark.parametrize("name", CORES)
def test_done_at_last_step_returns_initial_state(name):
    """Buffer, relevant set, scores, positions, counters: all exactly as ``init_state`` after a done
    (the relevant set of the new episode starts empty), even for a row whose inputs were NaN."""
    core = make(name)
    x, _, _ = inputs(4)
    x[0, :5] = float("nan")
    done = torch.zeros(BATCH, STEPS, dtype=torch.bool)
    done[:, -1] = True
    with torch.no_grad():
        _, state = core(x, done=done)
        fresh = core.init_state(BATCH)
        if name.startswith("mem"):  # every past step keeps a slot; all are empty now
            assert not state.valid.any() and not state.memory.any() and not state.keys.any()
            state = concat_states([filled_slots(state.select([b])) for b in range(BATCH)])
        assert_same_state(state, fresh, atol=0.0)


@pytest.mark.parametrize("name", CORES)
def test_nan_episode_does_not_leak(name):
    """A row whose first episode produced NaN continues exactly as a fresh row after its done."""
    core = make(name)
    x, _, _ = inputs(5)
    x[0, :4] = float("nan")
    done = torch.zeros(BATCH, STEPS, dtype=torch.bool)
    done[0, 3] = True
    with torch.no_grad():
        y, _ = core(x, done=done)
        fresh, _ = core(x[:1, 4:])
    torch.testing.assert_close(y[0, 4:], fresh[0], atol=1e-12, rtol=0)


def filled_slots(state):
    """A one-row ``MemState`` without its empty slots."""
    keep = state.valid[0]
    return type(state)(state.s, state.c, state.memory[:, keep], state.keys[:, keep], state.valid[:, keep],
                       state.steps)


@pytest.mark.parametrize("name", CORES)
def test_done_with_mask(name):
    """With padding (holes included), each row equals its valid steps run alone with their dones; a
    done on a padded step is ignored."""
    core = make(name)
    x, done, generator = inputs(6)
    mask = torch.rand(BATCH, STEPS, generator=generator) > 0.3
    mask[:, 0] = True
    padded_done = ~mask & (torch.rand(BATCH, STEPS, generator=generator) > 0.5)
    with torch.no_grad():
        y, state = core(x, mask=mask, done=done | padded_done)
        assert (y[~mask] == 0).all()
        for b in range(BATCH):
            y_row, state_row = core(x[b : b + 1, mask[b]], done=done[b : b + 1, mask[b]])
            torch.testing.assert_close(y[b, mask[b]], y_row[0], atol=1e-12, rtol=0)
            state_b = state.select([b])
            if name.startswith("mem"):  # padding and past episodes leave empty slots: compare the filled
                state_b, state_row = filled_slots(state_b), filled_slots(state_row)
            assert_same_state(state_b, state_row, atol=1e-12)


@pytest.mark.parametrize("name", CORES)
def test_bad_done(name):
    core = make(name)
    x, done, _ = inputs(7)
    with pytest.raises(TypeError, match="done"):
        core(x, done=done.double())
    with pytest.raises(TypeError, match="done"):
        core(x, done=done.tolist())
    with pytest.raises(ValueError, match="done"):
        core(x, done=done[:, :-1])
    with pytest.raises(ValueError, match="done"):
        core(x, done=done[:, None])


@pytest.mark.parametrize("name", ["mem-rnn", "mem-lstm"])
def test_mem_state_spans_the_current_episodes_only(name):
    """Streamed one step at a time over many episodes, the memory keeps at most the longest current
    episode's slots (it does not grow with the stream), and every output equals its episode run alone."""
    core = make(name)
    x = torch.randn(2, 40, DIM, generator=torch.Generator().manual_seed(8), dtype=torch.double)
    done = torch.zeros(2, 40, dtype=torch.bool)
    done[0, 4::5] = True  # row 0: episodes of 5 steps; row 1: of 8 steps
    done[1, 7::8] = True
    state, since_reset = None, torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        for t in range(40):
            y, state = core(x[:, t : t + 1], state, done=done[:, t : t + 1])
            since_reset = torch.where(done[:, t], 0, since_reset + 1)
            # each row's current episode fills the last since_reset[b] slots; nothing older is kept
            assert state.memory.shape[1] == int(since_reset.max())
            for b, length in ((0, 5), (1, 8)):
                start = t - t % length
                alone, _ = core(x[b : b + 1, start : t + 1])
                torch.testing.assert_close(y[b, 0], alone[0, -1], atol=1e-12, rtol=0)


def test_memoryless_sees_each_step_alone():
    """The memoryless core's output at step t is that of step t run alone, whatever came before and
    whatever the state; so an agent on it cannot tell two histories that end in the same observation."""
    core = make("mlp")
    x, done, _ = inputs(8)
    with torch.no_grad():
        y, state = core(x, done=done)
        alone = torch.cat([core(x[:, t : t + 1])[0] for t in range(STEPS)], dim=1)
        torch.testing.assert_close(y, alone, atol=1e-12, rtol=0)
        other = x.clone()
        other[:, :-1] = torch.randn_like(other[:, :-1])  # another history, the same last step
        torch.testing.assert_close(core(other, state=state)[0][:, -1], y[:, -1], atol=1e-12, rtol=0)
    assert state.rows.shape == (BATCH, 0)
    with pytest.raises(TypeError, match="NoMemory"):
        core(x, state=LSTM(dim=DIM).init_state(BATCH))


@pytest.mark.parametrize("name", CORES)
def test_gradients_finite_when_a_padded_step_sees_no_memory(name):
    """Left padding, and padding right after an episode end, leave a padded step with no stored state to
    attend to. Its output is masked; its gradient must not be NaN (a softmax over no valid slot was)."""
    core = make(name)
    x, _, _ = inputs(9)
    x.requires_grad_(True)
    mask = torch.ones(BATCH, STEPS, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[1, 6:] = False  # padding after the episode end at step 5
    done = torch.zeros(BATCH, STEPS, dtype=torch.bool)
    done[1, 5] = True
    y, _ = core(x, mask=mask, done=done)
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in core.parameters() if p.grad is not None)
    alone, _ = core(x[:1, 3:].detach())  # the left-padded row equals its valid steps alone
    torch.testing.assert_close(y[0, 3:].detach(), alone[0], atol=1e-12, rtol=0)
