#!/usr/bin/env bash
# The integration tests, after ./scripts/test.sh (CI runs both: .ci/run). One function per
# section, each self-contained, so sections from different branches merge as separate blocks.
set -euo pipefail
cd "$(dirname "$0")/.."

# aarch64: the whole C++ suite cross-compiled for 64-bit Arm (cmake/aarch64-linux-gnu.cmake: the
# NEON kernels, and every portable path built by another compiler for another ISA) and run under
# qemu-user through CTest. Every target is built; the fuzz target is off in this preset (it needs
# clang + libFuzzer for the host). Correctness only: qemu timings mean nothing.
# Measured on the shared 2-core dev VM: ~5.5 min to build from clean, ~9–14 min to test (141 tests).
aarch64() {
  echo "=== spin tests: aarch64 (cross-compiled, run under qemu-user) ==="
  local jobs start
  jobs="$(nproc)"
  start=$SECONDS
  cmake --preset aarch64 >/dev/null
  cmake --build --preset aarch64 -j"${jobs}"
  echo "aarch64: built in $((SECONDS - start)) s"
  ctest --preset aarch64 -j"${jobs}"  # its last lines are the summary CI reads (and the time)
}

./scripts/install-deps.sh
aarch64
