"""Resuming a run, in one place: find it, check the flags given against its saved settings, restore it.

Every resume goes through here. ``chronomem train --resume`` and ``chronomem rl train --resume`` find
the run (``find_run``) and settle its settings (``resumed_settings``); the loops, the supervised
trainer's ``train(resume=...)`` and PPO's, refuse to write over another run (``check_new_run``), load
the checkpoint (``restore``, ``restore_optimizer``) and continue the run directory from its step
(``continue_run_dir``); ``chronomem run --resume`` reuses an RL experiment's finished runs after
comparing their settings (``find_run``, ``differences``) and continues a supervised experiment's
training runs where they stopped (``rejoin``).

The rules (docs/training.md, "Resuming"):

* A resumed run writes only into its own directory: the one given (or the one holding the checkpoint
  given), never the ``out`` saved in its config.json, so a moved or copied run continues where it now
  is and no other run is touched.
* Its saved settings hold: only the fields made with ``setting(..., resumable=True)`` may change (none
  of them changes a step's maths); any other flag given must equal its saved value.
* A run killed before its first checkpoint starts again from step 0, in place.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from chronomem.config import config_flag, resumable_fields
from chronomem.train.checkpoint import (
    CheckpointError,
    find_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_config,
    locate_run,
    rewind,
    save_config,
)

NOT_SET = "(not set)"  # the saved value of a setting config.json does not hold
WRITTEN_BY = {"ppo": "a PPO run (written by chronomem rl train)"}  # config.json's "kind" -> what it is


@dataclass(frozen=True)
class Run:
    """A run to continue, as ``find_run`` found it."""

    dir: Path
    checkpoint: Path | None  # the checkpoint it continues from; None: killed before its first one
    config: dict[str, Any]  # its config.json


def find_run(path: str | Path, kind: str | None = None) -> Run:
    """The run ``--resume PATH`` continues: ``PATH`` is a run directory (from its newest checkpoint) or
    one of its checkpoints, ``RUN/checkpoints/step_N`` (from that one). ``kind``: the ``"kind"`` its
    config.json must hold (``"ppo"``), else ``CheckpointError``."""
    run_dir, checkpoint = locate_run(Path(path))
    config = load_config(run_dir)
    if kind is not None and config.get("kind") != kind:
        raise CheckpointError(f"{run_dir / 'config.json'} is not {WRITTEN_BY[kind]}")
    return Run(run_dir, checkpoint, config)


def _as_saved(value: Any) -> Any:
    """``value`` as config.json holds it (a tuple as a list)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def differences(asked: dict[str, Any], saved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``key -> (asked value, saved value)`` for each key of ``asked`` whose value differs from the one
    ``saved`` (a part of config.json) holds, compared as config.json holds them; a key ``saved`` lacks
    differs, its saved value ``NOT_SET``."""
    return {key: (value, saved.get(key, NOT_SET)) for key, value in asked.items()
            if _as_saved(value) != saved.get(key, NOT_SET)}


def check_own_directory(out: str | Path | None, run_dir: str | Path) -> None:
    """ValueError unless ``out`` (``--out``, None when not given) is the resumed run's own directory."""
    if out is not None and Path(out).resolve() != Path(run_dir).resolve():
        raise ValueError(f"--out {out}: a resumed run writes only into its own directory, {run_dir}; "
                         "leave --out out (copy the run directory to continue a copy elsewhere)")


def resumed_settings(run: Run, config_cls: type, saved: dict[str, Any], given: dict[str, Any],
                     kept: dict[str, tuple[Any, Any]] | None = None):
    """The ``config_cls`` a resumed run continues with: its ``saved`` settings (config.json's), the
    resumable fields ``given`` on the command line replacing theirs, ``out`` its directory now, and
    ``progress`` as given (it belongs to the command, not to the run: shown unless turned off again).

    Before anything is touched, a ValueError names the first flag given that would change the run: a
    field of ``config_cls`` not resumable whose value differs from the saved one, or one of ``kept``
    (``flag -> (given, saved)``: what the run keeps outside ``config_cls``, e.g. its model and task);
    and an ``--out`` other than the run's directory."""
    resumable = {f.name for f in resumable_fields(config_cls)}
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.name not in resumable and f.name != "out"}
    changed = [(flag, value, saved_value) for flag, (value, saved_value) in (kept or {}).items()
               if _as_saved(value) != saved_value]
    asked = {name: value for name, value in given.items() if name in fields}
    for name, (value, saved_value) in differences(asked, saved).items():
        meta = fields[name].metadata
        shown = f"0 ({meta['zero_is_none']})" if value is None and meta.get("zero_is_none") else value
        changed.append((config_flag(fields[name]), shown, saved_value))
    if changed:
        flag, value, saved_value = changed[0]
        saved_value = tuple(saved_value) if isinstance(saved_value, list) else saved_value
        may_change = ", ".join(config_flag(f) for f in resumable_fields(config_cls))
        raise ValueError(f"{flag} {value} differs from the resumed run's saved value {saved_value} "
                         f"({run.dir / 'config.json'}); with --resume only {may_change} may change")
    check_own_directory(given.get("out"), run.dir)
    now = {name: given[name] for name in resumable if name in given}
    return config_cls(**{**saved, **now, "out": str(run.dir), "progress": given.get("progress", True)})


def rejoin(cfg, spec: dict[str, Any]):
    """``(cfg, run)`` with which an experiment's training run continues after ``chronomem run --resume``:
    ``(cfg, None)`` when ``cfg.out`` holds no run yet (it starts there); else the ``Run`` found there and
    the settings it continues with (``resumed_settings``), after checking that it is this very run: its
    ``spec`` (model and task) and every setting of ``cfg`` that changes a step's maths equal the saved
    ones (ValueError naming the first that differs). ``train(..., resume=run)`` then loads a finished
    run's final checkpoint and only evaluates it, or continues an unfinished one from its newest
    checkpoint (from step 0, in place, when it was killed before its first)."""
    if cfg.out is None or not (Path(cfg.out) / "config.json").exists():
        return cfg, None
    run = find_run(cfg.out)
    given = dataclasses.asdict(cfg)
    kept = {"the model and task": (spec, run.config.get("spec", NOT_SET))}
    return resumed_settings(run, type(cfg), run.config.get("train", {}), given, kept), run


def check_new_run(out: str | Path | None, resume: str | Path | Run | None = None, flag: str = "out") -> None:
    """Refuse to start a run in ``out`` when it already holds one (a ``config.json``), unless the run
    resumed (``resume``: a run directory, one of its checkpoints, or a ``Run``) is that very run:
    starting anew there would rewrite its config and metrics and leave its checkpoints of later steps
    to be loaded as this run's. The Python API and the command line refuse alike (``flag`` names the
    argument)."""
    if out is None or not (Path(out) / "config.json").exists():
        return
    out = Path(out)
    if resume is not None:
        run_dir = resume.dir if isinstance(resume, Run) else locate_run(Path(resume))[0]
        if run_dir.resolve() == out.resolve():
            return
    resume_it = f"--resume {out}" if flag.startswith("--") else f"resume={str(out)!r}"
    raise ValueError(f"{flag} {out} already holds a run (config.json): continue it with {resume_it}, "
                     f"or choose another {flag}")


def resume_point(resume: str | Path | Run) -> Path | None:
    """The checkpoint that resuming ``resume`` loads: a checkpoint directory, the newest complete one of
    a run directory (``find_checkpoint``), or a ``Run``'s; None for a run directory killed before its
    first checkpoint: that run starts again from step 0, in place."""
    if isinstance(resume, Run):
        return resume.checkpoint
    path = Path(resume)
    if (path / "config.json").exists() and not (path / "model.safetensors").exists() \
            and not list_checkpoints(path / "checkpoints"):
        return None
    return find_checkpoint(path)


@dataclass
class Restored:
    """The checkpoint a run continues from and the trainer state saved with it."""

    checkpoint: Path
    state: dict[str, Any]  # step, seconds, optimizer, rng, and what else the loop saved

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def seconds(self) -> float:
        """Training seconds up to the checkpoint (0 in checkpoints written before they were saved)."""
        return float(self.state.get("seconds", 0.0))

    def logged(self) -> list[dict[str, Any]]:
        """The rows its run logged up to the checkpoint (its ``metrics.csv``, as ``read_metrics`` gives them;
        none without the file), less a final test row at its step: the history that the resumed run's
        continues, so that its curves and its best return span the whole run, not the last sitting."""
        from chronomem.train.metrics import kept_on_resume, read_metrics

        path = self.checkpoint.parent.parent / "metrics.csv"  # RUN/checkpoints/step_N
        if not path.is_file():
            return []
        return [row for row in read_metrics(path) if kept_on_resume(row["step"], row.get("split", ""), self.step)]


def restore(resume: str | Path | Run | None, model: torch.nn.Module, map_location="cpu") -> Restored | None:
    """Load the weights of the checkpoint ``resume`` continues from (``resume_point``) into ``model``;
    None, with ``model`` untouched, when there is none (no ``resume``, or a run killed before its first
    checkpoint: it starts at step 0). The loop restores its optimizer next (``restore_optimizer``)."""
    checkpoint = None if resume is None else resume_point(resume)
    if checkpoint is None:
        return None
    return Restored(checkpoint, load_checkpoint(checkpoint, model, map_location=map_location))


def restore_optimizer(restored: Restored, optimizer: torch.optim.Optimizer, scheduler=None) -> None:
    """The optimizer's state, the scheduler's (when given: build it first, its construction sets the lr
    of step 0) and torch's random state, as the checkpoint saved them."""
    optimizer.load_state_dict(restored.state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(restored.state["scheduler"])
    set_rng_state(restored.state["rng"])


def rng_state() -> dict[str, Any]:
    """torch's random state as a checkpoint saves it: the CPU generator's, and each GPU's where CUDA is in
    use (an agent on a GPU samples its actions there), so that a resumed run draws what the whole run would."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore ``rng_state()``'s state (loaded onto any device: the generators take CPU byte tensors)."""
    torch.set_rng_state(state["torch"].cpu())
    if torch.cuda.is_available():
        for device, cuda_state in enumerate(state.get("cuda", [])[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), device)


def continue_run_dir(run_dir: Path, logger, restored: Restored | None, config: dict[str, Any]) -> None:
    """Make ``run_dir`` read as one run from here on: a resumed run's checkpoints after its step are
    set aside (``rewind``) and ``logger``'s metrics.csv drops the rows logged after it (a new run's
    starts anew); config.json is written with the settings now in force (a resume may change the
    resumable ones, and ``out`` is where the run now is)."""
    step = 0 if restored is None else restored.step
    if restored is not None:
        rewind(run_dir, step)
    logger.rewind(step)
    save_config(run_dir, config)
