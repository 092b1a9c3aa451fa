"""Recurrent PPO (chronomem.rl.ppo): replay == acting for every core, GAE against a naive loop, the
same-step autoreset and truncation bootstrap, a memory task solved, resume, and bad input."""

import csv
import math
import re

import numpy as np
import pytest
import torch

from chronomem.envs.make import make_vector_env
from chronomem.registry import MODELS, _load
from chronomem.rl.ppo import (
    Args,
    DeadHeadsWatch,
    Rollout,
    StallWatch,
    as_windows,
    collect,
    differentiable_on_cudnn,
    gae,
    learn,
    make_agent,
    make_optimizer,
    obs_map,
    replay,
    replay_windows,
    train,
)

pytest.importorskip("gymnasium")
torch.set_num_threads(1)

CUE = "chronomem/CueRecall-v0"
# Episodes of 2..7 steps, cut by a time limit of 5: terminations and truncations at different steps.
STAGGERED = {"random_delay": True, "delay": 6, "max_episode_steps": 5}
# Tiny options of each core, so that its memory fills, slides or chunks within a rollout of 12 steps.
TINY = {
    "relevance-rnn": {"buffer_size": 2, "relevant_size": 2},
    "relevance-lstm": {"buffer_size": 2, "relevant_size": 2},
    "transformer-xl": {"mem_len": 6},
    "gtrxl": {"mem_len": 6},
    "tlb": {"chunk_size": 4, "num_state": 4, "self_per_cross": 1},
    "htm": {"chunk_size": 4, "memory_size": 4, "top_k": 2},
}
# make_agent's refusals: a core that cannot be an agent's memory (yet) is skipped with its reason.
UNUSABLE = re.compile(r"does not take episode ends|keeps no state|no causal variant")


def tiny_args(core: str = "lstm", **changes) -> Args:
    values = dict(env=CUE, core=core, dim=16, depth=1, heads=2, hidden=16, num_envs=4, num_steps=12,
                  num_minibatches=2, update_epochs=1, total_frames=48, progress=False)
    return Args(**{**values, **changes})


def agent_and_envs(core: str, seed: int = 0, num_envs: int = 4):
    envs = make_vector_env(CUE, num_envs, **STAGGERED)
    torch.manual_seed(seed)
    try:
        agent = make_agent(tiny_args(core, num_envs=num_envs), TINY.get(core, {}), envs.single_observation_space,
                           envs.single_action_space)
    except ValueError as err:
        envs.close()
        if UNUSABLE.search(str(err)):
            pytest.skip(f"{core}: {err}")
        raise
    return agent.eval(), envs


def registry_cores() -> list[str]:
    _load()
    return sorted(MODELS)


@pytest.mark.parametrize("core", registry_cores())
def test_replay_recomputes_the_acting_log_probabilities_and_values(core):
    """The learner's replay (one call per minibatch of whole env sequences, from the rollout's start
    state, with done inside) gives the log-probabilities and values recorded while acting one step at
    a time: any state-handling difference between acting and learning shows here."""
    agent, envs = agent_and_envs(core)
    obs, _ = envs.reset(seed=[11, 12, 13, 14])
    state = agent.initial_state(4)
    _, obs, state = collect(agent, envs, obs, state, 12)  # the second rollout starts mid-episode
    rollout, _, _ = collect(agent, envs, obs, state, 12)
    envs.close()
    assert rollout.terminated.any() and rollout.truncated.any()
    assert rollout.done[:, :-1].any(0).sum() >= 2  # episode ends inside the replayed call
    with torch.no_grad():
        for rows in ([0, 1], [2, 3], [3, 0]):
            rows = torch.tensor(rows)
            logprobs, entropy, values, _ = replay(agent, rollout, rows)
            torch.testing.assert_close(logprobs, rollout.logprobs[rows], atol=1e-5, rtol=0)
            torch.testing.assert_close(values, rollout.values[rows], atol=1e-5, rtol=0)
            assert (entropy > 0).all()


@pytest.mark.parametrize("core", registry_cores())
def test_after_an_update_acting_still_computes_what_the_learner_replays(core):
    """An update with PPO's own optimiser (fused Adam, which bumps no version counter) between two
    rollouts, the acting state carried across it: the second rollout's acting log-probabilities and
    values equal the replay's, so nothing a core keeps in its state or module (Transformer-XL's memory
    keys, HTM's local keys and values, ``W_kr R``) outlives the parameters it was computed with."""
    agent, envs = agent_and_envs(core)
    args = tiny_args(core, lr=0.05, update_epochs=2)
    obs, _ = envs.reset(seed=[21, 22, 23, 24])
    state = agent.initial_state(4)
    rollout, obs, state = collect(agent, envs, obs, state, 12)
    before = [p.detach().clone() for p in agent.parameters()]
    learn(agent, make_optimizer(agent, args, torch.device("cpu")), rollout, *gae(rollout, args.gamma, args.gae_lambda),
          args)
    assert max((p - b).abs().max() for p, b in zip(agent.parameters(), before, strict=True)) > 1e-3
    rollout, _, _ = collect(agent, envs, obs, state, 12)
    envs.close()
    logprobs, _, values, _ = replay(agent, rollout, torch.arange(4))  # with gradients, as the learner does
    torch.testing.assert_close(logprobs.detach(), rollout.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(values.detach(), rollout.values, atol=1e-5, rtol=0)


@pytest.mark.parametrize("core", ["lstm", "transformer-xl", "tlb", "htm", "relevance-lstm", "mem-lstm"])
def test_replay_in_windows_starts_each_from_the_state_stored_while_acting(core):
    """recurrence = 4 of T = 12: the three windows of each row are replayed side by side, each from the
    state the agent had at its first step, so the replay still gives the acting log-probabilities and
    values, episode ends inside and across windows included."""
    agent, envs = agent_and_envs(core)
    obs, _ = envs.reset(seed=[11, 12, 13, 14])
    _, obs, state = collect(agent, envs, obs, agent.initial_state(4), 12)
    rollout, _, _ = collect(agent, envs, obs, state, 12, window=4)
    envs.close()
    assert rollout.window == 4 and rollout.done[:, :-1].any(0).sum() >= 2
    with torch.no_grad():
        for rows in ([0, 1], [3, 0], [2]):
            logprobs, _, values, _ = replay(agent, rollout, torch.tensor(rows))
            torch.testing.assert_close(logprobs, rollout.logprobs[rows], atol=1e-5, rtol=0)
            torch.testing.assert_close(values, rollout.values[rows], atol=1e-5, rtol=0)
        # --minibatch windows: any set of windows, from any envs and times, replays as acted
        for windows in ([5, 0, 11], [2, 7], [9]):  # index w * B + b
            windows = torch.tensor(windows)
            logprobs, _, values, _ = replay_windows(agent, rollout, windows)
            torch.testing.assert_close(logprobs, as_windows(rollout.logprobs, 4)[windows], atol=1e-5, rtol=0)
            torch.testing.assert_close(values, as_windows(rollout.values, 4)[windows], atol=1e-5, rtol=0)
            b, w = windows % 4, windows // 4
            torch.testing.assert_close(values[:, 0], rollout.values[b, 4 * w], atol=1e-5, rtol=0)


def test_no_gradient_crosses_a_window_start():
    """Truncated back-propagation: the values of the second window do not depend, through the memory, on
    the observations of the first; replayed whole, they do."""
    agent, envs = agent_and_envs("lstm")
    obs, _ = envs.reset(seed=[1, 2, 3, 4])
    whole, _, _ = collect(agent, envs, obs, agent.initial_state(4), 8)
    obs, _ = envs.reset(seed=[1, 2, 3, 4])
    agent_state = agent.initial_state(4)
    windows, _, _ = collect(agent, envs, obs, agent_state, 8, window=4)
    envs.close()
    for rollout, crosses in ((whole, True), (windows, False)):
        rollout.obs = rollout.obs.float().requires_grad_(True)
        _, _, values, _ = replay(agent, rollout, torch.arange(4))
        values[:, 4:].sum().backward()
        reached = rollout.obs.grad[:, :4].abs().sum() > 0
        assert bool(reached) == crosses


@pytest.mark.parametrize("core", registry_cores())
def test_replay_after_the_previous_tail_recomputes_the_acting_log_probabilities_and_values(core):
    """replay_context: the replay runs the previous rollout's last K steps first, from the state stored at
    their start, and drops their outputs; with the acting weights it rebuilds the state the rollout started
    from, so the rollout's log-probabilities and values are the acted ones: with K = 2 of 12 (an episode runs
    through some row's whole tail into the rollout, so the stored state counts) and K = 12 (the whole previous
    rollout, episode ends inside)."""
    agent, envs = agent_and_envs(core)
    obs, _ = envs.reset(seed=[31, 32, 33, 34])
    state = agent.initial_state(4)
    for steps in (2, 12):
        previous, obs, state = collect(agent, envs, obs, state, 12, context_steps=steps)
        rollout, obs, state = collect(agent, envs, obs, state, 12, context=previous.tail(steps))
        ended = rollout.context.done.any(1)  # per row: an episode ended in its tail
        assert rollout.context.done.shape == (4, steps) and ended.any() and (steps == 12 or not ended.all())
        with torch.no_grad():
            for rows in ([0, 1], [3, 2, 0]):
                logprobs, _, values, _ = replay(agent, rollout, torch.tensor(rows))
                torch.testing.assert_close(logprobs, rollout.logprobs[rows], atol=1e-5, rtol=0)
                torch.testing.assert_close(values, rollout.values[rows], atol=1e-5, rtol=0)
    envs.close()


def test_the_replay_context_carries_the_gradient_back_to_the_current_episodes_start():
    """The values at a rollout's first step depend, through the LSTM's state, on the context's steps of the
    episode running there, and on none before its start (an episode end in the context resets the state)."""
    agent, envs = agent_and_envs("lstm")
    obs, _ = envs.reset(seed=[5, 6, 7, 8])
    previous, obs, state = collect(agent, envs, obs, agent.initial_state(4), 12, context_steps=8)
    rollout, _, _ = collect(agent, envs, obs, state, 12, context=previous.tail(8))
    envs.close()
    rollout.obs = rollout.obs.float()
    context = rollout.context
    context.obs = context.obs.float().requires_grad_(True)
    _, _, values, _ = replay(agent, rollout, torch.arange(4))
    values[:, 0].sum().backward()
    reached = context.obs.grad.flatten(2).abs().sum(-1) > 0  # [B, K]
    for row in range(4):
        ends = torch.nonzero(context.done[row]).flatten().tolist()
        start = ends[-1] + 1 if ends else 0  # the context's first step of the episode running at step 0
        assert reached[row].tolist() == [step >= start for step in range(8)]
    assert reached.any() and not reached.all()


def test_replay_context_trains_and_is_checked():
    result = train(tiny_args(replay_context=5, total_frames=96))
    assert result.frames == 96 and all(np.isfinite(row["approx_kl"]) for row in result.history)
    with pytest.raises(ValueError, match="--replay-context replays whole rollouts: .* --recurrence 4"):
        tiny_args(replay_context=4, recurrence=4)
    with pytest.raises(ValueError, match="--replay-context must be at most --num-steps 12"):
        tiny_args(replay_context=13)
    agent, envs = agent_and_envs("lstm")
    obs, _ = envs.reset(seed=[1, 2, 3, 4])
    rollout, _, _ = collect(agent, envs, obs, agent.initial_state(4), 12)
    envs.close()
    with pytest.raises(ValueError, match="kept no tail state"):
        rollout.tail(4)


def test_recurrence_must_divide_the_rollout():
    with pytest.raises(ValueError, match="--recurrence must be a positive integer that divides --num-steps 12"):
        tiny_args(recurrence=5)


def test_window_minibatches_train_and_must_divide_the_windows():
    """torch-ac's minibatches (windows from every env and time): 4 envs x 3 windows of 4 steps in 3
    minibatches of 4 windows, where env minibatches could not split 4 envs in 3."""
    result = train(tiny_args(recurrence=4, minibatch="windows", num_minibatches=3, total_frames=96))
    assert result.frames == 96 and all(np.isfinite(row["approx_kl"]) for row in result.history)
    with pytest.raises(ValueError, match="must divide the rollout's 12 windows"):
        tiny_args(recurrence=4, minibatch="windows", num_minibatches=5)
    with pytest.raises(ValueError, match="--minibatch must be one of envs, windows"):
        tiny_args(minibatch="steps")
    assert tiny_args(recurrence=4).recurrence == 4


def test_the_update_differentiates_an_lstm_in_training_mode_and_replays_the_acting_function(device):
    """cuDNN differentiates an nn.LSTM only in training mode, and the agent acts in eval mode: for the
    update its dropout-free RNNs switch to training mode (the same function), then back. On a GPU
    (CHRONOMEM_TEST_DEVICE=cuda) the backward below is the one that failed in eval mode."""
    agent, envs = agent_and_envs("lstm")
    agent.to(device)
    obs, _ = envs.reset(seed=[11, 12, 13, 14])
    rollout, _, _ = collect(agent, envs, obs, agent.initial_state(4, device), 12)
    envs.close()
    rnns = [m for m in agent.modules() if isinstance(m, torch.nn.RNNBase)]
    assert rnns and not any(m.training for m in rnns)
    with differentiable_on_cudnn(agent):
        assert all(m.training for m in rnns) and not agent.training
        logprobs, _, values, _ = replay(agent, rollout, torch.arange(4, device=device))
        (logprobs.sum() + values.sum()).backward()
    assert not any(m.training for m in rnns)
    torch.testing.assert_close(logprobs.detach(), rollout.logprobs, atol=1e-5, rtol=0)
    assert all(p.grad is not None for p in rnns[0].parameters())


def naive_gae(r, v, term, trunc, final, next_v, gamma, lam):
    """Per env and per step: the discounted sum of TD errors up to the episode's end or the rollout's."""
    B, T = r.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                after = final[b, k] if trunc[b, k] else 0.0 if term[b, k] else (v[b, k + 1] if k + 1 < T else next_v[b])
                total += weight * (r[b, k] + gamma * after - v[b, k])
                if term[b, k] or trunc[b, k]:
                    break
                weight *= gamma * lam
            adv[b, t] = total
    return adv


def random_rollout(seed: int, B: int = 3, T: int = 9) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(B, T, generator=g) < 0.2
    trunc = (torch.rand(B, T, generator=g) < 0.2) & ~term
    term[0, -1], trunc[0, -1], trunc[1, 3], term[1, 3] = True, False, True, False
    final = torch.where(trunc, torch.randn(B, T, generator=g, dtype=torch.float64), 0.0)
    return Rollout(obs=None, actions=torch.zeros(B, T, dtype=torch.long), logprobs=torch.zeros(B, T),
                   values=torch.randn(B, T, generator=g, dtype=torch.float64),
                   rewards=torch.randn(B, T, generator=g, dtype=torch.float64), terminated=term, truncated=trunc,
                   final_values=final, next_value=torch.randn(B, generator=g, dtype=torch.float64), state=None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_a_naive_loop_with_dones_and_truncations(seed):
    r = random_rollout(seed)
    advantages, returns = gae(r, 0.9, 0.8)
    expected = naive_gae(r.rewards, r.values, r.terminated, r.truncated, r.final_values, r.next_value, 0.9, 0.8)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + r.values)
    # a truncated step bootstraps with the final observation's value; a terminal one with 0
    assert advantages[1, 3] == pytest.approx(float(r.rewards[1, 3] + 0.9 * r.final_values[1, 3] - r.values[1, 3]))
    assert advantages[0, -1] == pytest.approx(float(r.rewards[0, -1] - r.values[0, -1]))


class RecordingEnvs:
    """A vector env that keeps every step's ``info["final_obs"]``."""

    def __init__(self, envs):
        self.envs, self.final_obs = envs, []

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        out = self.envs.step(actions)
        self.final_obs.append(out[4].get("final_obs"))
        return out


def test_every_call_of_a_rollout_has_the_acting_shape_truncation_bootstraps_included():
    """A truncation is valued in a call of the whole batch (the other rows' values dropped), not of the
    truncated rows alone: a compiled agent (static shapes) then compiles no graph per number of rows."""
    agent, envs = agent_and_envs("lstm", seed=3)
    shapes = []

    class Recorded:  # the agent, noting the shape of every observation it is called on
        def parameters(self):
            return agent.parameters()

        def __call__(self, obs, state):
            shapes.append(tuple(obs.shape[:2]))
            return agent(obs, state)

    obs, _ = envs.reset(seed=[1, 2, 3, 4])
    rollout, _, _ = collect(Recorded(), envs, obs, agent.initial_state(4), 16)
    envs.close()
    assert rollout.truncated.any()
    assert len(shapes) == 16 + int(rollout.truncated.any(0).sum()) + 1  # steps, bootstraps, the next value
    assert set(shapes) == {(4, 1)}


def test_same_step_autoreset_and_truncation_bootstrap():
    """The step that ends an episode returns the next episode's first observation; the rollout keeps it
    as the next step's input, resets the state there, bootstraps a truncation with the value of the
    final observation under the ended episode's memory, and GAE stops at every episode's end."""
    agent, envs = agent_and_envs("lstm", seed=3)
    recording = RecordingEnvs(envs)
    obs, _ = envs.reset(seed=[1, 2, 3, 4])
    rollout, _, _ = collect(agent, recording, obs, agent.initial_state(4), 16)
    envs.close()
    done = rollout.done
    assert rollout.truncated.any() and rollout.terminated.any()
    fresh = agent.initial_state(1)
    with torch.no_grad():
        for b, t in done[:, :-1].nonzero().tolist():
            first = rollout.obs[b, t + 1]
            assert first[:-1].sum() == 1 and first[-1] == 0  # a new episode's cue, as Gymnasium returns it
            _, value, _ = agent(first[None, None], fresh)  # the memory starts empty there
            assert float(value) == pytest.approx(float(rollout.values[b, t + 1]), abs=1e-5)
        for b, t in rollout.truncated.nonzero().tolist():  # each episode starts from the initial state
            start = int(done[b, :t].nonzero().max()) + 1 if done[b, :t].any() else 0
            episode = torch.cat([rollout.obs[b, start : t + 1], torch.as_tensor(recording.final_obs[t][b])[None]])
            _, values, _ = agent(episode[None], fresh)
            assert float(values[0, -1]) == pytest.approx(float(rollout.final_values[b, t]), abs=1e-5)
            assert float(values[0, -1]) != pytest.approx(float(rollout.values[b, t]), abs=1e-5)
        assert (rollout.final_values[~rollout.truncated] == 0).all()
    advantages, _ = gae(rollout, 0.99, 0.95)
    shifted = Rollout(**{**rollout.__dict__, "rewards": rollout.rewards.clone(), "values": rollout.values.clone()})
    for b, t in done[:, :-1].nonzero().tolist():  # change the step after every end: nothing before it moves
        shifted.rewards[b, t + 1] += 10.0
        shifted.values[b, t + 1] += 10.0
    changed, _ = gae(shifted, 0.99, 0.95)
    torch.testing.assert_close(changed[done], advantages[done])


def test_timeout_as_failure_ends_the_return_at_the_time_limit():
    """``timeout="failure"``: the same actions and episodes, every truncation stored as a termination,
    so GAE bootstraps nothing there (the return ends with what the env paid)."""
    rollouts = []
    for timeout in ("truncation", "failure"):
        agent, envs = agent_and_envs("lstm", seed=3)
        torch.manual_seed(0)
        obs, _ = envs.reset(seed=[1, 2, 3, 4])
        rollouts.append(collect(agent, envs, obs, agent.initial_state(4), 16, timeout=timeout)[0])
        envs.close()
    bootstrapped, failed = rollouts
    assert bootstrapped.truncated.any() and not failed.truncated.any()
    torch.testing.assert_close(failed.actions, bootstrapped.actions)
    assert torch.equal(failed.terminated, bootstrapped.terminated | bootstrapped.truncated)
    assert (failed.final_values == 0).all()
    returns = gae(failed, 0.99, 0.95)[1]
    ends = bootstrapped.truncated
    torch.testing.assert_close(returns[ends], failed.rewards[ends])  # lambda-return at an end: the reward alone
    with pytest.raises(ValueError, match="--timeout must be one of truncation, failure"):
        tiny_args(timeout="never")


def test_stall_watch_needs_a_low_kl_streak_and_a_flat_return():
    watch = StallWatch(updates=4, kl=1e-4)
    assert not any(watch.step(1e-5, [0.5, 0.5]) for _ in range(3))
    assert not watch.step(1e-3, [0.5, 0.5])  # a moving update breaks the streak
    assert not any(watch.step(1e-5, [0.5, 0.4]) for _ in range(3))
    assert watch.step(1e-5, [0.4, 0.5]) and watch.warned  # four in a row, the return flat: said once
    assert not watch.step(1e-5, [0.5])
    rising = StallWatch(updates=4, kl=1e-4)  # a low KL while the return climbs is learning, not a stall
    assert not any(rising.step(1e-5, [r, r + 0.01]) for r in (0.0, 0.0, 1.0, 1.0))
    assert not StallWatch(updates=0, kl=1e-4).step(0.0, [])
    # a converged policy (entropy below half of log 4) is not stalled, however still; near uniform, it is
    solved = StallWatch(updates=4, kl=1e-4, max_entropy=math.log(4))
    assert not any(solved.step(0.0, [1.0, 1.0], entropy=0.01) for _ in range(8))
    assert [solved.step(0.0, [1.0, 1.0], entropy=1.3) for _ in range(4)] == [False, False, False, True]
    # the end of an annealed schedule (learning rate below a tenth of its start) stops a policy by design
    settling = StallWatch(updates=4, kl=1e-4)
    assert not any(settling.step(0.0, [0.5, 0.5], lr_fraction=f) for f in (0.09, 0.06, 0.03, 0.01, 0.0))
    assert [settling.step(0.0, [0.5, 0.5], lr_fraction=0.5) for _ in range(4)] == [False, False, False, True]


def test_a_stalled_run_says_so_once_in_the_progress_and_in_metrics(tmp_path, capsys):
    """A learning rate that cannot move the policy: the run says so once (stderr and metrics.csv)."""
    out = tmp_path / "run"
    train(tiny_args(lr=1e-9, total_frames=48 * 8, stall_updates=3, out=str(out), progress=True))
    err = capsys.readouterr().err
    assert err.count("the policy has stalled") == 1 and "--norm-adv" in err, err
    rows = read_metrics(out / "metrics.csv")
    assert [row["update"] for row in rows if row.get("stalled") == "1"] == ["3"]
    train(tiny_args(lr=1e-9, total_frames=48 * 8, stall_updates=0, out=str(tmp_path / "off"), progress=True))
    assert "stalled" not in capsys.readouterr().err


def test_heads_watched_reports_what_the_heads_read():
    """The core's output norm and the share of each head's units passing no gradient, against a hand
    computation; tanh heads saturate on a large output where ReLU heads keep about half their units."""
    from chronomem.agents import SATURATED, heads_watched

    agent, envs = agent_and_envs("lstm")
    obs, _ = envs.reset(seed=0)
    envs.close()
    obs = obs_map(lambda x: torch.as_tensor(x)[:, None], obs)
    with torch.no_grad():
        y, _ = agent.core(agent.encoder(obs))
        with heads_watched(agent) as seen:
            agent(obs)
    hidden = torch.tanh(agent.actor[0](y)), torch.tanh(agent.critic[0](y))
    assert seen["core_output_norm"] == pytest.approx(y.norm(dim=-1).mean().item(), rel=1e-5)
    assert seen["heads_no_gradient_policy"] == pytest.approx((hidden[0].abs() > SATURATED).float().mean().item())
    assert seen["heads_no_gradient_value"] == pytest.approx((hidden[1].abs() > SATURATED).float().mean().item())
    assert not agent.core._forward_hooks and not agent.actor[1]._forward_hooks  # removed on leaving
    large = torch.randn(4, 3, 16) * 1e3  # an output grown large: every tanh unit saturated, ReLU's half at 0
    for head in (agent.actor, agent.critic):
        hidden = head[1](head[0](large))
        assert (hidden.abs() > SATURATED).float().mean() == 1.0
        assert 0.2 < (torch.relu(head[0](large)) == 0).float().mean() < 0.8


def test_dead_heads_are_said_once_in_the_progress_and_in_metrics(tmp_path, capsys, monkeypatch):
    """Heads whose first layer is scaled up saturate every unit from the start: the run says so once, and
    metrics.csv logs the shares; a run with the usual heads does not warn."""
    from chronomem.agents import ActorCritic

    watch = DeadHeadsWatch(updates=2)
    full = {"heads_no_gradient_policy": 1.0, "heads_no_gradient_value": 1.0, "core_output_norm": 50.0}
    assert [watch.step(full), watch.step({**full, "heads_no_gradient_policy": 0.5}), watch.step(full),
            watch.step(full), watch.step(full)] == [False, False, False, True, False]
    assert not DeadHeadsWatch(updates=0).step(full) and not DeadHeadsWatch(updates=1).step({})
    train(tiny_args(total_frames=48 * 4, stall_updates=3, out=str(tmp_path / "usual"), progress=True))
    assert "no gradient" not in capsys.readouterr().err
    usual = read_metrics(tmp_path / "usual" / "metrics.csv")
    assert all(0 <= float(row[k]) < 1 for row in usual for k in ("heads_no_gradient_policy", "heads_no_gradient_value"))
    mlp = ActorCritic._mlp

    def scaled(width, hidden, out, out_gain, activation):
        layers = mlp(width, hidden, out, out_gain, activation)
        layers[0].weight.data *= 1e4
        return layers

    monkeypatch.setattr(ActorCritic, "_mlp", staticmethod(scaled))
    train(tiny_args(total_frames=48 * 4, stall_updates=3, out=str(tmp_path / "dead"), progress=True))
    err = capsys.readouterr().err
    assert err.count("the heads pass the core almost no gradient") == 1 and "final_norm=True" in err, err
    rows = read_metrics(tmp_path / "dead" / "metrics.csv")
    assert all(float(row["heads_no_gradient_policy"]) >= DeadHeadsWatch.SHARE for row in rows)


def test_a_memoryless_agent_stays_at_chance_where_the_lstm_recalls_the_cue():
    """The same settings as the LSTM's CueRecall test above: the memoryless core (``mlp``) cannot carry
    the cue to the question and stays near 0.5, the return of guessing."""
    args = Args(env=CUE, core="mlp", dim=32, hidden=32, num_envs=8, num_steps=16, num_minibatches=2,
                total_frames=6400, lr=5e-3, seed=1, log_every=2, progress=False)
    returns = [row["return_mean"] for row in train(args).history]
    assert max(returns[-3:]) <= 0.75, returns


def test_collect_refuses_next_step_autoreset():
    import gymnasium as gym

    agent, envs = agent_and_envs("lstm")
    envs.close()
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(CUE)] * 2)  # Gymnasium's default: NEXT_STEP
    obs, _ = envs.reset(seed=0)
    with pytest.raises(ValueError, match="autoreset on the same step"):
        collect(agent, envs, obs, agent.initial_state(2), 4)
    envs.close()


def test_ppo_with_an_lstm_solves_cue_recall():
    """A cue at step 0, asked for at step 5: a memoryless policy earns 0.5, the LSTM agent ~1."""
    args = Args(env=CUE, core="lstm", dim=32, hidden=32, num_envs=8, num_steps=16, num_minibatches=2,
                total_frames=6400, lr=5e-3, seed=1, log_every=2, progress=False)
    result = train(args)
    returns = [row["return_mean"] for row in result.history]
    assert returns[0] < 0.8 and min(returns[-2:]) >= 0.9, returns


def read_metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_resume_continues_the_run(tmp_path):
    out = tmp_path / "run"
    args = tiny_args(total_frames=96, checkpoint_every=1, out=str(out))
    first = train(args)
    assert first.frames == 96
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert checkpoints == ["step_00000048", "step_00000096"]
    resumed = train(tiny_args(total_frames=192, checkpoint_every=1, out=str(out)), resume=out)
    assert resumed.frames == 192 and resumed.seconds >= first.seconds
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [48, 96, 144, 192]
    assert resumed.history[:2] == first.history  # the whole run's history: curves and MMER span it
    assert [r["step"] for r in resumed.history] == [48, 96, 144, 192]
    # from an earlier checkpoint: the later rows and checkpoints are set aside, the run goes on from there
    again = train(tiny_args(total_frames=192, checkpoint_every=1, out=str(out)), resume=out / "checkpoints" /
                  "step_00000144")
    assert again.frames == 192
    assert (out / "checkpoints" / "step_00000192.discarded").is_dir()
    assert [int(r["step"]) for r in read_metrics(out / "metrics.csv")] == [48, 96, 144, 192]
    with pytest.raises(ValueError, match="--total-frames 48 is below the checkpoint's 192 frames"):
        train(tiny_args(total_frames=48, out=str(out)), resume=out)


@pytest.mark.parametrize("change, message", [
    ({"num_minibatches": 3}, "--num-minibatches 3 must divide --num-envs 4"),
    ({"num_envs": 0}, "--num-envs must be a positive integer, got 0"),
    ({"gamma": 1.5}, r"--gamma must be in \[0.0, 1.0\], got 1.5"),
    ({"lr": -1.0}, r"--lr must be a number > 0.0, got -1.0"),
    ({"lr": float("inf")}, r"--lr must be a number > 0.0, got inf"),
    ({"clip_coef": 0.0}, r"--clip-coef must be a number > 0.0, got 0.0"),
    ({"ent_coef": -0.1}, r"--ent-coef must be a number >= 0.0, got -0.1"),
    ({"target_kl": 0.0}, r"--target-kl must be a number > 0.0 \(or None\), got 0.0"),
    ({"update_epochs": 2.5}, "--update-epochs must be a positive integer, got 2.5"),
    ({"dim": True}, "--dim must be a positive integer, got True"),
    ({"stall_updates": -1}, "--stall-updates must be an integer >= 0, got -1"),
    ({"num_envs": 1, "num_minibatches": 1, "num_steps": 1}, "at least 2 steps"),
])
def test_bad_hyper_parameters_are_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        tiny_args(**change)


def test_unknown_core_and_env_are_clear_errors():
    with pytest.raises(ValueError, match="unknown model 'nope'; valid names: .*lstm"):
        train(tiny_args(core="nope"))
    with pytest.raises(ValueError, match="--env 'MiniGrid-DoorKey-5x5-v9' is not a registered.*DoorKey-5x5-v0"):
        train(tiny_args(env="MiniGrid-DoorKey-5x5-v9"))


def test_a_core_without_state_or_done_is_refused_by_name():
    envs = make_vector_env(CUE, 2)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    with pytest.raises(ValueError, match="core 'transformer' keeps no state between calls"):
        make_agent(tiny_args("transformer"), {}, *spaces)
    with pytest.raises(ValueError, match="core 'transformer-xl' does not take episode ends inside a call.*sliding"):
        make_agent(tiny_args("transformer-xl"), {"memory_mode": "segment"}, *spaces)
    with pytest.raises(TypeError, match="--core lstm .*unknown argument"):
        make_agent(tiny_args("lstm"), {"nope": 1}, *spaces)


def test_head_activation_builds_the_heads_and_is_saved_with_the_run(tmp_path):
    """--head-activation relu gives paper 001's ReLU heads (the same weights as tanh's from the same seed: only
    the nonlinearity differs), a large input cannot saturate them, and a run rebuilds them from its config."""
    from chronomem.agents import HEAD_ACTIVATIONS, ActorCritic
    from chronomem.rl.evaluate import load_agent
    from chronomem.rl.settings import HEAD_ACTIVATIONS as NAMES

    assert set(NAMES) == set(HEAD_ACTIVATIONS)
    envs = make_vector_env(CUE, 2)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    agents = {}
    for name in NAMES:
        torch.manual_seed(0)
        agents[name] = make_agent(tiny_args(head_activation=name), {}, *spaces)
    tanh, relu = agents["tanh"], agents["relu"]
    assert isinstance(tanh.actor[1], torch.nn.Tanh) and isinstance(relu.critic[1], torch.nn.ReLU)
    assert all(torch.equal(a, b) for a, b in zip(tanh.state_dict().values(), relu.state_dict().values(), strict=True))
    big = 100 * torch.randn(64, 16)  # a core's output of norm ~400: every tanh unit saturated, ReLU's scaled
    assert (tanh.actor[:2](big).abs() > 0.99).float().mean() > 0.9
    assert torch.allclose(relu.actor(big), 100 * relu.actor(big / 100) - 99 * relu.actor[2].bias, atol=1e-3)
    with pytest.raises(ValueError, match="head_activation must be one of .*got 'gelu'"):
        ActorCritic(tanh.encoder, tanh.core, 2, head_activation="gelu")
    with pytest.raises(ValueError, match="--head-activation must be one of"):
        tiny_args(head_activation="gelu")
    train(tiny_args(head_activation="relu", out=str(tmp_path / "run")))
    loaded, args, _ = load_agent(tmp_path / "run", device="cpu")
    assert args.head_activation == "relu" and isinstance(loaded.actor[1], torch.nn.ReLU)


def test_obs_map_handles_arrays_and_dicts():
    assert obs_map(lambda x: x + 1, np.zeros(2)).tolist() == [1, 1]
    assert obs_map(lambda x: x * 2, {"a": np.ones(1)})["a"].tolist() == [2]


def test_a_stop_flag_counts_only_on_rows_with_enough_ended_episodes():
    from chronomem.rl.ppo import stop_reached

    args = tiny_args(stop_return=0.9, stop_length=80)  # 4 envs: 4 episodes by default
    row = {"return_mean": 1.0, "length_mean": 70.0}
    assert not stop_reached({**row, "episodes": 3}, args)  # three quick ones of a first rollout
    assert stop_reached({**row, "episodes": 4}, args)
    assert not stop_reached({**row, "episodes": 8, "length_mean": 81.0}, args)  # both must hold
    assert stop_reached({**row, "episodes": 1}, tiny_args(stop_return=0.9, stop_episodes=1))
    with pytest.raises(ValueError, match="--stop-episodes must be a positive integer"):
        tiny_args(stop_return=0.9, stop_episodes=0)


def test_stop_return_ends_the_run_at_the_first_logged_row_that_reaches_it():
    stopped = train(tiny_args(total_frames=48 * 4, stop_return=0.0))
    assert stopped.frames == 48 and len(stopped.history) == 1  # every mean return is >= 0
    full = train(tiny_args(total_frames=48 * 4, stop_return=1.5))  # out of reach: the whole run
    assert full.frames == 48 * 4 and len(full.history) == 4
