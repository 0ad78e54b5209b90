// spin/diagnose.h — "will spin help me?": a per-decode-step cost model of DSA's attention path on a
// GPU, before anyone installs anything (`spin diagnose`).
//
// For a model preset (spin/engine.h), a context, a batch, next_n and a GPU preset, it estimates per
// indexer layer the lightning indexer, the top-k and the sparse MLA attention, their sum over the
// indexer layers (the attention path of one decode step), the indexer's share of it, and the
// path's speedup when spin skips a fraction s of the indexer's blocks — with the top-k reading only
// the scored entries (as spin's CPU top-k does) and with it reading the full -inf-padded row (what
// skipping buys with today's GPU top-k kernels). MoE, MLP and projections are outside the path.
//
// The model, each term with the published figure it rests on (GpuPreset holds them, with sources):
//   indexer   floor + max(key bytes / effective bandwidth, FLOPs / effective FP8 rate); key bytes =
//             batch · entries · (1 − s) · 132 (fp8 key + fp32 scale), shared by a request's next_n
//             rows (MQA); FLOPs = 2 · heads · 128 · entries · (1 − s) · rows. The floor and the
//             effective bandwidth are fitted to DeepGEMM's paged-logits kernel on an H200 (11 µs at
//             batch 1 and 149 µs at batch 64, 64K entries); other GPUs scale the bandwidth by their
//             HBM spec at the same efficiency.
//   top-k     floor + entries read · time per entry, one row per SM at a time (rows beyond the SM
//             count queue): fitted to the published kernel time of the preset.
//   attention floor + max(FLOPs / sparse-MLA rate, bytes / effective bandwidth) over the top-k (+ the
//             V4 window): FlashMLA's sparse decode rate (fp8 cache, bf16 matmul), unchanged by s.
//   predictor spin's own select + observe: 1.4 % of the full indexer, its measured CPU share
//             (`spin bench predictor`); no CUDA predictor exists yet, so this is the one CPU figure.
// A model, not a measurement: where a GPU is lent, `spin bench` figures replace it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spin/engine.h"
#include "spin/status.h"

namespace spin {

struct GpuPreset {
  std::string name;
  double hbm_tb_s = 0;             // HBM bandwidth, spec
  double fp8_dense_tflops = 0;     // FP8 tensor rate without sparsity, spec
  int32_t sms = 0;                 // streaming multiprocessors
  double indexer_bw_efficiency = 0;   // share of hbm_tb_s the paged-logits kernel reaches
  double indexer_floor_us = 0;        // fixed cost of one indexer launch
  double fp8_efficiency = 0;          // share of fp8_dense_tflops a tuned FP8 kernel reaches
  double topk_floor_us = 0;           // fixed cost of one top-k launch
  double topk_ns_per_entry = 0;       // one row's time per entry read
  double attention_tflops = 0;        // sparse MLA decode rate
  double attention_floor_us = 0;
  std::vector<std::string> sources;   // where each figure comes from, in the order above
};

// h100, h200, b200.
Result<GpuPreset> gpu_preset(const std::string& name);
const std::vector<std::string>& gpu_preset_names();

struct DiagnoseInput {
  ModelPreset model;
  GpuPreset gpu;
  int64_t context = 0;   // tokens per request (the indexer sees context / compress_ratio entries)
  int32_t batch = 1;
  int32_t next_n = 1;
  std::vector<double> sparsities = {0.0, 0.3, 0.4, 0.5, 0.6, 0.7};
};

// One indexer layer's stage times, and the attention path of one decode step.
struct StageTimes {
  double indexer_us = 0, topk_us = 0, attention_us = 0, predictor_us = 0;
  double layer_us() const { return indexer_us + topk_us + attention_us + predictor_us; }
};

struct DiagnoseRow {
  double sparsity = 0;
  StageTimes scored_topk;   // top-k over the scored entries only
  StageTimes full_topk;     // top-k over the whole -inf-padded row
  double path_ms_scored = 0, path_ms_full = 0;      // × indexer layers
  double speedup_scored = 1, speedup_full = 1;      // over sparsity 0 (no predictor)
};

struct DiagnoseResult {
  DiagnoseInput input;
  int64_t entries = 0;          // indexer entries per request
  double indexer_share = 0;     // indexer + top-k over the attention path, at sparsity 0
  double topk_share_of_indexer = 0;  // top-k / (indexer + top-k) at sparsity 0
  std::vector<DiagnoseRow> rows;
};

Result<DiagnoseResult> diagnose(const DiagnoseInput& input);

}  // namespace spin
