"""BabyAI behaviour cloning (paper 003 Sec. 4.2): the bot's demos, their cache, the action tagger, the
policy acting one step at a time, the success rate by acting, and the experiments at smoke scale."""

import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("minigrid")

from chronomem.agents import InstructedPolicy  # noqa: E402
from chronomem.envs.minigrid import VOCAB_SIZE  # noqa: E402
from chronomem.registry import get_model  # noqa: E402
from chronomem.tasks import babyai  # noqa: E402
from chronomem.tasks.babyai import (  # noqa: E402
    MAX_WORDS,
    NUM_ACTIONS,
    STEP_FEATURES,
    BabyAIDemos,
    cache_path,
    generate_demos,
    load_demos,
    read_demos,
    save_demos,
    step_features,
)

LEVEL = "GoToLocal"  # a one-room level: a bot episode takes a few steps


@pytest.fixture(scope="module")
def demos():
    return generate_demos(LEVEL, 10, seed=0)


def policy(model: str, seed: int = 0) -> InstructedPolicy:
    torch.manual_seed(seed)
    options = {"chunk_size": 4, "num_state": 3, "self_per_cross": 1} if model == "tlb" else {}
    core = get_model(model)(dim=16, depth=2, num_heads=2, causal=True, **options)
    return InstructedPolicy(core, 16, NUM_ACTIONS, VOCAB_SIZE, MAX_WORDS, "chunk" if model == "tlb" else "sequence")


# ---- demos ----------------------------------------------------------------------------------------


def test_stored_actions_replayed_in_the_env_reach_the_goal(demos):
    assert len(demos) == 10 and demos.failures == 0
    assert demos.images.dtype == demos.actions.dtype == demos.missions.dtype == np.uint8
    env = babyai.make_level(LEVEL)
    for i in range(len(demos)):
        episode = demos.episode(i)
        obs, _ = babyai.quiet_reset(env, episode["seed"])
        np.testing.assert_array_equal(obs["mission"], episode["mission"])
        ended = False
        for t, action in enumerate(episode["action"]):
            assert not ended  # the goal is reached at the last stored action, not before
            np.testing.assert_array_equal(obs["image"], episode["image"][t])  # the observation acted on
            assert obs["direction"] == episode["direction"][t]
            obs, reward, terminated, truncated, _ = env.step(int(action))
            ended = terminated or truncated
        assert terminated and reward > 0
    env.close()


def test_generation_does_not_depend_on_the_number_of_workers(demos, monkeypatch, capsys):
    monkeypatch.setattr(babyai, "DEMO_SHARE", 3)  # 4 shares of the 10 seeds over 2 processes
    parallel = generate_demos(LEVEL, 10, seed=0, workers=2, progress=True)
    for key in ("images", "directions", "actions", "missions", "lengths", "seeds"):
        np.testing.assert_array_equal(getattr(parallel, key), getattr(demos, key))
    assert f"{LEVEL} bot demos: done, 10 demos in" in capsys.readouterr().err  # progress, on stderr


def test_failed_episodes_are_left_out(monkeypatch):
    from minigrid.utils.baby_ai_bot import BabyAIBot

    made, real_init, real_replan = [], BabyAIBot.__init__, BabyAIBot.replan

    def init(self, env):
        real_init(self, env)
        made.append(self)
        self.episode = len(made) - 1  # the bot of seed 0, 1, 2, ...

    def replan(self, *args):
        if self.episode == 1:
            raise RuntimeError("the bot is stuck")
        return 0 if self.episode == 2 else real_replan(self, *args)  # seed 2: turn left until the step limit

    monkeypatch.setattr(BabyAIBot, "__init__", init)
    monkeypatch.setattr(BabyAIBot, "replan", replan)
    kept = generate_demos("GoToObj", 4, seed=0)
    assert kept.seeds.tolist() == [0, 3] and kept.failures == 2 and len(kept.lengths) == 2


def test_an_episode_the_bot_never_finishes_is_a_failure(monkeypatch):
    import time

    from minigrid.utils.baby_ai_bot import BabyAIBot

    real_replan, calls, start = BabyAIBot.replan, [], time.monotonic()

    def replan(self, *args):  # the first episode's planner hangs, like Unlock seed 63's (for 5 s here)
        calls.append(self)
        while calls[0] is self and time.monotonic() - start < 5:
            time.sleep(0.01)
        return real_replan(self, *args)

    monkeypatch.setattr(BabyAIBot, "replan", replan)
    monkeypatch.setattr(babyai, "BOT_SECONDS", 0.3)
    kept = generate_demos("GoToObj", 3, seed=0)
    assert kept.seeds.tolist() == [1, 2] and kept.failures == 1  # without the limit: [0, 1, 2] after 5 s
    assert time.monotonic() - start < 5


def test_level_generation_prints_nothing(capfd):
    generate_demos(LEVEL, 1, seed=8)  # seed 8 of GoToLocal is one whose generation rejects a sample
    assert "Sampling rejected" not in capfd.readouterr().out


def test_unknown_level_is_a_value_error():
    with pytest.raises(ValueError, match="level must be one of"):
        generate_demos("PutNext-v0", 1)
    assert babyai.level_id("PutNext") == "BabyAI-PutNextS7N4-v0"  # minigrid 3.2 has no BabyAI-PutNext-v0


def test_the_cache_round_trips_and_is_reused(tmp_path, demos, monkeypatch):
    first = load_demos(LEVEL, 10, 0, tmp_path)
    path = cache_path(tmp_path, LEVEL, 10, 0)
    assert path.exists() and path.name == "BabyAI-GoToLocal-v0_seed0_n10.npz"

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached demos should have been read")

    monkeypatch.setattr(babyai, "generate_demos", no_generation)
    again = load_demos(LEVEL, 10, 0, tmp_path)
    for key in ("images", "directions", "actions", "missions", "lengths", "seeds"):
        np.testing.assert_array_equal(getattr(again, key), getattr(demos, key))
        assert getattr(again, key).dtype == getattr(first, key).dtype
    assert again.level == LEVEL and again.failures == 0
    with pytest.raises(AssertionError):  # another count is another file
        load_demos(LEVEL, 9, 0, tmp_path)


def test_a_corrupted_cache_file_is_a_clear_error_naming_it(tmp_path, demos):
    path = cache_path(tmp_path, LEVEL, 10, 0)
    save_demos(path, demos)
    path.write_bytes(path.read_bytes()[:200])  # truncated
    with pytest.raises(ValueError, match=f"demo cache {path} cannot be read"):
        load_demos(LEVEL, 10, 0, tmp_path)
    path.write_bytes(b"not an npz file")
    with pytest.raises(ValueError, match="delete it to generate the demos again"):
        read_demos(path)
    broken = babyai.Demos(demos.level, demos.images[:-1], demos.directions, demos.actions, demos.missions,
                          demos.lengths, demos.seeds)
    save_demos(path, broken)  # arrays that do not fit together
    with pytest.raises(ValueError, match=f"demo cache {path} does not hold consistent demos"):
        read_demos(path)


# ---- the task ---------------------------------------------------------------------------------------


def test_batches_hold_the_steps_and_the_bot_actions(demos):
    task = BabyAIDemos(demos, held_out=3)
    batch = task.collate([(0, 2), (0, 5)])
    assert batch.inputs.dtype == torch.uint8 and batch.inputs.shape == (2, max(demos.lengths[[2, 5]]), STEP_FEATURES)
    for b, i in enumerate((2, 5)):
        episode, t = demos.episode(i), int(demos.lengths[i])
        rows = [step_features({"image": episode["image"][s], "direction": episode["direction"][s],
                               "mission": episode["mission"]}) for s in range(t)]
        np.testing.assert_array_equal(batch.inputs[b, :t].numpy(), np.stack(rows))
        np.testing.assert_array_equal(batch.targets[b, :t].numpy(), episode["action"])
        assert batch.mask[b, :t].all() and not batch.mask[b, t:].any() and not batch.inputs[b, t:].any()
    # training batches never hold the held-out episodes: with all but episode 0 held out, only it is drawn
    only_first = BabyAIDemos(demos, held_out=9).sample(5, torch.Generator().manual_seed(0))
    first = demos.episode(0)["action"]
    assert only_first.targets.shape == (5, len(first)) and (only_first.targets == torch.from_numpy(first).long()).all()
    evaluated = list(task.eval_batches(2, 10))
    assert [int(b.mask.sum()) for b in evaluated] == [int(demos.lengths[7:9].sum()), int(demos.lengths[9])]


# ---- the policy: causal, and acting step by step equals the whole episode -------------------------


def random_steps(batch: int, steps: int, generator: torch.Generator) -> torch.Tensor:
    image = torch.stack([torch.randint(11, (batch, steps, 49), generator=generator),
                         torch.randint(6, (batch, steps, 49), generator=generator),
                         torch.randint(3, (batch, steps, 49), generator=generator)], -1).flatten(2)
    direction = torch.randint(4, (batch, steps, 1), generator=generator)
    words = torch.randint(1, VOCAB_SIZE, (batch, 1, MAX_WORDS), generator=generator)
    words[:, :, 6:] = 0
    return torch.cat([image, direction, words.expand(batch, steps, MAX_WORDS)], -1).to(torch.uint8)


@pytest.mark.parametrize("model", ["transformer", "tlb"])
def test_the_action_at_t_does_not_depend_on_later_steps(model):
    net = policy(model).eval()
    g = torch.Generator().manual_seed(1)
    inputs = random_steps(3, 11, g)
    changed = inputs.clone()
    changed[:, 5:, :148] = random_steps(3, 6, g)[..., :148]  # the steps after t = 4, mid-chunk (the mission stays)
    with torch.no_grad():
        before, _ = net(inputs)
        after, _ = net(changed)
    torch.testing.assert_close(after[:, :5], before[:, :5])
    assert not torch.allclose(after[:, 5:], before[:, 5:])


@pytest.mark.parametrize("model", ["transformer", "tlb"])
def test_acting_step_by_step_equals_the_whole_episode(model):
    net = policy(model).eval()
    steps = random_steps(4, 13, torch.Generator().manual_seed(2))  # several TLB chunks of 3 states
    with torch.no_grad():
        whole, _ = net(steps)
        state, acted = net.initial_state(4), []
        for t in range(steps.shape[1]):
            logits, state = net.step(steps[:, t], state)
            acted.append(logits)
    torch.testing.assert_close(torch.stack(acted, 1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", ["transformer", "tlb"])
def test_rows_at_their_own_steps_act_as_each_episode_alone(model):
    """An acting loop resets the rows whose episode ended (``state.reset``), each row at its own step:
    every episode's logits equal those of the whole-episode forward over it alone. Episodes of several
    lengths put the rows at different steps, so some rows open a TLB chunk (or an episode) while others
    do not; each new episode reads its own mission. Acting goes through ``policy(inputs [B, 1, F],
    state)``, the interface of ``chronomem.rl.acting``."""
    net = policy(model).eval()
    g = torch.Generator().manual_seed(4)
    lengths = [[5, 8, 7], [7, 13], [2, 1, 6, 11]]  # per row, its episodes (20 steps each)
    episodes = [[random_steps(1, n, g)[0] for n in row] for row in lengths]
    inputs = torch.stack([torch.cat(row) for row in episodes])
    ends = torch.zeros(inputs.shape[:2], dtype=torch.bool)
    for b, row in enumerate(lengths):
        ends[b, torch.tensor(row).cumsum(0) - 1] = True
    with torch.no_grad():
        state, acted = net.initial_state(3), []
        for t in range(inputs.shape[1]):
            logits, state = net(inputs[:, t : t + 1], state)
            acted.append(logits[:, 0])
            state = state.reset(ends[:, t])
        acted = torch.stack(acted, 1)
        for b, row in enumerate(episodes):
            start = 0
            for episode in row:
                alone, _ = net(episode[None])
                torch.testing.assert_close(acted[b, start : start + len(episode)], alone[0], atol=1e-5, rtol=1e-5)
                start += len(episode)
    assert state.steps.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="mask must be None"):
        net(inputs[:, :1], net.initial_state(3), mask=torch.ones(3, 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="PolicyState of acting"):
        net(inputs[:, :1], object())


def test_padding_does_not_change_valid_outputs(demos):
    net = policy("tlb").eval()
    task = BabyAIDemos(demos)
    batch = task.collate([(0, i) for i in range(len(demos))])
    with torch.no_grad():
        padded, _ = net(batch.inputs, mask=batch.mask)
        for b in range(len(demos)):
            t = int(batch.mask[b].sum())
            alone, _ = net(batch.inputs[b:b + 1, :t])
            torch.testing.assert_close(padded[b:b + 1, :t], alone, atol=1e-5, rtol=1e-5)


def test_policy_bad_input():
    core = get_model("transformer")(dim=16, depth=1, num_heads=2, causal=True)
    with pytest.raises(ValueError, match="placement must be one of"):
        InstructedPolicy(core, 16, NUM_ACTIONS, VOCAB_SIZE, MAX_WORDS, "prefix")
    with pytest.raises(ValueError, match="chunk_size >= 2"):
        InstructedPolicy(core, 16, NUM_ACTIONS, VOCAB_SIZE, MAX_WORDS, "chunk")
    with pytest.raises(ValueError, match="must be causal"):
        InstructedPolicy(get_model("transformer")(dim=16, depth=1, num_heads=2, causal=False), 16, NUM_ACTIONS,
                         VOCAB_SIZE, MAX_WORDS)
    net = InstructedPolicy(core, 16, NUM_ACTIONS, VOCAB_SIZE, MAX_WORDS)
    with pytest.raises(ValueError, match=f"step features \\[B, N, {STEP_FEATURES}\\]"):
        net(torch.zeros(2, 3, 10, dtype=torch.uint8))
    with pytest.raises(TypeError, match="integer step features"):
        net(torch.zeros(2, 3, STEP_FEATURES))
    with pytest.raises(TypeError, match="state must be a PolicyState"):
        net.step(torch.zeros(2, STEP_FEATURES, dtype=torch.uint8), None)


# ---- success rate by acting ---------------------------------------------------------------------


class Replay(torch.nn.Module):
    """A policy that plays given action sequences (one per row, from each row's episode start), then
    action ``rest``; its state is the step of each row's episode."""

    def __init__(self, actions: list[np.ndarray], rest: int = 0):
        super().__init__()
        self.actions, self.rest = actions, rest
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def initial_state(self, batch, device=None):
        return ReplayState(torch.zeros(batch, dtype=torch.long))

    def forward(self, features, state):
        steps = state.steps.tolist()
        chosen = [int(a[t]) if t < len(a) else self.rest for a, t in zip(self.actions, steps, strict=True)]
        logits = torch.nn.functional.one_hot(torch.tensor(chosen), NUM_ACTIONS).float()
        return logits[:, None], ReplayState(state.steps + 1)


@dataclasses.dataclass(frozen=True)
class ReplayState:
    steps: torch.Tensor

    def reset(self, done):
        return ReplayState(self.steps.masked_fill(done, 0))


def test_one_episode_envs_idle_after_their_episode():
    """An evaluation's env plays its seeded episode, then idles: the same observation, reward 0, no end."""
    bot = generate_demos(LEVEL, 2, seed=500)
    actions = [bot.episode(i)["action"] for i in range(2)]
    envs = babyai.level_vector_env(LEVEL, 2, one_episode=True)
    try:
        obs, _ = envs.reset(seed=[500, 501])
        ended = np.zeros(2, bool)
        for t in range(max(map(len, actions)) + 3):
            chosen = [int(a[t]) if t < len(a) else 0 for a in actions]
            before = obs.copy()
            obs, reward, terminated, truncated, _ = envs.step(np.array(chosen))
            for i in np.flatnonzero(ended):  # already played out
                assert not terminated[i] and not truncated[i] and reward[i] == 0
                np.testing.assert_array_equal(obs[i], before[i])
            ended |= terminated | truncated
            assert ended[[i for i in range(2) if t == len(actions[i]) - 1]].all()  # the bot's last action ends it
        assert ended.all()
    finally:
        envs.close()


def test_success_rate_counts_episodes_that_reach_the_goal():
    from chronomem.experiments.babyai import RandomPolicy, success_rate

    bot = generate_demos(LEVEL, 4, seed=500)
    actions = [bot.episode(i)["action"] for i in range(4)]
    assert success_rate(Replay(actions), LEVEL, 4, seed=500) == 1.0
    assert success_rate(Replay(actions[:2] + [np.zeros(0), np.zeros(0)]), LEVEL, 4, seed=500) == 0.5  # turn left
    assert success_rate(Replay(actions), LEVEL, 4, seed=500, max_steps=1) == 0.0  # cut before the goal
    with pytest.raises(ValueError, match="episodes"):
        success_rate(Replay(actions), LEVEL, 0)
    rates = [success_rate(RandomPolicy(seed), LEVEL, 8, seed=500) for seed in (3, 3)]
    assert rates[0] == rates[1] and 0.0 <= rates[0] <= 1.0  # the reference: seeded, repeatable


# ---- the experiments ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["babyai", "babyai-multi"])
def test_experiment_smoke_run(tmp_path, monkeypatch, name):
    from chronomem.experiments.babyai import MULTI_SCALES, SCALES
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment

    monkeypatch.setenv("CHRONOMEM_CACHE", str(tmp_path / "cache"))
    scale = (SCALES if name == "babyai" else MULTI_SCALES)["smoke"]
    first = run_experiment(get_experiment(name), "smoke", tmp_path / "0", seed=1, progress=False)
    if name == "babyai":  # a second run reads the cached demos and gives the same numbers
        again = run_experiment(get_experiment(name), "smoke", tmp_path / "1", seed=1, progress=False)
        assert first["results"] == again["results"] and first["extra"]["curves"] == again["extra"]["curves"]
    assert len(list((tmp_path / "cache" / "babyai").glob("*.npz"))) == len(scale.levels)
    assert set(first["results"]) == {"transformer", "tlb"}
    steps = [f"step {s}" for s in range(scale.eval_every, scale.steps + 1, scale.eval_every)]
    for model, row in first["results"].items():
        assert list(row) == steps and all(0.0 <= v <= 100.0 for v in row.values())
        curve = first["extra"]["curves"][model]
        assert [len(p["seeds"]) for p in curve] == [scale.seeds] * len(steps)
        assert [p["demos_seen"] for p in curve] == [int(s.split()[1]) * scale.batch_size for s in steps]
        assert row[steps[-1]] == pytest.approx(100 * np.mean(curve[-1]["seeds"]), abs=0.06)
    gaps = first["extra"]["claim_check"]["tlb_minus_transformer_points"]
    means = [first["extra"]["curves"][m] for m in ("tlb", "transformer")]
    assert gaps == [pytest.approx(100 * (t["mean"] - r["mean"]), abs=0.06) for t, r in zip(*means, strict=True)]
    random = first["extra"]["random_policy"]
    assert set(random["success"]) == set(scale.levels) and 0.0 <= random["mean"] <= 1.0
    assert (tmp_path / "0" / "success.png").stat().st_size > 0
    report = (tmp_path / "0" / "report.md").read_text()
    assert "converges faster" in report and "Fig. 3" in report
    saved = json.loads((tmp_path / "0" / "results.json").read_text())
    assert saved["config"]["levels"] == {level: babyai.LEVELS[level] for level in scale.levels}


def test_the_success_plot_fits_its_title_and_keeps_its_legend_off_the_curves(tmp_path, monkeypatch):
    import matplotlib.image
    import matplotlib.pyplot as plt

    from chronomem.experiments.babyai import MULTI_SCALES, plot_from_results

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to measure it
    points = [{"step": s, "demos_seen": 16 * s, "mean": 0.2, "min": 0.1, "max": 0.3, "seeds": [0.1, 0.2, 0.3]}
              for s in (400, 800)]
    results = {"experiment": "babyai-multi", "scale": "quick",
               "config": {"scale": {"levels": list(MULTI_SCALES["quick"].levels)}},  # the title that was cut off
               "extra": {"curves": {"transformer": points, "tlb": points}, "random_policy": {"mean": 0.1}}}
    plot_from_results(results, tmp_path / "success.png")
    fig = figures[-1]
    assert matplotlib.image.imread(tmp_path / "success.png").shape[1] >= 800
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend, title = ax.get_legend().get_window_extent(renderer), fig._suptitle.get_window_extent(renderer)
    page = fig.bbox
    assert legend.x0 >= ax.get_window_extent(renderer).x1  # right of the data
    assert page.x0 <= title.x0 and title.x1 <= page.x1 and title.y1 <= page.y1  # not cut off
    assert "GoTo" in fig._suptitle.get_text()
    assert "random policy (10%)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_resumed_experiment_gives_the_uninterrupted_curves(tmp_path, monkeypatch):
    """chronomem run babyai --resume: one run killed during its second segment (its curve.json holds the
    first evaluation, its newest checkpoint is that segment's start), one never started. The first
    continues from its checkpoint, the second trains from scratch; the table and curves are the
    uninterrupted ones."""
    import shutil
    from pathlib import Path

    import chronomem.train
    from chronomem.experiments.babyai import SCALES
    from chronomem.experiments.base import run_experiment
    from chronomem.registry import get_experiment
    from chronomem.train.checkpoint import checkpoint_name

    monkeypatch.setenv("CHRONOMEM_CACHE", str(tmp_path / "cache"))
    experiment = get_experiment("babyai")
    scale = SCALES["smoke"]
    whole = run_experiment(experiment, "smoke", tmp_path / "whole", seed=1, progress=False)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for file in ("results.json", "report.md", "results.png", "success.png"):
        (tmp_path / "cut" / file).unlink(missing_ok=True)
    runs = sorted(p.parent for p in (tmp_path / "cut").rglob("config.json"))
    cut = runs[-1]
    kept = json.loads((cut / "curve.json").read_text())
    (cut / "curve.json").write_text(json.dumps({**kept, "curve": kept["curve"][:1]}))
    shutil.rmtree(cut / "checkpoints" / checkpoint_name(scale.steps))  # killed before its last checkpoint
    shutil.rmtree(runs[0])  # never started
    calls = []
    train = chronomem.train.train

    def recording_train(model, task, cfg, *, resume=None, **kw):
        calls.append((Path(cfg.out), None if resume is None or resume.checkpoint is None else resume.checkpoint.name))
        return train(model, task, cfg, resume=resume, **kw)

    monkeypatch.setattr(chronomem.train, "train", recording_train)
    resumed = run_experiment(experiment, "smoke", tmp_path / "cut", seed=1, progress=False, resume=True)
    assert [call for call in calls if call[0] == cut] == [(cut, checkpoint_name(scale.eval_every))]
    assert [call for call in calls if call[0] == runs[0]][0] == (runs[0], None)
    assert {call[0] for call in calls} == {cut, runs[0]}  # the finished runs are read, not trained
    assert resumed["results"] == whole["results"]
    assert resumed["extra"]["curves"] == whole["extra"]["curves"]
