"""The RL experiments at smoke scale: ballet-rl (paper 001 Table 3) and popgym (POPGym's MMER)."""

import json

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("popgym")

from chronomem.envs.ballet_world import ballet_id  # noqa: E402
from chronomem.experiments import popgym as popgym_experiment  # noqa: E402
from chronomem.experiments import run_experiment  # noqa: E402
from chronomem.experiments.rl_runs import max_mean_return, mean_curve  # noqa: E402
from chronomem.registry import _load, get_experiment  # noqa: E402

_load(experiments=True)


def test_ballet_rl_smoke(tmp_path):
    results = run_experiment(get_experiment("ballet-rl"), "smoke", tmp_path, progress=False)
    assert set(results["results"]) == {"mlp", "lstm", "transformer-xl", "htm"}
    for model, row in results["results"].items():
        assert set(row) == {"2_delay16"} and 0 <= row["2_delay16"] <= 100
        if model != "mlp":
            assert results["paper"][model]["8_delay48"] > 0  # Table 3 beside ours
        assert results["extra"][model]["runs"][0]["frames"] == 16
    assert (tmp_path / "learning_curves.png").stat().st_size > 0
    report = (tmp_path / "report.md").read_text()
    assert "success rate" in report
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"]["train_env"] == ballet_id("mixture", "symbolic")
    # the control: every model on the any-dancer level, first; where a seed did not learn it (2 episodes
    # after 16 frames: an untrained agent, lucky or not), the report says so above everything else
    control = saved["control"]
    assert saved["config"]["control_env"] == ballet_id("2_delay16", "symbolic", any_dancer=True)
    assert set(control["learned"]) == set(results["results"])
    for model, rows in saved["extra"]["control"].items():
        assert [row["learned"] for row in rows] == control["learned"][model]
        assert rows[0]["learned"] == (rows[0]["success"]["2_delay16"] >= 90 and rows[0]["length"]["2_delay16"] <= 80)
    assert all((tmp_path / "control" / f"{m}-seed0" / "config.json").exists() for m in results["results"])
    assert not all(map(all, control["learned"].values()))
    assert report.index("**The control was not learned**") < report.index("Ballet as an RL task")
    assert "| mlp |" in report.split("Control (no memory needed):")[1]
    claims = {c["text"] for c in saved["claims"]}
    assert "HTM above the memoryless agent" in claims


def test_popgym_smoke(tmp_path, monkeypatch):
    # The published table plus a row of a model only the paper has (as POPGym's GRU), one of whose
    # environments is outside the smoke scale: results.json carries the scale's rows of every model.
    extra = {"gru": {"RepeatPreviousEasy": 0.5, "CountRecallHard": -0.25}}
    monkeypatch.setattr(popgym_experiment, "PAPER", {**popgym_experiment.PAPER, **extra})
    run_experiment(get_experiment("popgym"), "smoke", tmp_path, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    results = saved["results"]
    assert list(results) == ["mlp", "lstm", "gtrxl", "htm"]
    smoke = {"RepeatPreviousEasy", "MineSweeperEasy"}
    # the control first, for every core, on the task with the memory demand removed
    assert set(saved["control"]["learned"]) == set(results) and saved["control"]["frames"] == 64
    assert all((tmp_path / f"{m}-RepeatCurrent-seed0" / "config.json").exists() for m in results)
    assert "Control (no memory needed): `popgym-RepeatCurrent-v0`" in (tmp_path / "report.md").read_text()
    for model in ("mlp", "lstm", "gtrxl", "htm"):
        assert set(results[model]) == smoke
        assert all(-1 <= v <= 1 for v in results[model].values())
    published = {m: {s: v for s, v in row.items() if s in smoke} for m, row in popgym_experiment.PAPER.items()}
    assert saved["paper"] == {m: row for m, row in published.items() if row} | {"gru": {"RepeatPreviousEasy": 0.5}}
    assert "| gru | — (0.50) | — (—) |" in (tmp_path / "report.md").read_text()  # a paper-only row
    assert (tmp_path / "learning_curves.png").stat().st_size > 0
    assert set(saved["extra"]["random_return"]) == smoke  # the random-policy line, from the code
    assert all(-1 <= v <= 1 for v in saved["extra"]["random_return"].values())
    assert all(run["curve"] for runs in saved["extra"]["runs"].values() for run in runs)  # the seed band


def test_popgym_harder_runs_its_own_environments_with_popgym_settings(tmp_path):
    harder, easy = popgym_experiment.HARDER_SCALES, popgym_experiment.SCALES
    for scale in ("quick", "paper"):  # the agents, settings and control are popgym's; the envs are harder
        assert harder[scale].ppo == easy[scale].ppo and harder[scale].models == easy[scale].models
        assert harder[scale].control_frames == easy[scale].control_frames
        assert harder[scale].envs == popgym_experiment.HARDER_ENVS
    saved = run_experiment(get_experiment("popgym-harder"), "smoke", tmp_path, progress=False)
    assert list(saved["config"]["envs"]) == ["popgym-CountRecallEasy-v0"]
    assert all(set(row) == {"CountRecallEasy"} for row in saved["results"].values())
    assert set(saved["control"]["learned"]) == set(saved["results"])
    assert (tmp_path / "mlp-CountRecallEasy-seed0" / "config.json").exists()


def test_popgym_published_table_names_real_environments_and_mmers():
    popgym_experiment.check_paper_table(popgym_experiment.PAPER)
    popgym_experiment.check_paper_table({"gru": {"RepeatPreviousEasy": 1.0, "LabyrinthExploreHard": -1}})
    for bad, message in (({"gru": {"RepeatPreviusEasy": 0.5}}, "POPGym environment"),
                         ({"gru": {"RepeatPrevious": 0.5}}, "POPGym environment"),
                         ({"gru": {"RepeatPreviousEasy": 1.5}}, r"\[-1, 1\]"),
                         ({"gru": {"RepeatPreviousEasy": True}}, r"\[-1, 1\]"),
                         ({"transformer": {"RepeatPreviousEasy": 0.5}}, "model must be one of")):
        with pytest.raises(ValueError, match=message):
            popgym_experiment.check_paper_table(bad)


def test_smooth_averages_equal_groups_of_updates():
    from chronomem.experiments.rl_runs import smooth

    points = [(1000 * (i + 1), float(i % 2)) for i in range(120)]  # a return alternating 0, 1
    smoothed = smooth(points, bins=50)
    assert len(smoothed) == 40 and smoothed[0] == (3000, 1 / 3) and smoothed[-1] == (120_000, 2 / 3)
    assert smooth(points[:7], bins=50) == points[:7]  # short curves are drawn as they are


def test_mmer_and_mean_curves():
    history = [{"step": 8}, {"step": 16, "return_mean": -0.5}, {"step": 24, "return_mean": 0.25},
               {"step": 32, "return_mean": 0.0}]
    assert max_mean_return(history) == 0.25 and max_mean_return(history[:1]) is None
    assert mean_curve([[(16, 0.0), (24, 1.0)], [(16, 1.0)]]) == [(16, 0.5)]


def test_a_run_cut_short_continues_from_its_last_checkpoint(tmp_path, monkeypatch):
    """``ppo_run(reuse=True)`` on a run cut after a checkpoint (its later ones gone, as when a session
    ends): it resumes from there and ends at its frames, the metrics of the frames before kept."""
    import shutil

    from chronomem.experiments import rl_runs
    from chronomem.rl import ppo
    from chronomem.train.metrics import read_metrics

    settings = dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=8, num_minibatches=1,
                    update_epochs=1, checkpoint_every=1)
    run_dir = tmp_path / "run"
    rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, settings, 64, 3, run_dir, progress=False)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000064")  # cut after 48 frames (the last two are kept)
    (run_dir / "checkpoints" / "latest").write_text("step_00000048")
    resumed_from = []
    train = ppo.train
    monkeypatch.setattr(ppo, "train", lambda args, options, resume=None: resumed_from.append(resume) or train(
        args, options, resume=resume))
    result = rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, settings, 64, 3, run_dir, progress=False,
                             reuse=True)
    assert resumed_from[0].checkpoint.name == "step_00000048" and result.frames == 64
    assert [row["step"] for row in result.history] == [16, 32, 48, 64]  # the whole run's: 16-48 read back
    assert [int(row["step"]) for row in read_metrics(run_dir / "metrics.csv")] == [16, 32, 48, 64]


def test_a_finished_run_is_loaded_as_it_ended(tmp_path, monkeypatch):
    """``ppo_run(reuse=True)`` on a finished run: the same weights, history, frames, and torch's random
    state as right after training, without training again."""
    import torch

    from chronomem.experiments import rl_runs
    from chronomem.rl import ppo

    ppo_settings = dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=8, num_minibatches=1,
                        update_epochs=1, log_every=1)
    trained = rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 3, tmp_path / "run",
                              progress=False)
    random_state = torch.get_rng_state()
    torch.manual_seed(12345)  # whatever ran in between

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(ppo, "train", no_training)
    loaded = rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 3, tmp_path / "run",
                             progress=True, reuse=True)  # progress does not change the run
    assert torch.equal(torch.get_rng_state(), random_state)
    assert loaded.frames == trained.frames == 48 and len(trained.history) == 3
    assert loaded.history == trained.history
    assert abs(loaded.seconds - trained.seconds) < 1.0
    for (name, a), (_, b) in zip(trained.agent.state_dict().items(), loaded.agent.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not loaded.agent.training
    assert rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, {**ppo_settings, "checkpoint_every": 2}, 48,
                           3, tmp_path / "run", progress=False, reuse=True).frames == 48  # nor how often it saved
    # 33-48 frames round up to the same three updates of 16: the same run; 49 is a fourth update
    assert rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 33, 3, tmp_path / "run",
                           progress=False, reuse=True).frames == 48
    with pytest.raises(ValueError, match="other settings.*total_frames: saved 48, asked 64"):
        rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 49, 3, tmp_path / "run",
                        progress=False, reuse=True)
    with pytest.raises(ValueError, match="other settings.*seed: saved 3, asked 4"):
        rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 4, tmp_path / "run",
                        progress=False, reuse=True)
    # A run saved before a setting existed (here: recurrence) ran at its default, and is reused as such...
    config_file = tmp_path / "run" / "config.json"
    config = json.loads(config_file.read_text())
    del config["args"]["recurrence"]
    config_file.write_text(json.dumps(config))
    assert rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, ppo_settings, 48, 3, tmp_path / "run",
                           progress=False, reuse=True).frames == 48
    # ...but not when the new setting is asked away from its default.
    with pytest.raises(ValueError, match="other settings.*recurrence: saved None, asked 4"):
        rl_runs.ppo_run("popgym-RepeatPreviousEasy-v0", "lstm", {}, {**ppo_settings, "recurrence": 4}, 48, 3,
                        tmp_path / "run", progress=False, reuse=True)


def test_a_row_may_be_a_variant_of_a_core_that_it_names(tmp_path, capsys):
    """``{"htm-final-norm": {"core": "htm", ...}}``: the row trains the named core with the other options,
    its progress line names the row, it is reused as itself by --resume, and a bad ``core`` is refused
    before anything trains."""
    from chronomem.experiments import rl_runs

    settings = dict(dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=8, num_minibatches=1,
                    update_epochs=1, log_every=1)
    options = dict(core="htm", chunk_size=4, memory_size=4, top_k=2, final_norm=True)
    assert rl_runs.row_core("htm-final-norm", options) == ("htm", dict(chunk_size=4, memory_size=4, top_k=2,
                                                                      final_norm=True))
    assert rl_runs.row_core("lstm", {}) == ("lstm", {})
    assert rl_runs.variant_row("htm", dict(chunk_size=4, memory_size=4, top_k=2), final_norm=True) == options
    env = "popgym-RepeatPreviousEasy-v0"
    rl_runs.check_cores("exp", ("htm-final-norm",), env, settings, {"htm-final-norm": options})
    trained = rl_runs.ppo_run(env, "htm-final-norm", options, settings, 32, 0, tmp_path / "run", progress=True)
    assert f"htm-final-norm on {env}, seed 0" in capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["args"]["core"] == "htm" and saved["core_options"]["final_norm"] is True
    assert saved["args"]["name"] == "htm-final-norm"
    assert "core" not in saved["core_options"]
    assert trained.agent.core.norm is not None  # final_norm reached the core's builder
    loaded = rl_runs.ppo_run(env, "htm-final-norm", options, settings, 32, 0, tmp_path / "run", progress=False,
                             reuse=True)
    assert loaded.history == trained.history
    with pytest.raises(TypeError, match="row 'bad'.*'core' must name a registered core"):
        rl_runs.check_cores("exp", ("bad",), env, settings, {"bad": {"core": 3}})
    with pytest.raises(ValueError, match="core"):
        rl_runs.check_cores("exp", ("bad",), env, settings, {"bad": {"core": "no-such-core"}})


def test_a_kept_evaluation_is_read_back_only_for_the_same_settings_and_weights(tmp_path):
    """``kept_evaluation``: evaluated and written on a fresh run; read back on a resumed one when its
    settings and the agent's weights are the ones kept; evaluated again otherwise."""
    import torch

    from chronomem.experiments import rl_runs

    agent, calls = torch.nn.Linear(3, 2), []

    def evaluate():
        calls.append(1)
        return {"MemoryS7": {"return_mean": 0.5 + len(calls), "episodes": 4}}

    first = rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 4}, evaluate, reuse=False)
    assert len(calls) == 1 and (tmp_path / rl_runs.EVALUATION_FILE).exists()
    assert rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 4}, evaluate, reuse=True) == first
    assert len(calls) == 1  # read back
    assert rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 4}, evaluate, reuse=False) != first  # fresh run
    kept = rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 4}, evaluate, reuse=True)
    assert len(calls) == 2
    assert rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 8}, evaluate, reuse=True) != kept  # settings
    assert len(calls) == 3
    with torch.no_grad():
        agent.weight[0, 0] += 1e-6
    rl_runs.kept_evaluation(tmp_path, agent, {"episodes": 8}, evaluate, reuse=True)  # other weights
    assert len(calls) == 4
    assert rl_runs.kept_evaluation(None, agent, {"episodes": 8}, evaluate, reuse=True) and len(calls) == 5


def test_a_resumed_minigrid_transfer_does_not_evaluate_its_finished_runs_again(tmp_path, monkeypatch):
    from chronomem.rl import evaluate

    whole = run_experiment(get_experiment("minigrid-transfer"), "smoke", tmp_path / "run", progress=False)
    (tmp_path / "run" / "results.json").rename(tmp_path / "whole.json")
    evaluated, really_evaluate = [], evaluate.evaluate
    monkeypatch.setattr(evaluate, "evaluate", lambda *args, **kw: evaluated.append(args[1]) or really_evaluate(
        *args, **kw))
    resumed = run_experiment(get_experiment("minigrid-transfer"), "smoke", tmp_path / "run", progress=False,
                             resume=True)
    assert evaluated == [] and resumed["results"] == whole["results"]
    assert resumed["extra"]["runs"] == whole["extra"]["runs"]


@pytest.mark.parametrize("name", ["ballet-rl", "popgym", "minigrid-transfer"])
def test_a_resumed_experiment_gives_the_uninterrupted_table(tmp_path, monkeypatch, name):
    import shutil

    from chronomem.rl import ppo

    experiment = get_experiment(name)
    whole = run_experiment(experiment, "smoke", tmp_path / "whole", progress=False)
    # An interrupted run: no results yet, and its last run killed before its final checkpoint.
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    for file in ("results.json", "report.md", "results.png", "learning_curves.png"):
        (tmp_path / "cut" / file).unlink(missing_ok=True)
    runs = sorted(p.parent for p in (tmp_path / "cut").rglob("config.json"))
    shutil.rmtree(runs[-1] / "checkpoints")
    trained = []
    train = ppo.train
    monkeypatch.setattr(ppo, "train", lambda args, *rest, **kw: trained.append(args.out) or train(args, *rest, **kw))
    resumed = run_experiment(experiment, "smoke", tmp_path / "cut", progress=False, resume=True)
    assert trained == [str(runs[-1])]  # only the unfinished run trained again
    assert resumed["results"] == whole["results"]
    assert resumed["extra"].get("curves") == whole["extra"].get("curves")
    assert json.loads((tmp_path / "cut" / "results.json").read_text())["results"] == whole["results"]
    assert resumed["config"]["resumed"] and "resumed" not in whole["config"]  # its seconds are the call's


def test_resume_is_refused_where_it_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="--resume: tour cannot reuse"):
        run_experiment(get_experiment("tour"), "smoke", tmp_path, progress=False, resume=True)
    with pytest.raises(ValueError, match="no such directory"):
        run_experiment(get_experiment("popgym"), "smoke", tmp_path / "missing", progress=False, resume=True)


# ---- the learning curves: read at a glance -------------------------------------------------------


def drawn(monkeypatch, draw):
    """The figure ``draw()`` saves, kept open (the plot functions close theirs)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    draw()
    return figures[-1]


def covers(box, other) -> bool:
    return box.x0 < other.x1 and other.x0 < box.x1 and box.y0 < other.y1 and other.y0 < box.y1


def check_readable(fig, path):
    """At least 800 px wide as saved; the legend and the title overlap no panel and lie inside the figure."""
    import matplotlib.image

    assert matplotlib.image.imread(path).shape[1] >= 800
    renderer = fig.canvas.get_renderer()
    outside = [fig.legends[0].get_window_extent(renderer), fig._suptitle.get_window_extent(renderer)]
    for ax in fig.axes:
        if ax.axison:
            assert not any(covers(box, ax.get_window_extent(renderer)) for box in outside)
    page = fig.bbox
    assert all(page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1 for box in outside)


def test_learning_curves_show_a_seed_band_a_random_line_a_shared_y_axis_and_a_legend_outside(tmp_path, monkeypatch):
    from chronomem.experiments.rl_runs import plot_curves

    frames = [1000 * (i + 1) for i in range(10)]
    seeds = [[(f, 0.1 * s + f / 1e5) for f in frames] for s in range(3)]  # seed s: 0.1 s above seed 0
    panels = {"A": {"lstm": seeds, "htm": seeds[:1]}, "B": {"lstm": [[(f, -0.5) for f in frames]] * 3},
              "C": {"htm": seeds}, "D": {"lstm": [[(10 * f, v) for f, v in seed] for seed in seeds]}}
    chance = {"A": -0.25, "B": 0.5, "C": 0.0, "D": 0.1}
    fig = drawn(monkeypatch, lambda: plot_curves(panels, tmp_path / "c.png", "a title", chance=chance, ylim=(-1, 1),
                                                 ylabel="the y"))
    check_readable(fig, tmp_path / "c.png")
    shown = [ax for ax in fig.axes if ax.axison]
    assert len(shown) == 4 and all(ax.get_ylim() == (-1, 1) for ax in shown)  # 2 rows of 3: one slot empty
    assert shown[3].get_xlim()[1] > 5 * shown[0].get_xlim()[1]  # each panel its own frames (a longer run: D)
    assert shown[0].get_ylabel() == "the y"
    for ax in shown:
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert [list(line.get_ydata()) for line in dashed] == [[chance[ax.get_title()]] * 2]
    a = shown[0]
    lstm = next(line for line in a.get_lines() if line.get_label() == "lstm")
    assert list(lstm.get_ydata()) == pytest.approx([0.1 + f / 1e5 for f in frames])  # the mean of the 3 seeds
    band = a.collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(frames[0] / 1e5) and band.max() == pytest.approx(0.2 + frames[-1] / 1e5)
    assert len(a.collections) == 1  # one seed (htm): no band
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["lstm", "htm", "random policy"] and "band: lowest to highest seed" in \
        fig.legends[0].get_title().get_text()


def test_legend_labels_give_each_core_s_seeds_only_where_the_cores_differ():
    from chronomem.experiments.rl_runs import core_labels, seeds_alike

    assert seeds_alike({"lstm": 3, "htm": 3}) and core_labels({"lstm": 3, "htm": 3}) == {"lstm": "lstm", "htm": "htm"}
    assert not seeds_alike({"lstm": 6, "htm": 3})
    assert core_labels({"lstm": 6, "htm": 3}) == {"lstm": "lstm (6 seeds)", "htm": "htm (3 seeds)"}


def test_a_random_policy_return_is_the_same_for_a_seed():
    from chronomem.experiments.rl_runs import random_return

    first = random_return("popgym-RepeatPreviousEasy-v0", episodes=20, seed=3)
    assert random_return("popgym-RepeatPreviousEasy-v0", episodes=20, seed=3) == first
    assert random_return("popgym-RepeatPreviousEasy-v0", episodes=20, seed=4) != first
    assert -1 <= first <= 1


def test_popgym_curves_are_drawn_from_results_old_and_new(tmp_path, monkeypatch):
    """A results dict with every seed's curve draws bands; one written before they were kept (the mean
    curve only, no random returns) draws the means and the random returns computed from the code."""
    curve = [[1000 * (i + 1), -0.5 + 0.01 * i] for i in range(5)]
    old = {"scale": "quick", "config": {"envs": ["popgym-RepeatPreviousEasy-v0"], "seeds": 3},
           "extra": {"curves": {"RepeatPreviousEasy": {"lstm": curve}},
                     "runs": {"lstm": [{"env": "RepeatPreviousEasy", "seed": s, "mmer": -0.4} for s in range(3)]}}}
    monkeypatch.setattr(popgym_experiment, "random_returns", lambda envs: {"RepeatPreviousEasy": -0.375})
    fig = drawn(monkeypatch, lambda: popgym_experiment.plot_learning_curves(old, tmp_path / "old.png"))
    ax = fig.axes[0]
    assert not ax.collections and "not stored" in fig.legends[0].get_title().get_text()
    assert [list(line.get_ydata()) for line in ax.get_lines() if line.get_linestyle() == "--"] == [[-0.375] * 2]
    new = json.loads(json.dumps(old))
    for run in new["extra"]["runs"]["lstm"]:
        run["curve"] = [[f, r + 0.1 * run["seed"]] for f, r in curve]
    new["extra"]["random_return"] = {"RepeatPreviousEasy": -0.5}
    fig = drawn(monkeypatch, lambda: popgym_experiment.plot_learning_curves(new, tmp_path / "new.png"))
    assert len(fig.axes[0].collections) == 1 and fig.axes[0].get_ylim() == (-1, 1)
    assert [list(line.get_ydata()) for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"] == [[-0.5] * 2]


def test_ballet_rl_chance_is_a_random_dancer_on_the_mixture(tmp_path, monkeypatch):
    from chronomem.experiments import ballet_rl

    assert ballet_rl.mixture_chance_return() == pytest.approx((1 / 2 + 1 / 4 + 1 / 8) / 3)
    assert get_experiment("ballet-rl").chance == {"2_delay16": 50, "4_delay16": 25, "8_delay16": 12.5,
                                                  "2_delay48": 50, "4_delay48": 25, "8_delay48": 12.5}
    curve = [[1000 * (i + 1), 0.3] for i in range(5)]
    results = {"scale": "quick", "config": {"observation": "symbolic", "seeds": 1},
               "extra": {"curves": {"htm": curve}, "htm": {"runs": [{"seed": 0, "curve": curve}]}}}
    fig = drawn(monkeypatch, lambda: ballet_rl.plot_learning_curves(results, tmp_path / "b.png"))
    check_readable(fig, tmp_path / "b.png")
    dashed = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert list(dashed[0].get_ydata()) == [pytest.approx(0.2917, abs=1e-4)] * 2
    assert "random dancer" in dashed[0].get_label()
    assert fig.axes[0].get_ylim() == (0, 1)


def test_a_ballet_run_in_progress_is_plotted_from_its_metrics(tmp_path, monkeypatch):
    from chronomem.experiments.ballet_rl import plot_run_in_progress

    def write(where, points):
        where.mkdir(parents=True)
        (where / "metrics.csv").write_text("step,split,return_mean\n" + "".join(f"{s},train,{r}\n" for s, r in points))

    write(tmp_path / "lstm-seed0", [(1000, 0.4), (2000, 0.5), (3000, 0.6)])
    write(tmp_path / "control" / "lstm-seed0", [(100, 0.9), (200, 1.0)])
    write(tmp_path / "control" / "mlp-seed0", [(100, 0.8), (200, 0.95)])
    fig = drawn(monkeypatch, lambda: plot_run_in_progress(tmp_path, tmp_path / "c.png"))
    assert (tmp_path / "c.png").exists()
    level, control = [ax for ax in fig.axes if ax.axison]
    assert level.get_title() == "training episodes: 2_delay16" and control.get_title().startswith("control")
    lines = {line.get_label(): list(line.get_ydata()) for line in level.get_lines() if line.get_linestyle() != "--"}
    assert lines == {"lstm": [0.4, 0.5, 0.6]}
    assert sorted(line.get_label() for line in control.get_lines() if line.get_linestyle() != "--") == ["lstm", "mlp"]


def test_visual_match_plots_the_choice_against_the_distractor_length(tmp_path, monkeypatch):
    from chronomem.experiments.visual_match import DODGE, plot_success_by_length

    results = {"config": {"distractors": [30, 90, 250], "scale": "quick", "seeds": 2},
               "per_seed": {"mlp": {"d30": [30, 36], "d90": [33, 33], "d250": [31, 35]},
                            "htm": {"d30": [96, 98], "d90": [90, 94], "d250": [80, 90]}}}
    fig = drawn(monkeypatch, lambda: plot_success_by_length(results, tmp_path / "s.png"))
    assert (tmp_path / "s.png").exists()
    ax = fig.axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()
             if line.get_linestyle() != "--"}
    # each core's points beside the length, the first core's left of it and the second's right
    beside = {"mlp": [d / DODGE ** 0.5 for d in (30, 90, 250)], "htm": [d * DODGE ** 0.5 for d in (30, 90, 250)]}
    assert lines == {"mlp": (pytest.approx(beside["mlp"]), [33, 33, 33]),
                     "htm": (pytest.approx(beside["htm"]), [97, 92, 85])}
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"] == [pytest.approx(100 / 3)]
    bands = [c for c in ax.collections if not hasattr(c, "get_segments")]
    bars = [[[list(point) for point in segment] for segment in c.get_segments()] for c in ax.collections
            if hasattr(c, "get_segments")]
    assert len(bands) == 2  # a seed band per core
    assert ax.get_legend().get_title().get_text() == "mean over 2 seeds, band and bars: lowest to highest seed"
    # a bar per core and length from the lowest seed to the highest: the spread where a band has no width (one length)
    spreads = {"mlp": [(30, 36), (33, 33), (31, 35)], "htm": [(96, 98), (90, 94), (80, 90)]}
    for segments, model in zip(bars, ("mlp", "htm"), strict=True):
        assert segments == [[[pytest.approx(x), low], [pytest.approx(x), high]]
                            for x, (low, high) in zip(beside[model], spreads[model], strict=True)]
    assert [tick for tick in ax.get_xticks()] == [30, 90, 250]  # the lengths themselves label the axis


@pytest.mark.parametrize("name, env_prefix", [("visual-match", "chronomem/VisualMatch-passive-d"),
                                               ("key-to-door", "chronomem/KeyToDoor-d")])
def test_the_tvt_experiments_train_their_control_and_each_length(tmp_path, name, env_prefix):
    results = run_experiment(get_experiment(name), "smoke", tmp_path, progress=False)
    config, extra = results["config"], results["extra"]
    assert config["control_env"] == f"{env_prefix}5-control-v0"
    saved = json.loads((tmp_path / "control" / "mlp-seed0" / "config.json").read_text())
    assert saved["args"]["env"] == config["control_env"]
    saved = json.loads((tmp_path / "d5" / "lstm-seed0" / "config.json").read_text())
    assert saved["args"]["env"] == f"{env_prefix}5-v0"
    assert set(results["results"]) == {"mlp", "lstm", "htm", "htm-final-norm"}
    assert all(set(cells) == {"d5"} for cells in results["results"].values())
    assert set(results["control"]["learned"]) == {"mlp", "lstm", "htm", "htm-final-norm"}
    saved = json.loads((tmp_path / "d5" / "htm-final-norm-seed0" / "config.json").read_text())
    assert saved["args"]["core"] == "htm" and saved["core_options"]["final_norm"] is True  # a variant row
    assert all(0 <= row["success"] <= 100 for rows in extra["runs"].values() for row in rows)
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "success_by_distractor.png").exists()


def test_visual_match_d30_is_quick_at_30_with_twice_the_episodes_and_a_floor_and_gate_row(tmp_path):
    """visual-match-d30: quick's PPO settings but an entropy weight of 0.05 and quick's agents at its longest
    distractor with twice its episodes, the control at that distractor, and the row htm-floor-gate (HTM with
    relevance_floor and read_gate), htm-final-norm (the paper's layer with final_norm) and both together."""
    from chronomem.experiments.visual_match import CPU_HTM, D30_SCALES, SCALES

    quick, d30 = SCALES["quick"], D30_SCALES["quick"]
    assert d30.ppo == {**quick.ppo, "ent_coef": 0.05} and quick.ppo["ent_coef"] == 0.03
    assert d30.distractors == (max(quick.distractors),)
    assert d30.frames(30) == 2 * quick.frames(30) == 3_000_000
    assert d30.control_frames == d30.frames(30)  # the control at 30 with the runs' frames
    assert d30.models["htm"] == CPU_HTM
    assert d30.models["htm-floor-gate"] == dict(core="htm", **CPU_HTM, relevance_floor=0.6, read_gate=0.0)
    assert d30.models["htm-final-norm"] == dict(core="htm", **CPU_HTM, final_norm=True)
    assert d30.models["htm-floor-gate-final-norm"] == dict(core="htm", **CPU_HTM, relevance_floor=0.6, read_gate=0.0,
                                                           final_norm=True)
    long = D30_SCALES["long"]  # twice the frames again, the control as quick's, without the paper's layer
    assert long.frames(30) == 2 * d30.frames(30) and long.control_frames == d30.control_frames
    assert long.ppo == d30.ppo and long.models == {m: d30.models[m] for m in ("mlp", "lstm", "htm-floor-gate")}
    with pytest.raises(ValueError, match="scale of visual-match-d30 must be one of"):
        run_experiment(get_experiment("visual-match-d30"), "paper", tmp_path / "paper", progress=False)

    results = run_experiment(get_experiment("visual-match-d30"), "smoke", tmp_path, progress=False)
    assert results["config"]["control_env"] == "chronomem/VisualMatch-passive-d5-control-v0"
    saved = json.loads((tmp_path / "d5" / "htm-floor-gate-seed0" / "config.json").read_text())
    assert saved["args"]["core"] == "htm" and saved["args"]["name"] == "htm-floor-gate"
    assert saved["core_options"]["relevance_floor"] == 0.6 and saved["core_options"]["read_gate"] == 0.0
    assert set(results["results"]) == set(results["control"]["learned"]) == {"mlp", "htm-floor-gate"}
    assert results["experiment"] == "visual-match-d30"


def test_visual_match_d30_whole_is_d30_quick_with_rollouts_of_two_whole_episodes(tmp_path):
    """visual-match-d30-whole: visual-match-d30's quick settings, frames and control but rollouts of 120 steps, a
    multiple of the 60-step episode, for the memoryless agent, the LSTM and htm-floor-gate-final-norm; its smoke
    scale runs those three rows and their control."""
    from chronomem.experiments.visual_match import D30_SCALES, WHOLE_SCALES, episode_length

    d30, whole = D30_SCALES["quick"], WHOLE_SCALES["quick"]
    assert whole.ppo == {**d30.ppo, "num_steps": 120} and d30.ppo["num_steps"] == 128
    assert whole.ppo["num_steps"] % episode_length(30) == 0 and d30.ppo["num_steps"] % episode_length(30)
    assert (whole.distractors, whole.frames(30), whole.control_frames) == (d30.distractors, d30.frames(30),
                                                                          d30.control_frames)
    assert whole.models == {m: d30.models[m] for m in ("mlp", "lstm", "htm-floor-gate-final-norm")}
    results = run_experiment(get_experiment("visual-match-d30-whole"), "smoke", tmp_path, progress=False)
    rows = {"mlp", "lstm", "htm-floor-gate-final-norm"}
    assert set(results["results"]) == set(results["control"]["learned"]) == rows
    saved = json.loads((tmp_path / "d5" / "htm-floor-gate-final-norm-seed0" / "config.json").read_text())
    assert saved["core_options"]["final_norm"] is True and saved["core_options"]["relevance_floor"] == 0.6
