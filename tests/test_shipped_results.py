"""The measured tables shipped in docs/measured were made by the configurations the code has now.

A scale's settings (step or frame counts, sizes, learning rates, model options) are recorded in
every results.json's ``config``. When the code's scale differs from the one a shipped results.json
records, its numbers are no longer what ``chronomem run`` gives: this test fails, naming the
settings, until the experiment is run again (``chronomem run EXPERIMENT --scale SCALE``) and its
results.json replaced. Code changes that keep the configuration (a faster kernel, a fix) are shown
on the results page instead, by the commit each results.json records (``code``).
"""

import dataclasses
import json
from pathlib import Path

import pytest

from chronomem.experiments import (
    babyai,
    ballet_rl,
    decision_transformer,
    htm,
    images,
    listops,
    lm,
    minigrid,
    popgym,
    relevance,
    ssl,
    visual_match,
)
from chronomem.experiments import copy_baselines as copy

MEASURED = Path(__file__).resolve().parent.parent / "docs" / "measured"
SHIPPED = sorted(MEASURED.glob("*/results.json"))

SCALE_TABLES = {
    "copy-baselines": copy.SCALES, "ballet": htm.BALLET_SCALES, "pai": htm.PAI_SCALES, "listops": listops.SCALES,
    "listops-length": listops.SCALES, "transfer-copy": relevance.TRANSFER_SCALES,
    "denoise": relevance.DENOISE_SCALES, "lm": lm.SCALES, "resolution-transfer": images.SCALES,
    "resolution-transfer-learned": images.SCALES,
    "babyai": babyai.SCALES, "babyai-multi": babyai.MULTI_SCALES, "ballet-rl": ballet_rl.SCALES,
    "popgym": popgym.SCALES, "popgym-harder": popgym.HARDER_SCALES, "minigrid-transfer": minigrid.SCALES,
    "ssl": ssl.SCALES,
    "decision-transformer": decision_transformer.SCALES, "listops-length-easy": listops.EASY_SCALES,
    **visual_match.GAME_SCALES,
}
MISSING = "(not recorded)"
PER_MODEL = ("model_ppo",)  # {model: settings} fields: a model added since does not change the runs recorded


def as_json(value):
    """``value`` as results.json stores it (tuples become lists, dataclasses dicts)."""
    return json.loads(json.dumps(value, default=lambda obj: dataclasses.asdict(obj) if dataclasses.is_dataclass(obj)
                                 else str(obj)))


def runs_of(results: dict) -> list[tuple[str, str, dict]]:
    """``(experiment, scale, config)`` of every experiment a results.json holds (the tour holds several)."""
    if results["experiment"] == "tour":
        return [(name, results["scale"], config) for name, config in results["config"]["experiments"].items()]
    return [(results["experiment"], results["scale"], results["config"])]


def changed_settings(scale, config: dict) -> dict:
    """The settings of ``scale`` (the code's) that ``config`` (a results.json's) recorded otherwise:
    ``{name: (recorded, now)}``. A run may choose some of the scale's models (``--models``): a list of
    model names then stands for them."""
    recorded = config["scale"] if isinstance(config.get("scale"), dict) else config
    defaults = {f.name: as_json(f.default) for f in dataclasses.fields(scale) if f.default is not dataclasses.MISSING}
    changed = {}
    for name, now in as_json(dataclasses.asdict(scale)).items():
        was = recorded.get(name, MISSING)
        if was == MISSING and name in defaults and now == defaults[name]:
            continue  # a field added since, at its default: what the code did before the field existed
        if isinstance(now, dict) and isinstance(was, list):  # the models chosen among the scale's
            if not set(was) <= set(now):
                changed[name] = (was, sorted(now))
        elif name in PER_MODEL and isinstance(recorded.get("models"), list):  # only the models that ran
            ran = set(recorded["models"])
            was_ran, now_ran = ({m: v for m, v in d.items() if m in ran} for d in (was, now))
            if was_ran != now_ran:
                changed[name] = (was_ran, now_ran)
        elif was != now:
            changed[name] = (was, now)
    return changed


def test_every_shipped_experiment_is_checked():
    assert SHIPPED, f"no results.json under {MEASURED}"
    for path in SHIPPED:
        for name, _, _ in runs_of(json.loads(path.read_text())):
            assert name in SCALE_TABLES, f"{path}: add {name!r}'s scales to SCALE_TABLES"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.parent.name)
def test_shipped_results_were_made_by_the_configs_the_code_produces(path):
    for name, scale, config in runs_of(json.loads(path.read_text())):
        changed = changed_settings(SCALE_TABLES[name][scale], config)
        assert not changed, (f"{path.relative_to(MEASURED.parent.parent)} is stale: {name} at scale {scale} now "
                             f"runs with other settings {changed} (recorded, now); run `chronomem run {name} --scale "
                             f"{scale}` again and replace it")


def test_a_changed_setting_is_caught():
    # The check can fail: a step count, a nested model option and a new field away from its default each
    # count as a change.
    scale = htm.BALLET_SCALES["tour"]
    recorded = {"scale": {**as_json(dataclasses.asdict(scale)), "models": ["htm"]}}
    assert changed_settings(scale, recorded) == {}
    assert "steps" in changed_settings(dataclasses.replace(scale, steps=scale.steps + 1), recorded)
    other = {"htm": {**scale.models["htm"], "top_k": 4}}
    assert changed_settings(dataclasses.replace(scale, models=other), {"scale": as_json(dataclasses.asdict(scale))})
    del recorded["scale"]["warmup"]  # not recorded: the same run while the code keeps its default...
    assert changed_settings(scale, recorded) == {}
    assert changed_settings(dataclasses.replace(scale, warmup=5), recorded) == {"warmup": (MISSING, 5)}  # ...not else
    recorded["scale"]["models"] = ["htm", "lstm"]  # a model the scale does not have any more
    assert "models" in changed_settings(scale, recorded)
    # a model's own PPO changes count for the models that ran, not for a model added since
    quick = ballet_rl.SCALES["quick"]
    recorded = {"scale": {**as_json(dataclasses.asdict(quick)), "models": ["mlp", "htm"]}}
    assert changed_settings(quick, recorded) == {}
    added = dataclasses.replace(quick, models={**quick.models, "new": {}},
                                model_ppo={**quick.model_ppo, "new": {"depth": 3}})
    assert changed_settings(added, recorded) == {}
    ran = dataclasses.replace(quick, model_ppo={**quick.model_ppo, "htm": {"depth": 3}})
    assert changed_settings(ran, recorded) == {"model_ppo": ({"htm": {"depth": 1}}, {"htm": {"depth": 3}})}
