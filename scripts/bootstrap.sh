#!/usr/bin/env bash
# The first command: installs what is missing, builds the optimised tree, runs the main job,
# then records the default real-model traces. Extra arguments are passed to the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
./build/release/tools/spin eval "$@"
# Real-model score traces (recorder/README.md): cached by content, instant after the first run.
./scripts/record-real-traces.sh
