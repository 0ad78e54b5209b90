// Benchmark plumbing: timing loop, machine peak, machine description, atomic JSON output.
#include "bench_common.h"

#include "spin/cpu.h"
#include "spin/files.h"
#include "spin/indexer.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "spin_git_commit.h"  // generated at build time (tools/CMakeLists.txt)

namespace spin::bench {

Timing time_it(const std::function<void()>& fn, double min_seconds, int min_runs) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up: page faults, caches, thread pool start
  std::vector<double> samples;
  const auto start = clock::now();
  while (static_cast<int>(samples.size()) < min_runs ||
         std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto t0 = clock::now();
    fn();
    samples.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), static_cast<int>(samples.size())};
}

namespace {

#if defined(__x86_64__)
// 16 independent accumulators hide the dot-product latency; nothing touches memory.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_loop(int64_t iterations) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3F80));  // bf16 1.0
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3400));  // tiny: no overflow
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
  }
  __m512 sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = _mm512_add_ps(sum, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return out[0];
}

__attribute__((target("avx2,fma"))) double fma_loop(int64_t iterations) {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(x, y, acc[j]);
  }
  __m256 sum = acc[0];
  for (int j = 1; j < 12; ++j) sum = _mm256_add_ps(sum, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, sum);
  return out[0];
}

__attribute__((target("avx512f"))) double fma512_loop(int64_t iterations) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
  }
  __m512 sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = _mm512_add_ps(sum, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return out[0];
}

#endif  // __x86_64__

#if defined(__aarch64__)
__attribute__((noinline)) double neon_fma_loop(int64_t iterations) {
  float32x4_t acc[16];
  for (auto& a : acc) a = vdupq_n_f32(0.0f);
  const float32x4_t x = vdupq_n_f32(1.0f), y = vdupq_n_f32(1e-7f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = vfmaq_f32(acc[j], x, y);
  }
  float32x4_t sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = vaddq_f32(sum, acc[j]);
  return vgetq_lane_f32(sum, 0);
}

// BFDOT (FEAT_BF16), the neon_bf16 indexer's instruction: 4 lanes × 2 products, summed, per op.
#if defined(__clang__)
__attribute__((noinline, target("bf16")))
#else
__attribute__((noinline, target("arch=armv8.2-a+bf16")))  // arm_neon.h's target for bf16
#endif
double neon_bf16_dot_loop(int64_t iterations) {
  float32x4_t acc[16];
  for (auto& a : acc) a = vdupq_n_f32(0.0f);
  // Read through volatile: GCC 12 would materialise the bf16 constants with an fp16 FMOV, which
  // the v8.2-a + bf16 target lacks (the assembler refuses it).
  volatile uint16_t one = 0x3F80, tiny = 0x3400;  // 1.0, ~1.2e-7
  const bfloat16x8_t x = vreinterpretq_bf16_u16(vdupq_n_u16(one));
  const bfloat16x8_t y = vreinterpretq_bf16_u16(vdupq_n_u16(tiny));
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = vbfdotq_f32(acc[j], x, y);
  }
  float32x4_t sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = vaddq_f32(sum, acc[j]);
  return vgetq_lane_f32(sum, 0);
}
#endif  // __aarch64__

struct PeakLoop {
  const char* instruction;
  const char* path;  // the kernel path (impl name) whose inner loop is this instruction
  double flop_per_iteration;  // vdpbf16ps zmm = 32 pairs × 2 products, summed: 64; fma zmm 32, ymm 16, q 8
  double (*loop)(int64_t);
};
constexpr PeakLoop kPeakLoops[] = {
#if defined(__x86_64__)
    {"avx512-bf16 vdpbf16ps (zmm)", "avx512bf16", 16 * 64.0, bf16_dot_loop},
    {"fp32 fma (zmm)", "avx512f", 16 * 32.0, fma512_loop},
    {"fp32 fma (ymm)", "avx2", 12 * 16.0, fma_loop},
#endif
#if defined(__aarch64__)
    {"bf16 bfdot (neon q)", "neon_bf16", 16 * 16.0, neon_bf16_dot_loop},
    {"fp32 fmla (neon q)", "neon", 16 * 8.0, neon_fma_loop},
#endif
};

// Whether this process may run `path`'s instruction: the kernel front ends' own answer, so the
// SPIN_CPU cap (spin/cpu.h) holds here too and a capped bench states the smaller machine's peak.
bool cpu_supports(const char* path) {
  for (IndexerImpl impl : indexer_impls()) {
    if (std::string(path) == indexer_impl_name(impl)) return indexer_impl_supported(impl);
  }
  return false;
}

double seconds_of(const PeakLoop& l, int64_t iterations, int threads, std::vector<double>& sink) {
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  sink[omp_get_thread_num()] = l.loop(iterations);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure_loop(const PeakLoop& l, int threads) {
  // ~0.1 s per attempt; the best of five rides out a busy neighbour (peaks are maxima). The
  // iteration count is sized by a doubling probe (≥ 20 ms) rather than fixed, so the same 0.5 s
  // holds on a slow core or under an emulator (qemu-user runs the tests of the aarch64 build).
  std::vector<double> sink(static_cast<size_t>(threads));  // keeps the loops' results alive
  int64_t iterations = 1 << 12;
  double probe = 0;
  while ((probe = seconds_of(l, iterations, threads, sink)) < 0.02 && iterations < (int64_t{1} << 40)) iterations *= 2;
  iterations = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iterations) * 0.1 / std::max(probe, 1e-9)));
  double best = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const double seconds = seconds_of(l, iterations, threads, sink);
    best = std::max(best, l.flop_per_iteration * static_cast<double>(iterations) * threads / seconds / 1e9);
  }
  if (sink[0] == 12345.0) std::fputs("", stderr);  // an observable use of the results
  return best;
}

}  // namespace

MachinePeak measure_peak(int threads) {
  MachinePeak peak{"none (no FMA or bf16 dot)", 0, threads};
  for (const PeakLoop& l : kPeakLoops) {
    if (!cpu_supports(l.path)) continue;
    const double gflops = measure_loop(l, threads);
    if (gflops > peak.gflops) peak = {l.instruction, gflops, threads};
  }
  return peak;
}

MachinePeak measure_path_peak(const std::string& path, int threads) {
  for (const PeakLoop& l : kPeakLoops) {
    if (path == l.path && cpu_supports(l.path)) return {l.instruction, measure_loop(l, threads), threads};
  }
  return {"none (no instruction of its own)", 0, threads};
}

void print_peaks(const MachinePeak& machine, const MachinePeak& own) {
  std::printf("peak: %.1f GFLOP/s (%s, measured now on %d threads)\n", machine.gflops, machine.instruction.c_str(),
              machine.threads);
  if (own.gflops > 0) {
    std::printf("this path's peak: %.1f GFLOP/s (%s; column \"own\")\n", own.gflops, own.instruction.c_str());
  }
  std::printf("\n");
}

std::string own_peak_cell(double gflops, const MachinePeak& own) {
  char cell[32];
  if (own.gflops > 0) {
    std::snprintf(cell, sizeof(cell), "%5.1f%%", 100 * gflops / own.gflops);
  } else {
    std::snprintf(cell, sizeof(cell), "%6s", "-");
  }
  return cell;
}

nlohmann::json machine_json(int threads) {
  return {{"commit", SPIN_GIT_COMMIT}, {"cpu", cpu_model_name()}, {"kernels", cpu_summary()},
          {"spin_cpu", cpu_cap_name()}, {"threads", threads}, {"hardware_threads", omp_get_num_procs()}};
}

int finish_records(const std::string& path, const nlohmann::json& records) {
  if (path.empty()) return 0;
  const Status status = write_file_atomic(path, records.dump(2) + "\n");
  if (!status.ok()) {
    std::fprintf(stderr, "spin: error: %s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("\nwrote %zu records to %s\n", records.size(), path.c_str());
  return 0;
}

}  // namespace spin::bench
