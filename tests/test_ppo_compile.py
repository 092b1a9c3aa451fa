"""``--compile``: PPO with the agent under torch.compile gives eager's actions, values and losses.

On the CPU the graphs are traced and differentiated with the ``aot_eager`` backend (no code generated):
what is tested is that every causal core goes through torch.compile (graph breaks included) and computes
the same function. Every core's acting steps run in ``make test``; a whole short run of every core is
``slow`` (``pytest -m slow tests/test_ppo_compile.py``), the LSTM's in ``make test``.
"""

from __future__ import annotations

import pytest
import torch
from tests.test_ppo import TINY, agent_and_envs, registry_cores, tiny_args

from chronomem.rl.acting import act, sampled
from chronomem.rl.ppo import compiled, train

COMPILE = dict(compile=True, compile_backend="aot_eager")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # each test compiles its own agent from scratch
    yield
    torch._dynamo.reset()


def assert_acts_as_eager(core: str, **compile_settings) -> None:
    """The agent compiled with ``compile_settings`` takes eager's sampled actions and values over six steps
    with episode ends between them, its weights shared."""
    agent, envs = agent_and_envs(core)
    try:
        model = compiled(agent, tiny_args(core, **compile_settings))
        assert model is not agent and next(model.parameters()) is next(agent.parameters())  # shared weights
        obs, _ = envs.reset(seed=[0, 1, 2, 3])
        eager_state = compiled_state = agent.initial_state(4, "cpu")
        with torch.inference_mode():
            for step in range(6):
                torch.manual_seed(step)
                action, _, value, eager_state, _ = act(agent, obs, eager_state, sampled)
                torch.manual_seed(step)
                same_action, _, same_value, compiled_state, _ = act(model, obs, compiled_state, sampled)
                assert torch.equal(action, same_action), (core, step)
                torch.testing.assert_close(same_value, value, atol=1e-5, rtol=1e-5)
                obs, _, terminated, truncated, _ = envs.step(action.numpy())
                done = torch.as_tensor(terminated | truncated)
                eager_state, compiled_state = eager_state.reset(done), compiled_state.reset(done)
    finally:
        envs.close()


@pytest.mark.parametrize("core", registry_cores())
def test_a_compiled_agent_acts_as_the_eager_one(core):
    assert_acts_as_eager(core, **COMPILE)


@pytest.mark.slow
@pytest.mark.parametrize("core", ["lstm", "htm"])
def test_an_agent_compiled_with_inductor_and_its_cpp_wrapper_acts_as_the_eager_one(core):
    """``--compile-cpp-wrapper``: inductor's generated kernels, called from generated C++."""
    assert_acts_as_eager(core, compile=True, compile_cpp_wrapper=True)


def test_the_cpp_wrapper_needs_inductor():
    with pytest.raises(ValueError, match="--compile-cpp-wrapper needs --compile-backend inductor, got 'aot_eager'"):
        compiled(torch.nn.Linear(2, 2), tiny_args("lstm", compile_cpp_wrapper=True, **COMPILE))


def test_without_compile_the_agent_is_itself():
    agent, envs = agent_and_envs("lstm")
    envs.close()
    assert compiled(agent, tiny_args("lstm")) is agent


def assert_same_runs(core: str) -> None:
    eager = train(tiny_args(core, total_frames=48 * 2), TINY.get(core, {}))
    torch._dynamo.reset()
    fast = train(tiny_args(core, total_frames=48 * 2, **COMPILE), TINY.get(core, {}))
    assert len(eager.history) == len(fast.history) == 2
    for a, b in zip(eager.history, fast.history, strict=True):
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "return_mean"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (core, key)
    for p, q in zip(eager.agent.parameters(), fast.agent.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-5, rtol=1e-4)


def test_a_compiled_run_learns_as_the_eager_one():
    assert_same_runs("lstm")


@pytest.mark.slow
@pytest.mark.parametrize("core", registry_cores())
def test_a_compiled_run_of_every_core_learns_as_the_eager_one(core):
    agent, envs = agent_and_envs(core)  # skips a core that cannot be an agent
    envs.close()
    assert_same_runs(core)
