// Benchmark plumbing shared by every `spin bench` subcommand: timing, machine peak, records.
//
// Conventions: warm up, repeat until a minimum time and run count, report the median
// in µs with GFLOP/s, GB/s and the fraction of the machine peak measured in the same process; each
// JSON record carries the commit, machine and shape.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "spin/status.h"

namespace spin::bench {

struct Timing {
  double median_us = 0;
  double min_us = 0;
  int runs = 0;
};

// Runs `fn` once to warm up, then until `min_seconds` have passed and at least `min_runs` runs.
Timing time_it(const std::function<void()>& fn, double min_seconds, int min_runs = 3);

struct MachinePeak {
  std::string instruction;  // "avx512-bf16 vdpbf16ps" or "fp32 fma"
  double gflops = 0;        // over `threads` threads
  int threads = 0;
};
// Peak of the fastest dot-product instruction this CPU offers for the indexer math, measured now
// with register-only loops on `threads` threads: the best of bf16 dot (vdpbf16ps, where present)
// and fp32 FMA at its widest (zmm where AVX-512F is present, else ymm). On Sapphire Rapids the
// zmm FMA peak can match or beat vdpbf16ps, so both are measured rather than assumed.
MachinePeak measure_peak(int threads);
// Peak of the one instruction kernel path `path` (an impl name: avx512bf16, avx512f, avx2, neon)
// is built on, measured as measure_peak does: a forced path is stated against its own ISA as well
// as against the machine (forced avx2 on an AVX-512 machine ≈ what an AVX2-only core of the same
// clock would reach). gflops = 0 for paths without one (portable, reference).
MachinePeak measure_path_peak(const std::string& path, int threads);
// "peak: …" lines of a kernel bench's header: the machine peak, and the path's own when it has one.
void print_peaks(const MachinePeak& machine, const MachinePeak& own);
// A peak column ("peak", "own"): percent of that peak, or "-" when there is none.
std::string own_peak_cell(double gflops, const MachinePeak& own);

// Fields every record carries: commit, cpu model, the kernel ISAs it may use (SPIN_CPU), threads.
nlohmann::json machine_json(int threads);

// Writes `records` (a JSON array) atomically to `path` unless it is empty; the exit code.
int finish_records(const std::string& path, const nlohmann::json& records);

struct IndexerBenchOptions {
  std::vector<int64_t> contexts = {8192, 32768, 131072, 524288};
  std::vector<int> rows = {1, 2};
  std::vector<double> sparsities = {0.0, 0.3, 0.5};
  std::string impl = "auto";
  int threads = 0;
  double min_seconds = 0.5;
  std::string json_path;
};
int run_indexer_bench(const IndexerBenchOptions& options);

struct TopkBenchOptions {
  std::vector<int64_t> contexts = {8192, 32768, 131072, 524288};
  int topk = 2048;
  int threads = 1;
  double min_seconds = 0.3;
  double sparsity = 0.0;  // > 0: also time a block-masked row, full-row vs scored entries only
  std::string json_path;
};
int run_topk_bench(const TopkBenchOptions& options);

struct PredictorBenchOptions {
  std::vector<int64_t> contexts = {8192, 32768, 131072, 524288};
  std::string predictor = "spin";
  double sparsity = 0.5;
  int steps = 200;
  int threads = 0;
  double min_seconds = 0.3;
  std::string json_path;
  std::vector<std::string> settings;  // predictor config overrides, key=value (after target_sparsity)
};
int run_predictor_bench(const PredictorBenchOptions& options);

struct AttentionBenchOptions {
  std::vector<int32_t> rows = {1, 8};  // rows (each its own request and entries)
  int32_t heads = 128;
  int32_t topk = 2048;
  std::string latent = "fp8";
  std::string impl = "auto";
  std::string probabilities = "bf16";  // AttentionOptions::bf16_probabilities
  int threads = 0;
  double min_seconds = 0.5;
  std::string json_path;
};
int run_attention_bench(const AttentionBenchOptions& options);

struct QuantBenchOptions {
  int64_t entries = 65536;  // 128-dim vectors per timed pass
  double min_seconds = 0.5;
  std::string json_path;
};
int run_quant_bench(const QuantBenchOptions& options);

struct DecodeBenchOptions {
  std::string model = "deepseek-v3.2";
  std::vector<int64_t> contexts = {32768, 131072};  // indexer entries per request
  int32_t batch = 8;
  int32_t layers = 2;
  int steps = 12;
  int warmup = 2;
  std::vector<double> sparsities = {0.3, 0.4, 0.5};
  std::string predictor = "spin";
  int32_t next_n = 1;
  double acceptance_rate = 0.7;
  std::string latent = "fp8";
  std::string indexer_impl = "auto";    // any name of indexer_impls(): forces the indexer path
  std::string attention_impl = "auto";  // any name of attention_impls(): forces the attention path
  bool attn_err = true;
  // Where the indexer's keys, queries and acceptance come from: "random", a scenario of
  // spin/lab/workload.h (generated for these layers and steps), or a key trace file.
  std::string source = "random";
  double path_share = 0.5;
  int threads = 0;
  uint64_t seed = 1;
  std::string json_path;
};
int run_decode_bench(const DecodeBenchOptions& options);
// The step-latency tail of all-keep and of options.predictor at `sparsity` on the first of
// options.contexts (the same paired, interleaved run as the bench): p50 and p99 over requests and
// steps, nearest rank.
struct DecodeTail {
  double all_keep_p50_ms = 0, all_keep_p99_ms = 0, predictor_p50_ms = 0, predictor_p99_ms = 0;
};
Result<DecodeTail> measure_decode_tail(const DecodeBenchOptions& options, double sparsity);

// Median time of the full (all-keep) indexer at the V3.2 shape, rows 1 — the denominator of
// every overhead ratio.
double time_full_indexer_us(int64_t context, int threads, double min_seconds);

}  // namespace spin::bench
