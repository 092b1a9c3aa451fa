"""benchmarks/htm_read_impl.py at a tiny width: its replays build the agents' cores, every read gives
the same outputs, and it reports the choice ``read_impl="auto"`` made. No timing is asserted."""

import pytest
import torch

from helpers import load_benchmark

bench = load_benchmark("htm_read_impl")


@pytest.mark.parametrize("label, batch, steps, options", bench.REPLAYS)
def test_every_read_of_a_replay_gives_the_same_outputs(label, batch, steps, options):
    calls = {impl: bench.replay_call(impl, batch, steps, options, dim=16) for impl in bench.IMPLS}
    outputs = {impl: call() for impl, call in calls.items()}
    for impl in bench.IMPLS:
        torch.testing.assert_close(outputs[impl], outputs["gather"], atol=1e-5, rtol=1e-4)
    took, fill = bench.first_read(calls["auto"])
    assert took in ("grouped", "gather") and 0 < fill <= 1
