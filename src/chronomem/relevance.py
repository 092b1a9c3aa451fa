"""Relevancy screening (paper 004, Algorithm 1): attentive RNN / LSTM with a constant-size memory.

At every step t (Algorithm 1, lines 2-12)::

    h_t = phi(V s_{t-1} + U x_t + b)                       # line 2 (LSTM: gates read s_{t-1})
    S_t = S_{t-1} + [h_t]; drop h_{t-nu} if |S| > nu        # lines 3-5: short-term buffer, nu states
    h_{t-nu} enters R_t if C(t-nu)                          # lines 6-7: relevancy screening
    M_t = [S_t ; R_t]                                       # line 8
    z_i = softmax_i( v^T tanh(W_a s_{t-1} + U_a m_i) )      # lines 9-11, bias-free additive attention
    s_t = h_t + sum_i z_i m_i                               # line 12; s_t is the module's output

Screening C (Section 2 and the authors' code, bhargav104/MemoryNets): the relevance score of a state is
``beta(i) = sum_{j=i}^{i+nu-1} alpha_{i,j}``, the (detached) attention weights it received while in the
buffer. When a state leaves the buffer it enters R if R has fewer than rho states, else it replaces
the lowest-scored member of R only if its beta is strictly greater (ties: the first lowest slot).
Scores are frozen once in R. Stored states are live tensors: gradients flow through the attention
skip connections (full BPTT); only the screening decision carries no gradient.

Order within a step, decided from Algorithm 1: h_t is added to the buffer *before* the attention
(line 3 precedes line 8), so the memory read at step t contains h_t itself, and the state leaving the
buffer at step t enters R before the attention of step t. This matches beta(i) summing over
j = i .. i+nu-1 (a state is attended nu times while buffered, first at its own step) and the authors'
code (whose loop is shifted by one step). The query is s_{t-1}.

``MemRNN`` / ``MemLSTM`` (the paper's "vanilla self-attention RNN/LSTM") attend over every past state:
O(T) memory of stored states and O(T^2) compute; with autograd their saved activations grow as T^2.
A ``RelevanceRNN`` with ``buffer_size >= T`` computes exactly what ``MemRNN`` computes.

Deviations from the authors' code (their Algorithm 1 is followed instead): the code mixes
``s_t = 0.5 (h_t + sum_i z_i m_i)``, reads its classifier from h_t and runs step 1 without attention;
here s_t is exactly line 12, the output is s_t, and step 1 attends to {h_1}.

Memory layout (vectorised over the batch; the only Python loop is the time recurrence): ``memory``
and ``keys`` hold ``[B, nu + rho, H]``: slots ``0..nu-1`` are the buffer, oldest first (a shifted
tensor: a step drops slot 0 and appends h_t), slots ``nu..`` the relevant set. ``keys`` caches
``U_a m_i`` so each stored state is projected once; ``U x_t`` is computed for all t in one matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_positive, check_state_batch, check_tensor, parameter_dtype
from chronomem.config import build_config
from chronomem.core import CausalCore
from chronomem.layers import RecurrentState, clear_rows
from chronomem.registry import register_model

NONLINEARITIES = ("tanh", "modrelu", "relu")
INITS = ("orthogonal", "henaff", "xavier", "kaiming")


# ============================================================================================
# State
# ============================================================================================


@dataclass(frozen=True)
class RelevanceState(RecurrentState):
    """State between calls of ``RelevanceRNN`` / ``RelevanceLSTM`` (all zeros = the initial state).

    * ``s [B, H]``: the macro-state s_{t-1}; ``c [B, H]``: LSTM cell (``None`` for the RNN).
    * ``memory [B, nu+rho, H]``, ``keys [B, nu+rho, H]`` (``U_a m_i``): buffer slots ``0..nu-1``
      (oldest first), relevant-set slots ``nu..nu+rho-1``. Live tensors (gradients flow through them).
    * ``valid [B, nu+rho]``: which slots hold a state.
    * ``score [B, nu+rho]``: beta — running for buffer slots, frozen for relevant slots. No gradient.
    * ``position [B, nu+rho]``: the time step (0-based, counted over calls) of each stored state.
    * ``steps [B]``: number of (valid) steps processed so far.
    """

    s: Tensor
    c: Tensor | None
    memory: Tensor
    keys: Tensor
    valid: Tensor
    score: Tensor
    position: Tensor
    steps: Tensor

    def relevant(self, buffer_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(states, scores, positions, valid)`` of the relevant set (slots after the buffer)."""
        n = buffer_size
        return self.memory[:, n:], self.score[:, n:], self.position[:, n:], self.valid[:, n:]


@dataclass(frozen=True)
class MemState(RecurrentState):
    """State of ``MemRNN`` / ``MemLSTM``: the past states of the current episodes (``memory``/``keys``
    grow by one per step; ``compact`` drops the slots of ended episodes)."""

    s: Tensor
    c: Tensor | None
    memory: Tensor  # [B, N, H]
    keys: Tensor  # [B, N, H]
    valid: Tensor  # [B, N]
    steps: Tensor  # [B]

    def compact(self) -> MemState:
        """The state without the slots empty in every row (ended episodes, padding), which no query
        attends to: the memory spans the batch's longest current episode, not the whole stream."""
        filled = self.valid.any(0)
        if bool(filled.all()):
            return self
        return replace(self, memory=self.memory[:, filled], keys=self.keys[:, filled], valid=self.valid[:, filled])

    def reset(self, done: Tensor) -> MemState:
        return super().reset(done).compact()

    @classmethod
    def joinable(cls, states):
        """States of different lengths (taken at different steps: PPO's replay windows) padded with empty
        slots to the longest, so they join along the batch. No query attends to an empty slot, so each
        row reads what it read before."""
        n = max(state.valid.shape[1] for state in states)

        def padded(state: MemState) -> MemState:
            extra = n - state.valid.shape[1]
            return state if extra == 0 else replace(
                state, memory=F.pad(state.memory, (0, 0, 0, extra)), keys=F.pad(state.keys, (0, 0, 0, extra)),
                valid=F.pad(state.valid, (0, extra)))

        return [padded(state) for state in states]


# ============================================================================================
# The recurrent core shared by the four models
# ============================================================================================


class ModReLU(nn.Module):
    """modReLU (Arjovsky et al. 2016) on real values: ``sign(z) * relu(|z| + b)``."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(hidden_size).uniform_(-0.01, 0.01))

    def forward(self, z: Tensor) -> Tensor:
        return torch.sign(z) * F.relu(z.abs() + self.bias)


def henaff_(weight: Tensor) -> Tensor:
    """Henaff et al. (2016) init: block-diagonal 2x2 rotations with angles uniform in [-pi, pi]."""
    n = weight.shape[0]
    with torch.no_grad():
        w = torch.zeros(n, n, dtype=weight.dtype, device=weight.device)
        angles = torch.empty(n // 2).uniform_(-math.pi, math.pi)
        for i, a in enumerate(angles.tolist()):
            c, s = math.cos(a), math.sin(a)
            w[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=weight.dtype)
        if n % 2:
            w[-1, -1] = 1.0
        weight.copy_(w)
    return weight


def _init_recurrent(weight: Tensor, init: str, blocks: int) -> None:
    """Initialise each ``[H, H]`` block of a recurrent weight ``[blocks*H, H]``."""
    for block in weight.detach().chunk(blocks, dim=0):
        {"orthogonal": nn.init.orthogonal_, "henaff": henaff_, "xavier": nn.init.xavier_normal_,
         "kaiming": nn.init.kaiming_normal_}[init](block)


class _AttentiveRecurrence(CausalCore):
    """Parameters and one step of the RNN / LSTM core with additive attention (Algorithm 1)."""

    @dataclass
    class Config:
        input_size: int = 0
        hidden_size: int = 128
        buffer_size: int = 10  # nu (paper's Copy setting)
        relevant_size: int = 15  # rho
        nonlinearity: str = "tanh"  # RNN only: "tanh" | "modrelu" | "relu"
        init: str = "orthogonal"  # recurrent weight V: "orthogonal" | "henaff" | "xavier" | "kaiming"

    lstm = False
    screened = True  # False: MemRNN/MemLSTM (attend over every past state)

    def __init__(self, input_size: int | None = None, hidden_size: int | None = None, *, config=None,
                 **kwargs):
        super().__init__()
        if input_size is not None:
            kwargs["input_size"] = input_size
        if hidden_size is not None:
            kwargs["hidden_size"] = hidden_size
        cfg = self.config = build_config(self.Config, config, kwargs)
        self.input_size = self.dim = check_positive(cfg.input_size, "input_size")
        self.hidden_size = self.out_dim = check_positive(cfg.hidden_size, "hidden_size")
        if self.screened:
            self.buffer_size = check_positive(cfg.buffer_size, "buffer_size (nu)", 1)
            self.relevant_size = check_positive(cfg.relevant_size, "relevant_size (rho)", 0)
        if cfg.nonlinearity not in NONLINEARITIES:
            raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {cfg.nonlinearity!r}")
        if cfg.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {cfg.init!r}")
        H, gates = self.hidden_size, 4 if self.lstm else 1
        self.U = nn.Linear(self.input_size, gates * H)  # U x_t + b
        self.V = nn.Linear(H, gates * H, bias=False)  # V s_{t-1}
        self.W_a = nn.Linear(H, H, bias=False)  # attention query from s_{t-1}
        self.U_a = nn.Linear(H, H, bias=False)  # attention key of each stored state
        self.v_a = nn.Parameter(torch.empty(H))
        self.phi = None if self.lstm else (ModReLU(H) if cfg.nonlinearity == "modrelu" else
                                          nn.Tanh() if cfg.nonlinearity == "tanh" else nn.ReLU())
        nn.init.xavier_normal_(self.U.weight)  # the authors' input init
        _init_recurrent(self.V.weight, cfg.init, gates)
        nn.init.normal_(self.v_a, std=math.sqrt(2.0 / (1 + H)))  # xavier_normal_ of a [1, H] matrix

    # ---------------------------------------------------------------------------------------
    def check_input(self, x) -> Tensor:
        return check_tensor(x, "x", 3, self.input_size, "[B, T, input_size]", dtype=parameter_dtype(self))

    @staticmethod
    def _ends(done: Tensor | None) -> set[int]:
        """The steps after which some row's episode ends (one host sync per call, so the step loop pays
        for a reset only at those steps)."""
        return set() if done is None else set(done.any(0).nonzero().flatten().tolist())

    def _zeros_core(self, batch: int, device, dtype) -> tuple[Tensor, Tensor | None]:
        s = torch.zeros(batch, self.hidden_size, device=device, dtype=dtype)
        return s, (s.clone() if self.lstm else None)

    def _precompute(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``U x_t + b`` for every t in one matmul, padded with zeros for the query columns, and the
        fused recurrent weight ``[V ; W_a]^T`` so one ``addmm`` per step gives gates and query."""
        ux = self.U(x)  # [B, T, G]
        ux = F.pad(ux, (0, self.hidden_size))  # [B, T, G + H]
        w_rec = torch.cat([self.V.weight, self.W_a.weight], 0).t()  # [H, G + H]
        return ux.unbind(1), w_rec  # unbind: one gradient stack for all steps (x[:, t] would be O(T^2))

    def _core(self, ux_t: Tensor, w_rec: Tensor, s: Tensor, c: Tensor | None):
        """Line 2: ``h_t = phi(V s_{t-1} + U x_t + b)`` (LSTM gates read s_{t-1}); also the query."""
        rec = torch.addmm(ux_t, s, w_rec)
        pre, query = rec[:, : -self.hidden_size], rec[:, -self.hidden_size :]  # query = W_a s_{t-1}
        if self.lstm:
            i, f, g, o = pre.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            h = self.phi(pre)
        return h, c, query

    def _attend(self, query: Tensor, mk: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Lines 9-11 over ``mk = [m_i | U_a m_i]`` (``[B, N, 2H]``): ``z = softmax(v^T tanh(W_a s_{t-1}
        + U_a m_i))`` over the valid slots; returns ``(sum_i z_i m_i, z)``."""
        memory, keys = mk.split(self.hidden_size, -1)  # split (not slicing): one backward op for both
        logits = (query.unsqueeze(1) + keys).tanh_() @ self.v_a  # [B, N]
        # The lowest finite value, not -inf: a padded step may see no valid slot (left padding, padding
        # after an episode end), and a softmax of all -inf is NaN, whose gradient would reach the
        # parameters through the masked output. Where a slot is valid the weights are the same.
        z = torch.softmax(logits.masked_fill(~valid, torch.finfo(logits.dtype).min), dim=-1)
        return (z.unsqueeze(-1) * memory).sum(1), z  # (a multiply-sum beats bmm here on CPU)


# ============================================================================================
# Relevance RNN / LSTM: buffer of nu states + relevant set of rho states
# ============================================================================================


class RelevanceRNN(_AttentiveRecurrence):
    """ReLRNN (paper 004): ``outputs [B, T, H], state = module(x [B, T, I], state=None, mask=None,
    done=None)``.

    ``outputs`` are the macro-states s_t. ``buffer_size`` = nu >= 1, ``relevant_size`` = rho >= 0
    (rho = 0: buffer only). ``mask [B, T]`` (True = valid): a padded step leaves the state unchanged and
    outputs zeros. ``done [B, T]`` (True where a step is the last of its episode; ignored at padded
    steps): after it the row restarts from the initial state (buffer, relevant set and scores empty),
    by selection, so nothing crosses the boundary. Defaults: H=128, nu=10, rho=15 (the authors' Copy
    settings).
    """

    def init_state(self, batch_size: int, device=None, dtype=None) -> RelevanceState:
        check_positive(batch_size, "batch_size")
        dtype = dtype or self.U.weight.dtype
        n, H = self.buffer_size + self.relevant_size, self.hidden_size
        s, c = self._zeros_core(batch_size, device, dtype)
        return RelevanceState(
            s=s, c=c,
            memory=torch.zeros(batch_size, n, H, device=device, dtype=dtype),
            keys=torch.zeros(batch_size, n, H, device=device, dtype=dtype),
            valid=torch.zeros(batch_size, n, dtype=torch.bool, device=device),
            score=torch.zeros(batch_size, n, device=device, dtype=dtype),
            position=torch.zeros(batch_size, n, dtype=torch.long, device=device),
            steps=torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def check_state(self, state, batch: int) -> RelevanceState:
        if not isinstance(state, RelevanceState):
            raise TypeError(f"state must be a RelevanceState (or None), got {type(state).__name__}")
        check_state_batch(state.s.shape[0], batch)
        expected = (batch, self.buffer_size + self.relevant_size, self.hidden_size)
        if tuple(state.memory.shape) != expected:
            raise ValueError(f"state.memory must have shape {expected} (B, nu+rho, H), "
                             f"got {tuple(state.memory.shape)}")
        if (state.c is None) == self.lstm:
            raise ValueError("state.c must be a cell tensor for an LSTM and None for an RNN")
        return state

    def _screen(self, oldest: Tensor, rel_mk: Tensor, valid: Tensor, score: Tensor, position: Tensor):
        """Lines 4-7: the oldest buffer state leaves if the buffer is full; it enters the relevant set
        if there is room, else replaces the lowest-scored member when its beta is strictly greater.
        ``oldest [B, 2H]`` is buffer slot 0, ``rel_mk [B, rho, 2H]`` the relevant set.
        Returns the relevant set's ``(mk, valid, score, position)``. No gradient flows through the
        decision; the stored state itself stays a live tensor."""
        nu = self.buffer_size
        rel_valid, rel_score, rel_position = valid[:, nu:], score[:, nu:], position[:, nu:]
        leaving = valid[:, 0]  # buffer full -> slot 0 (h_{t-nu}) leaves now
        free = ~rel_valid
        has_free = free.any(1)
        first_free = free.to(torch.int8).argmax(1)
        lowest = rel_score.masked_fill(free, float("inf")).argmin(1)  # first lowest on ties
        beta = score[:, 0]
        enter = leaving & (has_free | (beta > rel_score.gather(1, lowest[:, None]).squeeze(1)))
        # Nobody enters: R is unchanged (same values; skipped on CPU only, where the check costs no sync).
        if rel_mk.device.type == "cpu" and not bool(enter.any()):
            return rel_mk, rel_valid, rel_score, rel_position
        slot = torch.where(has_free, first_free, lowest)  # [B]
        rows = torch.arange(rel_mk.shape[0], device=rel_mk.device)
        e1 = enter[:, None]
        # replaceWith(): each row writes at most one slot; rows that do not enter rewrite their own value.
        rel_mk = rel_mk.index_put((rows, slot), torch.where(e1, oldest, rel_mk[rows, slot]))
        rel_valid = rel_valid.index_put((rows, slot), rel_valid[rows, slot] | enter)
        # the entering score is frozen from now on (only buffer scores are incremented)
        rel_score = rel_score.index_put((rows, slot), torch.where(enter, beta, rel_score[rows, slot]))
        new_position = torch.where(enter, position[:, 0], rel_position[rows, slot])
        rel_position = rel_position.index_put((rows, slot), new_position)
        return rel_mk, rel_valid, rel_score, rel_position

    def scan(self, x: Tensor, st: RelevanceState, mask: Tensor | None, done: Tensor | None):
        """Algorithm 1 over the call (``forward``: ``CausalCore``); ``done`` the episode ends before the
        call's last step."""
        batch, T = x.shape[:2]
        ends = self._ends(done)
        nu, rho = self.buffer_size, self.relevant_size
        ux, w_rec = self._precompute(x)
        s, c, valid, score, position, steps = st.s, st.c, st.valid, st.score, st.position, st.steps
        mk = torch.cat([st.memory, st.keys], -1)  # [B, nu+rho, 2H]: stored states | their cached keys
        one = valid.new_ones(batch, 1)
        outputs = []
        for t in range(T):
            h, c_new, query = self._core(ux[t], w_rec, s, c)  # line 2
            hk = torch.cat([h, self.U_a(h)], -1).unsqueeze(1)  # h_t and its key U_a h_t (computed once)
            # Lines 4-7: screening of the state leaving the buffer.
            oldest, kept, r_mk = mk.split([1, nu - 1, rho], 1)  # oldest buffer slot, rest of buffer, R
            if rho > 0:
                r_mk, r_valid, r_score, r_pos = self._screen(oldest.squeeze(1), r_mk, valid, score, position)
            else:
                r_valid, r_score, r_pos = valid[:, nu:], score[:, nu:], position[:, nu:]
            # Lines 3, 5, 8: shift the buffer (drop h_{t-nu}), append h_t; M_t = [S_t ; R_t].
            new_mk = torch.cat([kept, hk, r_mk], 1)
            new_valid = torch.cat([valid[:, 1:nu], one, r_valid], 1)
            new_position = torch.cat([position[:, 1:nu], steps[:, None], r_pos], 1)
            read, z = self._attend(query, new_mk, new_valid)  # lines 9-11
            s_new = h + read  # line 12
            # beta: detached attention weights received while in the buffer (frozen once in R).
            z = z.detach()
            new_score = torch.cat([score[:, 1:nu] + z[:, : nu - 1], z[:, nu - 1 : nu], r_score], 1)
            if mask is None:
                s, c, steps = s_new, c_new, steps + 1
                mk, valid, score, position = new_mk, new_valid, new_score, new_position
                outputs.append(s_new)
            else:  # a padded step leaves the state unchanged
                m = mask[:, t]
                m1 = m[:, None]
                s = torch.where(m1, s_new, s)
                c = None if c is None else torch.where(m1, c_new, c)
                mk = torch.where(m1[..., None], new_mk, mk)
                valid, score = torch.where(m1, new_valid, valid), torch.where(m1, new_score, score)
                position, steps = torch.where(m1, new_position, position), steps + m.long()
                outputs.append(s_new.masked_fill(~m1, 0.0))
            if t in ends:  # the episode ended: the whole state (buffer, relevant set, scores) restarts
                d = done[:, t]
                s, mk, valid = clear_rows(s, d), clear_rows(mk, d), clear_rows(valid, d)
                score, position, steps = clear_rows(score, d), clear_rows(position, d), clear_rows(steps, d)
                c = None if c is None else clear_rows(c, d)
        memory, keys = mk.split(self.hidden_size, -1)
        out_state = RelevanceState(s, c, memory, keys, valid, score, position, steps)
        return torch.stack(outputs, 1), out_state


class RelevanceLSTM(RelevanceRNN):
    """ReLLSTM (paper 004): an LSTM whose gates read s_{t-1} in place of h_{t-1}; memory as ReLRNN.

    ``nonlinearity`` is unused (the LSTM's own sigmoid/tanh); ``init`` applies to each gate's block of V.
    """

    lstm = True


# ============================================================================================
# MemRNN / MemLSTM: attention over every past state
# ============================================================================================


class MemRNN(_AttentiveRecurrence):
    """MemRNN (paper 004, Bahdanau-style self-attentive RNN): the memory keeps every past state.

    Same equations as ``RelevanceRNN`` with M_t = {h_1, ..., h_t}. O(T) stored states, O(T^2) compute
    (and O(T^2) saved activations when training). ``buffer_size``/``relevant_size`` are ignored.
    ``mask`` and ``done`` as in ``RelevanceRNN``: after a done every stored slot of the row is emptied.
    The returned state keeps only the slots filled in some row, so across calls the memory is as long
    as the longest current episode of the batch (plus padding inside it), not the whole stream.
    """

    screened = False

    def init_state(self, batch_size: int, device=None, dtype=None) -> MemState:
        check_positive(batch_size, "batch_size")
        dtype = dtype or self.U.weight.dtype
        s, c = self._zeros_core(batch_size, device, dtype)
        empty = torch.zeros(batch_size, 0, self.hidden_size, device=device, dtype=dtype)
        no_slots = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        return MemState(s, c, empty, empty.clone(), no_slots,
                        torch.zeros(batch_size, dtype=torch.long, device=device))

    def check_state(self, state, batch: int) -> MemState:
        if not isinstance(state, MemState):
            raise TypeError(f"state must be a MemState (or None), got {type(state).__name__}")
        check_state_batch(state.s.shape[0], batch)
        return state

    def scan(self, x: Tensor, state: MemState, mask: Tensor | None, done: Tensor | None):
        """Every past state attended (``forward``: ``CausalCore``); ``done`` the episode ends before the
        call's last step."""
        batch, T = x.shape[:2]
        ends = self._ends(done)
        ux, w_rec = self._precompute(x)
        s, c, valid, steps = state.s, state.c, state.valid, state.steps
        mk = torch.cat([state.memory, state.keys], -1)  # [B, N, 2H]: stored states | their cached keys
        one = valid.new_ones(batch, 1)
        n0 = mk.shape[1]
        # Without autograd (inference), write into preallocated storage instead of concatenating: the
        # memory is still O(T), but no step copies it. With autograd, a new tensor per step (O(T^2)).
        inplace = not torch.is_grad_enabled()
        if inplace:
            store = torch.cat([mk, mk.new_zeros(batch, T, mk.shape[-1])], 1)
            store_valid = torch.cat([valid, valid.new_zeros(batch, T)], 1)
        outputs = []
        for t in range(T):
            h, c_new, query = self._core(ux[t], w_rec, s, c)
            m = None if mask is None else mask[:, t]
            hk = torch.cat([h, self.U_a(h)], -1)  # h_t and its key, computed once
            if inplace:
                store[:, n0 + t] = hk
                store_valid[:, n0 + t] = True if m is None else m
                mk, valid = store[:, : n0 + t + 1], store_valid[:, : n0 + t + 1]
            else:
                mk = torch.cat([mk, hk.unsqueeze(1)], 1)  # M_t = M_{t-1} + [h_t]
                valid = torch.cat([valid, one if m is None else m[:, None]], 1)
            read, _ = self._attend(query, mk, valid)
            s_new = h + read
            if m is None:
                s, c, steps = s_new, c_new, steps + 1
                outputs.append(s_new)
            else:  # padding: the slot stays invalid and the state unchanged
                s = torch.where(m[:, None], s_new, s)
                c = None if c is None else torch.where(m[:, None], c_new, c)
                steps = steps + m.long()
                outputs.append(s_new.masked_fill(~m[:, None], 0.0))
            if t in ends:  # the episode ended: forget every stored state of the row
                d = done[:, t]
                if inplace:  # clear the storage itself (mk and valid are views of it)
                    mk.masked_fill_(d[:, None, None], 0.0)
                    valid.masked_fill_(d[:, None], False)
                else:
                    mk, valid = clear_rows(mk, d), clear_rows(valid, d)
                s, steps = clear_rows(s, d), clear_rows(steps, d)
                c = None if c is None else clear_rows(c, d)
        memory, keys = mk.split(self.hidden_size, -1)
        return torch.stack(outputs, 1), MemState(s, c, memory, keys, valid, steps).compact()


class MemLSTM(MemRNN):
    """MemLSTM: LSTM gates read s_{t-1}; attention over every past state."""

    lstm = True


# ============================================================================================
# Registry builders: builder(dim, depth, num_heads, causal, **options) -> backbone (input_size = dim)
# ============================================================================================


def _builder(cls, screened: bool):
    def build(dim: int, depth: int = 1, num_heads: int = 1, causal: bool = True, *,
              hidden_size: int | None = None, **options):
        """``depth`` and ``num_heads`` are unused (one recurrent layer, one additive attention)."""
        if not screened:
            options.pop("buffer_size", None)
            options.pop("relevant_size", None)
        return cls(input_size=dim, hidden_size=hidden_size or dim, **options)

    build.__name__ = f"build_{cls.__name__}"
    return build


register_model("relevance-rnn")(_builder(RelevanceRNN, True))
register_model("relevance-lstm")(_builder(RelevanceLSTM, True))
register_model("mem-rnn")(_builder(MemRNN, False))
register_model("mem-lstm")(_builder(MemLSTM, False))

__all__ = ["MemLSTM", "MemRNN", "MemState", "ModReLU", "RelevanceLSTM", "RelevanceRNN", "RelevanceState"]
