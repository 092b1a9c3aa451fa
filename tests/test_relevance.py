"""RelevanceRNN / RelevanceLSTM / MemRNN / MemLSTM against a naive per-example Algorithm 1."""

import math

import pytest
import torch

from chronomem.relevance import MemLSTM, MemRNN, MemState, RelevanceLSTM, RelevanceRNN, RelevanceState

torch.set_num_threads(1)


def make(cls, nu=3, rho=2, I=5, H=8, seed=0, **kw):  # noqa: E741
    torch.manual_seed(seed)
    if cls in (MemRNN, MemLSTM):
        return cls(I, H, **kw).double()
    return cls(I, H, buffer_size=nu, relevant_size=rho, **kw).double()


# --------------------------------------------------------------------------------------------
# Naive reference: Algorithm 1 for one example with Python lists and loops.
# --------------------------------------------------------------------------------------------


def naive(module, x):
    """x [T, I] -> (outputs [T, H], buffer entries, relevant entries); entries are dicts."""
    lstm = module.lstm
    H = module.hidden_size
    nu = getattr(module, "buffer_size", math.inf)
    rho = getattr(module, "relevant_size", 0)
    U, b, V = module.U.weight, module.U.bias, module.V.weight
    W_a, U_a, v_a = module.W_a.weight, module.U_a.weight, module.v_a
    s = torch.zeros(H, dtype=x.dtype)
    c = torch.zeros(H, dtype=x.dtype)
    buffer, relevant, outputs = [], [], []
    for t in range(x.shape[0]):
        pre = U @ x[t] + b + V @ s  # line 2
        if lstm:
            i, f, g, o = pre.chunk(4)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            h = module.phi(pre)
        if len(buffer) == nu:  # lines 4-7
            old = buffer.pop(0)
            if len(relevant) < rho:
                relevant.append(old)
            elif rho > 0:
                j = min(range(len(relevant)), key=lambda k: relevant[k]["beta"])  # first lowest
                if old["beta"] > relevant[j]["beta"]:
                    relevant[j] = old
        buffer.append({"h": h, "beta": 0.0, "pos": t})  # line 3
        memory = buffer + relevant  # line 8
        logits = torch.stack([v_a @ torch.tanh(W_a @ s + U_a @ m["h"]) for m in memory])  # line 10
        z = torch.softmax(logits, 0)  # line 11
        s = h + sum(z[i] * memory[i]["h"] for i in range(len(memory)))  # line 12
        for i, entry in enumerate(buffer):
            entry["beta"] += float(z[i].detach())
        outputs.append(s)
    return torch.stack(outputs), buffer, relevant


CASES = [(RelevanceRNN, 3, 2), (RelevanceRNN, 1, 3), (RelevanceRNN, 4, 0), (RelevanceRNN, 2, 5),
         (RelevanceRNN, 5, 1), (RelevanceLSTM, 3, 2), (RelevanceLSTM, 1, 4)]


@pytest.mark.parametrize("cls,nu,rho", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_algorithm_1(cls, nu, rho, seed):
    kw = {"nonlinearity": "modrelu"} if (seed == 2 and cls is RelevanceRNN) else {}
    module = make(cls, nu, rho, seed=seed, **kw)
    x = torch.randn(3, 25, 5, dtype=torch.double) * 2
    y, state = module(x)
    for b in range(x.shape[0]):
        ref, buffer, relevant = naive(module, x[b])
        torch.testing.assert_close(y[b], ref, rtol=1e-10, atol=1e-10)
        # relevant set: same states, same frozen scores, same positions, in the same slots
        r_mem, r_score, r_pos, r_valid = state.relevant(nu)
        assert int(r_valid[b].sum()) == len(relevant)
        for k, entry in enumerate(relevant):
            assert int(r_pos[b, k]) == entry["pos"]
            assert float(r_score[b, k]) == pytest.approx(entry["beta"], abs=1e-10)
            torch.testing.assert_close(r_mem[b, k], entry["h"], rtol=1e-10, atol=1e-10)
        # buffer: the last nu states with their running scores (oldest first)
        assert state.position[b, :nu].tolist() == [e["pos"] for e in buffer]
        betas = torch.tensor([e["beta"] for e in buffer], dtype=x.dtype)
        torch.testing.assert_close(state.score[b, :nu], betas)


def test_naive_cases_exercise_replacement():
    """The reference comparison is only meaningful if states get replaced in R: check that they do."""
    module = make(RelevanceRNN, 3, 2, seed=0)
    x = torch.randn(8, 25, 5, dtype=torch.double) * 2
    _, state = module(x)
    _, _, pos, _ = state.relevant(3)
    assert (pos != torch.tensor([0, 1])).any()  # some row replaced its first entries


@pytest.mark.parametrize("cls", [MemRNN, MemLSTM])
def test_mem_rnn_matches_naive(cls):
    module = make(cls, seed=3)
    x = torch.randn(2, 12, 5, dtype=torch.double)
    y, _ = module(x)
    for b in range(2):
        torch.testing.assert_close(y[b], naive(module, x[b])[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rel_cls,mem_cls", [(RelevanceRNN, MemRNN), (RelevanceLSTM, MemLSTM)])
@pytest.mark.parametrize("nu", [16, 40])
def test_large_buffer_equals_mem_rnn(rel_cls, mem_cls, nu):
    rel = make(rel_cls, nu, 3, seed=4)
    mem = make(mem_cls, seed=5)
    mem.load_state_dict(rel.state_dict())
    x = torch.randn(3, 16, 5, dtype=torch.double)
    torch.testing.assert_close(rel(x)[0], mem(x)[0], rtol=1e-12, atol=1e-12)


def test_rho0_nu1_reads_only_newest_state():
    module = make(RelevanceRNN, 1, 0, seed=6)
    x = torch.randn(2, 10, 5, dtype=torch.double)
    y, state = module(x)
    s = torch.zeros(2, 8, dtype=torch.double)
    for t in range(10):
        h = torch.tanh(module.U(x[:, t]) + module.V(s))
        s = 2 * h  # the only memory entry is h_t itself: z = 1, s_t = h_t + h_t
        torch.testing.assert_close(y[:, t], s)
    assert state.valid.shape == (2, 1) and state.position[:, 0].eq(9).all()


# --------------------------------------------------------------------------------------------
# Streaming, batch independence, padding, state helpers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RelevanceRNN, RelevanceLSTM, MemRNN, MemLSTM])
@pytest.mark.parametrize("split", [1, 7, 19])
def test_streaming_equals_batch(cls, split):
    module = make(cls, 3, 2, seed=7)
    x = torch.randn(2, 20, 5, dtype=torch.double)
    y, state = module(x)
    y1, s1 = module(x[:, :split])
    y2, s2 = module(x[:, split:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2.memory, state.memory)
    assert torch.equal(s2.valid, state.valid) and torch.equal(s2.steps, state.steps)
    if isinstance(state, RelevanceState):
        assert torch.equal(s2.position, state.position)
        torch.testing.assert_close(s2.score, state.score)


@pytest.mark.parametrize("cls", [RelevanceRNN, RelevanceLSTM, MemRNN])
def test_batch_independence(cls):
    module = make(cls, 2, 3, seed=8)
    x = torch.randn(4, 15, 5, dtype=torch.double)
    y, _ = module(x)
    for b in range(4):
        torch.testing.assert_close(module(x[b : b + 1])[0][0], y[b], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [RelevanceRNN, RelevanceLSTM, MemRNN])
def test_padding_steps_leave_state_unchanged(cls):
    module = make(cls, 2, 2, seed=9)
    x = torch.randn(3, 14, 5, dtype=torch.double)
    mask = torch.rand(3, 14, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    y, state = module(x, mask=mask)
    for b in range(3):
        yb, sb = module(x[b : b + 1, mask[b]])
        torch.testing.assert_close(y[b, mask[b]], yb[0], rtol=1e-12, atol=1e-12)
        assert (y[b, ~mask[b]] == 0).all()
        torch.testing.assert_close(state.s[b], sb.s[0])
        assert int(state.steps[b]) == int(mask[b].sum())


@pytest.mark.parametrize("cls", [MemRNN, MemLSTM])
def test_mem_states_of_different_lengths_join(cls):
    """States taken after different numbers of steps (a PPO replay's windows) join along the batch, padded
    with empty slots, and each row continues as it would alone."""
    from chronomem.layers import concat_states

    module = make(cls, 2, 2, seed=12)
    x = torch.randn(3, 16, 5, dtype=torch.double)
    lengths = (3, 9, 0)  # the third row has no past: an empty memory
    states = [module(x[b : b + 1, :n])[1] if n else module.init_state(1, dtype=torch.double)
              for b, n in enumerate(lengths)]
    joined = concat_states(states)
    assert joined.memory.shape[:2] == (3, 9) and joined.valid.sum(1).tolist() == list(lengths)
    y, _ = module(x[:, 9:], joined)
    for b, state in enumerate(states):
        torch.testing.assert_close(y[b : b + 1], module(x[b : b + 1, 9:], state)[0], rtol=1e-12, atol=1e-12)


def test_reset_and_detach():
    module = make(RelevanceLSTM, 2, 2, seed=10)
    x = torch.randn(2, 9, 5, dtype=torch.double)
    _, state = module(x)
    fresh, _ = module(x)
    state = state.reset(torch.tensor([True, False])).detach()
    y, _ = module(x, state)
    torch.testing.assert_close(y[0], fresh[0])  # the reset row starts over
    assert not torch.allclose(y[1], fresh[1])
    assert not state.memory.requires_grad


# --------------------------------------------------------------------------------------------
# Gradients: full BPTT through stored states; the screening decision carries none
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [RelevanceRNN, RelevanceLSTM])
def test_gradient_reaches_first_input(cls):
    module = make(cls, 2, 3, seed=11)
    x = torch.randn(2, 30, 5, dtype=torch.double, requires_grad=True)
    y, state = module(x)
    y[:, -1].sum().backward()
    assert x.grad[:, 0].abs().sum() > 0
    assert not state.score.requires_grad  # beta is built from detached attention weights
    assert state.valid.dtype == torch.bool and state.position.dtype == torch.long


def test_gradient_flows_through_relevant_set_skip_connection():
    """With V = 0 and W_a = 0 the only path from x_1 to s_T is h_1 stored in R (attention skip)."""
    module = make(RelevanceRNN, 2, 3, seed=12)
    with torch.no_grad():
        module.V.weight.zero_()
        module.W_a.weight.zero_()
    x = torch.randn(1, 20, 5, dtype=torch.double, requires_grad=True)
    y, state = module(x)
    _, _, pos, valid = state.relevant(2)
    y[0, -1].sum().backward()
    in_r = set(pos[0][valid[0]].tolist())
    for t in range(18):  # not in the final buffer (positions 18, 19)
        reaches = bool(x.grad[0, t].abs().sum() > 0)
        assert reaches == (t in in_r), (t, in_r)


@pytest.mark.parametrize("cls", [RelevanceRNN, MemRNN, MemLSTM])
def test_same_results_with_and_without_grad(cls):
    """Screening does not depend on autograd; MemRNN's inference path (preallocated) equals training's."""
    module = make(cls, 3, 2, seed=13)
    x = torch.randn(2, 20, 5, dtype=torch.double)
    mask = torch.rand(2, 20, generator=torch.Generator().manual_seed(1)) > 0.2
    y, s = module(x[:, :8], mask=mask[:, :8])
    y, s = module(x[:, 8:], s, mask=mask[:, 8:])
    with torch.no_grad():
        y2, s2 = module(x[:, :8], mask=mask[:, :8])
        y2, s2 = module(x[:, 8:], s2, mask=mask[:, 8:])
    torch.testing.assert_close(y, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s.memory, s2.memory, rtol=1e-12, atol=1e-12)
    assert torch.equal(s.valid, s2.valid)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="buffer_size"):
        RelevanceRNN(5, 8, buffer_size=0)
    with pytest.raises(ValueError, match="relevant_size"):
        RelevanceRNN(5, 8, relevant_size=-1)
    with pytest.raises(ValueError, match="nonlinearity"):
        RelevanceRNN(5, 8, nonlinearity="gelu")
    with pytest.raises(ValueError, match="init"):
        RelevanceRNN(5, 8, init="zeros")
    with pytest.raises(TypeError):
        RelevanceRNN(5, 8, buffer=3)
    module = RelevanceRNN(5, 8, buffer_size=2, relevant_size=2)
    with pytest.raises(ValueError, match="x"):
        module(torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="x"):
        module(torch.randn(2, 4))
    with pytest.raises(ValueError, match="empty"):
        module(torch.randn(2, 0, 5))
    _, state = module(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="batch size"):
        module(torch.randn(2, 4, 5), state)
    with pytest.raises(TypeError, match="mask"):
        module(torch.randn(2, 4, 5), mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="state.c"):
        RelevanceLSTM(5, 8, buffer_size=2, relevant_size=2)(torch.randn(3, 4, 5), state)
    mem = MemRNN(5, 8)
    _, mstate = mem(torch.randn(3, 4, 5))
    assert isinstance(mstate, MemState)
    with pytest.raises(ValueError, match="batch size"):
        mem(torch.randn(2, 4, 5), mstate)
    with pytest.raises(TypeError):
        mem(torch.randn(3, 4, 5), state)


def test_config_and_registry_builders():
    cfg = RelevanceRNN.Config(input_size=5, hidden_size=8, buffer_size=4, relevant_size=1, init="henaff")
    module = RelevanceRNN(config=cfg)
    assert (module.buffer_size, module.relevant_size, module.out_dim) == (4, 1, 8)
    w = module.V.weight.detach()
    torch.testing.assert_close(w @ w.T, torch.eye(8), atol=1e-5, rtol=0)  # henaff init is orthogonal
    from chronomem.heads import build_model
    from chronomem.tasks.copy import CopyTask

    task = CopyTask(seq_len=5)
    batch = task.sample(2, torch.Generator().manual_seed(0))
    for name in ("relevance-rnn", "relevance-lstm", "mem-rnn", "mem-lstm"):
        net = build_model(name, task, dim=16, buffer_size=3, relevant_size=2)
        logits, _ = net(batch.inputs)
        assert logits.shape == (2, 25, 10)
    net = build_model("relevance-rnn", task, dim=16, hidden_size=12, buffer_size=3, relevant_size=2)
    assert net.backbone.hidden_size == 12 and net(batch.inputs)[0].shape == (2, 25, 10)


# --------------------------------------------------------------------------------------------
# Experiments at smoke scale
# --------------------------------------------------------------------------------------------


def test_experiments_smoke(tmp_path):
    pytest.importorskip("chronomem.train")
    from chronomem.experiments.base import run_experiment
    from chronomem.experiments.relevance import DENOISE_SCALES, TRANSFER_SCALES
    from chronomem.registry import get_experiment

    lengths = {"transfer-copy": sorted(TRANSFER_SCALES["smoke"].eval), "denoise": DENOISE_SCALES["smoke"].T}
    for name in ("transfer-copy", "denoise"):
        result = run_experiment(get_experiment(name), "smoke", tmp_path / name, seed=0)
        assert set(result["results"]) >= {"relevance-rnn", "mem-rnn"}
        for model, row in result["results"].items():
            assert list(row) == [f"T={T}" for T in lengths[name]], (model, row)  # every length, in order
            values = list(row.values())
            if "OOM" in values:  # memory only grows with T: after the first OOM every longer T is OOM
                assert set(values[values.index("OOM"):]) == {"OOM"}, (model, row)
            if name == "transfer-copy":  # a share of the 10 x n copied symbols: a multiple of 100 / (10 n)
                for T, value in zip(lengths[name], values, strict=True):
                    if value != "OOM":
                        step = 100 / (10 * TRANSFER_SCALES["smoke"].eval[T])
                        assert abs(value / step - round(value / step)) < 0.01, (model, T, value)
        assert "peak_memory_mb" in result["extra"]
        assert (tmp_path / name / "report.md").exists()
