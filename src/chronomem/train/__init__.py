"""Training: the supervised loop, checkpoints, metrics and data-parallel setup."""

from chronomem.train.checkpoint import CheckpointError, load_checkpoint
from chronomem.train.loop import TrainConfig, TrainResult, build, evaluate, load_run, train, train_spec

__all__ = [
    "CheckpointError", "TrainConfig", "TrainResult", "build", "evaluate", "load_checkpoint", "load_run", "train",
    "train_spec",
]
