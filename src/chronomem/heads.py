"""Task heads that wrap any backbone: sequence classifier, per-step tagger, causal LM (with streaming
evaluation and generation).

The backbone convention (every model in chronomem follows it):

* ``y, state = backbone(x, state=None, mask=None)`` with ``x [B, N, dim]``, ``mask [B, N]`` boolean
  (True = valid) and ``y [B, N, backbone.out_dim]``;
* optional ``backbone.summary(y, state, mask) -> [B, out_dim]``: a model whose paper reads the class
  from its memory (TLB's state, BLRP's latent block) says so here; otherwise the classifier pools
  ``y`` (mean over valid steps, or the last valid step).

Heads turn tokens (``nn.Embedding``) or features (``nn.Linear``, or an ``encoder`` from
``chronomem.encoders``) into ``x`` and ``y`` into logits. A task whose inputs are image patches says so
with ``task.patches = {"channels", "patch_size", "grid"}``; ``build_model`` then embeds them with a
``PatchEncoder`` (its 2-D positions follow the image across resolutions), whose position scheme
``build_model(..., patch_positions=...)`` chooses for every model alike: ``"sinusoid"`` (fixed, the
default) or ``"learned"`` (ViT's table, resized bilinearly at another resolution).

``reconstruction=w`` (any head) adds paper 001's self-supervised auxiliary loss (Sec. 2 "Agents",
App. A.1, App. D.4): at every step a linear decoder reconstructs that step's input from the
backbone's output, features with a sigmoid cross-entropy averaged over features (the paper's image
loss; features must lie in [0, 1]) and tokens with a softmax cross-entropy. A forward returns
``logits, state``; the trainer asks for the loss, ``logits, state, auxiliary = head(inputs, state,
mask, return_auxiliary=True)``, and adds ``auxiliary = w * loss`` (None with ``w = 0``) to the task
loss. ``reconstruction_loss`` below is the one implementation, shared with the agents.

The agents (``ActorCritic`` for PPO, ``InstructedPolicy`` for behaviour cloning) live in
``chronomem.agents``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_tensor, check_token_ids, parameter_dtype
from chronomem.encoders import PatchEncoder
from chronomem.layers import masked_mean


def reconstruction_loss(decode: Callable[..., Tensor], weight: float, y: Tensor, targets: tuple[Tensor, ...],
                        mask: Tensor | None = None, every: int = 1) -> Tensor:
    """Paper 001's auxiliary loss (Sec. 2 "Agents", App. A.1, App. D.4), weighted: ``weight`` times the
    mean over the valid steps (``mask [B, N]``, True = valid; None: every step) of ``decode(y, *targets)
    [B, N]``, each step's loss of reconstructing its input (``targets``, ``[B, N, ...]`` each) from the
    core's output ``y [B, N, D]`` at that step. ``every=k > 1`` (deviation, a CPU budget) keeps the steps
    ``phase, phase + k, ...`` from a phase drawn at random per call (one ``torch.randint``): an unbiased
    estimate of the mean over every step at ``1 / k`` of the decoder's cost. Used by the heads
    (``reconstruction=w``) and by ``chronomem.agents.ActorCritic``."""
    if every > 1:
        phase = int(torch.randint(min(every, y.shape[1]), ()))
        y, targets = y[:, phase::every], tuple(t[:, phase::every] for t in targets)
        mask = None if mask is None else mask[:, phase::every]
    per_step = decode(y, *targets)
    if mask is None:
        return weight * per_step.mean()
    return weight * masked_mean(per_step.reshape(-1, 1), mask.reshape(-1), dim=0)[0]  # over the batch's valid steps


class _Head(nn.Module):
    def __init__(
        self,
        backbone: nn.Module,
        dim: int,
        *,
        vocab_size: int | None = None,
        input_dim: int | None = None,
        reconstruction: float = 0.0,
        encoder: nn.Module | None = None,
    ):
        super().__init__()
        if (vocab_size is None) == (input_dim is None):
            raise ValueError("give exactly one of vocab_size (token inputs) or input_dim (feature inputs)")
        if not isinstance(reconstruction, (int, float)) or reconstruction < 0:
            raise ValueError(f"reconstruction must be a loss weight >= 0, got {reconstruction!r}")
        self.backbone = backbone
        self.dim = dim
        self.out_dim = getattr(backbone, "out_dim", dim)
        self.tokens = vocab_size is not None
        self.vocab_size, self.input_dim = vocab_size, input_dim
        if encoder is not None and self.tokens:
            raise ValueError("an encoder embeds feature inputs: give input_dim, not vocab_size, with it")
        if encoder is None:
            self.embed = nn.Embedding(vocab_size, dim) if self.tokens else nn.Linear(input_dim, dim)
        else:  # features -> [B, N, dim] by an observation encoder (e.g. PatchEncoder) in place of nn.Linear
            self.embed = encoder
        self.reconstruction = float(reconstruction)
        if self.reconstruction:  # App. A.1: decoders with their own weights
            self.decoder = nn.Linear(self.out_dim, vocab_size if self.tokens else input_dim)

    def encode(self, inputs: Tensor, state=None, mask: Tensor | None = None, return_auxiliary: bool = False):
        """``(x, y, state, auxiliary)``: the embedded inputs ``x [B, N, dim]``, the backbone's output and
        state, and with ``return_auxiliary`` the weighted reconstruction loss (module docstring; None
        without it or with ``reconstruction=0``)."""
        inputs = self.check_inputs(inputs)
        x = self.embed(inputs)
        y, state = self.backbone(x, state=state, mask=mask)
        auxiliary = None
        if return_auxiliary and self.reconstruction:
            auxiliary = reconstruction_loss(self.reconstruct, self.reconstruction, y, (inputs,), mask)
        return x, y, state, auxiliary

    def check_inputs(self, inputs: Tensor) -> Tensor:
        """Token ids ``[B, N]`` in ``[0, vocab_size)`` as int64, or features ``[B, N, input_dim]`` cast to
        the embedding's dtype (the input rules of ``chronomem.layers``)."""
        if self.tokens:
            return check_token_ids(inputs, "inputs", self.vocab_size)
        if isinstance(inputs, Tensor) and not inputs.is_floating_point():
            raise TypeError(f"inputs must be floating-point features [B, N, input_dim={self.input_dim}], got "
                            f"dtype {inputs.dtype} (integer token ids need a head built with vocab_size)")
        return check_tensor(inputs, "inputs", 3, self.input_dim, "[B, N, input_dim]", dtype=parameter_dtype(self.embed))

    def reconstruct(self, y: Tensor, inputs: Tensor) -> Tensor:
        """``[B, N]``: the loss of reconstructing each step's input from ``y`` at that step."""
        out = self.decoder(y).float()
        if self.tokens:
            return F.cross_entropy(out.flatten(0, 1), inputs.flatten(), reduction="none").view(inputs.shape)
        target = inputs.float()
        if bool(((target < 0) | (target > 1)).any()):  # one check (one sync) per step
            raise ValueError("reconstruction of feature inputs needs features in [0, 1] (a sigmoid "
                             f"cross-entropy), got values in [{float(target.min())}, {float(target.max())}]")
        return F.binary_cross_entropy_with_logits(out, target, reduction="none").mean(-1)


class Tagger(_Head):
    """One prediction per step: ``logits [B, N, num_classes], state``."""

    def __init__(self, backbone: nn.Module, dim: int, num_classes: int, **inputs):
        super().__init__(backbone, dim, **inputs)
        self.norm = nn.LayerNorm(self.out_dim)
        self.out = nn.Linear(self.out_dim, num_classes)

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None, return_auxiliary: bool = False):
        _, y, state, auxiliary = self.encode(inputs, state, mask, return_auxiliary)
        logits = self.out(self.norm(y))
        return (logits, state, auxiliary) if return_auxiliary else (logits, state)


class CausalLM(Tagger):
    """Next-token prediction: a tagger whose classes are the vocabulary (targets = inputs shifted).

    ``evaluate_stream`` streams a whole text through the model with its state (the loss per token of
    a long text, e.g. bits per byte); ``generate`` continues a prompt one token at a time, carrying the
    state, so each new token costs one step of the backbone, not a pass over the whole context. Both
    need a backbone for which calls of any length give the same outputs as one call (causal TLB,
    Transformer-XL with ``memory_mode="sliding"``, the LSTM): a one-token call then computes exactly
    what a pass over the whole prefix would (docs/lm.md).
    """

    def __init__(self, backbone: nn.Module, dim: int, vocab_size: int, reconstruction: float = 0.0):
        super().__init__(backbone, dim, vocab_size, vocab_size=vocab_size, reconstruction=reconstruction)

    def _check_streaming(self, what: str) -> None:
        if getattr(self.backbone, "causal", True) is not True:
            raise ValueError(f"{what} needs a causal backbone, got {type(self.backbone).__name__} with causal=False")
        if getattr(getattr(self.backbone, "config", None), "memory_mode", "sliding") != "sliding":
            raise ValueError(f"{what} needs calls of any length to equal one call: give TransformerXL "
                             "memory_mode='sliding' (with 'segment' a query's span depends on where calls are cut)")
        if self.backbone.init_state(1, self.embed.weight.device) is None:
            raise ValueError(f"{what} carries the backbone's state, but {type(self.backbone).__name__} keeps none")

    @torch.no_grad()
    def evaluate_stream(self, tokens: Tensor, segment_len: int = 512, streams: int = 1) -> dict[str, float]:
        """Mean next-token cross-entropy over a whole text, streamed with the state.

        ``tokens [T]`` (long or uint8) is cut into ``streams`` contiguous pieces read side by side as a
        batch (the last one padded and masked at its end), each fed in calls of ``segment_len`` tokens
        with the state carried from call to call; every token after the first of its piece is
        predicted once. ``streams=1`` is the plain left-to-right evaluation; more streams are faster
        and lose only the context before each piece's start. Returns ``{"loss": nats per token,
        "bits_per_token": loss / ln 2, "tokens": predictions counted}``."""
        self._check_streaming("evaluate_stream")
        if not isinstance(tokens, Tensor) or tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D tensor of token ids, got "
                             f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
        for name, value in (("segment_len", segment_len), ("streams", streams)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        per_stream = -(-len(tokens) // streams)  # ceil: every piece the same length, the last one padded
        if per_stream < 2:
            raise ValueError(f"tokens must hold at least 2 tokens per stream, got {len(tokens)} for {streams} streams")
        device = self.embed.weight.device
        padded = torch.zeros(streams * per_stream, dtype=torch.long, device=device)
        padded[: len(tokens)] = tokens.to(device=device, dtype=torch.long)
        valid = torch.arange(streams * per_stream, device=device) < len(tokens)
        inputs, valid = padded.view(streams, per_stream), valid.view(streams, per_stream)
        was_training = self.training
        self.eval()
        state, total, count = None, torch.zeros((), dtype=torch.float64, device=device), 0
        for start in range(0, per_stream - 1, segment_len):
            stop = min(per_stream - 1, start + segment_len)
            mask = valid[:, start:stop]
            logits, state = self(inputs[:, start:stop], state, None if bool(mask.all()) else mask)
            targets, scored = inputs[:, start + 1 : stop + 1], valid[:, start + 1 : stop + 1]
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision: in float32
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
            total += loss[scored.flatten()].double().sum()
            count += int(scored.sum())
        self.train(was_training)
        loss = float(total) / count
        return {"loss": loss, "bits_per_token": loss / math.log(2), "tokens": count}

    @torch.inference_mode()
    def generate(self, prompt: bytes | Tensor | list[int], n: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> Tensor:
        """The ``n`` tokens that follow ``prompt`` (bytes or token ids), as a 1-D long tensor.

        The prompt is read in one call; each new token is then one call of one token with the state
        carried (no recomputation of the context). ``temperature=0`` is greedy decoding (argmax);
        otherwise tokens are sampled from ``softmax(logits / temperature)`` restricted to the
        ``top_k`` most likely (None: all), with ``generator`` (on the model's device) if given."""
        self._check_streaming("generate")
        if isinstance(prompt, (bytes, bytearray)):
            prompt = list(prompt)
        prompt = torch.as_tensor(prompt, dtype=torch.long, device=self.embed.weight.device)
        if prompt.dim() != 1 or len(prompt) == 0:
            raise ValueError(f"prompt must be a non-empty 1-D sequence of token ids, got shape {tuple(prompt.shape)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                                  or not 1 <= top_k <= self.vocab_size):
            raise ValueError(f"top_k must be an int in [1, vocab_size={self.vocab_size}] or None, got {top_k!r}")
        was_training = self.training
        self.eval()
        logits, state = self(prompt[None], None)
        out = torch.empty(n, dtype=torch.long, device=prompt.device)
        for i in range(n):
            last = logits[0, -1].float()
            if temperature == 0:
                token = last.argmax()
            else:
                last = last / temperature
                if top_k is not None:
                    kth = last.topk(top_k).values[-1]
                    last = last.masked_fill(last < kth, -math.inf)
                token = torch.multinomial(last.softmax(-1), 1, generator=generator)[0]
            out[i] = token
            if i + 1 < n:
                logits, state = self(token.view(1, 1), state)
        self.train(was_training)
        return out


class Classifier(_Head):
    """One prediction per sequence: ``logits [B, num_classes], state``.

    ``pooling`` is ``"mean"`` (over valid steps) or ``"last"`` (the last valid step); a backbone with a
    ``summary`` method overrides it. ``readout`` turns the pooled vector into logits:

    * ``"mlp"`` (default): Linear -> GELU -> Linear (our choice, GELU like the rest of the models);
    * ``"relu_mlp"``: Linear -> ReLU -> Linear, the Long Range Arena classifier head
      (``lra_benchmarks/models/layers/common_layers.py``, ``classifier_head``: Dense(mlp_dim), ReLU,
      Dense(num_classes)), which the LRA models and the TLB authors' model use;
    * ``"choices"``: for tasks whose classes are candidate answers shown in the input at steps
      ``choice_steps`` (one per class). A linear projection of the pooled vector is compared with the
      embedding of each candidate by a dot product, and the dot products are the logits (paper 001
      App. B.4, the PAI readout: "compared this output embedding to the embeddings of the two
      possible choices using dot products"). The candidates go through the same input embedding as
      everything else (App. B.4: "a single shared embedding layer").

    ``mlp_dim`` is the hidden width of the two MLP readouts (``dim`` when None; LRA's is its FFN width).

    ``fixed_readout=True`` (with ``"choices"``; our option, not the paper's) keeps that projection at
    its random initialisation, so it cannot shrink to uniform logits while nothing in the output
    predicts the answer yet (why it exists: docs/htm.md, PAI).
    """

    READOUTS = ("mlp", "relu_mlp", "choices")

    def __init__(
        self,
        backbone: nn.Module,
        dim: int,
        num_classes: int,
        pooling: str = "mean",
        readout: str = "mlp",
        choice_steps: tuple[int, ...] | None = None,
        fixed_readout: bool = False,
        mlp_dim: int | None = None,
        **inputs,
    ):
        super().__init__(backbone, dim, **inputs)
        if pooling not in ("mean", "last"):
            raise ValueError(f"pooling must be 'mean' or 'last', got {pooling!r}")
        if readout not in self.READOUTS:
            raise ValueError(f"readout must be one of {self.READOUTS}, got {readout!r}")
        if mlp_dim is not None and (isinstance(mlp_dim, bool) or not isinstance(mlp_dim, int) or mlp_dim < 1):
            raise ValueError(f"mlp_dim must be a positive int (or None for dim), got {mlp_dim!r}")
        if readout == "choices" and (choice_steps is None or len(choice_steps) != num_classes):
            raise ValueError(
                f"readout='choices' needs choice_steps, one input step per class ({num_classes}), got {choice_steps!r}"
            )
        if fixed_readout and readout != "choices":
            raise ValueError(f"fixed_readout=True needs readout='choices', got readout={readout!r}")
        self.pooling, self.readout = pooling, readout
        self.choice_steps = None if choice_steps is None else tuple(int(s) for s in choice_steps)
        self.norm = nn.LayerNorm(self.out_dim)
        hidden = dim if mlp_dim is None else mlp_dim
        if readout in ("mlp", "relu_mlp"):
            activation = nn.GELU() if readout == "mlp" else nn.ReLU()
            self.mlp = nn.Sequential(nn.Linear(self.out_dim, hidden), activation, nn.Linear(hidden, num_classes))
        else:
            self.project = nn.Linear(self.out_dim, dim)  # the "final output embedding" of App. B.4
            self.project.requires_grad_(not fixed_readout)

    def pool(self, y: Tensor, state, mask: Tensor | None) -> Tensor:
        if hasattr(self.backbone, "summary"):
            return self.backbone.summary(y, state, mask)
        if self.pooling == "mean":
            return masked_mean(self.norm(y), mask)
        if mask is None:
            return self.norm(y[:, -1])
        last = (mask.long().cumsum(1).argmax(1))  # index of the last valid step
        return self.norm(y[torch.arange(y.shape[0], device=y.device), last])

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None, return_auxiliary: bool = False):
        x, y, state, auxiliary = self.encode(inputs, state, mask, return_auxiliary)
        pooled = self.pool(y, state, mask)
        if self.readout != "choices":
            logits = self.mlp(pooled)
        else:
            choices = x[:, list(self.choice_steps)]  # [B, num_classes, dim] the embedded answers on offer
            logits = torch.einsum("bd,bcd->bc", self.project(pooled), choices)
        return (logits, state, auxiliary) if return_auxiliary else (logits, state)


def build_model(
    model: str,
    task,
    *,
    dim: int = 64,
    depth: int = 2,
    num_heads: int = 4,
    pooling: str = "mean",
    readout: str = "mlp",
    fixed_readout: bool = False,
    mlp_dim: int | None = None,
    reconstruction: float = 0.0,
    patch_positions: str = "sinusoid",
    **options,
) -> nn.Module:
    """Backbone ``model`` (a registry name) with the head that ``task`` needs.

    ``readout="choices"`` (classification only) scores the candidate answers at the task's
    ``choice_steps`` (see ``Classifier``; ``fixed_readout`` keeps its projection untrained);
    ``readout="relu_mlp"`` is LRA's classifier head, ``mlp_dim`` the hidden width of the MLP readouts.
    ``reconstruction`` weighs the auxiliary input reconstruction loss (module docstring; 0 = off).
    ``patch_positions``: the position scheme of the ``PatchEncoder`` of an image task (its ``positions``:
    ``"sinusoid"`` or ``"learned"``); a task without patches takes only the default."""
    from chronomem.registry import build_backbone

    if patch_positions not in PatchEncoder.POSITIONS:
        raise ValueError(f"patch_positions must be one of {PatchEncoder.POSITIONS}, got {patch_positions!r}")
    backbone = build_backbone(model, dim=dim, depth=depth, num_heads=num_heads, causal=task.causal, **options)
    inputs = {"vocab_size": task.vocab_size} if task.vocab_size is not None else {"input_dim": task.input_dim}
    inputs["reconstruction"] = reconstruction
    patches = getattr(task, "patches", None)
    if patches is not None:  # image patches: ViT's patch embedding with 2-D positions (chronomem.encoders)
        inputs["encoder"] = PatchEncoder(dim=dim, positions=patch_positions, **patches)
    elif patch_positions != "sinusoid":
        raise ValueError(f"patch_positions={patch_positions!r} chooses the position code of image patches; "
                         f"the task {getattr(task, 'name', type(task).__name__)!r} has no patches")
    if task.kind == "classify":
        choice_steps = getattr(task, "choice_steps", None) if readout == "choices" else None
        return Classifier(backbone, dim, task.num_classes, pooling=pooling, readout=readout,
                          choice_steps=choice_steps, fixed_readout=fixed_readout, mlp_dim=mlp_dim, **inputs)
    if readout != "mlp" or fixed_readout or mlp_dim is not None:
        raise ValueError(f"readout={readout!r} (fixed_readout={fixed_readout}, mlp_dim={mlp_dim}) needs a "
                         f"classification task, got task.kind={task.kind!r}")
    if task.kind == "tag":
        return Tagger(backbone, dim, task.num_classes, **inputs)
    if task.kind == "lm":  # next-token prediction over the input vocabulary (chronomem.tasks.text)
        return CausalLM(backbone, dim, task.vocab_size, reconstruction=reconstruction)
    raise ValueError(f"task.kind must be 'tag', 'classify' or 'lm', got {task.kind!r}")
