"""The device of the contract and kernel tests: ``CHRONOMEM_TEST_DEVICE=cuda make test`` runs the
agent-contract checks (tests/contract.py) and the ``ops/`` kernels against their naive references on a
GPU; the default, ``cpu``, runs them as on any machine. Asking for a device this machine lacks stops the
run with a usage error rather than silently testing the CPU."""

from __future__ import annotations

import pytest
import torch

from helpers import TEST_DEVICE


def pytest_report_header(config):
    return f"chronomem test device: {TEST_DEVICE} (CHRONOMEM_TEST_DEVICE)"


def pytest_configure(config):
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"CHRONOMEM_TEST_DEVICE={TEST_DEVICE}: CUDA is not available on this machine")


@pytest.fixture
def device() -> torch.device:
    """The device the contract and kernel tests run on (``CHRONOMEM_TEST_DEVICE``, default cpu)."""
    return TEST_DEVICE
