"""Agents on Visual Match and Key-to-Door: the success each episode reports reaches PPO's log and the
evaluation, apart from the apples, and an agent's encoder reads the grids."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from tests.test_rl_evaluate import tiny_agent  # noqa: E402

from chronomem.envs.tvt import key_to_door_id, visual_match_id  # noqa: E402
from chronomem.rl.ppo import EpisodeTracker, reduce_stats  # noqa: E402


def test_the_tracker_keeps_the_reported_successes_of_ended_episodes():
    tracker = EpisodeTracker(3)
    tracker.step(np.array([1.0, 2.0, 3.0]), np.array([False, False, False]), {})
    final = {"success": np.array([True, False, False]), "_success": np.array([True, False, True])}
    tracker.step(np.array([10.0, 0.0, 1.0]), np.array([True, False, True]), {"final_info": final})
    finished, successes, whole = tracker.take()
    assert finished == [(11.0, 2), (4.0, 2)] and successes == [1.0, 0.0] and whole == []
    assert tracker.take() == ([], [], [])
    # a truncation ends no game: its row reports no success and counts for the return alone
    tracker.step(np.zeros(3), np.array([True, False, False]), {"final_info": {"phase": np.array([2, 0, 0])}})
    assert tracker.take() == ([(0.0, 1)], [], [])


def test_the_tracker_says_which_episodes_lay_whole_in_one_replayed_window():
    tracker = EpisodeTracker(2)
    tracker.step(np.zeros(2), np.array([False, False]), window_steps=3)  # the window's third step
    tracker.step(np.zeros(2), np.array([True, False]), window_steps=1)  # a new window: row 0's 2 steps straddle it
    tracker.step(np.zeros(2), np.array([True, True]), window_steps=2)  # row 0's 1 step inside; row 1's 3 not
    assert tracker.take()[2] == [0.0, 1.0, 0.0]
    tracker.step(np.zeros(2), np.array([False, True]), window_steps=3)  # row 1: 1 step in a window of 3 so far
    assert tracker.take()[2] == [1.0]


def test_a_logged_row_has_the_success_rate_of_the_judged_episodes():
    from chronomem.train.distributed import Context

    ctx = Context()
    _, row = reduce_stats({"loss": 1.0}, [(1.0, 5), (3.0, 7)], ctx, "cpu", [1.0, 0.0, 1.0, 1.0])
    assert row == {"return_mean": 2.0, "length_mean": 6.0, "episodes": 2, "success_rate": 0.75}
    _, row = reduce_stats({"loss": 1.0}, [(1.0, 5)], ctx, "cpu")
    assert "success_rate" not in row and "episodes_whole" not in row
    _, row = reduce_stats({"loss": 1.0}, [(1.0, 5), (3.0, 7), (0.0, 2), (0.0, 2)], ctx, "cpu", (), [1.0, 0.0, 0.0, 0.0])
    assert row["episodes_whole"] == 0.25


@pytest.mark.parametrize("num_steps, window, context", [(70, None, 0), (36, None, 0), (64, None, 0), (70, 35, 0),
                                                       (70, 14, 0), (32, None, 32), (36, None, 4)])
def test_the_share_of_whole_episodes_follows_the_rollout_length(num_steps, window, context):
    """Visual Match's episodes at distractor 5 are 35 steps, every one (each phase ends on a timer), and the
    envs start together: with rollouts of two episodes every episode is replayed whole; with 36 or 64 steps an
    episode is cut wherever a rollout starts inside it; with windows (``recurrence``) the windows count; with a
    replay context (``replay_context``) the previous rollout's last steps count too, from the second rollout on."""
    from chronomem.envs.make import make_vector_env
    from chronomem.rl.ppo import collect

    env_id, length, rollouts = visual_match_id("passive", 5), 35, 40
    agent, envs = tiny_agent(env_id), make_vector_env(env_id, 2)
    obs, _ = envs.reset(seed=0)
    state, tracker, whole, tail = agent.initial_state(2), EpisodeTracker(2), [], None
    for _ in range(rollouts):
        rollout, obs, state = collect(agent, envs, obs, state, num_steps, tracker, window, context=tail,
                                      context_steps=context)
        tail = rollout.tail(context) if context else None
        finished, _, flags = tracker.take()
        assert {n for _, n in finished} <= {length}
        whole += flags
    envs.close()
    ends = range(length - 1, rollouts * num_steps, length)  # the steps that end an episode, from the first reset
    replayed = [end % (window or num_steps) + 1 + (context if end >= num_steps else 0) for end in ends]
    expected = [float(steps >= length) for steps in replayed for _ in range(2)]
    assert whole == expected and len(expected) > 0
    if not context:
        assert (sum(whole) == len(whole)) == ((window or num_steps) % length == 0)
    else:  # whole unless it ends too early in its rollout: at its first 2 steps (32 + 32), before its 31st (36 + 4)
        assert 0 < sum(whole) < len(whole)


@pytest.mark.parametrize("env_id", [visual_match_id("passive", 30), visual_match_id("active", 30, observation="pixels"),
                                    key_to_door_id(30)])
def test_evaluate_reports_the_env_success_not_the_share_of_positive_returns(env_id):
    from chronomem.rl.evaluate import evaluate

    agent = tiny_agent(env_id)
    # apples pay 0.01 here, so an episode's return is 10 * success + at most 0.3 of apples
    result = evaluate(agent, env_id, episodes=40, num_envs=8, progress=False, apple_rewards=0.01)
    assert 0.0 <= result["success_rate"] <= 1.0
    # the same episodes: the mean return is 10 x the success rate plus the apples' share (the share of
    # positive returns would say 1.0 and leave the apples negative)
    apples = result["return_mean"] - 10 * result["success_rate"]
    assert 0.0 <= apples <= 0.3 + 1e-9, result


def test_ppo_logs_the_success_rate():
    from chronomem.rl.ppo import Args, train

    args = Args(env=visual_match_id("passive", 30, control=True), core="mlp", dim=8, hidden=8, num_envs=4, num_steps=60,
                num_minibatches=1, update_epochs=1, total_frames=960, device="cpu", progress=False, log_every=1)
    history = train(args).history
    rows = [row for row in history if row.get("episodes")]
    assert rows and all(0.0 <= row["success_rate"] <= 1.0 for row in rows)
    assert sum(row["episodes"] for row in rows) == 960 // 60  # every episode is 60 steps and reports one


def test_stop_success_ends_the_run_at_the_first_logged_rate_that_reaches_it():
    from chronomem.rl.ppo import Args, stop_reached, train

    tiny = dict(env=visual_match_id("passive", 5), core="mlp", dim=8, hidden=8, num_envs=4, num_steps=35,
                num_minibatches=1, update_epochs=1, total_frames=140 * 3, device="cpu", progress=False, log_every=1)
    assert train(Args(**tiny, stop_success=0.0)).frames == 140  # every rate is >= 0: the first row stops it
    assert train(Args(**tiny, stop_success=1.01)).frames == 140 * 3  # out of reach: the whole run
    args = Args(**tiny, stop_success=0.5, stop_return=5.0)
    enough = {"episodes": args.num_envs}
    assert stop_reached({"return_mean": 6.0, "length_mean": 35, "success_rate": 0.5, **enough}, args)
    assert not stop_reached({"return_mean": 4.0, "length_mean": 35, "success_rate": 0.9, **enough}, args)  # both
    assert not stop_reached({"return_mean": 6.0, "length_mean": 35, **enough}, args)  # no episode reported one


@pytest.mark.parametrize("visual", ["cnn", "cells"])
@pytest.mark.parametrize("env_id", [visual_match_id("passive", 5), visual_match_id("active", 5, observation="pixels")])
def test_the_ballet_encoder_reads_a_grid_alone_of_any_shape(env_id, visual):
    import torch

    from chronomem.encoders import BalletEncoder, encoder_for
    from chronomem.envs.make import make_vector_env
    from chronomem.rl.acting import as_tensor, obs_map

    envs = make_vector_env(env_id, 3)
    obs, _ = envs.reset(seed=0)
    encoder = encoder_for(envs.single_observation_space, 16, visual=visual)
    key = "grid" if "grid" in obs else "image"
    assert isinstance(encoder, BalletEncoder) and encoder.vocab_size == 0 and encoder.words is None
    assert encoder.view == obs[key].shape[1:3] and encoder.input_shape == obs[key].shape[1:]
    batch = obs_map(lambda x: x.unsqueeze(1), as_tensor(obs, "cpu"))
    x = encoder(batch)
    picture, instruction = encoder.reconstruction_targets(batch)
    assert x.shape == (3, 1, 16) and instruction is None
    # each row's encoding is its own observation's: rows differ where the boards do
    alone = encoder(obs_map(lambda t: t[:1], batch))
    assert not torch.allclose(x[0], x[1]) and torch.allclose(alone, x[:1], atol=1e-6)
    loss = encoder.decoder(16)(torch.randn(3, 1, 16), picture, instruction)
    assert loss.shape == (3, 1) and bool((loss > 0).all())
    with pytest.raises(TypeError, match=repr(key)):
        encoder({"instruction": batch[key]})
    with pytest.raises(ValueError, match="shape"):
        encoder({key: batch[key][:, :, :-1]})


def test_the_visual_match_probe_runs_and_records(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "probes.jsonl"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "visual_match_probe.py"
    subprocess.run([sys.executable, str(script), "tiny", "--frames", "1024", "num_envs=4",
                    "num_minibatches=2", "env.apple_rewards=0.0", "--jsonl", str(out)], check=True, capture_output=True)
    record = json.loads(out.read_text())
    assert record["env"] == {"apple_rewards": 0.0} and record["args"] == {"num_envs": 4, "num_minibatches": 2}
    assert record["frames"] == 1024 and 0.0 <= record["eval_success"] <= 1.0
    # the task itself, its cue on one wall cell, and a core's options
    subprocess.run([sys.executable, str(script), "task", "--frames", "1024", "--core", "htm", "num_envs=4",
                    "num_minibatches=2", "env.control=False", "env.cue_cell=3", "core.chunk_size=4",
                    "core.memory_size=3", "core.top_k=2", "--out", str(tmp_path / "run"), "--jsonl", str(out)],
                   check=True, capture_output=True)
    record = json.loads(out.read_text().splitlines()[1])
    assert record["env"] == {"control": False, "cue_cell": 3}
    assert record["core_options"] == {"chunk_size": 4, "memory_size": 3, "top_k": 2}
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["core_options"]["chunk_size"] == 4 and config["core_options"]["memory_size"] == 3


# ---- a reward part learned apart (Args.reward_part) -------------------------------------------------------


def test_gae_of_two_reward_parts_is_gae_of_each_part():
    import dataclasses

    import torch
    from tests.test_ppo import random_rollout

    from chronomem.rl.ppo import gae

    a, b = random_rollout(0), random_rollout(1)  # the same ends (seeded alike below), two parts' numbers
    b = dataclasses.replace(b, terminated=a.terminated, truncated=a.truncated)
    final = torch.where(a.truncated.unsqueeze(-1), torch.stack([a.final_values, b.final_values], -1), 0.0)
    both = dataclasses.replace(a, values=torch.stack([a.values, b.values], -1),
                               rewards=torch.stack([a.rewards, b.rewards], -1), final_values=final,
                               next_value=torch.stack([a.next_value, b.next_value], -1))
    advantages, returns = gae(both, 0.9, 0.8)
    for k, part in enumerate((a, b)):
        want_adv, want_ret = gae(dataclasses.replace(part, final_values=final[..., k]), 0.9, 0.8)
        torch.testing.assert_close(advantages[..., k], want_adv)
        torch.testing.assert_close(returns[..., k], want_ret)


def test_the_step_share_of_an_ended_episode_comes_from_its_final_info():
    from chronomem.rl.ppo import step_share

    info = {"apple_reward": np.array([0.0, 1.0, 0.0]),
            "final_info": {"apple_reward": np.array([0.0, 0.0, 10.0]), "_apple_reward": np.array([False, False, True])}}
    assert step_share(info, "apple_reward").tolist() == [0.0, 1.0, 10.0]
    with pytest.raises(ValueError, match="--reward-part 'apples_now'"):
        step_share(info, "apples_now")


def test_ppo_with_a_reward_part_learns_two_returns_whose_sum_is_the_reward():
    import torch

    from chronomem.envs.make import make_vector_env
    from chronomem.rl.ppo import Args, collect, make_agent, train

    env_id = visual_match_id("passive", 5)
    args = Args(env=env_id, core="mlp", dim=8, hidden=8, num_envs=4, num_steps=70, num_minibatches=2,
                update_epochs=1, total_frames=560, device="cpu", progress=False, norm_adv=True,
                reward_part="apple_reward")
    envs = make_vector_env(env_id, 8)
    torch.manual_seed(0)
    agent = make_agent(args, {}, envs.single_observation_space, envs.single_action_space)
    assert agent.critic[-1].out_features == 2
    obs, _ = envs.reset(seed=0)
    rollout, *_ = collect(agent, envs, obs, agent.initial_state(8), 70, reward_part="apple_reward")
    assert rollout.values.shape == rollout.rewards.shape == (8, 70, 2)
    apples, rest = rollout.rewards[..., 0], rollout.rewards[..., 1]
    assert set(apples.unique().tolist()) == {0.0, 1.0, 10.0}  # the apples' part: what they paid, at any step
    assert set(rest.unique().tolist()) == {0.0, 10.0}  # the rest: the choice, at most once in each 35-step episode
    assert int((rest[:, :35] > 0).sum(1).max()) <= 1 and int((rest[:, 35:] > 0).sum(1).max()) <= 1
    result = train(args)
    assert result.frames == 560 and all(torch.isfinite(p).all() for p in result.agent.parameters())


class _Walker:
    """An agent that always takes one action (for benchmarks/visual_match_cases.py's counts)."""

    def __init__(self, action: int):
        self.action = action

    def initial_state(self, batch_size):
        return None

    def __call__(self, obs, state):
        import torch

        logits = torch.full((1, 1, 4), -1e9)
        logits[..., self.action] = 0.0
        return logits, None, state


def test_visual_match_cases_counts_right_wrong_and_no_square():
    from tests.helpers import load_benchmark

    cases = load_benchmark("visual_match_cases")
    env_id = visual_match_id("passive", 5, control=True)
    # walking north from the reward room's start reaches the middle square: right in the 6 cases whose
    # target it is, wrong in the other 12; walking south touches nothing
    north = cases.play_cases(_Walker(0), env_id, episodes=2, greedy=True)
    assert north["total"] == {"right": 12, "wrong": 24, "none": 0}
    assert all(c == ({"right": 2, "wrong": 0, "none": 0} if name.endswith("target 1") else
                     {"right": 0, "wrong": 2, "none": 0}) for name, c in north["cases"].items())
    assert cases.play_cases(_Walker(1), env_id, episodes=1, greedy=False)["total"] == {"right": 0, "wrong": 0,
                                                                                        "none": 18}
    with pytest.raises(ValueError, match="--env"):
        cases.play_cases(_Walker(0), key_to_door_id(5), episodes=1, greedy=True)


def test_visual_match_cases_main_appends_every_case_to_jsonl(tmp_path, capsys):
    import json

    from tests.helpers import load_benchmark

    from chronomem.rl.ppo import Args, train

    run = tmp_path / "run"
    train(Args(env=visual_match_id("passive", 5, control=True), core="mlp", dim=8, hidden=8, num_envs=2,
               num_steps=35, num_minibatches=1, update_epochs=1, total_frames=70, device="cpu", progress=False,
               out=str(run)))
    records = tmp_path / "cases.jsonl"
    cases = load_benchmark("visual_match_cases")
    for _ in range(2):  # appended, never overwritten
        cases.main([str(run), "--episodes", "1", "--greedy", "--jsonl", str(records)])
    first, second = (json.loads(line) for line in records.read_text().splitlines())
    assert first == second  # the same layouts and greedy actions
    assert len(first["cases"]) == 18 and sum(first["total"].values()) == 18 and first["greedy"]
    assert first["total"] == {k: sum(c[k] for c in first["cases"].values()) for k in ("right", "wrong", "none")}
    assert first["checkpoint"] == "step_00000070"
    assert capsys.readouterr().out.count("colours (") == 36  # each call still prints its 18 cases


def test_quick_htm_reaches_the_cue_only_through_its_chunk_memory():
    # HTM's local attention (the visibility rule, ops.htm_local's reference) must not see the explore phase
    # from any step of the reward phase at a quick length, or the "memory" row reads the cue through its
    # local attention (as the default window of 64 did).
    import torch

    from chronomem.envs.tvt import EXPLORE, REWARD
    from chronomem.experiments.visual_match import KEY_TO_DOOR_SCALES, SCALES
    from chronomem.htm import HTMConfig
    from chronomem.ops.htm_local import local_layout_reference

    for scale in (SCALES["quick"], KEY_TO_DOOR_SCALES["quick"]):
        options = scale.models["htm"]
        for distractor in scale.distractors:
            n = EXPLORE + distractor + REWARD  # one whole episode from its first step, in one call
            seen = local_layout_reference(torch.zeros(1, dtype=torch.long), torch.tensor([n]), n, cache=0,
                                          window=options["window"],
                                          extra_length=options.get("extra_length", HTMConfig.extra_length))
            assert not seen[0, EXPLORE + distractor:, :EXPLORE].any(), (scale.game, distractor)
            assert seen[0, EXPLORE - 1, :EXPLORE].all()  # the rule itself: the explore phase sees itself


class _FirstObservations(_Walker):
    """A walker that keeps each episode's first observation."""

    def __init__(self, action: int):
        super().__init__(action)
        self.first = []

    def initial_state(self, batch_size):
        return "new"

    def __call__(self, obs, state):
        if state == "new":
            self.first.append(obs["grid"][0, 0].numpy().copy())
        return super().__call__(obs, "old")


def test_visual_match_cases_keep_the_envs_cue_cell():
    # The passive ids put the cue on one cell (PASSIVE_CUE_CELL); forced layouts must keep it there, or an
    # agent trained with the cue in front is measured on cues it never saw (it then chooses at chance).
    import gymnasium as gym
    from tests.helpers import load_benchmark

    from chronomem.envs.tvt import COLOUR_CHANNELS

    cases = load_benchmark("visual_match_cases")
    env_id = visual_match_id("passive", 5)
    walker = _FirstObservations(1)
    cases.play_cases(walker, env_id, episodes=1, greedy=True)
    natural = gym.make(env_id)
    cue = natural.reset(seed=3)[0]["grid"][..., COLOUR_CHANNELS].any(-1)  # the explore room's one coloured cell
    natural.close()
    assert len(walker.first) == 18 and cue.sum() == 1
    assert all(np.array_equal(grid[..., COLOUR_CHANNELS].any(-1), cue) for grid in walker.first)


def test_visual_match_readout_finds_the_colour_where_it_is_in_view():
    import torch
    from tests.helpers import load_benchmark

    readout = load_benchmark("visual_match_readout")
    rng = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (300,), generator=rng)
    signal = torch.nn.functional.one_hot(labels, 3).double() @ torch.randn(3, 16, generator=rng, dtype=torch.double)
    noise = torch.randn(300, 16, generator=rng, dtype=torch.double)
    assert readout.readout_accuracy(signal + 0.3 * noise, labels) > 0.95
    assert readout.readout_accuracy(noise, labels) < 0.5  # nothing to read: about chance (1/3)
    assert readout.colour_share(signal, labels) == pytest.approx(1.0)  # all of the variance is the colour's
    assert readout.colour_share(signal + 3 * noise, labels) < 0.2 < readout.colour_share(signal + 0.3 * noise, labels)

    env_id = visual_match_id("passive", 5)
    from chronomem.envs.make import make_env
    from chronomem.rl.ppo import Args, make_agent

    env = make_env(env_id)
    args = Args(env=env_id, core="htm", dim=16, depth=1, heads=2, hidden=8, num_envs=2, num_minibatches=1,
                device="cpu")
    torch.manual_seed(0)
    agent = make_agent(args, dict(chunk_size=8, memory_size=8, top_k=2, window=4), env.observation_space,
                       env.action_space).eval()
    env.close()
    found = readout.read_out(agent, env_id, episodes=120, every=10)
    rows = {row["step"]: row for row in found["readout"]}
    assert found["reward_step"] == 20 and set(rows) == {0, 10, 14, 15, 19, 20, 30, 34}
    assert rows[14]["encoder"] > 0.9  # the cue in view: an untrained encoder's features hold it
    assert rows[20]["encoder"] < 0.6  # the reward room shows three colours, not which one
    assert all(row["first_chunk"] == 0 for row in found["readout"] if row["step"] < 9)  # no complete chunk yet
    assert rows[10]["first_chunk"] == pytest.approx(1.0)  # the only chunk: all the relevance
    assert 0 <= found["choice_right"] <= 1


def test_visual_match_seen_counts_the_explore_phases_that_show_the_colour(tmp_path):
    # benchmarks/visual_match_seen.py: the passive board shows the colour in every explore phase, the active
    # 5x5 window in some; the right choices split between the two kinds of episode and add up.
    import json

    from tests.helpers import load_benchmark

    seen = load_benchmark("visual_match_seen")
    passive = seen.seen_and_chosen(_Walker(0), visual_match_id("passive", 5), episodes=6)
    assert passive["seen"] == 100.0 and passive["right_when_not_seen"] is None
    assert passive["right"] == passive["right_when_seen"]
    active = seen.seen_and_chosen(None, visual_match_id("active", 5), episodes=40)
    assert 0.0 < active["seen"] < 100.0  # a random walk sees the colour in some episodes, not all
    shares = active["seen"] / 100, 1 - active["seen"] / 100
    assert active["right"] == pytest.approx(shares[0] * active["right_when_seen"]
                                            + shares[1] * active["right_when_not_seen"], abs=0.1)
    assert seen.seen_and_chosen(None, visual_match_id("active", 5), episodes=40) == active  # seeded
    with pytest.raises(ValueError, match="Visual Match"):
        seen.seen_and_chosen(None, key_to_door_id(5), episodes=1)
    records = tmp_path / "seen.jsonl"
    for _ in range(2):  # appended, never overwritten
        seen.main(["--random", visual_match_id("active", 5), "--episodes", "3", "--jsonl", str(records)])
    first, second = (json.loads(line) for line in records.read_text().splitlines())
    assert first == second and first["run"] == "random policy" and first["episodes"] == 3
    with pytest.raises(SystemExit):
        seen.main(["--episodes", "3"])  # neither runs nor --random
