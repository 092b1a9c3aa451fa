"""Agents: recurrent PPO (``ppo.py``, one readable file) with any causal core as the memory, and
evaluation of trained agents (``evaluate.py``). Needs the optional extra ``chronomem[rl]``."""
