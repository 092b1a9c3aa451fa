"""Checkpoints that a crash cannot corrupt and that load without unpickling.

Layout of a run directory::

    config.json                     model, task and trainer settings (JSON, never pickled)
    metrics.csv                     one row per logged step / evaluation
    checkpoints/step_00000100/      model.safetensors (weights), trainer.pt (optimizer, scheduler,
                                    RNG, step; loaded with torch.load(weights_only=True))
    checkpoints/latest              the name of the newest checkpoint (for people and scripts)

A checkpoint is written into ``step_N.tmp``, its files and directory are fsynced, and it is renamed to
``step_N`` only when complete; ``latest`` is then replaced atomically (temporary file, fsync, rename);
older checkpoints are deleted only after that. So a ``step_N`` directory is always complete, a kill at
any moment leaves at least one, and resuming a run directory loads the one of the highest step.

Resuming a run from an earlier checkpoint than its newest (``rewind``) sets the later checkpoints aside
as ``step_N.discarded`` (kept on disk, never loaded or pruned) so that the run continues on one line.
What a resume checks and restores is ``chronomem.train.resume``'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

KEEP = 2  # complete checkpoints kept on disk
CHECKPOINT_NAME = re.compile(r"step_(\d{8,})")  # a complete checkpoint; step_N.tmp is one being written


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated or does not match the model."""


def _tensor_key(tensor: torch.Tensor) -> tuple:
    """Two state-dict entries with the same key are one tied tensor (the same view of the same memory)."""
    return tensor.device, tensor.data_ptr(), tensor.shape, tensor.stride()


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as safetensors stores it: each tensor copied into its own CPU memory, a tied
    tensor once (under its first name).

    safetensors' own ``save_model`` refuses a tensor that is a view into a larger buffer, and on a GPU
    cuDNN keeps all of an ``nn.LSTM``'s weights in one flat buffer; copying each tensor out stores the same
    values in a file that any device loads."""
    weights, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if _tensor_key(tensor) in seen:
            continue
        seen.add(_tensor_key(tensor))
        weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return weights


def _load_into(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Copy ``weights`` into ``model`` (on whatever device it is); ``(missing, unexpected)`` names, a tied
    tensor counted as present when any of its names was loaded. A shape that differs raises RuntimeError."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    state = model.state_dict()
    loaded = {_tensor_key(state[name]) for name in weights if name in state}
    return [name for name in missing if _tensor_key(state[name]) not in loaded], list(unexpected)


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoint_step(path: Path) -> int | None:
    """The step of a complete checkpoint directory's name, None for any other name."""
    match = CHECKPOINT_NAME.fullmatch(Path(path).name)
    return int(match[1]) if match else None


def list_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints in ``root`` (a ``checkpoints`` directory), oldest step first."""
    if not Path(root).is_dir():
        return []
    found = [p for p in Path(root).iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def _fsync(path: Path) -> None:
    """Flush a file, or a directory's entries (so that a rename in it survives a power cut), to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # directories cannot be opened on Windows, where a rename is durable by itself
        if Path(path).is_dir():
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(path.parent)


def save_config(run_dir: Path, config: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.json", json.dumps(config, indent=2) + "\n")


def load_config(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path} not found: {path.parent} is not a run directory (one written by chronomem "
                              "train holds config.json and checkpoints/step_N)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON ({err})") from err


def locate_run(path: Path) -> tuple[Path, Path | None]:
    """``(run directory, checkpoint)`` of ``PATH``, as ``--resume PATH`` and ``chronomem eval PATH`` take it.

    ``PATH`` is a run directory (its newest checkpoint; None if it has none yet) or one checkpoint of
    a run, ``RUN/checkpoints/step_N`` (that one).
    """
    path = Path(path)
    if checkpoint_step(path) is not None or (path / "model.safetensors").exists():
        run_dir = path.parent.parent
        if path.parent.name != "checkpoints" or not (run_dir / "config.json").exists():
            raise CheckpointError(f"{path} is a checkpoint but not inside a run directory "
                                  "(RUN/checkpoints/step_N next to RUN/config.json)")
        return run_dir, path
    load_config(path)  # a clear error when PATH is not a run directory
    root = path / "checkpoints"
    return path, (find_checkpoint(path) if list_checkpoints(root) else None)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, trainer_state: dict[str, Any]) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = checkpoint_name(step)
    tmp = root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(weights_of(model), str(tmp / "model.safetensors"))
    torch.save(trainer_state, tmp / "trainer.pt")
    for file in ("model.safetensors", "trainer.pt"):
        _fsync(tmp / file)
    _fsync(tmp)
    final = root / name
    old = root / f"{name}.old"
    if final.exists():  # the same step written again: its previous copy goes only once the new one is in place
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync(root)
    write_text_atomic(root / "latest", name + "\n")
    shutil.rmtree(old, ignore_errors=True)
    this_line = [p for p in list_checkpoints(root) if checkpoint_step(p) <= step]
    for stale in this_line[:-KEEP]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def rewind(run_dir: Path, step: int) -> list[Path]:
    """Make ``step`` the newest checkpoint of ``run_dir``: later ones are renamed ``step_N.discarded``.

    ``latest`` is pointed at ``step`` first. Returns the renamed checkpoints."""
    root = Path(run_dir) / "checkpoints"
    later = [p for p in list_checkpoints(root) if checkpoint_step(p) > step]
    if not later:
        return []
    if (root / checkpoint_name(step)).is_dir():
        write_text_atomic(root / "latest", checkpoint_name(step) + "\n")
    renamed = []
    for path in later:
        target = path.with_name(path.name + ".discarded")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(path, target)
        renamed.append(target)
    _fsync(root)
    return renamed


def find_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or the newest complete one of a run directory.

    The newest by its step, not by ``latest``: a kill between a checkpoint's rename and the update of
    ``latest`` leaves ``latest`` one checkpoint behind."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    complete = list_checkpoints(path / "checkpoints")
    if not complete:
        raise CheckpointError(f"no checkpoint in {path}: expected {path / 'checkpoints' / 'step_N'} "
                              f"or {path / 'model.safetensors'}")
    return complete[-1]


def _reason(err: Exception) -> str:
    """The gist of a loader's error, without torch's advice to load unsafely (weights_only=False)."""
    text = str(err)
    if "WeightsUnpickler error:" in text:  # torch's wording around the reason suggests unpickling instead
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    text = " ".join(text.split())
    return f"{type(err).__name__}: {text.split('. ')[0].rstrip('.')}"


def _intact_hint(ckpt: Path) -> str:
    """Where to resume from instead when ``ckpt`` is damaged: the run's other complete checkpoints."""
    others = [p for p in list_checkpoints(ckpt.parent) if p != ckpt]
    if not others:
        return ""
    run = ckpt.parent.parent
    return (f"; an earlier checkpoint may be intact: resume from it with --resume "
            f"{' or '.join(str(run / 'checkpoints' / p.name) for p in reversed(others))}")


def load_weights(path: Path, model: torch.nn.Module) -> Path:
    """Load the weights of a checkpoint (or of a run directory's newest one) into ``model``, safely
    (safetensors); returns the checkpoint directory. Raises ``CheckpointError`` clearly."""
    ckpt = find_checkpoint(path)
    try:
        weights = load_file(str(ckpt / "model.safetensors"))
    except Exception as err:  # safetensors raises several types for truncated files
        raise CheckpointError(f"cannot read weights {ckpt / 'model.safetensors'}: truncated or corrupt "
                              f"({_reason(err)}){_intact_hint(ckpt)}") from err
    try:
        missing, unexpected = _load_into(model, weights)
    except RuntimeError as err:  # a tensor of another shape
        raise CheckpointError(f"weights in {ckpt} do not match the model: {_reason(err)}") from err
    if missing or unexpected:
        raise CheckpointError(
            f"weights in {ckpt} do not match the model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}"
        )
    return ckpt


def load_checkpoint(path: Path, model: torch.nn.Module, map_location="cpu") -> dict[str, Any]:
    """Load weights into ``model`` and return the trainer state. Raises ``CheckpointError`` clearly."""
    ckpt = load_weights(path, model)
    try:
        state = torch.load(ckpt / "trainer.pt", map_location=map_location, weights_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot read trainer state {ckpt / 'trainer.pt'}: truncated or corrupt "
                              f"({_reason(err)}){_intact_hint(ckpt)}") from err
    return state
