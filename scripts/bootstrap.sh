#!/usr/bin/env bash
# The first command: installs what is missing for the main job (install-deps.sh main: not the
# fuzzer's clang nor the cross toolchain, which the test commands install), builds the `spin`
# command only (the test binaries belong to ./scripts/test.sh), records the real-model score
# traces (cached by content: instant after the first run; recorder/README.md), then runs the main
# job with them in its real-model section. Extra arguments go to `spin eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh main
cmake --preset release >/dev/null
cmake --build --preset release --target spin -j"$(nproc)"
# The score traces only: the main job reads them; the distilled indexer's key traces (minutes of
# training on 2 cores) are ./scripts/record-real-traces.sh's default, for who replays them.
./scripts/record-real-traces.sh --no-keys
real=build/real-traces
./build/release/tools/spin eval --real "$real/smollm2-ctx8192-n1.safetensors" \
  --real "$real/smollm2-ctx8192-n2.safetensors" "$@"
