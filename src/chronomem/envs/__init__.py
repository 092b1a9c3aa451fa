"""Environments: worlds with the Gymnasium API, no training code.

Envs import only ``chronomem.layers``/``ops``/``registry`` and never models, tasks, trainers or the CLI.
Gymnasium is the optional extra ``chronomem[rl]``; a module here imports without it, and building one
of its environments then raises ``ModuleNotFoundError``. ``import chronomem.envs`` registers every
chronomem id with ``gymnasium.make``: Ballet (``chronomem.envs.ballet``), CueRecall (``recall``), Visual
Match and Key-to-Door (``tvt``), the MinAtar games (``minatar``).
"""

from chronomem.envs import ballet, minatar, recall, tvt  # noqa: F401  (their import registers their ids)
