// `spin advise`'s step model and rule (spin/lab/advise.h): the rest of the decode step from public
// model configs, spin's own device cost (measured by bench/gpu where it exists, else modelled from
// launches and bytes), the recommendation and its renderings. The quality replays live in spin_eval
// (src/eval/advise_quality.cpp); this file never times anything.
#include "spin/lab/advise.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.h"
#include "spin/geometry.h"

namespace spin {

extern const char* const kGpuGridJson;  // generated from SPIN_GPU_GRID_FILE (src/diagnose/CMakeLists.txt)

// ---- Configurations ------------------------------------------------------------------------------

PredictorConfig paper_spin_config() {
  // The library's "paper" preset (PredictorConfig::apply_preset): the SPIN paper's predictor as
  // published, without spin's additions.
  PredictorConfig c;
  const Status s = c.apply_preset("paper");
  (void)s;  // a known preset: cannot fail (tested)
  return c;
}

std::vector<std::pair<std::string, std::string>> config_overrides(const PredictorConfig& config) {
  auto pairs = [](const std::string& line) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(line);
    for (std::string kv; in >> kv;) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) out.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
    return out;
  };
  const auto base = pairs(PredictorConfig{}.to_string());
  std::vector<std::pair<std::string, std::string>> diff;
  for (const auto& kv : pairs(config.to_string())) {
    if (std::find(base.begin(), base.end(), kv) == base.end()) diff.push_back(kv);
  }
  return diff;
}

namespace {

// ---- Model weights (public config.json figures) ---------------------------------------------------

// MLA projection parameters of one layer: V3-style (q_a, q_b, kv_a, kv_b, o) and V4-style (one
// 512-dim latent for K and V, o through grouped low-rank projections).
double v3_attention_params(double hidden, double q_lora, double kv_lora, double heads, double nope, double rope,
                           double v) {
  return hidden * q_lora + q_lora * heads * (nope + rope) + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v) +
         heads * v * hidden;
}
double v4_attention_params(double hidden, double q_lora, double heads, double head_dim, double o_groups, double o_lora) {
  return hidden * q_lora + q_lora * heads * head_dim + hidden * head_dim + heads * head_dim * o_lora +
         o_groups * o_lora * hidden;
}

constexpr const char* kV32Source =
    "deepseek-ai/DeepSeek-V3.2 config.json (as V3): hidden 7168, 61 layers (3 dense, intermediate 18432), "
    "256 routed experts top-8 + 1 shared, expert intermediate 2048, MLA q_lora 1536 / kv_lora 512, 128 heads "
    "× (128 + 64 rope), v 128, vocab 129280";
constexpr const char* kV4FlashSource =
    "DeepSeek-V4-Flash config (reference/dsa_indexer_spec.md §2.2): hidden 4096, 43 layers, 256 routed experts "
    "top-6 + 1 shared, q_lora 1024, 64 heads × 512, o 8 groups × 1024, vocab 129280; expert intermediate 2048 "
    "derived from the published 284B total (reproduces the 13B active)";
constexpr const char* kV4ProSource =
    "DeepSeek-V4-Pro config (reference/dsa_indexer_spec.md §2.2): hidden 7168, 61 layers, 384 routed experts "
    "top-6 + 1 shared, q_lora 1536, 128 heads × 512, o 16 groups × 1024, vocab 129280; expert intermediate 3072 "
    "derived from the published 1.6T total (reproduces ~48B of the 49B active)";

// Weight-streaming GEMMs at decode batch sizes read their weights once; assumed to reach the share
// of HBM DeepGEMM's paged logits reach (GpuPreset::paged_logits_efficiency), and half the dense
// FP8 peak when compute binds (the same assumption diagnose makes for attention).
constexpr double kGemmComputeEfficiency = 0.5;
constexpr double kLmHeadBytesPerParam = 2;  // lm_head stays BF16 in the FP8 checkpoints

double experts_touched(const ModelWeights& w, double tokens) {
  const double e = w.routed_experts;
  return e * (1.0 - std::pow(1.0 - w.experts_per_token / e, tokens));
}

// ---- spin's own device cost --------------------------------------------------------------------

// Launches of spin's own per decode step (docs/gpu.md, tests/integration/launch_count.py at
// f950c9b): the first layer 7 (the step's commit: replay, close, finish; its plan: one select),
// every other layer 3 (compact, observe + remap, DeepGEMM's metadata), the last 4: 188 at V3.2's
// 61 layers.
constexpr double kFirstLayerLaunches = 7, kLayerLaunches = 3, kLastLayerLaunches = 4;
// A dependent node inside a CUDA graph costs 1.5–3 µs (reference/device_path_review.md G1,
// derived): the midpoint.
constexpr double kLaunchSeconds = 2.25e-6;
// Bytes per request and block the step's own kernels read and write of the state at next_n 1
// (docs/gpu.md "State"): select reads the binary16 slot EMA (NaN: never seen) and the last
// top-k's hits (3) and empties the hits row (1); observe reads and writes a scored block's EMA
// (4); close reads the hits and the last top-k and writes it (3).
constexpr double kStateBytesPerBlock = 11;

double modelled_own_ms(const Deployment& d, const ModelPreset& m, const GpuPreset& g, double sparsity) {
  PredictorConfig c;
  c.page_size = m.page_size;
  c.topk = m.topk;
  c.target_sparsity = sparsity;
  const int64_t entries = std::max<int64_t>(1, d.context / m.compress_ratio);
  const int64_t blocks = blocks_for_entries(c, entries);
  const double scored = static_cast<double>(std::min(entries, budget_blocks(c, blocks) * c.block_entries()));
  const double rows = static_cast<double>(d.batch) * d.next_n;
  // Observe reads the scored fp32 logits once more; compact writes the table; the plan touches state.
  const double batch = d.batch;
  const double bytes = rows * scored * 4 + batch * scored / c.block_entries() * 4 +
                       batch * static_cast<double>(blocks) * kStateBytesPerBlock;
  const double layers = m.indexer_layers;
  const double launches = layers < 2 ? kFirstLayerLaunches
                                     : kFirstLayerLaunches + kLayerLaunches * (layers - 2) + kLastLayerLaunches;
  return (launches * kLaunchSeconds + layers * bytes / (g.hbm_bytes_per_s * g.paged_logits_efficiency)) * 1e3;
}

struct GridRow {
  int64_t context = 0;
  int32_t batch = 0, next_n = 0;
  double sparsity = 0, own_us = 0;
};

const std::vector<GridRow>& measured_grid() {
  static const std::vector<GridRow> rows = [] {
    std::vector<GridRow> out;
    const auto j = nlohmann::json::parse(kGpuGridJson, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("rows")) return out;
    for (const auto& r : j["rows"]) {
      if (!r.contains("spin_own_us_triton") || !r["spin_own_us_triton"].is_number()) continue;
      out.push_back({r.value("context", int64_t{0}), r.value("batch", 0), r.value("next_n", 0),
                     r.value("sparsity", 0.0), r["spin_own_us_triton"].get<double>()});
    }
    return out;
  }();
  return rows;
}

// The grid point nearest to (entries, batch, next_n, sparsity): same rows per request where the
// grid has them, then the nearest context and batch (log scale), then the nearest sparsity.
const GridRow* nearest_measured(int64_t entries, int32_t batch, int32_t next_n, double sparsity) {
  const GridRow* best = nullptr;
  double best_d = INFINITY;
  for (const GridRow& r : measured_grid()) {
    const double d = 100.0 * (r.next_n != std::min(next_n, 2)) +
                     std::abs(std::log2(static_cast<double>(r.context) / static_cast<double>(entries))) +
                     std::abs(std::log2(static_cast<double>(r.batch) / batch)) + std::abs(r.sparsity - sparsity);
    if (d < best_d) best_d = d, best = &r;
  }
  return best;
}

double percent(double x) { return 100.0 * x; }

}  // namespace

// ---- The step ------------------------------------------------------------------------------------

Status Deployment::validate() const {
  if (auto m = model_preset(model); !m.ok()) return m.status();
  if (auto g = gpu_preset(gpu); !g.ok()) return g.status();
  if (context < 1 || context > (int64_t{1} << 24)) return invalid_argument("context {} is outside 1..2^24 tokens", context);
  if (batch < 1 || batch > 65536) return invalid_argument("batch {} is outside 1..65536", batch);
  if (next_n < 1 || next_n > kMaxNextN) return invalid_argument("next_n {} is outside 1..{}", next_n, kMaxNextN);
  if (tensor_parallel < 1 || tensor_parallel > 1024)
    return invalid_argument("tensor parallel size {} is outside 1..1024", tensor_parallel);
  if (!(other_ms < 1e6) || std::isnan(other_ms)) return invalid_argument("other_ms {} is not below 1e6", other_ms);
  return ok_status();
}

Result<ModelWeights> model_weights(const std::string& model) {
  if (model == "deepseek-v3.2") {
    return ModelWeights{7168, 61, 3, 18432, 256, 8, 1, 2048, v3_attention_params(7168, 1536, 512, 128, 128, 64, 128),
                        129280, kV32Source};
  }
  if (model == "deepseek-v4-flash") {
    return ModelWeights{4096, 43, 0, 0, 256, 6, 1, 2048, v4_attention_params(4096, 1024, 64, 512, 8, 1024), 129280,
                        kV4FlashSource};
  }
  if (model == "deepseek-v4-pro") {
    return ModelWeights{7168, 61, 0, 0, 384, 6, 1, 3072, v4_attention_params(7168, 1536, 128, 512, 16, 1024), 129280,
                        kV4ProSource};
  }
  return model_preset(model).status();  // the preset list's own error
}

Result<RestOfStep> rest_of_step(const Deployment& d) {
  SPIN_RETURN_IF_ERROR(d.validate());
  auto w = model_weights(d.model);
  if (!w.ok()) return w.status();
  const GpuPreset g = gpu_preset(d.gpu).value();
  const double tokens = static_cast<double>(d.batch) * d.next_n;
  const double expert = 3.0 * w->hidden * w->expert_intermediate;  // gate, up, down
  const double moe_layers = w->layers - w->dense_layers;
  const double dense = w->layers * w->attention_params_per_layer + w->dense_layers * 3.0 * w->hidden * w->dense_intermediate +
                       moe_layers * w->shared_experts * expert;
  const double lm_head = static_cast<double>(w->vocab) * w->hidden;
  RestOfStep r;
  r.experts_touched_per_layer = experts_touched(w.value(), tokens);
  const double tp = d.tensor_parallel;
  r.bytes_per_gpu = (dense + moe_layers * r.experts_touched_per_layer * expert + kLmHeadBytesPerParam * lm_head) / tp;
  const double active = dense + moe_layers * w->experts_per_token * expert + lm_head;
  r.flops_per_gpu = 2.0 * tokens * active / tp;
  const double t_mem = r.bytes_per_gpu / (g.hbm_bytes_per_s * g.paged_logits_efficiency);
  const double t_flop = r.flops_per_gpu / (g.fp8_flops * kGemmComputeEfficiency);
  r.ms = std::max(t_mem, t_flop) * 1e3;
  r.bound = t_mem >= t_flop ? "memory" : "compute";
  r.source = fmt::format(
      "rest of the step (MoE, dense FFNs, MLA projections, lm_head), modelled: {}; FP8 weights (lm_head BF16) split "
      "over {} GPUs, {:.0f} of {} routed experts touched per layer at {} tokens (uniform routing), streamed at {:.0f} % "
      "of HBM or {:.0f} % of FP8 dense (assumptions); communication, sampling and the host left out (--other-ms "
      "overrides)",
      w->source, d.tensor_parallel, r.experts_touched_per_layer, w->routed_experts, tokens,
      percent(g.paged_logits_efficiency), percent(kGemmComputeEfficiency));
  return r;
}

SpinOwnCost spin_own_cost(const Deployment& d, double sparsity) {
  const ModelPreset m = model_preset(d.model).value();
  const GpuPreset g = gpu_preset(d.gpu).value();
  SpinOwnCost c;
  c.modelled_ms = modelled_own_ms(d, m, g, sparsity);
  c.ms = c.modelled_ms;
  c.source = fmt::format("modelled: {:.0f} launches a step × {:.2f} µs (a CUDA-graph node, 1.5–3 µs: "
                         "device_path_review G1) + observe's logits re-read, compact's table and the plan's state "
                         "at {:.0f} % of HBM (docs/gpu.md)",
                         kFirstLayerLaunches + kLayerLaunches * std::max(0, m.indexer_layers - 2) + kLastLayerLaunches,
                         kLaunchSeconds * 1e6, percent(g.paged_logits_efficiency));
  const int64_t entries = std::max<int64_t>(1, d.context / m.compress_ratio);
  const GridRow* r = g.name == "h200" ? nearest_measured(entries, d.batch, d.next_n, sparsity) : nullptr;
  if (r != nullptr) {
    c.measured = true;
    c.ms = r->own_us * m.indexer_layers * 1e-3;
    c.source = fmt::format("measured on an H200 by bench/gpu ({}: spin_own_us_triton {:.1f} µs a layer × {} "
                           "layers) at the nearest grid point: {} entries, batch {}, sparsity {}, next_n {}; the "
                           "launch-and-byte model gives {:.3f} ms",
                           SPIN_GPU_GRID_FILE, r->own_us, m.indexer_layers, r->context, r->batch, r->sparsity,
                           r->next_n, c.modelled_ms);
  }
  return c;
}

Result<StepModel> model_step(const Deployment& d, const std::vector<double>& sparsities) {
  SPIN_RETURN_IF_ERROR(d.validate());
  StepModel s;
  s.deployment = d;
  DiagnoseInput in;
  in.model = model_preset(d.model).value();
  in.gpu = gpu_preset(d.gpu).value();
  in.context = d.context;
  in.batch = d.batch;
  in.next_n = d.next_n;
  in.sparsities = sparsities;
  if (d.other_ms >= 0) {
    s.rest.ms = d.other_ms;
    s.rest.source = fmt::format("rest of the step (MoE, projections): {} ms, given with --other-ms", d.other_ms);
  } else {
    auto rest = rest_of_step(d);
    if (!rest.ok()) return rest.status();
    s.rest = rest.value();
  }
  in.other_ms = s.rest.ms;
  auto diag = diagnose(in);
  if (!diag.ok()) return diag.status();
  s.diagnose = diag.value();
  s.step_ms = s.diagnose.indexer_ms + s.diagnose.topk_ms + s.diagnose.attention_ms + s.rest.ms;
  s.indexer_share = s.diagnose.indexer_share;
  s.topk_share = s.diagnose.topk_share;
  for (const DiagnoseRow& row : s.diagnose.rows) {
    StepPoint p;
    p.target_sparsity = row.target_sparsity;
    p.realised_sparsity = row.realised_sparsity;
    p.own = spin_own_cost(d, row.target_sparsity);
    p.step_ms = row.step_ms_scored + p.own.ms;
    p.gain = s.step_ms / p.step_ms - 1.0;
    s.points.push_back(p);
  }
  // diagnose's GPU, kernel and model lines; its budget and rest-of-step lines are replaced by
  // what advise adds (spin's own work, the modelled rest of the model).
  for (const std::string& line : s.diagnose.sources) {
    if (!line.starts_with("budget:") && !line.starts_with("rest of the step")) s.sources.push_back(line);
  }
  s.sources.push_back("budget: budget_blocks (spin/predict.h); the indexer and top-k shrink to the scored entries, "
                      "spin's own device work is added (next line)");
  s.sources.push_back("spin's own work: " + (s.points.empty() ? std::string("–") : s.points.front().own.source));
  s.sources.push_back(s.rest.source);
  return s;
}

// ---- The quality ---------------------------------------------------------------------------------

const std::vector<std::string>& default_advise_scenarios() {
  // The built-in set `spin eval` runs by default, plain decode, but cached-507k (minutes to generate
  // on a small machine): documents, agentic turns and needle shifts.
  static const std::vector<std::string> kScenarios = {"doc-qa-10k", "doc-qa-94k", "agentic", "needle-shift"};
  return kScenarios;
}

const std::vector<double>& default_advise_sparsities() {
  static const std::vector<double> kSparsities = {0.2, 0.3, 0.4, 0.5, 0.6, 0.7};
  return kSparsities;
}

Status check_trace_geometry(const std::string& path, const TraceMeta& meta, const ModelPreset& model,
                            bool any_topk) {
  if ((any_topk || meta.topk == model.topk) && meta.page_size == model.page_size && meta.compress_ratio == model.compress_ratio) {
    return ok_status();
  }
  return invalid_argument(
      "{}: its geometry (top-k {}, page {}, compress ratio {}; model '{}') is not {}'s (top-k {}, page {}, compress "
      "ratio {}): record it from that model, or name the model it came from with --model{}",
      path, meta.topk, meta.page_size, meta.compress_ratio, meta.model, model.name, model.topk, model.page_size,
      model.compress_ratio, any_topk ? "" : " (--at-model-topk reads it at the model's top-k)");
}

// ---- The rule --------------------------------------------------------------------------------------

namespace {

const StepPoint* step_at(const StepModel& step, double sparsity) {
  for (const StepPoint& p : step.points)
    if (std::abs(p.target_sparsity - sparsity) < 1e-9) return &p;
  return nullptr;
}

// The highest sparsity above 0 (0 is all-keep: nothing to advise) whose worst request stays within
// tolerance; at equal sparsity spin's default (listed first) wins.
const QualityPoint* highest_within(const std::vector<QualityPoint>& quality, double tolerance) {
  const QualityPoint* best = nullptr;
  for (const QualityPoint& q : quality) {
    if (!(q.target_sparsity > 0 && q.requests > 0 && q.miss_p99.worst <= tolerance)) continue;
    if (best == nullptr || q.target_sparsity > best->target_sparsity + 1e-12) best = &q;
  }
  return best;
}

std::string hf_model_id(const std::string& model) {
  if (model == "deepseek-v4-flash") return "deepseek-ai/DeepSeek-V4-Flash";
  if (model == "deepseek-v4-pro") return "deepseek-ai/DeepSeek-V4-Pro";
  return "deepseek-ai/DeepSeek-V3.2";
}

std::string vllm_line(const Deployment& d, const std::string& config, double sparsity) {
  // target_sparsity always (even at its default), then the fields the config changes.
  nlohmann::ordered_json fields = {{"target_sparsity", sparsity}};
  if (config == kConfigPaper) fields["preset"] = "paper";  // the plugin applies it first
  const nlohmann::ordered_json spin = {{"spin", {{"config", fields}}}};
  return fmt::format("vllm serve {} --tensor-parallel-size {}{} --additional-config '{}'", hf_model_id(d.model),
                     d.tensor_parallel, d.next_n > 1 ? fmt::format(" --speculative-config '{{\"method\": \"mtp\", "
                                                                   "\"num_speculative_tokens\": {}}}'", d.next_n - 1)
                                                     : "",
                     spin.dump());
}

// The plugin keeps every block of a request that sees at most this many indexer entries on a GPU
// (python/spin_dsa/vllm/config.py DEFAULT_MIN_CONTEXT: the same cost model's break-even).
constexpr int64_t kPluginMinContext = 32768;

}  // namespace

Result<Advice> recommend(const StepModel& step, const std::vector<QualityPoint>& quality, double tolerance,
                         const std::string& measured_on) {
  if (!(tolerance > 0 && tolerance < 1)) return invalid_argument("tolerance {} is outside (0, 1)", tolerance);
  for (const QualityPoint& q : quality) {
    if (step_at(step, q.target_sparsity) == nullptr)
      return invalid_argument("sparsity {} has quality but no step model", q.target_sparsity);
  }
  Advice a;
  a.step = step;
  a.quality = quality;
  a.tolerance = tolerance;
  const double share = step.indexer_share;
  const QualityPoint* best = highest_within(quality, tolerance);
  if (best != nullptr) {
    a.recommended_sparsity = best->target_sparsity;
    a.recommended_config = best->config;
    a.p99_miss_worst = best->miss_p99.worst;
    a.expected_gain = step_at(step, best->target_sparsity)->gain;
  }
  const std::string share_text = fmt::format("the indexer is {:.1f} % of your step", percent(share));
  if (share < kMinIndexerShare) {
    a.verdict = share_text + ": spin cannot pay here";
  } else if (best == nullptr) {
    a.verdict = fmt::format("{}, but no sparsity keeps every request's p99 miss within {} on {}: do not run "
                            "spin at this tolerance", share_text, tolerance, measured_on);
  } else if (a.expected_gain <= 0) {
    a.verdict = fmt::format("{}, but at {} spin's own work outweighs what it skips: spin cannot pay here", share_text,
                            best->target_sparsity);
  } else {
    a.pays = true;
    a.verdict = fmt::format("run spin{} at {}: expected +{:.1f} % decode throughput, p99 miss ≤ {:.3f} on {}",
                            best->config == kConfigPaper ? " (the paper's config)" : "", best->target_sparsity,
                            percent(a.expected_gain), a.p99_miss_worst, measured_on);
    a.vllm_line = vllm_line(step.deployment, best->config, best->target_sparsity);
  }
  if (step.diagnose.entries <= kPluginMinContext) {
    a.notes.push_back(fmt::format("{} entries per request: the vLLM plugin keeps every block at or below its "
                                  "min_context ({}), so spin is off there unless you lower it",
                                  step.diagnose.entries, kPluginMinContext));
  }
  return a;
}

// ---- Renderings ------------------------------------------------------------------------------------

namespace {

std::string num(double v, const char* f = "{:.3f}") { return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "–"; }

std::string step_text(const StepModel& s) {
  const Deployment& d = s.deployment;
  const DiagnoseResult& r = s.diagnose;
  std::string out = fmt::format(
      "Deployment: {} on {} ×{} (tensor parallel), context {} tokens ({} indexer entries), batch {}, next_n {}\n"
      "Decode step, all-keep (modelled): {:.2f} ms = indexer {:.2f} + top-k {:.2f} + sparse attention {:.2f} + rest of "
      "the model {:.2f}\n"
      "  indexer share {:.1f} %, top-k share {:.1f} %\n\n",
      d.model, d.gpu, d.tensor_parallel, d.context, r.entries, d.batch, d.next_n, s.step_ms, r.indexer_ms, r.topk_ms,
      r.attention_ms, s.rest.ms, percent(s.indexer_share), percent(s.topk_share));
  out += fmt::format("{:>8} {:>9} {:>11} {:>14} {:>9}\n", "sparsity", "realised", "step ms", "spin's own ms", "gain");
  for (const StepPoint& p : s.points) {
    out += fmt::format("{:>8.2f} {:>9.3f} {:>11.2f} {:>10.3f} ({}) {:>+8.1f}%\n", p.target_sparsity,
                       p.realised_sparsity, p.step_ms, p.own.ms, p.own.measured ? "m" : "e", percent(p.gain));
  }
  out += "  (m = measured by bench/gpu on an H200, e = estimated from launches and bytes)\n";
  return out;
}

std::string quality_text(const Advice& a) {
  std::string out = fmt::format(
      "\nQuality per request (closed loop vs all-keep; median / p10 / worst request):\n"
      "{:>8} {:>6} {:>9} {:>26} {:>26}\n",
      "config", "sparse", "realised", "mean recall", "p99 miss");
  for (const QualityPoint& q : a.quality) {
    out += fmt::format("{:>8} {:>6.2f} {:>9.3f} {:>8} / {:>6} / {:>6} {:>8} / {:>6} / {:>6}{}\n", q.config,
                       q.target_sparsity, q.realised_sparsity, num(q.recall_mean.median), num(q.recall_mean.p10),
                       num(q.recall_mean.worst), num(q.miss_p99.median), num(q.miss_p99.p10), num(q.miss_p99.worst),
                       q.miss_p99.worst <= a.tolerance ? "  ✓" : "");
  }
  out += fmt::format("  (✓: worst request's p99 miss within the tolerance {}; {} = spin's default, {} = the paper's "
                     "spin; requests: ",
                     a.tolerance, kConfigDefault, kConfigPaper);
  for (size_t i = 0; i < a.sources_of_quality.size(); ++i) out += (i ? "; " : "") + a.sources_of_quality[i];
  return out + ")\n";
}

}  // namespace

std::string advice_text(const Advice& a) {
  std::string out = "spin advise — " + a.verdict + "\n\n" + step_text(a.step) + quality_text(a);
  if (a.cpu_tail) {
    const Advice::CpuTail& t = *a.cpu_tail;
    out += fmt::format("\nSlow tail on this CPU ({}; {}), spin at {}: step p50 {:.2f} → {:.2f} ms, p99 {:.2f} → {:.2f} ms "
                       "({:+.1f} % at p99)\n",
                       t.cpu, t.setup, t.sparsity, t.all_keep_p50_ms, t.spin_p50_ms, t.all_keep_p99_ms, t.spin_p99_ms,
                       percent(t.spin_p99_ms / t.all_keep_p99_ms - 1));
  }
  out += "\nRecommendation: ";
  if (a.recommended_sparsity) {
    out += fmt::format("sparsity {} ({}), expected decode-step gain {:+.1f} %, worst request's p99 miss {:.3f} (tolerance "
                       "{})\n",
                       *a.recommended_sparsity, a.recommended_config, percent(a.expected_gain), a.p99_miss_worst,
                       a.tolerance);
  } else {
    out += fmt::format("none within tolerance {}\n", a.tolerance);
  }
  out += a.verdict + "\n";
  if (!a.vllm_line.empty()) out += "\n  " + a.vllm_line + "\n";
  for (const std::string& n : a.notes) out += "note: " + n + "\n";
  out += "\nsources:\n";
  for (const std::string& s : a.step.sources) out += "  - " + s + "\n";
  return out;
}

namespace {

nlohmann::json jnum(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
nlohmann::json spread_json(const Spread& s) {
  return {{"median", jnum(s.median)}, {"p10", jnum(s.p10)}, {"worst", jnum(s.worst)}};
}

}  // namespace

std::string advice_json(const Advice& a) {
  const StepModel& s = a.step;
  const Deployment& d = s.deployment;
  nlohmann::json step_rows = nlohmann::json::array();
  for (const StepPoint& p : s.points) {
    step_rows.push_back({{"target_sparsity", p.target_sparsity}, {"realised_sparsity", p.realised_sparsity},
                         {"step_ms", p.step_ms}, {"gain", p.gain}, {"spin_own_ms", p.own.ms},
                         {"spin_own_measured", p.own.measured}, {"spin_own_modelled_ms", p.own.modelled_ms},
                         {"spin_own_source", p.own.source}});
  }
  nlohmann::json quality = nlohmann::json::array();
  for (const QualityPoint& q : a.quality) {
    quality.push_back({{"config", q.config}, {"target_sparsity", q.target_sparsity}, {"requests", q.requests},
                       {"realised_sparsity", jnum(q.realised_sparsity)}, {"recall_mean", spread_json(q.recall_mean)},
                       {"miss_p99", spread_json(q.miss_p99)}, {"within_tolerance", q.miss_p99.worst <= a.tolerance}});
  }
  nlohmann::json out = {
      {"deployment", {{"model", d.model}, {"gpu", d.gpu}, {"context", d.context}, {"batch", d.batch},
                      {"next_n", d.next_n}, {"tensor_parallel", d.tensor_parallel}}},
      {"indexer_share", s.indexer_share}, {"topk_share", s.topk_share},
      {"step_ms", {{"all_keep", s.step_ms}, {"indexer", s.diagnose.indexer_ms}, {"topk", s.diagnose.topk_ms},
                   {"attention", s.diagnose.attention_ms}, {"rest", s.rest.ms}}},
      {"step", step_rows}, {"quality", quality}, {"quality_requests", a.sources_of_quality},
      {"tolerance", a.tolerance}, {"pays", a.pays},
      {"recommended_sparsity", a.recommended_sparsity ? nlohmann::json(*a.recommended_sparsity) : nlohmann::json(nullptr)},
      {"recommended_config", a.recommended_sparsity ? nlohmann::json(a.recommended_config) : nlohmann::json(nullptr)},
      {"paper_config", config_overrides(paper_spin_config())},
      {"expected_gain", a.recommended_sparsity ? jnum(a.expected_gain) : nlohmann::json(nullptr)},
      {"p99_miss_worst", a.recommended_sparsity ? jnum(a.p99_miss_worst) : nlohmann::json(nullptr)},
      {"verdict", a.verdict}, {"vllm_line", a.vllm_line.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.vllm_line)},
      {"notes", a.notes}, {"sources", s.sources}, {"estimate", "paper model of the GPU step; quality measured by replay"}};
  if (a.cpu_tail) {
    const Advice::CpuTail& t = *a.cpu_tail;
    out["cpu_tail"] = {{"cpu", t.cpu}, {"setup", t.setup}, {"sparsity", t.sparsity},
                       {"all_keep_step_p50_ms", t.all_keep_p50_ms}, {"all_keep_step_p99_ms", t.all_keep_p99_ms},
                       {"spin_step_p50_ms", t.spin_p50_ms}, {"spin_step_p99_ms", t.spin_p99_ms}};
  }
  return out.dump(2) + "\n";
}

std::string advice_markdown(const Advice& a) {
  const StepModel& s = a.step;
  const Deployment& d = s.deployment;
  std::string md = "## Verdict\n\n**" + a.verdict + "**\n\n";
  md += fmt::format("For {} on {} ×{}, context {}, batch {}, next_n {} (modelled step {:.2f} ms: indexer {:.1f} %, "
                    "top-k {:.1f} %; `spin advise` takes your deployment and traces). Tolerance: worst request's p99 "
                    "miss ≤ {}.\n\n",
                    d.model, d.gpu, d.tensor_parallel, d.context, d.batch, d.next_n, s.step_ms, percent(s.indexer_share),
                    percent(s.topk_share), a.tolerance);
  md += "| config | sparsity | step gain | mean recall (median / p10 / worst) | p99 miss (median / p10 / worst) |\n"
        "|---|---:|---:|---:|---:|\n";
  for (const QualityPoint& q : a.quality) {
    const StepPoint* p = step_at(s, q.target_sparsity);
    md += fmt::format("| {} | {:.0f}% | {:+.1f}% | {} / {} / {} | {} / {} / {}{} |\n", q.config, percent(q.target_sparsity),
                      p ? percent(p->gain) : NAN, num(q.recall_mean.median), num(q.recall_mean.p10),
                      num(q.recall_mean.worst), num(q.miss_p99.median), num(q.miss_p99.p10), num(q.miss_p99.worst),
                      q.miss_p99.worst <= a.tolerance ? " ✓" : "");
  }
  if (!a.vllm_line.empty()) md += "\n```sh\n" + a.vllm_line + "\n```\n";
  return md + "\n";
}

}  // namespace spin
