// spin/lab/diagnose.h — a paper model of one decode step on a GPU (`spin diagnose`): how long the
// lightning indexer, its top-k and the sparse MLA attention take, the indexer's share, and what
// skipping blocks at each sparsity would gain — with the top-k over the scored entries only (what
// spin's masked top-k does) and over the full row (a top-k that does not skip).
//
// No GPU is needed or used: every figure is arithmetic over public numbers, each with its source
// in the result (GpuPreset::*_source, DiagnoseResult::sources). The model, per indexer layer:
//   indexer   = max(latency floor, batch · entries · 132 B / (HBM · paged_logits_efficiency),
//                   2 · heads · 128 · entries · rows / (FP8 dense · paged_logits_efficiency))
//             (DeepGEMM's paged MQA logits are memory-bound: ~77 % of HBM at B=64, 64K on H200);
//   top-k     = per-row time (a published kernel time per entry, one row per SM) · entries read
//               · ceil(rows / SMs)  — flat in batch up to one wave, as the published figures are;
//   attention = max(latency floor, rows · (topk + window) · 656 B / (HBM · efficiency),
//                   rows · attn_heads · (topk + window) · (576 + 512) · 2 / (BF16 dense · 0.5))
//               (FlashMLA sparse decode over the fp8_ds_mla cache; the 0.5 is an assumption);
// with entries = context / compress_ratio and rows = batch · next_n. spin at sparsity s scores
// budget_blocks (spin/predict.h) of the blocks — never fewer than top-k needs — so the indexer
// (and the scored-only top-k) shrink by the realised block fraction; attention does not change.
// The rest of the step (MoE, projections) is `other_ms` per step, 0 unless given: with 0 the gain
// is that of the attention path alone, an upper bound on the step's.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/diagnose.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <cstdint>
#include <string>
#include <vector>

#include "spin/lab/model.h"
#include "spin/status.h"

namespace spin {

struct GpuPreset {
  std::string name;                 // "h100", "h200", "b200"
  double hbm_bytes_per_s = 0;       // HBM bandwidth
  double fp8_flops = 0;             // dense FP8 tensor-core peak
  double bf16_flops = 0;            // dense BF16 tensor-core peak
  int32_t sms = 0;                  // streaming multiprocessors
  double paged_logits_efficiency = 0;  // share of HBM DeepGEMM's paged logits reach
  double logits_floor_s = 0;        // one indexer launch at small batch (latency floor)
  double topk_s_per_entry = 0;      // one row's top-k time per entry read (one row per SM)
  std::string spec_source;          // where bandwidth, FLOPs and SMs come from
  std::string logits_source;        // where the efficiency and the floor come from
  std::string topk_source;          // where the top-k time comes from
};
// h100 (SXM), h200 (SXM), b200.
Result<GpuPreset> gpu_preset(const std::string& name);
const std::vector<std::string>& gpu_preset_names();

struct DiagnoseInput {
  ModelPreset model;        // spin/lab/model.h presets
  GpuPreset gpu;
  int64_t context = 131072; // tokens cached per request
  int32_t batch = 1;        // requests decoding together
  int32_t next_n = 1;       // rows per request (1 + MTP drafts)
  std::vector<double> sparsities = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  double other_ms = 0;      // the rest of the decode step (not modelled), per step
  Status validate() const;
};

struct DiagnoseRow {
  double target_sparsity = 0;
  double realised_sparsity = 0;       // 1 - budget_blocks / n_blocks
  double indexer_ms = 0;              // per step, all indexer layers
  double topk_scored_ms = 0;          // top-k over the scored entries only
  double topk_full_ms = 0;            // top-k over the whole row
  double step_ms_scored = 0;          // indexer + top-k(scored) + attention + other
  double step_ms_full = 0;            // indexer + top-k(full) + attention + other
  double gain_scored = 0;             // all-keep step / step_ms_scored
  double gain_full = 0;               // all-keep step / step_ms_full
};

struct DiagnoseResult {
  DiagnoseInput input;
  int64_t entries = 0;                // per request per layer
  int64_t n_blocks = 0;
  double indexer_ms = 0;              // all-keep, per step (all indexer layers)
  double topk_ms = 0;
  double attention_ms = 0;
  double indexer_share = 0;           // indexer / (indexer + top-k + attention + other)
  double topk_share = 0;
  std::string indexer_bound;          // the all-keep indexer's binding term: latency, memory, compute
  std::vector<DiagnoseRow> rows;
  std::vector<std::string> sources;   // one line per figure used
};

Result<DiagnoseResult> diagnose(const DiagnoseInput& input);
// Text table and the JSON object `spin diagnose [--json]` prints.
std::string diagnose_text(const DiagnoseResult& result);
std::string diagnose_json(const DiagnoseResult& result);

}  // namespace spin
