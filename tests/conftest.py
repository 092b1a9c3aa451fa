"""The device of the contract and kernel tests: ``CHRONOMEM_TEST_DEVICE=cuda make test`` runs the
agent-contract checks (tests/contract.py) and the ``ops/`` kernels against their naive references on a
GPU; the default, ``cpu``, runs them as on any machine. Asking for a device this machine lacks stops the
run with a usage error rather than silently testing the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import TEST_DEVICE


def pytest_report_header(config):
    return f"chronomem test device: {TEST_DEVICE} (CHRONOMEM_TEST_DEVICE)"


def pytest_configure(config):
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"CHRONOMEM_TEST_DEVICE={TEST_DEVICE}: CUDA is not available on this machine")
    share_the_cores()


def share_the_cores() -> None:
    """Under ``pytest -n N`` (pyproject's ``-n auto``) each worker gets its share of the cores as torch
    threads, and so do the processes it starts (``OMP_NUM_THREADS``, unless set): N workers at torch's
    default of every core would oversubscribe them, which on 2 cores slows each run 10-50x."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:  # not a worker: torch's defaults
        return
    from chronomem.threads import available_cores

    threads = max(1, available_cores() // int(workers))
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


@pytest.fixture
def device() -> torch.device:
    """The device the contract and kernel tests run on (``CHRONOMEM_TEST_DEVICE``, default cpu)."""
    return TEST_DEVICE
