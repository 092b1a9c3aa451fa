"""chronomem: long-range memory for sequence models.

Mechanisms: HTM (``chronomem.htm``), TLB (``chronomem.tlb``), BLRP (``chronomem.blrp``) and relevancy
screening (``chronomem.relevance``); baselines in ``chronomem.baselines``; task heads in
``chronomem.heads``; agents (actor-critic, instructed policy) in ``chronomem.agents``; tasks in
``chronomem.tasks``; the trainer in ``chronomem.train``; PPO in ``chronomem.rl``.
"""

__version__ = "0.1.0"
