"""The device-path tests (spin_dsa.device): the on-device predictor, compacted paging, the Triton
paged-logits kernel, and the GPU benchmark's CPU smoke run (scripts/test-integration.sh, section
`device`). They need torch; the Triton tests need triton too and skip alone without it.

Without a CUDA device the Triton kernels run on the CPU under Triton's interpreter: the flag must
be in the environment before triton is first imported, so it is set here, before any test module
loads (pytest imports conftest.py first).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/host_sync.py

torch = pytest.importorskip("torch", reason="the device-path tests need torch")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_report_header(config):
    mode = "CUDA " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else \
        f"CPU, TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}"
    return f"spin device tests: torch {torch.__version__}, {mode}"
