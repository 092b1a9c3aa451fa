"""The registry: names -> constructors, and what asking for one imports."""

import subprocess
import sys

import pytest

from chronomem.registry import build_backbone, get_experiment, get_model, get_task, names

IMPORTED = ("import sys; from chronomem.registry import {call}; {call}({name!r}); "
            "print('chronomem.experiments' in sys.modules)")


@pytest.mark.parametrize("call, name, experiments", [("get_model", "lstm", False), ("get_task", "copy", False),
                                                     ("get_experiment", "copy-baselines", True)])
def test_only_an_experiment_imports_the_experiments(call, name, experiments):
    code = IMPORTED.format(call=call, name=name)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(experiments)


def test_names_list_every_kind():
    listed = names()
    assert "lstm" in listed["models"] and "copy" in listed["tasks"] and "copy-baselines" in listed["experiments"]
    from chronomem.baselines import build_lstm
    from chronomem.tasks.copy import CopyTask

    assert get_model("lstm") is build_lstm and get_task("copy") is CopyTask
    assert get_experiment("copy-baselines").name == "copy-baselines"


@pytest.mark.parametrize("lookup", [get_model, get_task, get_experiment])
def test_unknown_name_lists_the_valid_ones(lookup):
    with pytest.raises(ValueError, match="valid names: "):
        lookup("no-such-name")


def test_a_missing_module_raises(monkeypatch):
    """A registered module that cannot be imported (renamed, deleted) fails loudly: it must not drop out of
    every test that loops over the registry."""
    import chronomem.registry as registry

    monkeypatch.setattr(registry, "_MODULES", (*registry._MODULES, "chronomem.no_such_mechanism"))
    with pytest.raises(ModuleNotFoundError, match="no_such_mechanism"):
        get_model("lstm")


def test_builders_keep_each_modules_own_defaults():
    """A registry builder passes on what it is given and restates no default: every field a builder is
    not given is the module's own default (issue 52: HTM's chunk default was 16 in one place, 32 in two)."""
    from dataclasses import asdict

    from chronomem.htm import HTMAttention, HTMConfig
    from chronomem.tlb import TLB

    given = {"dim": 64, "depth": 2, "num_heads": 4}
    htm = asdict(build_backbone("htm", **given, causal=True).config)
    assert htm == {**asdict(HTMConfig()), **given}
    tlb = asdict(build_backbone("tlb", **given, causal=True).config)
    assert tlb == {**asdict(TLB.Config()), **given, "causal": True}
    read = HTMAttention(64)
    assert (read.chunk_size, read.top_k) == (HTMConfig.chunk_size, HTMConfig.top_k)
