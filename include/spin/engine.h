// spin/engine.h — batched DSA decode steps over paged caches, with a block predictor in the loop.
//
// One DecodeEngine serves many concurrent requests (continuous batching: requests are added and
// retired between steps). Each step, for every indexer layer and every request:
//   predictor.select → block-masked indexer (only the selected blocks are scored) → top-k →
//   sparse MLA attention over the top-k (+ the V4 window) → predictor.observe,
// then predictor.commit(accepted) per request once all layers ran (MTP: next_n rows verified,
// acceptance drawn from a synthetic process with a fixed seed). Every stage is timed.
//
// Scope: the attention path only. Keys, latents and queries are random with a fixed seed (the
// engine measures speed; quality is spin eval's job); MoE, MLP and projections are outside it and
// enter only the whole-model projection of `spin bench decode`. Pages come from one allocator
// shared by all requests and layers (as vLLM's single block table); exhausting it is a clear error,
// never an overwrite. Before allocating anything the engine computes what it needs and refuses
// when it exceeds the memory limit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spin/attention.h"
#include "spin/indexer.h"
#include "spin/predict.h"
#include "spin/status.h"
#include "spin/topk.h"

namespace spin {

struct ModelPreset {
  std::string name;
  int32_t model_layers = 0;     // decoder layers of the model
  int32_t indexer_layers = 0;   // layers with a lightning indexer
  int32_t index_heads = 64;     // indexer heads × 128 dims
  int32_t topk = 2048;
  int32_t page_size = kDefaultPageSize;       // indexer entries per page
  int32_t compress_ratio = 1;   // tokens per indexer entry (V4 CSA: 4)
  int32_t attn_heads = 128;     // MLA query heads
  int32_t window = 0;           // V4 sliding-window entries attended besides the top-k
};
// deepseek-v3.2 (61 of 61 layers, top-k 2048, 128 heads), deepseek-v4-flash (21 of 43, ratio 4,
// top-k 512, 64 heads, window 128), deepseek-v4-pro (30 of 61, ratio 4, top-k 1024, 128 heads,
// window 128).
Result<ModelPreset> model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();

// The kernels' own options, one struct per kernel family, as the engine passes them to every call
// of a step (their num_threads are replaced by EngineConfig::threads). Printed with results.
struct EngineKernels {
  IndexerOptions indexer;
  TopkOptions topk;
  AttentionOptions attention;

  // The scalar reference indexer, top-k and attention (ground truth for tests).
  static EngineKernels reference();
  // "indexer=auto(avx512bf16) topk=auto attention=auto(avx512bf16) heads_per_task=0 bf16_probabilities=1".
  std::string to_string() const;
};

struct EngineConfig {
  ModelPreset model;
  int32_t layers = 4;              // indexer layers simulated (≤ model.indexer_layers)
  int32_t next_n = 1;              // rows per request per step (MTP: 2..4)
  double acceptance_rate = 0.7;    // MTP: each draft token accepted with this probability
  std::string predictor = "all-keep";
  PredictorConfig predictor_config;  // page_size and topk are taken from the model
  LatentDtype latent_dtype = LatentDtype::kFp8;
  int64_t pool_pages = 0;          // pages in the shared allocator (0: sized by reserve())
  int threads = 0;
  uint64_t seed = 1;
  bool measure_attn_err = false;   // also run all-keep (untimed) each step and compare outputs
  EngineKernels kernels;           // which implementation of each kernel, and its switches
};

struct StepStats {
  int64_t tokens = 0;          // tokens emitted (accepted + 1 per request)
  int64_t rows = 0;            // query rows processed
  // Stage times of the attention path; total_ms is their sum (what a serving engine would spend).
  // cache_ms is the simulation's own work (random keys, latents and queries), wall_ms everything.
  double indexer_ms = 0, topk_ms = 0, attention_ms = 0, predictor_ms = 0, total_ms = 0;
  double cache_ms = 0, wall_ms = 0;
  int64_t scored_entries = 0, visible_entries = 0;  // summed over layers and rows
  double attn_err_sum = 0;     // Σ ‖o − o_all_keep‖ / ‖o_all_keep‖ over rows (measure_attn_err)
  int64_t attn_err_rows = 0;
};

// Bytes the engine needs for `requests` requests of up to `max_tokens` tokens each.
int64_t engine_memory_bytes(const EngineConfig& config, int32_t requests, int64_t max_tokens);

class DecodeEngine {
 public:
  // Validates the config; fails with kResourceExhausted when `requests` × `max_tokens` do not fit
  // in `memory_limit_bytes` (0 = 80 % of physical memory).
  static Result<std::unique_ptr<DecodeEngine>> create(const EngineConfig& config, int32_t requests,
                                                      int64_t max_tokens, int64_t memory_limit_bytes = 0);
  ~DecodeEngine();

  // Admits a request with a prompt of `prompt_tokens` tokens (its cache is filled with random
  // keys and latents drawn from the seed and the request id). Fails when the pool is exhausted.
  Status add_request(int64_t request_id, int64_t prompt_tokens);
  // Retires a request, returning its pages to the pool.
  Status retire(int64_t request_id);
  // One decode step of every active request through every layer.
  Status step(StepStats* stats);

  int32_t active_requests() const;
  int64_t tokens(int64_t request_id) const;  // -1 if unknown
  int32_t free_pages() const;
  const EngineConfig& config() const;
  // The attention output of the last step, [rows of the request, heads, 512], for tests.
  const std::vector<float>* last_output(int64_t request_id, int32_t layer) const;

 private:
  struct Impl;
  explicit DecodeEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spin
