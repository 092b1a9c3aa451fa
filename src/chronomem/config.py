"""Configuration in one place: dataclass fields that carry their command-line flag, the flags built
from them, and the keyword-or-``Config`` constructor of the modules.

* ``setting(default, help, ...)``: a field of a settings dataclass (``chronomem.train.TrainConfig``,
  ``chronomem.rl.ppo.Args``, ``chronomem.train.ModelSize``) that carries its flag's help, choices,
  aliases and whether ``--resume`` may change it. Every default is written once, in the field.
* ``add_config_flags(parser, Config)``: one argparse flag per field (``--name-with-dashes``, a switch
  on by default is ``--no-name``); ``given_config(args, Config)``: the fields given on the command line.
  Every flag's own default is None, so a flag not given is told apart from one given with the default
  value (``--resume`` needs to know); the dataclass supplies the default.
* ``build_config(Config, config, kwargs)``: ``Module(**kwargs)`` or ``Module(config=Module.Config(...))``.

Why argparse and not tyro (the ecosystem's dataclass-to-CLI library): docs/design.md, "Configuration".
This module imports neither torch nor any chronomem module, so ``chronomem --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from typing import Any

# torch.compile's modes, as --compile-mode offers them (chronomem.train.compile)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None, resumable: bool = False,
            aliases: tuple[str, ...] = (), flag: str | None = None, zero_is_none: str | None = None,
            low: float | None = None, high: float | None = None, above: float | None = None) -> Any:
    """A dataclass field that carries its command-line flag: the CLI builds the flag from the field's
    name, type and default, so every default is written once, here.

    ``help`` describes the flag (the CLI appends the default), ``choices`` its valid values,
    ``resumable`` lets ``--resume`` change it (it changes no step's maths), ``aliases`` are other
    spellings of the flag, ``flag`` the flag itself when it is not the field's name with dashes, and
    ``zero_is_none`` makes ``0`` on the command line mean None (the string says what None means, as
    an error message shows it: ``--clip 0 (no clipping)``). ``low`` and ``high`` bound the value
    (inclusive), ``above`` from below (exclusive); ``check_settings`` checks them and ``choices``."""
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "resumable": resumable, "aliases": aliases, "flag": flag,
        "zero_is_none": zero_is_none, "low": low, "high": high, "above": above})


def check_settings(config: Any) -> None:
    """Check every field of the settings dataclass ``config`` against what its ``setting`` declares
    (``choices``, ``low``, ``high``, ``above``; a field typed ``int`` must hold an int, a bounded float a
    finite number; None passes where the field's type allows it). The error is a ValueError naming the
    flag, what it must be and what it got."""
    for field in dataclasses.fields(config):
        meta, value = field.metadata, getattr(config, field.name)
        kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
        if "help" not in meta or (value is None and "None" in kind):
            continue
        name = f"--{field.name.replace('_', '-')}"
        if meta.get("choices") and value not in meta["choices"]:
            raise ValueError(f"{name} must be one of {', '.join(meta['choices'])}, got {value!r}")
        low, high, above = meta.get("low"), meta.get("high"), meta.get("above")
        if low is None and high is None and above is None:
            continue
        or_none = " (or None)" if "None" in kind else ""
        if kind.startswith("int"):
            ok = not isinstance(value, bool) and isinstance(value, int)
            what = "a positive integer" if low == 1 and high is None else f"an integer >= {low}"
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            what = (f"in [{low}, {high}]" if low is not None and high is not None
                    else f"a number > {above}" if above is not None else f"a number >= {low}")
        ok = ok and (low is None or value >= low) and (high is None or value <= high) and (
            above is None or value > above)
        if not ok:
            raise ValueError(f"{name} must be {what}{or_none}, got {value!r}")


def config_flag(field: dataclasses.Field) -> str:
    """The flag of a config field: ``--name-with-dashes``, ``--no-name`` for a switch that is on by default."""
    if field.metadata.get("flag"):
        return field.metadata["flag"]
    name = field.name.replace("_", "-")
    return f"--no-{name}" if field.default is True else f"--{name}"


def resumable_fields(config: type) -> list[dataclasses.Field]:
    """The fields of ``config`` that ``--resume`` lets change (made with ``resumable=True``)."""
    return [f for f in dataclasses.fields(config) if f.metadata.get("resumable")]


def _flag_type(hint: Any, name: str) -> dict[str, Any]:
    """argparse's ``type`` (and ``nargs``) for a field annotated ``hint``: int, float, str, ``X | None``
    (None is the flag not given) or a fixed-length tuple."""
    present = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(present) == 1:
        hint = present[0]
    if typing.get_origin(hint) is tuple and len(set(typing.get_args(hint))) == 1:
        return {"type": typing.get_args(hint)[0], "nargs": len(typing.get_args(hint))}
    if hint in (int, float, str):
        return {"type": hint}
    raise TypeError(f"config field {name!r}: no command-line flag for its type {hint}")


def add_config_flags(parser: argparse.ArgumentParser, config: type) -> None:
    """One flag per field of the dataclass ``config`` (fields made with ``setting``): type from the
    annotation; help, choices and aliases from the field's metadata; the field's default shown in the
    help. Every flag's own default is None (``given_config`` reads what was given)."""
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        meta, flags = field.metadata, (config_flag(field), *field.metadata.get("aliases", ()))
        if hints[field.name] is bool:  # a switch: --name turns it on, --no-name off
            help = f"do not {meta['help']}" if field.default else meta.get("help")
            parser.add_argument(*flags, dest=field.name, action="store_const", const=not field.default,
                                default=None, help=help)
            continue
        default = " ".join(map(str, field.default)) if isinstance(field.default, tuple) else field.default
        shown = "" if default is None else f" (default {default})"
        # argparse names the value after the dest; a flag of its own (--heads for num_heads) after the flag
        metavar = meta["flag"].lstrip("-").replace("-", "_").upper() if meta.get("flag") else None
        parser.add_argument(*flags, dest=field.name, default=None, choices=meta.get("choices"), metavar=metavar,
                            help=meta.get("help", "") + shown, **_flag_type(hints[field.name], field.name))


def given_config(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The fields of ``config`` given on the command line, as the config takes them (a tuple for a
    list of values, None for the ``0`` of a ``zero_is_none`` field)."""
    values = {}
    for field in dataclasses.fields(config):
        value = getattr(args, field.name)
        if value is None:
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif field.metadata.get("zero_is_none") and value == 0:
            value = None
        values[field.name] = value
    return values


def build_config(config_cls, config: Any, kwargs: dict[str, Any]):
    """The constructor convention of the modules: ``Module(**kwargs)`` or ``Module(config=Module.Config(...))``
    (keywords given with a config replace its fields).

    Unknown keywords raise ``TypeError`` listing the accepted ones.
    """
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise TypeError(f"unknown argument(s) {unknown}; expected some of {sorted(names)}")
    if config is None:
        return config_cls(**kwargs)
    if not isinstance(config, config_cls):
        raise TypeError(f"config must be a {config_cls.__qualname__}, got {type(config).__name__}")
    return dataclasses.replace(config, **kwargs)
