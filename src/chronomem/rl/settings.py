"""PPO's settings (``chronomem rl train``'s flags): one typed dataclass, each field's default, help and
bounds declared once, where it is defined (``chronomem.config.setting``). A light module (no torch):
the RL experiments check their scales' PPO settings against it when they are imported, and the CLI
builds its flags from it. ``chronomem.rl.ppo`` reads it (CleanRL's ``Args``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chronomem.config import COMPILE_MODES, check_settings, setting

__all__ = ["Args", "HEAD_ACTIVATIONS", "MINIBATCHES", "TIMEOUTS", "check_ppo_settings"]

TIMEOUTS = ("truncation", "failure")
HEAD_ACTIVATIONS = ("tanh", "relu")
MINIBATCHES = ("envs", "windows")


@dataclass
class Args:
    env: str = setting("MiniGrid-DoorKey-5x5-v0", "Gymnasium environment id (MiniGrid-*, chronomem/CueRecall-v0, ...)")
    core: str = setting("lstm", "the agent's memory: a causal core of the registry (chronomem list)")
    dim: int = setting(64, "the core's width (the encoder's output)", low=1)
    depth: int = setting(1, "the core's layers", low=1)
    heads: int = setting(4, "the core's attention heads (attention cores)", low=1)
    hidden: int = setting(64, "hidden units of the policy and of the value MLP", low=1)
    head_activation: str = setting("tanh", "the policy's and the value's hidden activation: 'tanh' (rl-starter-files' "
                                   "heads) or 'relu' (paper 001's: every activation ReLU, App. A Table 1)",
                                   choices=HEAD_ACTIVATIONS)
    total_frames: int = setting(1_000_000, "environment steps of the run (rounded up to whole rollouts); with "
                                "--resume the new total", resumable=True, low=1)
    num_envs: int = setting(16, "environments stepped together (B), per rank under torchrun", low=1)
    num_steps: int = setting(128, "steps per environment per rollout (T)", low=1)
    recurrence: int | None = setting(None, "truncated back-propagation: replay windows of this many steps, each "
                                     "from the state stored while acting (torch-ac's recurrence; it must divide "
                                     "--num-steps); default: whole rollouts", low=1)
    replay_context: int = setting(0, "replay each rollout after the last K steps of the one before, from the state "
                                  "stored at their start: gradients reach K steps back across the rollout's "
                                  "start, those steps unscored (truncated BPTT with an overlap; a deviation, "
                                  "docs/rl.md 'Replay context'); 0: none", low=0)
    async_envs: bool = setting(False, "step the environments in subprocesses (AsyncVectorEnv)", resumable=True)
    vectorization: str | None = setting(None, "how the envs are batched: 'native' (one env class steps all B with "
                                        "array operations: Ballet, CueRecall), 'sync' or 'async' (Gymnasium's "
                                        "wrappers of B single envs); default native where the env has it",
                                        resumable=True)
    lr: float = setting(1e-3, "Adam's learning rate", above=0.0)
    adam_eps: float = setting(1e-5, "Adam's epsilon (CleanRL's 1e-5; torch-ac's 1e-8)", above=0.0)
    anneal_lr: bool = setting(True, "anneal the learning rate linearly to 0 over the run")
    gamma: float = setting(0.99, "discount", low=0.0, high=1.0)
    gae_lambda: float = setting(0.95, "GAE's lambda", low=0.0, high=1.0)
    num_minibatches: int = setting(8, "minibatches per epoch: each holds num_envs / num_minibatches whole env "
                                   "sequences (--minibatch envs) or that share of all windows (windows)", low=1)
    minibatch: str = setting("envs", "what a minibatch is made of: 'envs' (whole env sequences, every window of "
                             "the rows drawn) or 'windows' (windows of --recurrence steps drawn from every env "
                             "and time, as torch-ac)", choices=MINIBATCHES)
    update_epochs: int = setting(4, "epochs over each rollout", low=1)
    # Off by default, as in torch-ac and rl-starter-files (CleanRL's default is on): under sparse rewards
    # the advantages before the first success are noise, which normalising blows up to full-size steps.
    norm_adv: bool = setting(False, "normalise the advantages of each minibatch")
    clip_coef: float = setting(0.2, "clip range of the policy ratio (and of the value, with clip-vloss)", above=0.0)
    clip_vloss: bool = setting(True, "clip the value loss around the rollout's values")
    ent_coef: float = setting(0.01, "weight of the entropy bonus", low=0.0)
    vf_coef: float = setting(0.5, "weight of the value loss", low=0.0)
    max_grad_norm: float = setting(0.5, "gradient-norm clip", above=0.0)
    visual: str = setting("cnn", "Ballet's visual encoder and reconstruction decoder: 'cnn' (paper 001's CNN, "
                          "App. A) or 'cells' (its per-cell layer alone: about a tenth of the cost, for a CPU)")
    reconstruction: float | None = setting(None, "weight of paper 001's loss reconstructing each step's observation "
                                           "from the core's output (App. A.1); default: the encoder's (1 for "
                                           "Ballet, 0 otherwise)", low=0.0)
    reconstruct_every: int = setting(1, "decode one step in every k of a replayed sequence (at a random phase): "
                                     "an unbiased estimate of the reconstruction loss at 1/k of its cost", low=1)
    timeout: str = setting("truncation", "how the learner reads an episode cut by a time limit: 'truncation' (not "
                           "a terminal state: bootstrap from the value of its last observation; the envs' own "
                           "semantics, e.g. pycolab's LAST with discount 1) or 'failure' (a terminal state: the "
                           "return ends with what the env paid, as paper 001 scores a time-out 0, and as "
                           "torch-ac learns)", choices=TIMEOUTS)
    target_kl: float | None = setting(None, "end an update's epochs once the approximate KL exceeds this", above=0.0)
    stop_return: float | None = setting(None, "end the run early once a logged mean return reaches this",
                                        resumable=True)
    stop_length: float | None = setting(None, "end the run early once a logged mean episode length is at most "
                                        "this (with --stop-return: once both hold); a control that wandering "
                                        "passes is learned when it is passed fast", resumable=True)
    stop_episodes: int | None = setting(None, "a stop flag counts only on a logged row where at least this many "
                                        "episodes ended (default: --num-envs): the episodes that end in the first "
                                        "rollouts are the short ones, so a few of them say nothing of the policy",
                                        resumable=True, low=1)
    reward_part: str | None = setting(None, "an info key holding the part of each step's reward to learn apart "
                                      "(Visual Match: 'apple_reward'): two value heads learn that part's return "
                                      "and the rest's, and with --norm-adv each part's advantages are normalised "
                                      "alone before they are summed (a deviation, docs/rl.md 'Visual Match')")
    stop_success: float | None = setting(None, "end the run early once a logged success rate reaches this (an env "
                                         "that reports each episode's success: Visual Match, Key-to-Door; with "
                                         "the other stop flags: once all hold)", resumable=True)
    stall_updates: int = setting(20, "say once that the policy has stalled after this many updates in a row with "
                                 "approx_kl below --stall-kl and no move of the training return (0: never)",
                                 resumable=True, low=0)
    stall_kl: float = setting(1e-4, "approx_kl below which an update counts as not moving the policy", resumable=True,
                              above=0.0)
    seed: int = setting(1, "seed of the weights, the actions and the environments (rank r's envs: seed + r)")
    torch_threads: int = setting(1, "torch threads (one is faster on 2 cores: the envs need the other)",
                                 resumable=True, aliases=("--threads",), low=1)
    log_every: int = setting(1, "updates between logged rows", resumable=True, low=1)
    checkpoint_every: int = setting(0, "updates between checkpoints (0: only the final one)", resumable=True, low=0)
    out: str | None = setting(None, "run directory (config.json, metrics.csv, checkpoints)")
    name: str | None = setting(None, "what the progress line calls the run (default: the core's name; an "
                               "experiment gives its table row's, e.g. htm-final-norm)", resumable=True)
    progress: bool = setting(True, "show a progress bar or lines on stderr", resumable=True, aliases=("--quiet",))
    device: str | None = setting(None, "cpu, cuda, cuda:1 ... (default: cuda if available)", resumable=True)
    compile: bool = setting(False, "torch.compile the agent's forward, for acting and for the replay with its "
                            "backward (a GPU's speed-up: an acting step is hundreds of small kernels); the same "
                            "numbers as without it, to float tolerance", resumable=True)
    compile_mode: str = setting("default", "torch.compile's mode with --compile: 'default', 'reduce-overhead' "
                                "(CUDA graphs) or 'max-autotune'", resumable=True, choices=COMPILE_MODES)
    compile_backend: str = setting("inductor", "torch.compile's backend with --compile ('aot_eager' traces and "
                                   "differentiates the graphs without generating code: what the CPU tests use)",
                                   resumable=True)
    compile_cpp_wrapper: bool = setting(False, "with --compile and inductor: the code that calls each graph's "
                                        "kernels in C++, not Python (fewer microseconds per call: an acting "
                                        "step; longer compiles)", resumable=True)

    def __post_init__(self):
        check_settings(self)  # each field's bounds and choices, as declared above
        if self.recurrence is not None and self.num_steps % self.recurrence:
            raise ValueError(f"--recurrence must be a positive integer that divides --num-steps {self.num_steps}, "
                             f"got {self.recurrence!r}")
        if self.replay_context and self.recurrence is not None:
            raise ValueError("--replay-context replays whole rollouts: it cannot be combined with --recurrence "
                             f"{self.recurrence}")
        if self.replay_context > self.num_steps:
            raise ValueError(f"--replay-context must be at most --num-steps {self.num_steps} (it replays the end of "
                             f"the rollout before), got {self.replay_context}")
        windows = self.num_envs * (self.num_steps // self.recurrence if self.recurrence else 1)
        if self.minibatch == "windows" and windows % self.num_minibatches:
            raise ValueError(f"--num-minibatches {self.num_minibatches} must divide the rollout's {windows} windows "
                             f"(--num-envs x --num-steps / --recurrence): a minibatch holds whole windows")
        if self.minibatch == "envs" and self.num_envs % self.num_minibatches:
            raise ValueError(f"--num-minibatches {self.num_minibatches} must divide --num-envs {self.num_envs}: "
                             "a minibatch holds whole environment sequences")
        if self.num_envs * self.num_steps // self.num_minibatches < 2:
            raise ValueError("a minibatch needs at least 2 steps (num_envs * num_steps / num_minibatches) to "
                             "normalise its advantages")

    @property
    def frames_per_update(self) -> int:
        """One rank's frames per update (K ranks under torchrun step K times as many)."""
        return self.num_envs * self.num_steps


def check_ppo_settings(ppo: dict[str, Any], where: str) -> dict[str, Any]:
    """``ppo`` (a scale's ``Args`` fields, without the env and the core) if ``Args(**ppo)`` accepts it; a
    TypeError or ValueError naming ``where`` (the experiment and scale) otherwise."""
    try:
        Args(**ppo)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{where}: its PPO settings: {err}") from None
    return ppo
