"""rl/acting.py: the one acting loop. It ends an episode where the env says terminated or truncated,
resets exactly those rows of the agent's state before the next step, and hands back the state before
that reset; PPO's rollouts and the evaluation step through it."""

import numpy as np
import pytest
import torch

import chronomem.envs  # noqa: F401  (registers the ids below)
from chronomem.envs.make import make_env, make_vector_env
from chronomem.layers import concat_states
from chronomem.rl.acting import Acting, act, drawn, most_likely, obs_map, sampled

torch.set_num_threads(1)

CUE = "chronomem/CueRecall-v0"


def tiny_agent(env_id, core="lstm"):
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(env_id)
    args = Args(env=env_id, core=core, dim=8, depth=1, heads=2, hidden=8, num_envs=2, num_minibatches=1, device="cpu")
    torch.manual_seed(0)
    agent = make_agent(args, {}, env.observation_space, env.action_space).eval()
    env.close()
    return agent


def test_ended_rows_restart_and_the_others_carry_on():
    """Over many steps of 3 envs with episodes ending at different steps: every step's next state is the
    agent's state after the step with exactly the ended rows reset, and the state handed back is the one
    before the reset; a row whose episode ended acts next as a fresh agent would."""
    agent = tiny_agent(CUE)
    envs = make_vector_env(CUE, 3)
    obs, _ = envs.reset(seed=[0, 1, 2])
    acting = Acting(agent, envs, obs, agent.initial_state(3), choose=sampled)
    ends = 0
    for _ in range(60):
        before = acting.state
        step = acting.step()
        with torch.inference_mode():
            _, _, value, after, _ = act(agent, step.obs, before)
        torch.testing.assert_close(step.value, value, atol=0, rtol=0)
        torch.testing.assert_close(step.state.h, after.h, atol=0, rtol=0)  # handed back before the reset
        done = torch.as_tensor(step.done)
        assert torch.equal(acting.state.h[done], torch.zeros_like(acting.state.h[done]))
        assert torch.equal(acting.state.h[~done], after.h[~done])
        ends += int(done.sum())
    assert ends >= 3  # episodes ended in the run, in several rows
    envs.close()


def test_evaluation_and_rollouts_draw_the_same_actions_as_acting_by_hand():
    """The loop adds nothing to what a hand-written loop over the agent does (same seeds, same draws)."""
    agent = tiny_agent(CUE)
    for choose in (sampled, drawn, most_likely):
        actions = []
        for by_hand in (False, True):
            envs = make_vector_env(CUE, 2)
            obs, _ = envs.reset(seed=[5, 6])
            state = agent.initial_state(2)
            torch.manual_seed(1)
            acting, taken = Acting(agent, envs, obs, state, choose=choose), []
            for _ in range(30):
                if by_hand:
                    with torch.inference_mode():
                        action, _, _, state, _ = act(agent, obs, state, choose)
                    obs, _, term, trunc, _ = envs.step(action.numpy())
                    done = term | trunc
                    if done.any():
                        state = state.reset(torch.as_tensor(done))
                else:
                    action = acting.step().action
                taken.append(action.clone())
            actions.append(torch.stack(taken))
            envs.close()
        assert torch.equal(actions[0], actions[1])


def test_only_same_step_autoreset():
    import gymnasium as gym

    agent = tiny_agent(CUE)
    envs = gym.make_vec(CUE, 2, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    obs, _ = envs.reset(seed=0)
    with pytest.raises(ValueError, match="autoreset on the same step"):
        Acting(agent, envs, obs, agent.initial_state(2))
    envs.close()


def test_a_value_alone_draws_nothing():
    """A bootstrap's value (no ``choose``) leaves the random stream as it was."""
    agent = tiny_agent(CUE)
    env = make_env(CUE)
    obs, _ = env.reset(seed=0)
    batched = obs_map(lambda x: np.asarray(x)[None], obs)
    torch.manual_seed(3)
    with torch.inference_mode():
        action, logprob, _, _, _ = act(agent, batched, concat_states([agent.initial_state(1)]))
    assert action is None and logprob is None
    after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(3))
    env.close()


@pytest.mark.parametrize("core", ["transformer-xl", "htm"])
def test_one_acting_compares_the_parameters_once(core, monkeypatch):
    """The steps of one ``Acting`` are one fixed stretch (``layers.parameters_fixed``): a core that caches
    keys and values compares its parameters' values with the cached ones at the first step only, and the
    next ``Acting`` (after an update, in PPO) compares again and sees the change."""
    agent = tiny_agent(CUE, core)
    envs = make_vector_env(CUE, 2)
    obs, _ = envs.reset(seed=[0, 1])
    compared = []
    original = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or original(a, b))
    acting = Acting(agent, envs, obs, agent.initial_state(2))
    acting.step()  # the core's first comparison makes its copy: nothing to compare yet
    compared.clear()
    acting = Acting(agent, envs, acting.obs, acting.state)
    for _ in range(4):
        acting.step()
    once = len(compared)
    assert once > 0  # the first step compared each parameter tensor ...
    compared.clear()
    acting.step()
    assert not compared  # ... and no later step of the same Acting compares
    tags = acting.state.kv_version.clone()
    with torch.no_grad():
        for p in agent.core.parameters():
            p.add_(0.01)
    acting = Acting(agent, envs, acting.obs, acting.state)
    acting.step()
    envs.close()
    assert compared  # a new Acting compares again (up to the first parameter that changed) ...
    new_tags = acting.state.kv_version
    assert bool((new_tags[new_tags > 0] != tags.max()).all())  # ... and tags its cache with a new number
