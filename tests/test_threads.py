"""``chronomem.threads``: the conditions a measurement records, and the flag for a busy machine.

The load average is monkeypatched: the tests must not depend on what else this machine is running.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chronomem import threads


@pytest.fixture
def two_cores(monkeypatch):
    """Two available cores, no OpenMP settings in the environment, and a load set by the test."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    load = {"now": 0.4}
    monkeypatch.setattr(os, "getloadavg", lambda: (load["now"], 0.0, 0.0), raising=False)
    return load


def test_conditions_keys_and_types(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    c = threads.conditions()
    assert set(c) == {"torch_threads", "cores", "omp_num_threads", "omp_wait_policy", "load_average"}
    import torch

    assert c["torch_threads"] == torch.get_num_threads() and isinstance(c["torch_threads"], int)
    assert c["cores"] == threads.available_cores() >= 1
    assert c["omp_num_threads"] == "1" and c["omp_wait_policy"] == "PASSIVE"
    assert c["load_average"] is None or (isinstance(c["load_average"], float) and c["load_average"] >= 0)
    assert threads.conditions(3)["torch_threads"] == 3  # workers that set their own
    assert threads.conditions([2, 1])["torch_threads"] == [2, 1]


def test_conditions_without_a_load_average_or_omp_settings(two_cores, monkeypatch):
    def unavailable():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    c = threads.conditions(1)
    assert c["load_average"] is None and c["omp_num_threads"] is None and c["omp_wait_policy"] is None
    with threads.Measured(1) as measured:
        pass
    assert measured.busy is False  # unknown is not busy
    assert measured.summary() == (
        "1 torch thread, OMP_NUM_THREADS unset, OMP_WAIT_POLICY unset, load unknown -> unknown on 2 cores"
    )


def test_an_idle_measurement_is_not_busy(two_cores):
    lines = []
    with threads.Measured(1, log=lines.append) as measured:
        two_cores["now"] = 1.1  # the measuring process itself raises the load, within the cores
    record = measured.record()
    assert record["busy"] is False and measured.busy is False
    assert record["before"]["load_average"] == 0.4 and record["after"]["load_average"] == 1.1
    assert lines == [
        "conditions before: 1 torch thread, OMP_NUM_THREADS unset, OMP_WAIT_POLICY unset, load 0.4 on 2 cores",
        "conditions: 1 torch thread, OMP_NUM_THREADS unset, OMP_WAIT_POLICY unset, load 0.4 -> 1.1 on 2 cores",
    ]


@pytest.mark.parametrize("before, after", [(3.1, 0.5), (0.5, 3.1), (2.5, 3.1)])
def test_a_load_above_the_cores_at_either_end_is_busy(two_cores, before, after):
    two_cores["now"] = before
    measured = threads.Measured(2).start()
    two_cores["now"] = after
    measured.stop()
    assert measured.busy is True and measured.record()["busy"] is True
    assert measured.summary().endswith(
        "; MEASURED ON A BUSY MACHINE (load 3.1 > 2 cores): the timings include contention"
    )
    assert measured.summary().startswith("2 torch threads, ")


def test_a_load_equal_to_the_cores_is_not_busy(two_cores):
    two_cores["now"] = 2.0
    assert threads.Measured(1).start().stop().busy is False


def test_summary_of_several_thread_settings_and_the_environment(two_cores, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    summary = threads.Measured([1, 2]).start().stop().summary()
    assert summary == ("torch threads 1, 2 (one setting each), OMP_NUM_THREADS=2, OMP_WAIT_POLICY=PASSIVE, "
                       "load 0.4 -> 0.4 on 2 cores")


def test_record_before_start_is_an_error():
    measured = threads.Measured(1)
    with pytest.raises(ValueError, match="before start"):
        measured.record()
    with pytest.raises(ValueError, match="before start"):
        measured.stop()


def test_no_torch_import_when_the_threads_are_given():
    """The command line and the benchmarks' parents read the conditions without loading torch."""
    code = "import sys, chronomem.threads as t; t.Measured(1).start().stop(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_threads_set_to_restores_the_count_after_the_block_even_on_an_error():
    import torch

    from chronomem.threads import threads_set_to

    before = torch.get_num_threads()
    inner = 2 if before == 1 else 1
    with threads_set_to(inner) as got:
        assert got == inner and torch.get_num_threads() == inner
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"), threads_set_to(inner):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="--torch-threads"), threads_set_to(0, "--torch-threads"):
        pass
    assert torch.get_num_threads() == before
