"""Training: the supervised loop, checkpoints and resume, metrics and data-parallel setup."""

from chronomem.train.checkpoint import CheckpointError, load_checkpoint
from chronomem.train.loop import ModelSize, TrainConfig, TrainResult, build, evaluate, load_run, train, train_spec

__all__ = [
    "CheckpointError", "ModelSize", "TrainConfig", "TrainResult", "build", "evaluate", "load_checkpoint", "load_run",
    "train", "train_spec",
]
