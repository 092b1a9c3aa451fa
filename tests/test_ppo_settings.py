"""benchmarks/ppo_settings.py (settings by time to a control's threshold) and benchmarks/ppo_peer.py's
ablation, on their smallest runs: a run stops at its control's threshold, the tables sort and count as
they say, and each ablation changes what it names. No timing is asserted."""

import pytest
import torch

from helpers import load_benchmark

pytest.importorskip("minigrid")

ppo_settings = load_benchmark("ppo_settings")
ppo_peer = load_benchmark("ppo_peer")

CUE = "chronomem/CueRecall-v0"


def tiny_control(**changes):
    values = dict(env=CUE, agent=dict(core="lstm", dim=16, hidden=16),
                  grid={"small": dict(num_envs=4, num_steps=16, num_minibatches=2, lr=5e-3)},
                  stop_return=-1.0, max_frames=256, about="CueRecall, any return")
    return ppo_settings.Control(**{**values, **changes})


def test_a_run_stops_at_the_first_update_that_meets_the_threshold(monkeypatch):
    monkeypatch.setitem(ppo_settings.CONTROLS, "tiny", tiny_control())
    reached = ppo_settings.run_one("tiny", "small", seed=1)
    assert reached["reached"] == reached["frames"] == 64  # every return is >= -1: the first update stops it
    monkeypatch.setitem(ppo_settings.CONTROLS, "tiny", tiny_control(stop_length=0.5))  # no episode is this short
    missed = ppo_settings.run_one("tiny", "small", seed=1)
    assert missed["reached"] is None and missed["frames"] == 256


def test_the_table_sorts_by_median_seconds_and_counts_a_missed_threshold_as_never(monkeypatch):
    monkeypatch.setitem(ppo_settings.CONTROLS, "tiny", tiny_control())

    def record(setting, seed, seconds, reached):
        return {"setting": setting, "seed": seed, "seconds": seconds, "reached": reached, "frames": 1000,
                "fps": 100, "approx_kl_median": 1e-3}

    records = [record("slow", 1, 50.0, 900), record("slow", 2, 60.0, 1000),
               record("never", 1, 5.0, None), record("never", 2, 5.0, None),
               record("fast", 1, 10.0, 500), record("fast", 2, 30.0, None)]  # median of 10 and never: never
    lines = ppo_settings.table("tiny", records).splitlines()
    rows = [line.split(" | ")[0].strip("| ") for line in lines if line.startswith("| ") and "setting" not in line]
    assert rows == ["slow", "fast", "never"]
    assert "| slow | 2/2 | 55 | 950 |" in lines[4]


def test_the_ablations_change_what_they_name():
    from chronomem.envs.make import make_vector_env
    from chronomem.rl.ppo import Args, make_agent

    envs = make_vector_env("MiniGrid-DoorKey-5x5-v0", 2)
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    agent = make_agent(Args(), {}, *spaces)
    ppo_peer.torch_ac_agent(agent, "init")
    for module in agent.modules():
        if isinstance(module, torch.nn.Linear):
            torch.testing.assert_close(module.weight.norm(dim=1), torch.ones(module.weight.shape[0]))
            assert not module.bias.any()
    ppo_peer.torch_ac_agent(agent, "image")
    obs = {"image": torch.randint(0, 3, (1, 1, 7, 7, 3)), "direction": torch.tensor([[0]]),
           "mission": torch.randint(1, 5, (1, 1, spaces[0]["mission"].shape[0]))}
    other = {**obs, "direction": torch.tensor([[2]]), "mission": torch.randint(1, 5, obs["mission"].shape)}
    torch.testing.assert_close(agent.encoder(obs), agent.encoder(other))  # only the image reaches the core
    assert set(ppo_peer.ABLATIONS) >= {"ours", "all of torch-ac's"}
    for changes in ppo_peer.ABLATIONS.values():  # every Args change is a real setting
        Args(**{k: v for k, v in changes.items() if k != "agent"})


def test_the_ablation_table_gives_each_variant_against_torch_ac():
    records = [{"name": "torch-ac", "ablation": "torch-ac", "seed": s, "reached": r} for s, r in ((1, 100), (2, 300))]
    records += [{"name": "chronomem", "ablation": "ours", "seed": s, "reached": r} for s, r in ((1, 300), (2, None))]
    lines = ppo_peer.ablation_table(records, max_frames=1000).splitlines()
    assert lines[2] == "| torch-ac | 0k, 0k | 200 | 1.00x | 2/2 |"
    assert lines[3] == "| ours | 0k, > 1k | not reached | - | 1/2 |"


def test_the_peer_table_gives_the_median_seconds_to_the_target_and_its_ratio():
    """The headline is the wall-clock time to 0.9: a run's seconds count only where it reached 0.9 (it
    stops there); a run that never did is never, not its seconds."""
    def record(name, seed, seconds, reached, variant="ours"):
        return {"name": name, "ablation": "torch-ac" if name == "torch-ac" else variant, "seed": seed,
                "seconds": seconds, "reached": reached, "fps": 1000.0}

    records = [record("torch-ac", 1, 30.0, 60_000), record("torch-ac", 2, 50.0, 80_000),
               record("torch-ac", 3, 40.0, 70_000),
               record("chronomem", 1, 20.0, 90_000), record("chronomem", 2, 10.0, None),
               record("chronomem", 3, 24.0, 100_000)]
    text = ppo_peer.table(records, max_frames=400_000)
    medians = {line.split()[0]: line.split() for line in text.splitlines()
               if line.startswith(("torch-ac ", "chronomem "))}
    assert medians["torch-ac"][3] == "40.0" and medians["chronomem"][3] == "24.0"  # 10 s never reached: inf
    assert "seconds to 0.9 0.60x (target <= 0.6), frames to 0.9 1.43x (target <= 1.0), frames/s 1.00x" in text
    never = [record("torch-ac", 1, 30.0, 60_000), record("chronomem", 1, 5.0, None)]
    assert "seconds to 0.9 - " in ppo_peer.table(never, max_frames=400_000)
    # another of our settings (--variant) gets its own medians and ratios
    windows = "minibatches of 4-step windows"
    text = ppo_peer.table(records + [record("chronomem", s, 12.0, 70_000 + s, windows) for s in (1, 2, 3)],
                          max_frames=400_000)
    assert "chronomem / torch-ac: seconds to 0.9 0.60x" in text
    assert (f"ratio chronomem, {windows} / torch-ac: seconds to 0.9 0.30x (target <= 0.6), frames to 0.9 1.00x"
            in text)


def test_a_setting_may_bring_its_own_core_and_core_options(monkeypatch):
    """A grid entry that names another core replaces the control's core options with its own (the
    control's HTM options would not build the LSTM)."""
    control = tiny_control(core_options=dict(chunk_size=4, top_k=1, memory_size=2),
                           grid={"htm": dict(num_envs=4, num_steps=16, num_minibatches=2, core="htm"),
                                 "lstm": dict(num_envs=4, num_steps=16, num_minibatches=2, core="lstm",
                                              core_options={})})
    monkeypatch.setitem(ppo_settings.CONTROLS, "tiny", control)
    assert ppo_settings.run_one("tiny", "lstm", seed=1)["frames"] == 64
    assert ppo_settings.run_one("tiny", "htm", seed=1)["frames"] == 64
    assert {"core_options"} <= set(ppo_settings.CONTROLS["ballet-any-attention"].grid["gtrxl (memory 256), 8 epochs"])
