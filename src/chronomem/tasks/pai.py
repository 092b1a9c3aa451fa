"""Paired associative inference (PAI), length 3 (Banino et al. 2020, MEMO; paper 001 Fig. 6b, App. B.4).

Each episode draws ``n_triplets`` triplets ``A_i - B_i - C_i`` of fresh items. The memory holds the
pairs ``A_i B_i`` and ``B_i C_i`` (``2 * n_triplets`` pairs, shuffled), the probe is an ``A_j`` and
the two choices are ``C_j`` (the answer) and a foil ``C_k`` (k != j): the C item of another triplet
of the same episode, so both choices were seen in memory equally often and only the chain
``A_j -> B_j -> C_j`` tells them apart (the "indirect" query of MEMO).

``query`` picks the trial type. MEMO's released PAI data (which paper 001 App. B.4 used "unmodified")
holds, for each memory of pairs, trials of three types: ``AB`` and ``BC`` (direct: the answer is
stored in the same pair as the probe) and ``AC`` (indirect); models train on all three and the
reported accuracy is that on ``AC``. ``query="indirect"`` (default) gives AC trials only,
``"direct"`` AB trials only, and ``"mixed"`` MEMO's training distribution: each example's type
drawn uniformly from AB, BC and AC (evaluate a model trained on it with ``query="indirect"``).
In every type the foil is the item of the answer's role (B or C) from another triplet.

Items are standard-normal random vectors drawn per episode (MEMO used ImageNet images through an embedding;
HTM's paper embedded "all the input memories and probes using a single shared embedding layer").
Nothing about an item can be learned across episodes: the task is pure memory.

Sequence (feature inputs, ``input_dim = item_dim + 5``): each step is an item vector followed by a
one-hot role ``[pair first, pair second, choice 0, choice 1, probe]``::

    A_1 B_1 | B_2 C_2 | ... (2 * n_triplets pairs, two steps each) | choice_0 choice_1 | probe

so a model whose chunks have length 2 and start at step 0 stores each pair as one chunk (App. B.4:
"each pair of associated images corresponds to a single chunk in memory (of length 2)"). The probe
comes last so that a causal model reads the answer at the last step (use ``pooling="last"``). The
target is the index of the correct choice (chance 50%).
"""

from __future__ import annotations

import torch

from chronomem.checks import check_positive
from chronomem.registry import register_task
from chronomem.tasks.base import Batch, Task

ROLES = ("pair_first", "pair_second", "choice_0", "choice_1", "probe")
QUERIES = ("indirect", "direct", "mixed")
# Trial types of MEMO's data as (probe, answer) positions in a triplet (0 = A, 1 = B, 2 = C).
TRIAL_TYPES = {"AB": (0, 1), "BC": (1, 2), "AC": (0, 2)}


class PAITask(Task):
    name = "pai"
    kind = "classify"
    num_classes = 2
    causal = True

    def __init__(
        self, n_triplets: int = 16, item_dim: int = 32, shuffle: bool = True, query: str = "indirect"
    ):
        if query not in QUERIES:
            raise ValueError(f"query must be one of {QUERIES} (A -> C, A -> B, or MEMO's mix of AB, BC "
                             f"and AC trials), got {query!r}")
        self.query = query
        self.n_triplets = check_positive(n_triplets, "n_triplets", minimum=2)  # a foil needs a second triplet
        self.item_dim = check_positive(item_dim, "item_dim")
        self.shuffle = bool(shuffle)
        self.input_dim = item_dim + len(ROLES)

    @property
    def length(self) -> int:
        return 4 * self.n_triplets + 3

    @property
    def choice_steps(self) -> tuple[int, int]:
        """Input steps of choice 0 and choice 1 (for ``build_model(..., readout="choices")``)."""
        return (4 * self.n_triplets, 4 * self.n_triplets + 1)

    @property
    def memory_length(self) -> int:
        """Steps holding the stored pairs (the chunks of length 2)."""
        return 4 * self.n_triplets

    def sample(self, batch_size: int, generator: torch.Generator, split: str = "train") -> Batch:
        B, n, F = batch_size, self.n_triplets, self.item_dim
        items = torch.randn(B, n, 3, F, generator=generator)
        # A, B, C of each triplet: fresh standard-normal vectors (norm ~ sqrt(item_dim))
        # Pairs: (A_i, B_i) and (B_i, C_i) for every triplet -> [B, 2n, 2, F]
        pairs = torch.cat([items[:, :, 0:2], items[:, :, 1:3]], dim=1)
        if self.shuffle:
            order = torch.argsort(torch.rand(B, 2 * n, generator=generator), dim=1)
            pairs = pairs.gather(1, order[:, :, None, None].expand_as(pairs))
        # Probe A_j; answer C_j; foil C_k with k != j.
        j = torch.randint(0, n, (B,), generator=generator)
        k = (j + torch.randint(1, n, (B,), generator=generator)) % n
        rows = torch.arange(B)
        if self.query == "mixed":  # MEMO's training trials: AB, BC and AC, uniformly
            kinds = torch.tensor(list(TRIAL_TYPES.values()))[torch.randint(0, 3, (B,), generator=generator)]
        else:
            kinds = torch.tensor([TRIAL_TYPES["AC" if self.query == "indirect" else "AB"]]).expand(B, 2)
        probe_at, answer_at = kinds.unbind(1)
        probe, answer, foil = items[rows, j, probe_at], items[rows, j, answer_at], items[rows, k, answer_at]
        target = torch.randint(0, 2, (B,), generator=generator)
        first = torch.where(target[:, None] == 0, answer, foil)
        second = torch.where(target[:, None] == 0, foil, answer)

        L = self.length
        inputs = torch.zeros(B, L, self.input_dim)
        inputs[:, : 4 * n, :F] = pairs.reshape(B, 4 * n, F)
        inputs[:, 0 : 4 * n : 2, F + 0] = 1.0  # pair first
        inputs[:, 1 : 4 * n : 2, F + 1] = 1.0  # pair second
        inputs[:, 4 * n, :F], inputs[:, 4 * n, F + 2] = first, 1.0
        inputs[:, 4 * n + 1, :F], inputs[:, 4 * n + 1, F + 3] = second, 1.0
        inputs[:, 4 * n + 2, :F], inputs[:, 4 * n + 2, F + 4] = probe, 1.0
        return Batch(inputs, target)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "n_triplets": self.n_triplets,
            "item_dim": self.item_dim,
            "shuffle": self.shuffle,
            "query": self.query,
        }


register_task("pai")(PAITask)
