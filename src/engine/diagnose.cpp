// The GPU cost model of spin/diagnose.h: presets with their sources, and the per-stage formulas.
#include "spin/diagnose.h"

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "spin/geometry.h"

namespace spin {
namespace {

constexpr double kKeyBytes = kIndexerHeadDim + 4;   // fp8 key + fp32 scale per entry
constexpr double kLatentBytes = 656;                 // FlashMLA fp8_ds_mla entry
constexpr double kMlaQkDim = 576, kMlaVDim = 512;    // MLA q·k and P·V widths
constexpr double kPredictorShare = 0.014;            // spin select + observe / full indexer (CPU)
constexpr double kLaunchFloorUs = 3;                 // top-k and attention launch (assumed)

// DeepGEMM's paged MQA logits on an H200, V3.2 shape (64 heads × 128), next_n 1, 64K entries:
// 0.011 ms at batch 1 and 0.149 ms at batch 64. floor + batch · bytes / bandwidth through both
// points gives the kernel's fixed cost and its effective bandwidth.
struct IndexerFit {
  double floor_us, efficiency;
};
IndexerFit fit_deepgemm_h200() {
  constexpr double entries = 65536, hbm = 4.8e12, t1 = 11e-6, t64 = 149e-6;
  const double bytes = entries * kKeyBytes;
  const double bandwidth = 63 * bytes / (t64 - t1);
  return {(t1 - bytes / bandwidth) * 1e6, bandwidth / hbm};
}

GpuPreset hopper(const std::string& name, double hbm_tb_s) {
  const IndexerFit fit = fit_deepgemm_h200();
  GpuPreset g;
  g.name = name;
  g.hbm_tb_s = hbm_tb_s;
  g.fp8_dense_tflops = 1979;
  g.sms = 132;
  g.indexer_bw_efficiency = fit.efficiency;
  g.indexer_floor_us = fit.floor_us;
  g.fp8_efficiency = 1550.0 / 1979;
  g.topk_floor_us = kLaunchFloorUs;
  g.topk_ns_per_entry = (37 - kLaunchFloorUs) * 1e3 / 65536;
  g.attention_tflops = 410;
  g.attention_floor_us = kLaunchFloorUs;
  g.sources = {
      fmt::format("HBM {} TB/s, FP8 1979 TFLOPS dense, 132 SMs: NVIDIA {} SXM spec", hbm_tb_s, name),
      "indexer: DeepGEMM paged MQA logits on H200, 0.011 ms (batch 1) and 0.149 ms (batch 64) at 64K "
      "(sglang HISA stage profile 2026-04-21, shared/reference/peers.md §2, §4); efficiency assumed equal "
      "on other GPUs",
      "FP8 compute: DeepGEMM 1550 TFLOPS FP8 on H800 (DeepGEMM README) = 78 % of dense peak",
      "top-k: sglang fast_topk_v2 on H200, 0.037 ms at 64K, batch 1 (0.039 at batch 64: rows run in "
      "parallel), same profile; one row per SM, time ∝ entries read; 3 µs launch floor assumed",
      "attention: FlashMLA sparse decode, fp8 cache, bf16 matmul, 410 TFLOPS on H800 SXM5 (FlashMLA "
      "README); H100/H200 share its SMs and clocks"};
  return g;
}

GpuPreset blackwell() {
  const IndexerFit fit = fit_deepgemm_h200();
  GpuPreset g;
  g.name = "b200";
  g.hbm_tb_s = 8.0;
  g.fp8_dense_tflops = 4500;
  g.sms = 148;
  g.indexer_bw_efficiency = fit.efficiency;
  g.indexer_floor_us = fit.floor_us;
  g.fp8_efficiency = 1550.0 / 1979;
  g.topk_floor_us = kLaunchFloorUs;
  g.topk_ns_per_entry = (9.9 - kLaunchFloorUs) * 1e3 / 131072;
  g.attention_tflops = 350;
  g.attention_floor_us = kLaunchFloorUs;
  g.sources = {"HBM 8 TB/s, FP8 4500 TFLOPS dense, 148 SMs: NVIDIA B200 spec",
               "indexer: the H200 DeepGEMM fit (peers.md §4), bandwidth scaled to 8 TB/s at the same efficiency",
               "FP8 compute: DeepGEMM's H800 efficiency (78 %) assumed",
               "top-k: tokenspeed PR 1366 on B200, 1 × 131072 rows, k 2048: 9.9 µs (peers.md §4); one row per SM, "
               "time ∝ entries read; 3 µs launch floor assumed",
               "attention: FlashMLA sparse decode on B200, ~350 TFLOPS (FlashMLA README)"};
  return g;
}

// One indexer layer at sparsity s (the predictor's share added when s > 0).
StageTimes layer_times(const DiagnoseInput& in, int64_t entries, double s, bool topk_scored_only) {
  const GpuPreset& g = in.gpu;
  const double bandwidth = g.hbm_tb_s * 1e12 * g.indexer_bw_efficiency;
  const double rows = static_cast<double>(in.batch) * in.next_n;
  const double scored = static_cast<double>(entries) * (1 - s);
  auto indexer_us = [&](double scored_entries) {
    const double bytes = in.batch * scored_entries * kKeyBytes;
    const double flops = 2.0 * in.model.index_heads * kIndexerHeadDim * scored_entries * rows;
    const double fp8 = g.fp8_dense_tflops * 1e12 * g.fp8_efficiency;
    return g.indexer_floor_us + std::max(bytes / bandwidth, flops / fp8) * 1e6;
  };
  StageTimes t;
  t.indexer_us = indexer_us(scored);
  const double topk_read = topk_scored_only ? scored : static_cast<double>(entries);
  const double waves = std::ceil(rows / g.sms);
  t.topk_us = g.topk_floor_us + topk_read * g.topk_ns_per_entry * 1e-3 * waves;
  const double attended = static_cast<double>(std::min<int64_t>(in.model.topk, entries)) + in.model.window;
  const double attn_flops = 2.0 * in.model.attn_heads * (kMlaQkDim + kMlaVDim) * attended * rows;
  const double attn_bytes = in.batch * attended * kLatentBytes;
  t.attention_us = g.attention_floor_us +
                   std::max(attn_flops / (g.attention_tflops * 1e12), attn_bytes / bandwidth) * 1e6;
  t.predictor_us = s > 0 ? kPredictorShare * indexer_us(static_cast<double>(entries)) : 0;
  return t;
}

Status validate(const DiagnoseInput& in) {
  if (in.context < 1 || in.context > (int64_t{1} << 26)) {
    return invalid_argument("context must be in [1, 2^26] tokens, got {}", in.context);
  }
  if (in.batch < 1 || in.batch > 65536) return invalid_argument("batch must be in [1, 65536], got {}", in.batch);
  if (in.next_n < 1 || in.next_n > kMaxNextN) return invalid_argument("next_n must be in [1, {}], got {}", kMaxNextN, in.next_n);
  if (in.context / in.model.compress_ratio < 1) {
    return invalid_argument("a context of {} tokens holds no indexer entry at compress ratio {}", in.context,
                            in.model.compress_ratio);
  }
  for (double s : in.sparsities) {
    if (!(s >= 0 && s < 1)) return invalid_argument("sparsity must be in [0, 1), got {}", s);
  }
  if (in.gpu.sms < 1 || !(in.gpu.hbm_tb_s > 0)) return invalid_argument("GPU preset '{}' is incomplete", in.gpu.name);
  return ok_status();
}

}  // namespace

const std::vector<std::string>& gpu_preset_names() {
  static const std::vector<std::string> names = {"h100", "h200", "b200"};
  return names;
}

Result<GpuPreset> gpu_preset(const std::string& name) {
  if (name == "h100") return hopper("h100", 3.35);
  if (name == "h200") return hopper("h200", 4.8);
  if (name == "b200") return blackwell();
  return invalid_argument("unknown GPU preset '{}' (h100, h200, b200)", name);
}

Result<DiagnoseResult> diagnose(const DiagnoseInput& input) {
  SPIN_RETURN_IF_ERROR(validate(input));
  DiagnoseResult r;
  r.input = input;
  r.entries = input.context / input.model.compress_ratio;
  const double layers = input.model.indexer_layers;
  const StageTimes dense = layer_times(input, r.entries, 0, true);
  r.indexer_share = (dense.indexer_us + dense.topk_us) / dense.layer_us();
  r.topk_share_of_indexer = dense.topk_us / (dense.indexer_us + dense.topk_us);
  for (double s : input.sparsities) {
    DiagnoseRow row;
    row.sparsity = s;
    row.scored_topk = layer_times(input, r.entries, s, true);
    row.full_topk = layer_times(input, r.entries, s, false);
    row.path_ms_scored = row.scored_topk.layer_us() * layers / 1e3;
    row.path_ms_full = row.full_topk.layer_us() * layers / 1e3;
    row.speedup_scored = dense.layer_us() / row.scored_topk.layer_us();
    row.speedup_full = dense.layer_us() / row.full_topk.layer_us();
    r.rows.push_back(row);
  }
  return r;
}

}  // namespace spin
