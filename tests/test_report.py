"""The results page is rendered from results.json files, exactly as the runs wrote them."""

import json

import pytest

from chronomem.report import find_results, results_page


def write_run(directory, experiment="copy", scale="quick", seed=0, results=None, paper=None, **extra):
    directory.mkdir(parents=True, exist_ok=True)
    data = {"experiment": experiment, "scale": scale, "seed": seed, "seconds": 12.0,
            "results": results or {"lstm": {"T=100": 30.25}}, "paper": paper or {"lstm": {"T=100": 99.0}},
            **{"config": {}, **extra}}
    (directory / "results.json").write_text(json.dumps(data))
    return directory


def test_one_run_gives_a_row_per_model_and_setting(tmp_path):
    write_run(tmp_path / "a", results={"lstm": {"T=100": 30.25}, "tlb": {"x1": 35.0}},
              paper={"lstm": {"T=100": 99.0}}, metric="test accuracy (%)")
    page = results_page([tmp_path])
    assert "## copy — `quick`" in page
    assert "| lstm | T=100 | 30.2 | 99.0 |" in page  # ours, then the paper's
    assert "| tlb | x1 | 35.0 | — |" in page  # no sparse matrix: tlb has only its own setting
    assert "| lstm | x1 |" not in page
    assert "Metric: test accuracy (%)." in page


def test_seeds_of_one_experiment_share_a_section_with_their_mean(tmp_path):
    write_run(tmp_path / "s0", seed=0, results={"lstm": {"T=100": 30.0}})
    write_run(tmp_path / "s1", seed=1, results={"lstm": {"T=100": 50.0}})
    write_run(tmp_path / "other", experiment="listops", results={"tlb": {"x1": 35.0}}, paper={"tlb": {"x1": 38.2}},
              chance=10.0)
    page = results_page([tmp_path])
    assert page.count("## copy") == 1 and page.count("## listops") == 1
    assert "| model | setting | seed 0 | seed 1 | mean | paper |" in page
    assert "| lstm | T=100 | 30.0 | 50.0 | 40.0 | 99.0 |" in page
    assert "| tlb | x1 | 35.0 | 38.2 | 10.0 |" in page  # listops: its recorded chance level, 10%, last


def test_runs_of_other_models_on_the_same_control_share_its_table(tmp_path):
    def control(per_seed, task="`Easy-v0`"):
        return {"task": task, "frames": 100, "metric": "MMER", "threshold": "MMER >= 0.9", "per_seed": per_seed,
                "learned": {m: [v >= 0.9 for v in values] for m, values in per_seed.items()}}

    write_run(tmp_path / "a", results={"mlp": {"T=100": 30.0}}, control=control({"mlp": [0.95, 0.97]}))
    write_run(tmp_path / "b", results={"htm": {"T=100": 35.0}}, control=control({"htm": [0.99, 0.5]}))
    page = results_page([tmp_path])
    assert page.count("Control (no memory needed): `Easy-v0`") == 1
    table = page.split("Control (no memory needed)")[1]
    assert "| mlp | 0.95, 0.97 | 2/2 |\n| htm | 0.99, 0.50 | 1/2 |" in table
    assert page.count("**The control was not learned** by `htm` (learned by 1/2 seeds)") == 1
    write_run(tmp_path / "c", results={"tlb": {"T=100": 35.0}}, control=control({"tlb": [1.0]}, task="`Other-v0`"))
    assert results_page([tmp_path]).count("Control (no memory needed):") == 2  # another task: its own table


def test_a_later_run_of_other_models_shares_the_column_of_its_seeds(tmp_path):
    write_run(tmp_path / "a", results={"lstm": {"T=100": 30.0}})
    write_run(tmp_path / "b", results={"tlb": {"T=100": 35.0}}, paper={})
    write_run(tmp_path / "c", seed=1, results={"tlb": {"T=100": 45.0}}, paper={})
    page = results_page([tmp_path])
    assert "| model | setting | seed 0 | seed 1 | mean | paper |" in page
    assert "| lstm | T=100 | 30.0 | — | — | 99.0 |" in page
    assert "| tlb | T=100 | 35.0 | 45.0 | 40.0 | — |" in page


def test_an_equal_time_run_gets_its_own_section_after_the_step_count_runs(tmp_path):
    write_run(tmp_path / "steps", results={"lstm": {"T=100": 30.0}})
    write_run(tmp_path / "timed", results={"lstm": {"T=100": 50.0}}, config={"time_budget": 440.0})
    page = results_page([tmp_path])
    timed = "## copy — `quick`, equal time budget of 440 s per model"
    assert page.count("## copy — `quick`") == 2 and timed in page
    assert page.index("| lstm | T=100 | 30.0 |") < page.index(timed) < page.index("| lstm | T=100 | 50.0 |")
    assert "| 40.0 |" not in page  # the two protocols are never averaged


def test_each_section_names_the_commit_that_made_it(tmp_path):
    write_run(tmp_path / "a")
    data = json.loads((tmp_path / "a" / "results.json").read_text())
    data["code"] = {"version": "0.1.0", "commit": "0123456789abcdef", "dirty": False}
    (tmp_path / "a" / "results.json").write_text(json.dumps(data))
    assert "code: commit `0123456789`." in results_page([tmp_path / "a"])
    data["code"]["dirty"] = True
    (tmp_path / "a" / "results.json").write_text(json.dumps(data))
    assert "code: commit `0123456789` with uncommitted changes." in results_page([tmp_path / "a"])


def test_a_resumed_run_says_its_wall_time_is_the_resumed_calls(tmp_path):
    write_run(tmp_path / "whole")
    assert "wall time 12 s; code: commit not recorded." in results_page([tmp_path / "whole"])
    write_run(tmp_path / "resumed", config={"resumed": True})
    assert "wall time 12 s (of the resumed call; the runs it loaded trained before it);" in results_page(
        [tmp_path / "resumed"])


def test_a_tour_sub_run_is_not_counted_twice(tmp_path):
    write_run(tmp_path / "tour", experiment="tour", results={"copy: lstm": {"T=100": 30.0}})
    write_run(tmp_path / "tour" / "copy", experiment="copy", results={"lstm": {"T=100": 30.0}})
    assert find_results([tmp_path]) == [tmp_path / "tour" / "results.json"]
    assert "## copy" not in results_page([tmp_path])


def test_the_same_inputs_give_the_same_page(tmp_path):
    write_run(tmp_path / "b", seed=1)
    write_run(tmp_path / "a", seed=0)
    assert results_page([tmp_path]) == results_page([tmp_path / "b", tmp_path / "a"])


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        results_page([tmp_path / "missing"])
    with pytest.raises(ValueError, match="no results.json"):
        results_page([tmp_path])
    (tmp_path / "results.json").write_text(json.dumps({"experiment": "x"}))
    with pytest.raises(ValueError, match="missing"):
        results_page([tmp_path])
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        results_page([tmp_path])


def test_values_below_ten_keep_two_decimals(tmp_path):
    write_run(tmp_path / "a", results={"lstm": {"return": 0.944, "bpb": 2.154, "steps": 1200}},
              paper={"lstm": {"return": 0.91, "bpb": 0.99}})
    page = results_page([tmp_path])
    assert "| lstm | return | 0.94 | 0.91 |" in page
    assert "| lstm | bpb | 2.15 | 0.99 |" in page
    assert "| lstm | steps | 1200.0 | — |" in page


def test_a_model_only_the_paper_has_gets_rows_for_the_settings_run(tmp_path):
    write_run(tmp_path / "a", results={"lstm": {"RepeatPreviousEasy": 0.5}},
              paper={"lstm": {"RepeatPreviousEasy": 0.9}, "gru": {"RepeatPreviousEasy": 0.8, "CountRecallHard": 0.1}})
    page = results_page([tmp_path])
    assert "| lstm | RepeatPreviousEasy | 0.50 | 0.90 |" in page
    assert "| gru | RepeatPreviousEasy | — | 0.80 |" in page  # after our rows, ours empty
    assert page.index("| lstm |") < page.index("| gru |")
    assert "CountRecallHard" not in page  # a setting no run measured gets no row


@pytest.mark.parametrize("config", [{"scale": {"seeds": 3}}, {"scale": "quick", "seeds": 3}])  # the RL layout 2nd
def test_a_run_that_averages_its_own_seeds_says_so(tmp_path, config):
    write_run(tmp_path / "r", seed=4, results={"lstm": {"T=100": 30.0}}, config=config)
    assert "| model | setting | seeds 4-6, mean | paper |" in results_page([tmp_path])


def test_the_report_reads_results_json_alone():
    """The report renders a run from its results.json: the chance level, its label and the claims are
    recorded there, so rendering imports neither the registry nor any experiment (no cycle back)."""
    import subprocess
    import sys

    code = """
import sys
from chronomem.report import claims_markdown, comparison_table
run = {"experiment": "not-registered", "results": {"a": {"s": 80.0}, "b": {"s": 40.0}}, "paper": {},
       "chance": 50.0, "chance_label": "coin", "scale": "quick", "config": {},
       "claims": [{"text": "a above b", "better": "a", "worse": "b"}]}
print(comparison_table(run["results"], run["paper"], run=run))
print(claims_markdown([run]))
print(sorted(m for m in sys.modules if m.startswith(("chronomem.registry", "chronomem.experiments"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "| coin | 50.0 |" in out
    assert "a above b" in out and "holds" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_report_counts_long_lists_and_writes_short_ones():
    """report.md writes a run's extra measurements, but a learning curve (a list of thousands of points)
    only as its length: the curve is in results.json and the figures."""
    from chronomem.registry import get_experiment
    from chronomem.report import report_markdown

    curve = [[frames, 0.5] for frames in range(0, 2000 * 64, 64)]
    results = {"experiment": "copy-baselines", "scale": "quick", "seed": 0, "seconds": 1.0, "config": {},
               "results": {"lstm": {"T=100": 30.0}}, "paper": {},
               "extra": {"runs": [{"seed": 0, "curve": curve, "last": [1, 2, 3]}]}}
    report = report_markdown(get_experiment("copy-baselines"), results)
    assert '"curve": "2000 entries (in results.json)"' in report
    assert '"last": [\n' in report and "128000" not in report and "127936" not in report
    assert len(results["extra"]["runs"][0]["curve"]) == 2000  # results.json keeps every point


def visual_match_run(directory, models, seeds=3, seed=0, control=False):
    """A quick visual-match results.json of ``models`` (success per seed and a training curve each), made
    with ``--seed seed``; ``control``: its control's summary too, seed i at 90 + i %, every seed learned."""
    lengths, own = (5, 30), range(seed, seed + seeds)
    per_seed = {m: {f"d{d}": [40.0 + i + d / 10 for i in own] for d in lengths} for m in models}
    curve = [[2048, 30.0], [4096, 50.0]]
    extra = {"runs": {m: [{"distractor": d, "seed": i, "success_curve": curve} for d in lengths for i in own]
                      for m in models},
             "control": {m: [{"seed": i, "success_curve": curve} for i in own] for m in models},
             "apples": {m: {f"d{d}": 3.0 + seed for d in lengths} for m in models}}
    if control:
        summary = {"task": "the colour shown", "frames": 4096, "metric": "success (%)", "threshold": ">= 90%",
                   "per_seed": {m: [90.0 + i for i in own] for m in models},
                   "learned": {m: [True] * seeds for m in models}}
    config = {"scale": "quick", "distractors": list(lengths), "seeds": seeds, "game": "visual_match",
              "models": list(models)}
    return write_run(directory, experiment="visual-match", seed=seed,
                     results={m: {k: sum(v) / seeds for k, v in cells.items()} for m, cells in per_seed.items()},
                     paper={"htm": {"d90": 97.0}}, per_seed=per_seed, extra=extra, config=config,
                     **({"control": summary} if control else {}))


def test_the_mean_of_runs_of_other_seeds_is_over_their_seeds(tmp_path):
    """A row pooled from a run of seeds 0-2 and one of seeds 3-5 shows the mean of its six seeds, as its
    claims take it, not the mean of the two runs' means, which each run stores rounded to a decimal; so
    does ``join_runs`` (the figures)."""
    from chronomem.report import join_runs, load_results, results_page

    runs = {0: [97.0, 97.33, 98.67], 3: [30.67, 97.0, 99.0]}  # means 97.667 and 75.557: stored 97.7 and 75.6
    for seed, values in runs.items():
        directory = visual_match_run(tmp_path / "runs" / f"seed{seed}", ["lstm"], seed=seed)
        data = json.loads((directory / "results.json").read_text())
        data["per_seed"]["lstm"]["d30"] = values
        data["results"]["lstm"]["d30"] = round(sum(values) / 3, 1)
        (directory / "results.json").write_text(json.dumps(data))
    row = next(line for line in results_page([tmp_path / "runs"]).splitlines() if line.startswith("| lstm | d30 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2:5] == ["97.7", "75.6", "86.6"]  # (97.7 + 75.6) / 2 would show 86.7
    joined = join_runs([load_results(tmp_path / "runs" / f"seed{seed}" / "results.json") for seed in runs])
    assert joined["results"]["lstm"]["d30"] == pytest.approx(sum(runs[0] + runs[3]) / 6)  # the figures' value


def test_runs_of_other_models_join_into_one_figure(tmp_path):
    """Two visual-match runs made apart (the main run's three models, then one more) join model by model
    (results, per seed, the extra's curves, config's models), and ``write_figures`` draws the joined
    figures in one folder per experiment and scale; a model in both runs, or other seeds, is refused."""
    from chronomem.report import join_runs, load_results, write_figures

    main = visual_match_run(tmp_path / "runs" / "main", ["mlp", "lstm", "htm"])
    more = visual_match_run(tmp_path / "runs" / "more", ["transformer-xl"])
    runs = [load_results(d / "results.json") for d in (main, more)]
    joined = join_runs(runs)
    assert list(joined["results"]) == joined["config"]["models"] == ["mlp", "lstm", "htm", "transformer-xl"]
    assert set(joined["per_seed"]) == set(joined["extra"]["runs"]) == set(joined["extra"]["control"]) == set(
        joined["results"])
    assert joined["per_seed"]["transformer-xl"] == runs[1]["per_seed"]["transformer-xl"]
    written = write_figures([tmp_path / "runs"], tmp_path / "figures")
    folder = tmp_path / "figures" / "visual-match-quick"
    assert sorted(written) == [folder / "learning_curves.png", folder / "success_by_distractor.png"]
    assert all(path.stat().st_size > 1000 for path in written)
    with pytest.raises(ValueError, match="more than one run"):
        join_runs([runs[0], runs[0]])
    other = load_results(visual_match_run(tmp_path / "other", ["transformer-xl"], seeds=2) / "results.json")
    with pytest.raises(ValueError, match="must share the seeds and settings"):
        join_runs([runs[0], other])


def test_other_seeds_of_a_model_pool_in_the_table_the_claims_and_the_figures(tmp_path):
    """A run made again with ``--seed 3`` for two of the main run's models adds seeds 3-5 to theirs: the
    table lists six values per row and takes the interval over six, the control's rows count six seeds, the
    claims judge the pooled seeds, and ``join_runs`` (the figures) pools them in seed order, the means
    over both runs, whichever run is listed first; the same seeds twice are refused."""
    from chronomem.report import join_runs, load_results, results_page, score, write_figures

    main = visual_match_run(tmp_path / "runs" / "main", ["mlp", "lstm", "htm"], control=True)
    more = visual_match_run(tmp_path / "runs" / "more", ["lstm", "htm"], seed=3, control=True)
    claim = {"text": "The LSTM remembers the colour", "better": "lstm", "worse": "mlp", "settings": ["d30"]}
    for directory in (main, more):
        data = json.loads((directory / "results.json").read_text())
        (directory / "results.json").write_text(json.dumps({**data, "claims": [claim]}))
    page = results_page([tmp_path / "runs"])
    assert "seeds 0-2, mean" in page and "seeds 3-5, mean" in page
    lstm = [40.0 + i + 3.0 for i in range(6)]  # d30's values, seeds 0-5
    row = next(line for line in page.splitlines() if line.startswith("| lstm | d30 |"))
    assert " / ".join(f"{v:.1f}" for v in lstm) in row
    low, high = score(sum(lstm) / 6, lstm).interval
    assert f"[{low:.1f}, {high:.1f}]" in row  # over six seeds, narrower than either run's three
    assert "| lstm | 90.0, 91.0, 92.0, 93.0, 94.0, 95.0 | 6/6 |" in page  # in seed order
    assert "| mlp | 90.0, 91.0, 92.0 | 3/3 |" in page
    judged = next(line for line in page.splitlines() if line.strip().startswith("- d30: lstm"))
    assert f"[{low:.1f}, {high:.1f}]" in judged.split(" vs ")[0]
    runs = [load_results(d / "results.json") for d in (more, main)]  # any order: joined in seed order
    joined = join_runs(runs)
    assert joined["config"]["models"] == ["mlp", "lstm", "htm"]
    assert joined["per_seed"]["lstm"]["d30"] == lstm and len(joined["per_seed"]["mlp"]["d30"]) == 3
    assert joined["results"]["lstm"]["d30"] == pytest.approx(sum(lstm) / 6)
    assert [r["seed"] for r in joined["extra"]["control"]["htm"]] == [0, 1, 2, 3, 4, 5]
    assert [r["seed"] for r in joined["extra"]["runs"]["lstm"] if r["distractor"] == 30] == [0, 1, 2, 3, 4, 5]
    assert joined["extra"]["apples"]["lstm"] == {"d5": 4.5, "d30": 4.5}  # 3.0 and 6.0: the two runs' means
    assert joined["extra"]["apples"]["mlp"]["d5"] == 3.0
    assert len(write_figures([tmp_path / "runs"], tmp_path / "figures")) == 2
    again = load_results(visual_match_run(tmp_path / "again", ["htm"], seed=2) / "results.json")
    with pytest.raises(ValueError, match=r"seed\(s\) \[2\] of model 'htm' in more than one run"):
        join_runs([runs[1], again])
