"""One training step of RelevanceRNN vs an LSTM of the same width in the same Python time loop.

Both models: embedding of Copy tokens -> recurrence over T steps (a Python loop: ``nn.LSTMCell`` for
the LSTM, the RelevanceRNN's own loop) -> linear readout -> cross-entropy -> backward -> RMSprop step.
The two are timed side by side in one run (interleaved repeats, median) and the ratio is printed.

    OMP_NUM_THREADS=1 python benchmarks/relevance_step.py [--batch 64 --hidden 128 --seq 120 --repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from chronomem.relevance import MemRNN, RelevanceLSTM, RelevanceRNN
from chronomem.threads import Measured


class CellLSTM(nn.Module):
    """An LSTM driven step by step by a Python loop (``nn.LSTMCell``), like the RelevanceRNN."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden_size)
        c = h
        outputs = []
        for x_t in x.unbind(1):  # unbind, not x[:, t]: the latter's backward is O(T^2)
            h, c = self.cell(x_t, (h, c))
            outputs.append(h)
        return torch.stack(outputs, 1), (h, c)


class Net(nn.Module):
    def __init__(self, core: nn.Module, hidden: int, vocab: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.core = core
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        y, _ = self.core(self.embed(tokens))
        return self.out(y)


def time_step(net: nn.Module, opt, tokens, targets) -> float:
    start = time.perf_counter()
    logits = net(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return time.perf_counter() - start


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buffer", type=int, default=10)
    parser.add_argument("--relevant", type=int, default=15)
    parser.add_argument("--all", action="store_true", help="also time RelevanceLSTM and MemRNN")
    args = parser.parse_args()
    torch.manual_seed(0)
    H = args.hidden
    models = {
        "lstm-cell-loop": Net(CellLSTM(H, H), H),
        "relevance-rnn": Net(RelevanceRNN(H, H, buffer_size=args.buffer, relevant_size=args.relevant), H),
    }
    if args.all:
        lstm = RelevanceLSTM(H, H, buffer_size=args.buffer, relevant_size=args.relevant)
        models["relevance-lstm"] = Net(lstm, H)
        models["mem-rnn"] = Net(MemRNN(H, H), H)
    opts = {k: torch.optim.RMSprop(m.parameters(), lr=1e-3) for k, m in models.items()}
    tokens = torch.randint(0, 10, (args.batch, args.seq))
    targets = torch.randint(0, 10, (args.batch, args.seq))
    times: dict[str, list[float]] = {k: [] for k in models}
    measured = Measured(log=print).start()
    for k in models:  # warm-up
        time_step(models[k], opts[k], tokens, targets)
    for _ in range(args.repeats):  # interleaved, so machine load affects both alike
        for k in models:
            times[k].append(time_step(models[k], opts[k], tokens, targets))
    base = statistics.median(times["lstm-cell-loop"])
    print(f"training step, B={args.batch} H={H} T={args.seq} nu={args.buffer} rho={args.relevant}, "
          f"torch threads={torch.get_num_threads()}, median of {args.repeats}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:16s} {1000 * med:8.1f} ms   ratio to lstm-cell-loop {med / base:5.2f}x")
    measured.stop()


if __name__ == "__main__":
    main()
