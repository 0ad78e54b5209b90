#!/usr/bin/env bash
# The first command: installs what is missing, builds the optimised tree, records the default
# real-model traces (cached by content: instant after the first run; recorder/README.md), then
# runs the main job with them in its real-model section. Extra arguments go to `spin eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
./scripts/record-real-traces.sh
real=build/real-traces
./build/release/tools/spin eval --real "$real/smollm2-ctx8192-n1.safetensors" \
  --real "$real/smollm2-ctx8192-n2.safetensors" "$@"
