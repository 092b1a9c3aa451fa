"""The registry: names -> constructors, and what asking for one imports."""

import subprocess
import sys
import textwrap

import pytest
import torch

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


@pytest.fixture
def package_dir(tmp_path, monkeypatch):
    """A folder read as part of the chronomem package, where a test writes a module file; the registry
    forgets what it found and loaded before and after the test."""
    import chronomem
    import chronomem.registry as registry

    monkeypatch.setattr(chronomem, "__path__", [*chronomem.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "MODELS", dict(registry.MODELS))
    monkeypatch.setattr(registry, "_loaded", set(registry._loaded))
    registry.model_modules.cache_clear()
    yield tmp_path
    registry.model_modules.cache_clear()
    for name in [name for name in sys.modules if name.startswith("chronomem.toy_")]:
        del sys.modules[name]


def test_a_new_model_is_one_module_file_with_its_registration(package_dir):
    """Nothing to edit but the new file: the registry finds the module by its ``@register_model`` and
    leaves a module that registers nothing unimported."""
    import chronomem.registry as registry

    (package_dir / "toy_mechanism.py").write_text(textwrap.dedent("""
        from torch import nn

        from chronomem.registry import register_model


        @register_model("toy-identity")
        def build(dim, depth, num_heads, causal, **options):
            return nn.Identity()
    """))
    (package_dir / "toy_helpers.py").write_text("raise RuntimeError('a module registering nothing is not imported')\n")
    assert "chronomem.toy_mechanism" in registry.model_modules()
    assert "chronomem.toy_helpers" not in registry.model_modules()
    assert isinstance(build_backbone("toy-identity", dim=4, depth=1, num_heads=1, causal=True), torch.nn.Identity)


def test_a_broken_model_module_raises(package_dir):
    """A module that registers a model but cannot be imported fails loudly: it must not drop out of every
    test that loops over the registry."""
    (package_dir / "toy_broken.py").write_text("import chronomem.no_such_mechanism\n\n\n"
                                                "@register_model('toy-broken')\ndef build(**options): ...\n")
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
