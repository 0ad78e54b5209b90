#!/usr/bin/env bash
# Every predictor on the retrieval scenarios (niah-mk-128k, mrcr-*; plain and -mtp): one
# `spin trace gen` and one `spin replay` per (predictor, sparsity), and the asked target's share of
# each closed-loop top-k (scripts/target-recall.py). One TSV row per replay on stdout:
#   scenario predictor target_sparsity recall_mean miss_p99 sparsity_mean topk_block_share
#   target_in_topk topk_in_target
# and per scenario one "facts" row: the open-loop prev-iter top-k recall and block Pearson (the
# all-keep churn statistics the calibration targets).
# Usage: scripts/measure-targets.sh [-s SPIN] [-d WORKDIR] SCENARIO...   (seed 1)
# SPARSITIES (default "0.3 0.5") and PREDICTORS (default: the eight below) override the grid.
set -euo pipefail
spin=build/release/tools/spin
work=${TMPDIR:-/tmp}/spin-targets
while getopts "s:d:" opt; do
  case $opt in s) spin=$OPTARG ;; d) work=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
predictors=${PREDICTORS:-all-keep oracle spin prev-iter step-reuse hisa indexcache-2 random}
for scenario in "$@"; do
  trace=$work/$scenario.st
  "$spin" trace gen --scenario "$scenario" --out "$trace" > /dev/null
  "$spin" replay "$trace" --predictor prev-iter --open-loop --json "$work/$scenario.open.json" > /dev/null 2>&1
  python3 - "$work/$scenario.open.json" "$scenario" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\tfacts\tprev_iter_topk_recall={d['topk_recall_mean']:.4f}\t"
      f"prev_iter_block_pearson={d['pearson_mean']:.4f}\ttopk_block_share={d['topk_block_share']:.4f}")
PY
  for sparsity in ${SPARSITIES:-0.3 0.5}; do
    for p in $predictors; do
      base=$work/$scenario.$p.$sparsity
      "$spin" replay "$trace" --predictor "$p" --sparsity "$sparsity" --json "$base.json" \
        --dump-topk "$base.topk" > /dev/null 2>&1
      metrics=$(python3 - "$base.json" "$sparsity" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def f(key):
    v = d.get(key)
    return "nan" if v is None else f"{v:.4f}"
print("\t".join([d["predictor"], sys.argv[2], f("recall_mean"), f("miss_p99"), f("sparsity_mean"),
                 f("topk_block_share")]))
PY
)
      target=$(python3 "$here/target-recall.py" "$trace" "$base.topk" | cut -f2,3 | sed 's/[a-z_]*=//g')
      printf '%s\t%s\t%s\n' "$scenario" "$metrics" "$target"
      rm -f "$base.topk"
    done
  done
done
