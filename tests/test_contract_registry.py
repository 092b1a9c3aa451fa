"""The agent contract (docs/design.md) on every registered causal core, found through the registry: a new
core that subclasses ``chronomem.core.CausalCore`` is checked here without a test file of its own.

A toy core written below (one module-level class and its registration) shows it: the contract runs on
it, and a copy that ignores the episode ends inside a call fails the contract."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

import chronomem.registry as registry
from chronomem.checks import check_positive, check_state_batch
from chronomem.core import CausalCore
from chronomem.layers import RecurrentState, clear_rows, concat_states
from chronomem.registry import build_backbone, names
from contract import (
    assert_same_state,
    check_any_split,
    check_done_equals_reset,
    check_select_concat,
    jitter_layer_norms_,
    randn64,
    random_dones,
)

torch.set_num_threads(1)

DIM, BATCH, STEPS = 8, 4, 13
# Small sizes for the cores that have them (chunks and memories that fill within STEPS); a core not
# named here is built with its builder's defaults. The agents' own options (chronomem.rl.ppo) come first.
SMALL = {
    "htm": dict(chunk_size=3, memory_size=4, top_k=2, window=3),
    "tlb": dict(chunk_size=4, num_state=3),
    "transformer-xl": dict(segment_len=4, mem_len=5),
    "gtrxl": dict(segment_len=4, mem_len=5),
    "relevance-rnn": dict(buffer_size=2, relevant_size=2),
    "relevance-lstm": dict(buffer_size=2, relevant_size=2),
}


# ---- a toy core: a leaky running sum, written against CausalCore alone -------------------------------


@dataclass(frozen=True)
class ToyState(RecurrentState):
    total: Tensor  # [B, dim]


class LeakySum(CausalCore):
    """``s_t = 0.5 s_{t-1} + W x_t``, ``y_t = tanh(s_t)``: all a core writes is its state and its scan."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = self.out_dim = check_positive(dim, "dim")
        self.proj = nn.Linear(dim, dim)

    def init_state(self, batch_size: int, device=None) -> ToyState:
        check_positive(batch_size, "batch_size")
        return ToyState(torch.zeros(batch_size, self.dim, device=device, dtype=self.proj.weight.dtype))

    def check_state(self, state, batch: int) -> ToyState:
        if not isinstance(state, ToyState):
            raise TypeError(f"state must be a ToyState, got {type(state).__name__}")
        check_state_batch(state.total.shape[0], batch)
        return state

    def scan(self, x: Tensor, state: ToyState, mask: Tensor | None, done: Tensor | None):
        total, outputs, inputs = state.total, [], self.proj(x)
        for t in range(x.shape[1]):
            new = 0.5 * total + inputs[:, t]
            total = new if mask is None else torch.where(mask[:, t, None], new, total)
            outputs.append(torch.tanh(new) if mask is None else torch.tanh(new) * mask[:, t, None])
            if done is not None:
                total = clear_rows(total, done[:, t])
        return torch.stack(outputs, 1), ToyState(total)


class ForgetsNothing(LeakySum):
    """A broken core: it ignores the episode ends inside a call."""

    def scan(self, x: Tensor, state: ToyState, mask: Tensor | None, done: Tensor | None):
        return super().scan(x, state, mask, None)


@pytest.fixture
def toy_cores(monkeypatch):
    """Register the toy cores for one test, as a module would with ``@register_model``."""
    registry._load()
    monkeypatch.setitem(registry.MODELS, "toy-leaky-sum", lambda dim, depth, num_heads, causal, **o: LeakySum(dim))
    monkeypatch.setitem(registry.MODELS, "toy-forgets", lambda dim, depth, num_heads, causal, **o: ForgetsNothing(dim))


# ---- the contract on every registered causal core -----------------------------------------------------


def build(name: str, seed: int = 0) -> CausalCore | None:
    """The registered model ``name``, small, float64, with the agents' options; None unless it is a causal
    core that takes episode ends inside a call (what an agent needs)."""
    from chronomem.rl.ppo import CORE_DEFAULTS

    torch.manual_seed(seed)
    try:
        core = build_backbone(name, dim=DIM, depth=2, num_heads=2, causal=True,
                           **{**CORE_DEFAULTS.get(name, {}), **SMALL.get(name, {})})
    except ValueError:  # a model with no causal form (BLRP)
        return None
    if not isinstance(core, CausalCore) or core.done_refused() is not None:
        return None
    return jitter_layer_norms_(core.double().eval())


def causal_cores() -> list[str]:
    return [name for name in names()["models"] if build(name) is not None]


def test_every_agent_core_is_found():
    """The cores the agents use are all CausalCores; the non-causal modules are not."""
    found = causal_cores()
    assert {"lstm", "mlp", "htm", "tlb", "transformer-xl", "gtrxl", "relevance-rnn", "relevance-lstm", "mem-rnn",
            "mem-lstm"} <= set(found)
    assert not {"transformer", "vit", "blrp"} & set(found)


def check_contract(name: str) -> None:
    core = build(name)
    generator = torch.Generator().manual_seed(1)
    x = randn64(BATCH, STEPS, DIM, seed=2)
    done = random_dones(BATCH, STEPS, generator, p=0.2)
    check_done_equals_reset(core, x, done)
    check_any_split(core, x, done, generator)
    check_select_concat(core, x, concat_states)
    # a done at a padded step is ignored: the same outputs and state as without it
    mask = torch.ones(BATCH, STEPS, dtype=torch.bool)
    mask[1:3, -3:] = False
    with torch.no_grad():
        y, state = core(x, mask=mask, done=done & mask)
        y_padded_done, state_padded_done = core(x, mask=mask, done=done | ~mask)
    torch.testing.assert_close(y_padded_done, y, atol=0, rtol=0)
    assert_same_state(state_padded_done, state, atol=0, name="state with dones at padded steps")
    assert (y[1:3, -3:] == 0).all()


@pytest.mark.parametrize("name", causal_cores())  # found at collection: every registered causal core
def test_contract(name):
    check_contract(name)


def test_contract_runs_on_a_new_core_without_its_own_tests(toy_cores):
    assert "toy-leaky-sum" in causal_cores()
    check_contract("toy-leaky-sum")


def test_contract_fails_a_core_that_ignores_episode_ends(toy_cores):
    with pytest.raises(AssertionError, match="done inside the call"):
        check_contract("toy-forgets")


def test_done_checked_once_for_every_core(toy_cores):
    """The base class checks ``done``: a bad one is the same clear error from every core."""
    x = randn64(BATCH, STEPS, DIM, seed=3)
    for name in causal_cores():
        core = build(name)
        with pytest.raises(TypeError, match=r"done must be a boolean tensor of shape \(4, 13\)"):
            core(x, done=torch.zeros(BATCH, STEPS))
        with pytest.raises(ValueError, match=r"done must have shape \(4, 13\)"):
            core(x, done=torch.zeros(BATCH, STEPS - 1, dtype=torch.bool))


def test_reset_checked_once_for_every_state(toy_cores):
    """``state.reset(done [B])`` rejects a bad ``done`` with the same error for every core's state."""
    for name in causal_cores():
        state = build(name).init_state(BATCH)
        with pytest.raises(TypeError, match=r"done must be a boolean tensor of shape \[B\]"):
            state.reset(torch.zeros(BATCH))
        with pytest.raises(ValueError, match="done has batch size 3, the state 4"):
            state.reset(torch.zeros(BATCH - 1, dtype=torch.bool))
