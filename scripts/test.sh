#!/usr/bin/env bash
# The second command: every test, in two configurations — Release (what users run) and
# RelWithDebInfo + AddressSanitizer + UBSan — each through CTest — then the Python package
# (scripts/test-python.sh: a fresh virtualenv, `pip install .`, pytest; 1–3 minutes, most of it
# compiling the library once more as position-independent code for the module).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs="$(nproc)"
for preset in release asan; do
  echo "=== spin tests: ${preset} ==="
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j"${jobs}"
  ctest --preset "${preset}" -j"${jobs}"
done
echo "=== spin tests: python ==="
./scripts/test-python.sh
