#!/usr/bin/env bash
# Issue 30's table: spin's default (adapt=1 since 2026-12-06) against the paper's spin (--preset
# paper), prev-iter and step-reuse — and the fixed rule it replaced (`fixed`: --set adapt=0; `adapt`
# spells the default out) — closed loop at 30 % and 50 %
# sparsity, mean recall / p99 miss, one line per cell, each the `spin replay` it ran.
#   [RULES="adapt ..."] ./scripts/regime-table.sh [SCENARIO|TRACE.safetensors[@TOPK]|TRACE.st ...]
# Scenarios are generated once into build/regime-traces/ (`spin trace gen --scenario S`, the
# scenario's own steps; S:STEPS for fewer); a recorded trace is replayed at its own top-k, or at
# TOPK (`--topk`); a .st file is replayed as it is (e.g. `spin trace convert`'s score trace of a
# generated one: the same figures without scoring the keys at every replay). RULES: the columns to
# run (default: default paper prev-iter step-reuse fixed). Default items: the built-in scenarios of the table in docs/results.md.
set -euo pipefail
cd "$(dirname "$0")/.."
spin=build/release/tools/spin
out=build/regime-traces
mkdir -p "$out"
items=("$@")
if (( ${#items[@]} == 0 )); then
  items=(doc-qa-10k doc-qa-94k agentic needle-shift v4flash-10k v4flash-94k layers-68k)
fi
declare -A rule=([default]="--predictor spin" [paper]="--predictor spin --preset paper"
                 [prev-iter]="--predictor prev-iter" [step-reuse]="--predictor step-reuse"
                 [adapt]="--predictor spin --set adapt=1" [fixed]="--predictor spin --set adapt=0")
for item in "${items[@]}"; do
  topk=()
  if [[ "$item" == *.st ]]; then
    trace="$item"
  elif [[ "$item" == *.safetensors* ]]; then
    trace="${item%@*}"
    [[ "$item" == *@* ]] && topk=(--topk "${item##*@}")
  else
    scenario="${item%%:*}"
    steps=()
    [[ "$item" == *:* ]] && steps=(--steps "${item##*:}")
    trace="$out/$item.st"
    [[ -f "$trace" ]] || "$spin" trace gen --scenario "$scenario" "${steps[@]}" --out "$trace" >/dev/null
  fi
  for sparsity in 0.3 0.5; do
    for name in ${RULES:-default paper prev-iter step-reuse fixed}; do
      [[ -n "${rule[$name]:-}" ]] || { echo "regime-table: unknown rule '$name' in RULES (default paper prev-iter step-reuse adapt fixed)" >&2; exit 2; }
      # shellcheck disable=SC2086  # the rule is a list of flags
      read -r mean p99 < <("$spin" replay "$trace" ${rule[$name]} --sparsity "$sparsity" "${topk[@]}" 2>/dev/null |
                           jq -r '"\(.recall_mean) \(.miss_p99)"')
      printf '%s %s %-10s %.4f %.4f   # spin replay %s %s --sparsity %s %s\n' "$item" "$sparsity" "$name" \
        "$mean" "$p99" "$trace" "${rule[$name]}" "$sparsity" "${topk[*]}"
    done
  done
done
