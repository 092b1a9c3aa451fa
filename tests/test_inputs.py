"""The input rules every public module shares (chronomem.layers module docstring), tested per module:

* a floating input of any dtype is cast to the parameters' dtype at the entry (the output has it);
* an integer or boolean tensor where features are expected is a TypeError naming the argument;
* token ids of a head are checked by the head's own argument name, shape and range;
* batch size 0 is a ValueError naming the argument, and ``init_state(0)`` one naming ``batch_size``;
* ``state.reset(done)`` brings a row that held NaN or inf back to exactly the initial state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from chronomem.baselines import LSTM, Transformer, TransformerXL
from chronomem.blrp import BLRP
from chronomem.heads import CausalLM, Classifier, Tagger
from chronomem.htm import HierarchicalMemory, HTMAttention, HTMTransformer
from chronomem.layers import _map_tensors
from chronomem.relevance import MemLSTM, MemRNN, RelevanceLSTM, RelevanceRNN
from chronomem.tlb import TLB

D = 8  # feature width of every backbone below
F_IN = 5  # feature width of the feature heads
VOCAB = 7


def memory_of(batch: int, dtype=torch.float32) -> HierarchicalMemory:
    """A hierarchical memory holding a few chunks (chunk 2, capacity 4)."""
    mem = HierarchicalMemory.empty(batch, 4, 2, D, dtype=dtype)
    return mem.write(torch.randn(batch, 5, D, generator=torch.Generator().manual_seed(1)).to(dtype))


class MemoryWriter(nn.Module):
    """``HierarchicalMemory.write`` as a module: its "parameters" are the memory's dtype."""

    def __init__(self):
        super().__init__()
        self.register_buffer("anchor", torch.zeros(()))

    def forward(self, x: Tensor):
        return memory_of(max(x.shape[0], 1), self.anchor.dtype).write(x).accumulator, None


class Reader(nn.Module):
    """``HTMAttention`` over a fixed memory, in the backbone calling convention."""

    def __init__(self):
        super().__init__()
        self.attn = HTMAttention(D, num_heads=2, top_k=2, chunk_size=2)

    def forward(self, x: Tensor):
        return self.attn(x, memory_of(max(x.shape[0], 1), self.attn.to_query.weight.dtype)), None


@dataclass
class Case:
    build: Callable[[], nn.Module]
    arg: str = "x"  # the name the module gives its input in messages
    width: int = D
    stateful: bool = False


def xl(**kw):
    return TransformerXL(dim=D, depth=1, num_heads=2, segment_len=2, mem_len=3, **kw)


CASES = {
    "HTMAttention": Case(Reader, arg="queries"),
    "HierarchicalMemory": Case(MemoryWriter),
    "HTMTransformer": Case(lambda: HTMTransformer(dim=D, depth=1, num_heads=2, top_k=1, chunk_size=2,
                                                  memory_size=2, window=2), stateful=True),
    "TLB": Case(lambda: TLB(dim=D, num_heads=2, chunk_size=2, num_state=2, self_per_cross=1), stateful=True),
    "BLRP": Case(lambda: BLRP(dim=D, num_heads=2, segment_size=2, latent_size=2, depth=1)),
    "RelevanceRNN": Case(lambda: RelevanceRNN(D, 6, buffer_size=2, relevant_size=1), stateful=True),
    "RelevanceLSTM": Case(lambda: RelevanceLSTM(D, 6, buffer_size=2, relevant_size=1), stateful=True),
    "MemRNN": Case(lambda: MemRNN(D, 6), stateful=True),
    "MemLSTM": Case(lambda: MemLSTM(D, 6), stateful=True),
    "Transformer": Case(lambda: Transformer(dim=D, depth=1, num_heads=2)),
    "TransformerXL": Case(xl, stateful=True),
    "GTrXL": Case(lambda: xl(gated=True), stateful=True),
    "LSTM": Case(lambda: LSTM(dim=D, hidden=6), stateful=True),
    "Tagger(features)": Case(lambda: Tagger(LSTM(dim=D), D, 3, input_dim=F_IN), arg="inputs", width=F_IN),
    "Classifier(features)": Case(lambda: Classifier(TLB(dim=D, num_heads=2, chunk_size=2, num_state=2), D, 3,
                                                    input_dim=F_IN), arg="inputs", width=F_IN),
}
STATEFUL = [name for name, case in CASES.items() if case.stateful]


def build(name: str, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return CASES[name].build().to(dtype).eval()


def features(name: str, batch: int = 2, steps: int = 5, seed: int = 0) -> Tensor:
    return torch.rand(batch, steps, CASES[name].width, generator=torch.Generator().manual_seed(seed))


# ---- item: input dtype ---------------------------------------------------------------------------


@pytest.mark.parametrize("module_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("input_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(CASES))
def test_floating_inputs_are_cast_to_the_parameter_dtype(name, input_dtype, module_dtype):
    model = build(name, module_dtype)
    x = features(name).to(input_dtype)
    with torch.no_grad():
        y = model(x)[0]
        want = model(x.to(module_dtype))[0]  # the documented rule: an explicit cast at the entry
        y_init = model(x, model.init_state(2))[0] if CASES[name].stateful else y  # init_state: same dtype
    assert y.dtype == module_dtype
    assert torch.equal(y, want) and torch.equal(y_init, y)


@pytest.mark.parametrize("input_dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("name", list(CASES))
def test_non_floating_features_raise_type_error_naming_the_argument(name, input_dtype):
    model = build(name)
    x = (features(name) * 3).to(input_dtype)
    arg = CASES[name].arg
    with pytest.raises(TypeError, match=rf"^{arg} must be .*floating-point.*{input_dtype}"):
        model(x)


# ---- item: token ids of the heads ------------------------------------------------------------------


def token_heads():
    torch.manual_seed(0)
    return [
        Tagger(LSTM(dim=D), D, 3, vocab_size=VOCAB),
        Classifier(Transformer(dim=D, depth=1, num_heads=2), D, 3, vocab_size=VOCAB),
        CausalLM(TransformerXL(dim=D, depth=1, num_heads=2, segment_len=2, mem_len=2), D, VOCAB),
    ]


@pytest.mark.parametrize("head", token_heads(), ids=lambda h: type(h).__name__)
def test_token_ids_are_checked_by_the_heads_argument(head):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    head(ids)  # valid ids: fine
    for bad in (VOCAB, -1, 10**6):
        wrong = ids.clone()
        wrong[1, 4] = bad
        lo, hi = int(wrong.min()), int(wrong.max())
        with pytest.raises(ValueError, match=rf"^inputs must hold token ids in \[0, {VOCAB}\).*\[{lo}, {hi}\]"):
            head(wrong)
    with pytest.raises(ValueError, match=r"^inputs must have 2 dimensions \[B, N\].*got shape \(9,\)"):
        head(ids[0])  # 1-D ids: named as the user's inputs, not as the embedded tensor
    with pytest.raises(TypeError, match="^inputs must be integer token ids.*float32"):
        head(ids.float())
    with pytest.raises(ValueError, match=r"^inputs must have batch size >= 1.*\(0, 9\)"):
        head(ids[:0])
    assert torch.equal(head.eval()(ids.to(torch.int16))[0], head(ids)[0])  # any integer dtype is an id


def test_feature_heads_point_integers_to_the_token_path():
    head = build("Tagger(features)")
    with pytest.raises(TypeError, match="vocab_size"):
        head(torch.zeros(2, 3, F_IN, dtype=torch.long))


# ---- item: batch size 0 ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_batch_size_zero_is_a_value_error(name):
    model = build(name)
    arg = CASES[name].arg
    with pytest.raises(ValueError, match=rf"^{arg} must have batch size >= 1.*got shape \(0, 5, {CASES[name].width}\)"):
        model(features(name, batch=0))
    if hasattr(model, "init_state"):
        with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0"):
            model.init_state(0)


def test_empty_hierarchical_memory_of_batch_zero_is_a_value_error():
    with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0"):
        HierarchicalMemory.empty(0, 4, 2, D)


# ---- item: reset restores the initial state ---------------------------------------------------------


def tensors(state) -> list[Tensor]:
    out: list[Tensor] = []
    _map_tensors(state, lambda t: out.append(t) or t)
    return out


# TLB keeps the initial state I_0 in the module: a reset row is marked ``fresh`` and its ``memory``
# row is a stand-in that the next call replaces by the live I_0 (TLBState docstring).
STAND_INS = {"TLB": {0}}  # index of TLBState.memory among the state's tensors


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
@pytest.mark.parametrize("name", STATEFUL)
def test_reset_brings_a_poisoned_row_back_to_the_initial_state(name, poison):
    model = build(name)
    B = 3
    x = features(name, B, 6, seed=1)
    x[0, -1] = poison  # row 0 meets a NaN / inf at its last step (still in every memory)
    z = features(name, B, 5, seed=2)
    done = torch.tensor([True, False, False])
    with torch.no_grad():
        _, state = model(x)
        if poison != poison:  # NaN reaches the state of row 0 only
            assert any(not t[0].isfinite().all() for t in tensors(state) if t.is_floating_point())
        reset = state.reset(done)
        init = model.init_state(B)
        for i, (r, s, fresh) in enumerate(zip(tensors(reset), tensors(state), tensors(init), strict=True)):
            assert torch.equal(r[1:], s[1:])  # the other rows are untouched
            if i in STAND_INS.get(name, ()):
                assert r[0].isfinite().all()
            elif r.shape == fresh.shape:
                assert torch.equal(r[0], fresh[0])  # exactly the initial state
            else:  # MemRNN's memory grows: the reset row holds only empty (zero, invalid) slots
                assert fresh.shape[1] == 0 and not r[0].any()
        y, _ = model(z, reset)
        y_fresh, _ = model(z, init)
        y_kept, _ = model(z, state)
    assert y.isfinite().all()
    torch.testing.assert_close(y[0], y_fresh[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(y[1:], y_kept[1:], atol=0, rtol=0)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_hierarchical_memory_reset_clears_a_poisoned_row(poison):
    mem = memory_of(2)
    x = torch.randn(2, 3, D)
    x[0, 2] = poison  # lands in the partial chunk being filled and in a committed chunk
    mem = mem.write(x)
    reset = mem.reset(torch.tensor([True, False]))
    empty = HierarchicalMemory.empty(2, 4, 2, D)
    for r, s, e in zip(tensors(reset), tensors(mem), tensors(empty), strict=True):
        assert torch.equal(r[0], e[0]) and torch.equal(r[1:], s[1:])
