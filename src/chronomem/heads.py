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
``PatchEncoder`` (its 2-D positions follow the image across resolutions).

``reconstruction=w`` (any head) adds paper 001's self-supervised auxiliary loss (Sec. 2 "Agents",
App. A.1, App. D.4): at every step a linear decoder reconstructs that step's input from the
backbone's output, features with a sigmoid cross-entropy averaged over features (the paper's image
loss; features must lie in [0, 1]) and tokens with a softmax cross-entropy. In training mode each
forward stores ``w * loss`` in ``head.auxiliary_loss`` and the trainer adds it to the task loss; in
eval mode (and with ``w = 0``) it is None.

Agents: ``ActorCritic`` (PPO) and ``InstructedPolicy`` (behaviour cloning on BabyAI, paper 003
Sec. 4.2: the instruction as one token before the states or at the start of every chunk; acts one
step at a time with the outputs of the whole-episode forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_positive, check_tensor, check_token_ids, parameter_dtype
from chronomem.encoders import PatchEncoder
from chronomem.layers import masked_mean


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
        self.auxiliary_loss: Tensor | None = None
        if self.reconstruction:  # App. A.1: decoders with their own weights
            self.decoder = nn.Linear(self.out_dim, vocab_size if self.tokens else input_dim)

    def encode(self, inputs: Tensor, state=None, mask: Tensor | None = None):
        """``(x, (y, state))``: the embedded inputs ``x [B, N, dim]`` and the backbone's output.
        Sets ``auxiliary_loss`` (see the module docstring)."""
        inputs = self.check_inputs(inputs)
        x = self.embed(inputs)
        y, state = self.backbone(x, state=state, mask=mask)
        self.auxiliary_loss = None
        if self.reconstruction and self.training:
            self.auxiliary_loss = self.reconstruction * self.reconstruction_loss(y, inputs, mask)
        return x, (y, state)

    def check_inputs(self, inputs: Tensor) -> Tensor:
        """Token ids ``[B, N]`` in ``[0, vocab_size)`` as int64, or features ``[B, N, input_dim]`` cast to
        the embedding's dtype (the input rules of ``chronomem.layers``)."""
        if self.tokens:
            return check_token_ids(inputs, "inputs", self.vocab_size)
        if isinstance(inputs, Tensor) and not inputs.is_floating_point():
            raise TypeError(f"inputs must be floating-point features [B, N, input_dim={self.input_dim}], got "
                            f"dtype {inputs.dtype} (integer token ids need a head built with vocab_size)")
        return check_tensor(inputs, "inputs", 3, self.input_dim, "[B, N, input_dim]", dtype=parameter_dtype(self.embed))

    def reconstruction_loss(self, y: Tensor, inputs: Tensor, mask: Tensor | None) -> Tensor:
        """Mean over valid steps of the loss of reconstructing each step's input from ``y`` at that step."""
        out = self.decoder(y).float()
        if self.tokens:
            per_step = F.cross_entropy(out.flatten(0, 1), inputs.flatten(), reduction="none").view(inputs.shape)
        else:
            target = inputs.float()
            if bool(((target < 0) | (target > 1)).any()):  # one check (one sync) per step
                raise ValueError("reconstruction of feature inputs needs features in [0, 1] (a sigmoid "
                                 f"cross-entropy), got values in [{float(target.min())}, {float(target.max())}]")
            per_step = F.binary_cross_entropy_with_logits(out, target, reduction="none").mean(-1)
        flat_mask = None if mask is None else mask.reshape(-1)  # the mean over every valid step of the batch
        return masked_mean(per_step.reshape(-1, 1), flat_mask, dim=0)[0]


class Tagger(_Head):
    """One prediction per step: ``logits [B, N, num_classes], state``."""

    def __init__(self, backbone: nn.Module, dim: int, num_classes: int, **inputs):
        super().__init__(backbone, dim, **inputs)
        self.norm = nn.LayerNorm(self.out_dim)
        self.out = nn.Linear(self.out_dim, num_classes)

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None):
        _, (y, state) = self.encode(inputs, state, mask)
        return self.out(self.norm(y)), state


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

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None):
        x, (y, state) = self.encode(inputs, state, mask)
        pooled = self.pool(y, state, mask)
        if self.readout != "choices":
            return self.mlp(pooled), state
        choices = x[:, list(self.choice_steps)]  # [B, num_classes, dim] the embedded answers on offer
        return torch.einsum("bd,bcd->bc", self.project(pooled), choices), state


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
    **options,
) -> nn.Module:
    """Backbone ``model`` (a registry name) with the head that ``task`` needs.

    ``readout="choices"`` (classification only) scores the candidate answers at the task's
    ``choice_steps`` (see ``Classifier``; ``fixed_readout`` keeps its projection untrained);
    ``readout="relu_mlp"`` is LRA's classifier head, ``mlp_dim`` the hidden width of the MLP readouts.
    ``reconstruction`` weighs the auxiliary input reconstruction loss (module docstring; 0 = off)."""
    from chronomem.registry import get_model

    builder = get_model(model)
    backbone = builder(dim=dim, depth=depth, num_heads=num_heads, causal=task.causal, **options)
    inputs = {"vocab_size": task.vocab_size} if task.vocab_size is not None else {"input_dim": task.input_dim}
    inputs["reconstruction"] = reconstruction
    patches = getattr(task, "patches", None)
    if patches is not None:  # image patches: ViT's patch embedding with 2-D positions (chronomem.encoders)
        inputs["encoder"] = PatchEncoder(dim=dim, **patches)
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


class ActorCritic(nn.Module):
    """An agent around any core: ``observation -> encoder -> core -> (policy logits, value)``.

    ``logits [B, N, num_actions], value [B, N], state = agent(obs, state=None, done=None)``: ``obs`` has
    ``[B, N]`` in front (see ``chronomem.encoders``); ``done [B, N]`` (True where a step is the last of
    its episode) goes to the core, which then resets the rows inside the call (docs/design.md, "Episode
    boundaries"). Policy and value are two MLPs with one hidden layer of ``hidden`` units and tanh
    (rl-starter-files' actor and critic), initialised orthogonally with gains sqrt(2), then 0.01 for
    the policy's output and 1 for the value's (CleanRL's ``layer_init``), so the first policy is
    near uniform.

    ``reconstruction=w`` adds paper 001's self-supervised loss (App. A.1; the heads' option above, for
    an agent): a decoder from the core's output reconstructs every step's observation (for Ballet the
    image and the instruction: ``chronomem.encoders.BalletDecoder``, built by the encoder's
    ``decoder(width)``; an encoder without one is a ValueError). A forward that records gradients
    (the learner's replay, not acting under ``torch.inference_mode``) stores ``w`` times the mean
    loss over its steps in ``auxiliary_loss`` and the unweighted mean in ``reconstruction_loss``
    (logged as its own column by PPO); otherwise both are None. ``reconstruct_every=k`` (deviation, a
    CPU budget; default 1, every step) decodes one step in every ``k`` of the call, from a phase drawn
    at random per call: an unbiased estimate of the mean over every step at ``1 / k`` of the decoder's
    cost (on Ballet's symbolic grid the decoder and its loss are most of a learner step).
    """

    def __init__(self, encoder: nn.Module, core: nn.Module, num_actions: int, hidden: int = 64,
                 reconstruction: float = 0.0, reconstruct_every: int = 1):
        super().__init__()
        if isinstance(num_actions, bool) or not isinstance(num_actions, int) or num_actions < 1:
            raise ValueError(f"num_actions must be a positive int, got {num_actions!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be a positive int, got {hidden!r}")
        if isinstance(reconstruction, bool) or not isinstance(reconstruction, (int, float)) or not reconstruction >= 0:
            raise ValueError(f"reconstruction must be a loss weight >= 0, got {reconstruction!r}")
        self.encoder, self.core = encoder, core
        out_dim = getattr(core, "out_dim", getattr(encoder, "dim", None))
        self.actor = self._mlp(out_dim, hidden, num_actions, 0.01)
        self.critic = self._mlp(out_dim, hidden, 1, 1.0)
        self.reconstruction = float(reconstruction)
        self.reconstruct_every = check_positive(reconstruct_every, "reconstruct_every")
        if self.reconstruction:
            if not hasattr(encoder, "decoder"):
                raise ValueError(f"reconstruction={reconstruction} needs an encoder with a reconstruction decoder "
                                 f"(e.g. BalletEncoder), got {type(encoder).__name__}; use reconstruction=0")
            self.decoder = encoder.decoder(out_dim)  # App. A.1: independent weights
        self.auxiliary_loss: Tensor | None = None
        self.reconstruction_loss: Tensor | None = None

    @staticmethod
    def _mlp(width: int, hidden: int, out: int, out_gain: float) -> nn.Sequential:
        layers = [nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, out)]
        for layer, gain in ((layers[0], 2**0.5), (layers[2], out_gain)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
        return nn.Sequential(*layers)

    def initial_state(self, batch_size: int, device=None):
        """The core's initial state for ``batch_size`` environments."""
        return self.core.init_state(batch_size, device)

    def forward(self, obs, state=None, done: Tensor | None = None):
        learning = self.reconstruction and torch.is_grad_enabled()
        targets = self.encoder.reconstruction_targets(obs) if learning else None  # checked and converted once
        x = self.encoder(obs) if targets is None else self.encoder.encode(*targets)
        y, state = self.core(x, state=state) if done is None else self.core(x, state=state, done=done)
        self.auxiliary_loss = self.reconstruction_loss = None
        if learning:
            targets = (y, *targets)
            if self.reconstruct_every > 1:  # every k-th step from a random phase (class docstring)
                phase = int(torch.randint(min(self.reconstruct_every, y.shape[1]), ()))
                targets = tuple(t[:, phase :: self.reconstruct_every] for t in targets)
            loss = self.decoder(*targets).mean()
            self.auxiliary_loss, self.reconstruction_loss = self.reconstruction * loss, loss.detach()
        return self.actor(y), self.critic(y).squeeze(-1), state


class InstructedPolicy(nn.Module):
    """Behaviour cloning with an instruction (paper 003 Sec. 4.2, BabyAI): ``logits [B, N, num_actions],
    None = policy(inputs, mask=mask)`` over whole episodes, ``logits [B, num_actions], state =
    policy.step(features [B, F], state)`` one step at a time (acting), with equal outputs.

    A step's ``inputs`` are ``chronomem.tasks.babyai.step_features``: the 7x7x3 view, the direction and
    the mission's token ids (uint8). The view and direction go through the ``MiniGridEncoder``
    (without its mission bag of words); the instruction becomes one token of width ``dim``: a GRU over
    its word embeddings (BabyAI's own agent reads its instruction with a GRU), its last output. Where
    the instruction token goes (the paper: "For the baseline Transformer model, we append the language
    instruction to the sequence of states [...] For the proposed model, the language instruction is
    appended to each chunk"):

    * ``placement="sequence"`` (Transformer): ``[instruction, s_0, s_1, ...]``; every state attends to it
      at every layer.
    * ``placement="chunk"`` (TLB, ``core.chunk_size = K``): every chunk is ``[instruction, K - 1 states]``,
      so each chunk attends to it.

    Deviation: one instruction token (the GRU's summary), not one token per word. The core must be
    causal; a stateless core (the Transformer) acts with a cache of each layer's keys and values, so a
    step costs O(t), not a recomputation of the episode. ``step`` moves every row one step forward from
    the start of its episode together (a batch of fresh episodes, as the evaluation plays them).
    """

    PLACEMENTS = ("sequence", "chunk")

    def __init__(self, core: nn.Module, dim: int, num_actions: int, vocab_size: int, max_words: int,
                 placement: str = "sequence", view: int = 7):
        super().__init__()
        from chronomem.encoders import MiniGridEncoder

        if placement not in self.PLACEMENTS:
            raise ValueError(f"placement must be one of {self.PLACEMENTS}, got {placement!r}")
        if not getattr(core, "causal", False):
            raise ValueError(f"the core must be causal (an agent acts on the past only), got {type(core).__name__} "
                             f"with causal={getattr(core, 'causal', None)}")
        self.placement = placement
        if placement == "chunk":
            chunk = getattr(core, "chunk_size", None)
            if not isinstance(chunk, int) or chunk < 2:
                raise ValueError(f"placement='chunk' needs a chunked core with chunk_size >= 2 (the instruction and "
                                 f"at least one state), got chunk_size={chunk!r}")
            self.period = chunk - 1  # states per chunk
        self.core, self.dim, self.view = core, dim, view
        self.max_words = check_positive(max_words, "max_words")
        self.image_features = view * view * 3
        self.encoder = MiniGridEncoder(dim, vocab_size=1, max_words=1, view=view, mission=False)
        self.words = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.instruction_rnn = nn.GRU(dim, dim, batch_first=True)
        self.norm = nn.LayerNorm(getattr(core, "out_dim", dim))
        self.out = nn.Linear(getattr(core, "out_dim", dim), num_actions)

    # ---- inputs ---------------------------------------------------------------------------------

    def states(self, inputs: Tensor) -> Tensor:
        """``[B, N, dim]`` embedded view and direction of every step of ``inputs [B, N, F]``."""
        width = self.image_features + 1 + self.max_words
        if not isinstance(inputs, Tensor) or inputs.dim() != 3 or inputs.shape[-1] != width:
            shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
            raise ValueError(f"inputs must be step features [B, N, {width}] (view, direction, mission), got {shape}")
        if inputs.is_floating_point():
            raise TypeError(f"inputs must be integer step features (uint8), got dtype {inputs.dtype}")
        image = inputs[..., :self.image_features].long().unflatten(-1, (self.view, self.view, 3))
        return self.encoder({"image": image, "direction": inputs[..., self.image_features].long()})

    def instruction(self, mission: Tensor) -> Tensor:
        """``[B, dim]``: the GRU's output after the last word of ``mission [B, max_words]`` (token ids, 0 pads)."""
        mission = mission.long()
        out, _ = self.instruction_rnn(self.words(mission))
        last = (mission != 0).long().sum(1).clamp_min(1) - 1
        return out[torch.arange(mission.shape[0], device=out.device), last]

    # ---- whole episodes (training) ----------------------------------------------------------------

    def forward(self, inputs: Tensor, state=None, mask: Tensor | None = None):
        if state is not None:
            raise TypeError("the whole-episode forward starts every row at its episode's start: state must be None "
                            "(act one step at a time with step())")
        s = self.states(inputs)
        batch, n, dim = s.shape
        valid = torch.ones(batch, n, dtype=torch.bool, device=s.device) if mask is None else mask
        token = self.instruction(inputs[:, 0, self.image_features + 1:])[:, None]  # the episode's mission
        if self.placement == "sequence":
            x = torch.cat([token, s], 1)
            y, _ = self.core(x, mask=torch.cat([valid[:, :1], valid], 1))
            return self.out(self.norm(y[:, 1:])), None
        p = self.period
        chunks = -(-n // p)
        pad = chunks * p - n
        s = F.pad(s, (0, 0, 0, pad)).view(batch, chunks, p, dim)
        valid = F.pad(valid, (0, pad)).view(batch, chunks, p)
        x = torch.cat([token[:, None].expand(batch, chunks, 1, dim), s], 2).flatten(1, 2)
        m = torch.cat([valid[..., :1], valid], 2).flatten(1, 2)  # a chunk's instruction is valid with its states
        y, _ = self.core(x, mask=m)
        y = y.view(batch, chunks, p + 1, -1)[:, :, 1:].flatten(1, 2)[:, :n]
        return self.out(self.norm(y)), None

    # ---- one step at a time (acting) --------------------------------------------------------------

    def initial_state(self, batch_size: int, device=None) -> PolicyState:
        core_state = self.core.init_state(batch_size, device)
        return PolicyState(steps=0, instruction=None, core=core_state, cache=None)

    def step(self, features: Tensor, state: PolicyState) -> tuple[Tensor, PolicyState]:
        """The logits ``[B, num_actions]`` of one step's ``features [B, F]`` and the next state."""
        if not isinstance(state, PolicyState):
            raise TypeError(f"state must be a PolicyState (policy.initial_state(batch)), got {type(state).__name__}")
        inputs = features[:, None]
        s = self.states(inputs)
        token = state.instruction
        if token is None:  # the first step: read the mission
            token = self.instruction(inputs[:, 0, self.image_features + 1:])
        opens = state.steps == 0 if self.placement == "sequence" else state.steps % self.period == 0
        x = torch.cat([token[:, None], s], 1) if opens else s
        if state.core is None:  # a stateless core: its keys and values so far
            y, cache = self.core.step(x, state.cache)
            core_state = None
        else:
            y, core_state = self.core(x, state=state.core)
            cache = None
        logits = self.out(self.norm(y[:, -1]))
        return logits, PolicyState(state.steps + 1, token, core_state, cache)


@dataclass(frozen=True)
class PolicyState:
    """``InstructedPolicy``'s state while acting: ``steps`` taken (every row alike), the instruction
    token ``[B, dim]`` (None before the first step), the core's state, and for a stateless core the
    ``cache``: per layer ``(keys, values)`` of every token so far."""

    steps: int
    instruction: Tensor | None
    core: object
    cache: tuple | None
