"""chronomem.config: fields that carry their flag, the flags built from them, and the keyword-or-Config
constructor."""

import argparse
import dataclasses
import inspect
import subprocess
import sys

import pytest

from chronomem.config import add_config_flags, build_config, config_flag, given_config, resumable_fields, setting


@dataclasses.dataclass
class Settings:
    steps: int = setting(10, "steps", resumable=True)
    lr: float = setting(0.1, "learning rate")
    mode: str = setting("a", "mode", choices=("a", "b"))
    betas: tuple[float, float] = setting((0.9, 0.99), "betas")
    clip: float | None = setting(1.0, "clip", zero_is_none="no clipping")
    num_heads: int = setting(4, "heads", flag="--heads")
    anneal: bool = setting(True, "anneal", aliases=("--constant",))
    norm: bool = setting(False, "normalise")
    out: str | None = setting(None, "where")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Settings)
    return parser.parse_args(argv)


def test_one_flag_per_field_named_from_the_field():
    flags = [config_flag(f) for f in dataclasses.fields(Settings)]
    assert flags == ["--steps", "--lr", "--mode", "--betas", "--clip", "--heads", "--no-anneal", "--norm", "--out"]
    assert [f.name for f in resumable_fields(Settings)] == ["steps"]


def test_only_the_flags_given_are_given_and_take_the_fields_types():
    assert given_config(parse(), Settings) == {}
    given = given_config(parse("--lr", "0.1", "--betas", "0.8", "0.9", "--heads", "2", "--no-anneal", "--norm"),
                         Settings)
    # --lr 0.1 equals the default and is still "given": --resume tells it from a flag left out
    assert given == {"lr": 0.1, "betas": (0.8, 0.9), "num_heads": 2, "anneal": False, "norm": True}
    assert given_config(parse("--constant"), Settings) == {"anneal": False}  # an alias
    assert given_config(parse("--clip", "0"), Settings) == {"clip": None}  # zero_is_none
    assert given_config(parse("--clip", "0.5"), Settings) == {"clip": 0.5}
    Settings(**given)  # the config takes them as given
    with pytest.raises(SystemExit):
        parse("--mode", "c")  # choices


def test_help_shows_each_default_and_names_a_flag_of_its_own_after_the_flag():
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Settings)
    text = " ".join(parser.format_help().split())
    for piece in ("--lr LR learning rate (default 0.1)", "--betas BETAS BETAS betas (default 0.9 0.99)",
                  "--heads HEADS heads (default 4)", "--no-anneal, --constant do not anneal", "--norm normalise",
                  "--out OUT where"):
        assert piece in text


def test_a_field_type_without_a_flag_is_refused():
    @dataclasses.dataclass
    class Odd:
        items: list[int] = setting((), "no flag for a list")

    with pytest.raises(TypeError, match="items"):
        add_config_flags(argparse.ArgumentParser(), Odd)


def test_build_config():
    @dataclasses.dataclass
    class Config:
        dim: int = 4
        heads: int = 2

    assert build_config(Config, None, {"dim": 8}) == Config(8, 2)
    assert build_config(Config, Config(6, 3), {"heads": 1}) == Config(6, 1)
    with pytest.raises(TypeError, match="unknown"):
        build_config(Config, None, {"width": 3})
    with pytest.raises(TypeError, match="config must be a"):
        build_config(Config, {"dim": 8}, {})


def test_model_size_is_build_models_size():
    """``chronomem train``'s --dim, --depth and --heads: ModelSize's fields, build_model's keywords and defaults."""
    from chronomem.heads import build_model
    from chronomem.train import ModelSize

    params = inspect.signature(build_model).parameters
    assert dataclasses.asdict(ModelSize()) == {f.name: params[f.name].default for f in dataclasses.fields(ModelSize)}
    assert [config_flag(f) for f in dataclasses.fields(ModelSize)] == ["--dim", "--depth", "--heads"]
    with pytest.raises(ValueError, match="--heads=3 must divide --dim=64"):
        ModelSize(num_heads=3)
    with pytest.raises(ValueError, match="must be >= 1"):
        ModelSize(depth=0)


def test_config_imports_nothing_heavy():
    code = ("import sys, chronomem.config\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'chronomem.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['chronomem.config']"


def test_check_settings_reads_the_bounds_declared_with_each_field():
    import dataclasses

    from chronomem.config import check_settings, setting

    @dataclasses.dataclass
    class Toy:
        steps: int = setting(4, "steps", low=1)
        keep: int = setting(0, "kept", low=0)
        rate: float = setting(0.1, "rate", above=0.0)
        share: float = setting(0.5, "share", low=0.0, high=1.0)
        limit: float | None = setting(None, "limit", above=0.0)
        mode: str = setting("a", "mode", choices=("a", "b"))
        free: int = 7  # no setting: not checked

    check_settings(Toy())
    check_settings(Toy(limit=2.0, free=-3))
    for change, message in [({"steps": 0}, "--steps must be a positive integer, got 0"),
                            ({"steps": 2.0}, "--steps must be a positive integer, got 2.0"),
                            ({"keep": -1}, "--keep must be an integer >= 0, got -1"),
                            ({"rate": 0.0}, "--rate must be a number > 0.0, got 0.0"),
                            ({"rate": float("nan")}, "--rate must be a number > 0.0, got nan"),
                            ({"share": 1.5}, r"--share must be in \[0.0, 1.0\], got 1.5"),
                            ({"limit": -1.0}, r"--limit must be a number > 0.0 \(or None\), got -1.0"),
                            ({"mode": "c"}, "--mode must be one of a, b, got 'c'")]:
        with pytest.raises(ValueError, match=message):
            check_settings(Toy(**change))


def test_rl_scales_check_their_ppo_settings_when_built():
    """A scale's PPO settings are checked against ``Args`` when the scale is made (at import for the
    shipped ones): a typo or a bad value fails there, naming the scale, not hours into a run."""
    import dataclasses

    from chronomem.experiments import ballet_rl, popgym, visual_match

    for module in (ballet_rl, popgym, visual_match):
        quick = module.SCALES["quick"]
        with pytest.raises(TypeError, match=f"{type(quick).__name__}: its PPO settings: .*'lrr'"):
            dataclasses.replace(quick, ppo={**quick.ppo, "lrr": 1e-3})
        with pytest.raises(ValueError, match=r"its PPO settings: --gamma must be in \[0.0, 1.0\], got 2.0"):
            dataclasses.replace(quick, ppo={**quick.ppo, "gamma": 2.0})
