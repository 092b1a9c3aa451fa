"""Environments: worlds with the Gymnasium API (``ballet``), no training code.

Envs import only ``chronomem.layers``/``ops``/``registry`` and never models, tasks, trainers or the CLI.
Gymnasium is the optional extra ``chronomem[rl]``; a module here imports without it, and building one
of its environments then raises ``ModuleNotFoundError``. Import a module (``chronomem.envs.ballet``)
to register its environment with ``gymnasium.make``.
"""
