#!/usr/bin/env bash
# The first command: installs what is missing, builds the optimised tree, runs the main job.
# Extra arguments are passed to the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
exec ./build/release/tools/spin eval "$@"
