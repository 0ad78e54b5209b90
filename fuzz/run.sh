#!/usr/bin/env bash
# Builds the trace-reader fuzzer (clang, libFuzzer + ASan + UBSan) in build/fuzz, writes a seed
# corpus of small valid traces, and fuzzes for the given number of seconds (default 20), starting
# from those seeds and from fuzz/regressions (inputs that once failed: each must stay fixed).
#   fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
# New interesting inputs accumulate in build/fuzz/corpus; a crash leaves build/fuzz/crash-* and
# a non-zero exit. Needs clang++ and libclang-rt-dev (Debian: clang, libclang-rt-14-dev).
set -euo pipefail
seconds=${1:-20}
shift || true
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build/fuzz
cxx=${SPIN_FUZZ_CXX:-clang++}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

cmake -S "$root/fuzz" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2
mkdir -p "$build/seeds" "$build/corpus"
"$build/make_seeds" "$build/seeds"
cd "$build"  # crash-*/leak-* artifacts land here
exec "$build/trace_reader_fuzz" -max_total_time="$seconds" -dict="$root/fuzz/trace.dict" \
  -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$@" \
  "$build/corpus" "$build/seeds" "$root/fuzz/regressions"
