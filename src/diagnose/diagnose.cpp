// The paper model of a GPU decode step (spin/lab/diagnose.h): GPU presets with their sources, the
// per-layer indexer / top-k / attention terms, and spin's gain per sparsity.
#include "spin/lab/diagnose.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "spin/geometry.h"
#include "spin/predict.h"

namespace spin {
namespace {

// Public spec sheets (dense tensor-core rates: the sheets' "with sparsity" figures halved).
constexpr const char* kH100Spec = "NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3, 1979 TFLOPS FP8 / 989 TFLOPS BF16 dense, 132 SMs";
constexpr const char* kH200Spec = "NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, 1979 TFLOPS FP8 / 989 TFLOPS BF16 dense, 132 SMs (H100 die)";
constexpr const char* kB200Spec = "NVIDIA HGX/DGX B200 specifications: 8 TB/s HBM3e, 4.5 PFLOPS FP8 / 2.25 PFLOPS BF16 dense, 148 SMs";
// The sglang HISA branch's H200 profile of 2026-04-21 (docs/sources.md has each source).
constexpr const char* kLogitsMeasured =
    "DeepGEMM paged MQA logits on H200, B=64, 64K: 553.6 MB in 0.149 ms = 77 % of HBM (sglang HISA-branch H200 profile, docs/sources.md); "
    "B=1, 64K: 0.011 ms, the latency floor (the same profile)";
constexpr const char* kLogitsCarried =
    "H200's measured 77 % of HBM and 0.011 ms floor carried over (assumption: no published figure "
    "for this GPU; docs/sources.md)";
constexpr const char* kTopkHopper =
    "fast_topk_v2 on H200, one layer: 0.037 ms at B=1, 64K and 0.039 ms at B=64 (one row per SM, "
    "flat in batch): 0.037 ms / 65536 entries per row (sglang HISA-branch profile, docs/sources.md)";
constexpr const char* kTopkHopperCarried =
    "H200's fast_topk_v2 time per entry (0.037 ms / 65536) carried over to H100 (same SM count and "
    "architecture; assumption)";
constexpr const char* kTopkB200 =
    "tokenspeed PR 1366 on B200: 1 × 131072 entries, k = 2048, 9.9 µs (docs/sources.md)";
constexpr double kLogitsEfficiency = 0.77;
constexpr double kLogitsFloorS = 0.011e-3;
constexpr double kHopperTopkSPerEntry = 0.037e-3 / 65536.0;
constexpr double kB200TopkSPerEntry = 9.9e-6 / 131072.0;
// Sparse MLA attention: FlashMLA reads the top-k (and window) latents in fp8_ds_mla (656 B) and
// computes QK over 576 dims and PV over 512 in BF16. Assumptions, stated in every result: it
// reaches the same share of HBM as the paged logits, and half the BF16 dense peak.
constexpr double kAttentionComputeEfficiency = 0.5;
constexpr const char* kAttentionSource =
    "sparse MLA (FlashMLA fp8_ds_mla, 656 B per entry, QK 576 + PV 512 dims, BF16): memory at 77 % "
    "of HBM, compute at 50 % of BF16 dense, and the indexer's 0.011 ms small-batch floor (assumptions: "
    "no published sparse-decode time: docs/sources.md)";

const std::vector<GpuPreset>& presets() {
  static const std::vector<GpuPreset> kPresets = {
      {"h100", 3.35e12, 1979e12, 989e12, 132, kLogitsEfficiency, kLogitsFloorS, kHopperTopkSPerEntry,
       kH100Spec, kLogitsCarried, kTopkHopperCarried},
      {"h200", 4.8e12, 1979e12, 989e12, 132, kLogitsEfficiency, kLogitsFloorS, kHopperTopkSPerEntry,
       kH200Spec, kLogitsMeasured, kTopkHopper},
      {"b200", 8.0e12, 4500e12, 2250e12, 148, kLogitsEfficiency, kLogitsFloorS, kB200TopkSPerEntry,
       kB200Spec, kLogitsCarried, kTopkB200},
  };
  return kPresets;
}

struct LayerTimes {
  double indexer_s = 0, topk_s = 0;
  const char* bound = "memory";  // which term of the indexer's max() binds
};

// One indexer layer when each request scores `scored` of its `entries` entries.
LayerTimes layer_times(const DiagnoseInput& in, int64_t entries, int64_t scored, int64_t topk_read) {
  const GpuPreset& g = in.gpu;
  const double rows = static_cast<double>(in.batch) * in.next_n;
  const double bytes = static_cast<double>(in.batch) * static_cast<double>(scored) * kEntryBytes;
  const double flops = 2.0 * in.model.index_heads * kIndexerHeadDim * static_cast<double>(scored) * rows;
  const double t_mem = bytes / (g.hbm_bytes_per_s * g.paged_logits_efficiency);
  const double t_flop = flops / (g.fp8_flops * g.paged_logits_efficiency);
  LayerTimes t;
  t.indexer_s = std::max({g.logits_floor_s, t_mem, t_flop});
  t.bound = t.indexer_s == g.logits_floor_s ? "latency" : t_mem >= t_flop ? "memory" : "compute";
  const double waves = std::ceil(rows / g.sms);
  t.topk_s = g.topk_s_per_entry * static_cast<double>(topk_read) * waves;
  (void)entries;
  return t;
}

}  // namespace

const std::vector<std::string>& gpu_preset_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> n;
    for (const GpuPreset& p : presets()) n.push_back(p.name);
    return n;
  }();
  return kNames;
}

Result<GpuPreset> gpu_preset(const std::string& name) {
  for (const GpuPreset& p : presets())
    if (p.name == name) return p;
  return invalid_argument("unknown GPU preset '{}'; known: {}", name, fmt::join(gpu_preset_names(), ", "));
}

Status DiagnoseInput::validate() const {
  if (model.indexer_layers < 1 || model.index_heads < 1 || model.topk < 1 || model.compress_ratio < 1)
    return invalid_argument("diagnose: model preset '{}' is incomplete", model.name);
  if (gpu.hbm_bytes_per_s <= 0 || gpu.sms < 1) return invalid_argument("diagnose: GPU preset '{}' is incomplete", gpu.name);
  if (context < 1 || context > (int64_t{1} << 24))
    return invalid_argument("diagnose: context {} is outside 1..2^24 tokens", context);
  if (batch < 1 || batch > 65536) return invalid_argument("diagnose: batch {} is outside 1..65536", batch);
  if (next_n < 1 || next_n > kMaxNextN)
    return invalid_argument("diagnose: next_n {} is outside 1..{}", next_n, kMaxNextN);
  if (sparsities.empty()) return invalid_argument("diagnose: no sparsity to evaluate");
  for (double s : sparsities)
    if (!(s >= 0.0 && s < 1.0)) return invalid_argument("diagnose: sparsity {} is outside [0, 1)", s);
  if (!(other_ms >= 0.0 && other_ms < 1e6)) return invalid_argument("diagnose: other_ms {} is outside [0, 1e6)", other_ms);
  return ok_status();
}

Result<DiagnoseResult> diagnose(const DiagnoseInput& in) {
  SPIN_RETURN_IF_ERROR(in.validate());
  DiagnoseResult r;
  r.input = in;
  const ModelPreset& m = in.model;
  PredictorConfig config;
  config.page_size = m.page_size;
  config.topk = m.topk;
  r.entries = std::max<int64_t>(1, in.context / m.compress_ratio);
  r.n_blocks = blocks_for_entries(config, r.entries);
  const double layers = m.indexer_layers;
  const LayerTimes full = layer_times(in, r.entries, r.entries, r.entries);
  const double rows = static_cast<double>(in.batch) * in.next_n;
  const double attended = static_cast<double>(std::min<int64_t>(m.topk, r.entries) + m.window);
  const double attn_bytes = rows * attended * static_cast<double>(LatentPageLayout::kFp8EntryBytes);
  const double attn_flops = rows * m.attn_heads * attended * (576.0 + 512.0) * 2.0;
  const double attn_s = std::max({in.gpu.logits_floor_s,
                                  attn_bytes / (in.gpu.hbm_bytes_per_s * in.gpu.paged_logits_efficiency),
                                  attn_flops / (in.gpu.bf16_flops * kAttentionComputeEfficiency)});
  r.indexer_ms = full.indexer_s * layers * 1e3;
  r.topk_ms = full.topk_s * layers * 1e3;
  r.attention_ms = attn_s * layers * 1e3;
  r.indexer_bound = full.bound;
  const double base = r.indexer_ms + r.topk_ms + r.attention_ms + in.other_ms;
  r.indexer_share = r.indexer_ms / base;
  r.topk_share = r.topk_ms / base;
  for (double s : in.sparsities) {
    config.target_sparsity = s;
    const int64_t budget = budget_blocks(config, r.n_blocks);
    const int64_t scored = std::min(r.entries, budget * config.block_entries());
    const LayerTimes t = layer_times(in, r.entries, scored, scored);
    DiagnoseRow row;
    row.target_sparsity = s;
    row.realised_sparsity = 1.0 - static_cast<double>(budget) / static_cast<double>(r.n_blocks);
    row.indexer_ms = t.indexer_s * layers * 1e3;
    row.topk_scored_ms = t.topk_s * layers * 1e3;
    row.topk_full_ms = r.topk_ms;
    row.step_ms_scored = row.indexer_ms + row.topk_scored_ms + r.attention_ms + in.other_ms;
    row.step_ms_full = row.indexer_ms + row.topk_full_ms + r.attention_ms + in.other_ms;
    row.gain_scored = base / row.step_ms_scored;
    row.gain_full = base / row.step_ms_full;
    r.rows.push_back(row);
  }
  r.sources = {
      std::string("GPU: ") + in.gpu.spec_source,
      std::string("indexer: ") + in.gpu.logits_source,
      std::string("top-k: ") + in.gpu.topk_source,
      std::string("attention: ") + kAttentionSource,
      fmt::format("model: {} preset (spin/lab/engine.h): {} indexer layers, {} heads × 128, top-k {}, "
                  "page {}, compress ratio {}, {} MLA heads, window {}",
                  m.name, m.indexer_layers, m.index_heads, m.topk, m.page_size, m.compress_ratio,
                  m.attn_heads, m.window),
      "budget: budget_blocks (spin/predict.h): ceil((1 - s) · blocks), never below top-k's blocks "
      "or the forced sink/local blocks; spin's own select/observe (O(blocks)) is left out",
      in.other_ms > 0 ? fmt::format("rest of the step: {} ms given with --other-ms", in.other_ms)
                      : "rest of the step (MoE, projections): not modelled (--other-ms); the gain is "
                        "the attention path's, an upper bound on the step's",
  };
  return r;
}

std::string diagnose_text(const DiagnoseResult& r) {
  const DiagnoseInput& in = r.input;
  std::string out = fmt::format(
      "{} on {}: context {} tokens ({} entries, {} blocks per request and layer), batch {}, next_n {}\n"
      "all-keep per decode step ({} indexer layers): indexer {:.3f} ms ({}-bound), top-k {:.3f} ms, "
      "sparse attention {:.3f} ms{}\n"
      "indexer share {:.1f} %, top-k share {:.1f} %\n\n",
      in.model.name, in.gpu.name, in.context, r.entries, r.n_blocks, in.batch, in.next_n,
      in.model.indexer_layers, r.indexer_ms, r.indexer_bound, r.topk_ms,
      r.attention_ms, in.other_ms > 0 ? fmt::format(", other {:.3f} ms", in.other_ms) : "",
      100.0 * r.indexer_share, 100.0 * r.topk_share);
  out += fmt::format("{:>8} {:>9} {:>11} {:>13} {:>11} {:>14} {:>12}\n", "sparsity", "realised", "indexer ms",
                     "top-k scored", "top-k full", "gain (scored)", "gain (full)");
  for (const DiagnoseRow& row : r.rows) {
    out += fmt::format("{:>8.2f} {:>9.3f} {:>11.3f} {:>13.3f} {:>11.3f} {:>13.3f}x {:>11.3f}x\n",
                       row.target_sparsity, row.realised_sparsity, row.indexer_ms, row.topk_scored_ms,
                       row.topk_full_ms, row.gain_scored, row.gain_full);
  }
  out += "\nsources:\n";
  for (const std::string& s : r.sources) out += "  - " + s + "\n";
  return out;
}

std::string diagnose_json(const DiagnoseResult& r) {
  const DiagnoseInput& in = r.input;
  nlohmann::json rows = nlohmann::json::array();
  for (const DiagnoseRow& row : r.rows) {
    rows.push_back({{"target_sparsity", row.target_sparsity}, {"realised_sparsity", row.realised_sparsity},
                    {"indexer_ms", row.indexer_ms}, {"topk_scored_ms", row.topk_scored_ms},
                    {"topk_full_ms", row.topk_full_ms}, {"step_ms_scored", row.step_ms_scored},
                    {"step_ms_full", row.step_ms_full}, {"gain_scored", row.gain_scored},
                    {"gain_full", row.gain_full}});
  }
  nlohmann::json out = {
      {"model", in.model.name}, {"gpu", in.gpu.name}, {"context", in.context}, {"batch", in.batch},
      {"next_n", in.next_n}, {"entries", r.entries}, {"blocks", r.n_blocks},
      {"gpu_spec", {{"hbm_bytes_per_s", in.gpu.hbm_bytes_per_s}, {"fp8_flops", in.gpu.fp8_flops},
                    {"bf16_flops", in.gpu.bf16_flops}, {"sms", in.gpu.sms},
                    {"paged_logits_efficiency", in.gpu.paged_logits_efficiency},
                    {"logits_floor_s", in.gpu.logits_floor_s}, {"topk_s_per_entry", in.gpu.topk_s_per_entry}}},
      {"all_keep", {{"indexer_ms", r.indexer_ms}, {"topk_ms", r.topk_ms}, {"attention_ms", r.attention_ms},
                    {"other_ms", in.other_ms}, {"indexer_share", r.indexer_share}, {"topk_share", r.topk_share},
                    {"indexer_bound", r.indexer_bound}}},
      {"sparsity", rows}, {"sources", r.sources}, {"estimate", "paper model, no GPU measured"}};
  return out.dump(2) + "\n";
}

}  // namespace spin
