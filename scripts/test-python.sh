#!/usr/bin/env bash
# The Python package's tests: a fresh virtualenv (build/python-test-venv, recreated every run), one
# `pip install ".[test]"` from the repository into it — the install test itself: scikit-build-core
# and nanobind come from PyPI through pip's build isolation, the library compiles from this CMake
# tree (build/python/, kept between runs, so a rerun recompiles only what changed) — then pytest
# over python/tests, then the boundary fuzzer (python/tests/fuzz_boundary.py: a seeded random search
# over every function's arguments, each case in a child process) for a fixed 75 s. Extra arguments
# go to pip (e.g. -C build-dir=/tmp/x for a cold build).
# The comparison with the `spin` command uses build/release/tools/spin when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv=build/python-test-venv
rm -rf "$venv"
mkdir -p build
"$python" -m venv "$venv"
start=$(date +%s)
"$venv/bin/pip" install --quiet --disable-pip-version-check ".[test]" "$@"
echo "spin: pip install . into a fresh virtualenv took $(($(date +%s) - start)) s"
export SPIN_BINARY="${SPIN_BINARY:-$PWD/build/release/tools/spin}"
# From the repository root pytest imports the installed spin_dsa (python/ is not on sys.path).
# Allowed to skip: the torch interop test (torch is not in this virtualenv); nothing else.
PYTHONPATH=scripts "$venv/bin/python" -m pytest -q -rs -p pytest_must_run \
  --must-run python/tests --may-skip python/tests/test_arrays.py::test_torch_tensors_without_copies \
  python/tests
# Fixed seed and time budget: the same cases every run on a given machine speed; a finding prints its
# replay command (python python/tests/fuzz_boundary.py --seed 1 --case N -v) and fails the script.
"$venv/bin/python" python/tests/fuzz_boundary.py --seconds 75 --seed 1
