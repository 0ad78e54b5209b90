import os
import pathlib
import shutil

import numpy as np
import pytest

import spin_dsa

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def small_trace_path(tmp_path_factory):
    """A small generated trace (doc-qa-10k dynamics, 3K prompt, 10 steps, 2 layers) on disk."""
    trace = spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=3000, steps=10, layers=2, seed=3)
    path = tmp_path_factory.mktemp("traces") / "small.safetensors"
    trace.write(str(path))
    return str(path)


def spin_binary():
    """The `spin` command, for comparisons with the CLI: $SPIN_BINARY or build/release/tools/spin."""
    env = os.environ.get("SPIN_BINARY")
    if env and os.path.exists(env):
        return env
    built = REPO / "build" / "release" / "tools" / "spin"
    if built.exists():
        return str(built)
    return shutil.which("spin-cli")
