// `spin bench decode`: batched DSA decode steps (predictor → masked indexer → top-k → sparse MLA
// attention → observe) for a model preset, all-keep and a predictor on identical data in one run.
//
// Reports per step: tokens/s of the attention path, the stage breakdown (indexer_ms, topk_ms,
// attention_ms, predictor_ms), speedup_vs_all_keep measured in the same run, the cost model's
// prediction beside it — 1 / (1 − (indexer share · realised sparsity − predictor share)) — and
// attn_err = ‖o − o_all_keep‖ / ‖o_all_keep‖ (mean over rows). A whole-model projection assumes
// the attention path is `--path-share` of a full decode step (stated in the output).
// Reproduce: spin bench decode --model deepseek-v3.2 --context 131072 --batch 8 --sparsity 0.5
#include <fmt/format.h>
#include <sys/resource.h>

#include <cmath>
#include <vector>

#include "bench_common.h"
#include "spin/engine.h"

namespace spin::bench {
namespace {

struct RunResult {
  StepStats mean;
  double step_ms = 0;
  double tokens_per_s = 0;
  double attn_err = NAN;
  double realised_sparsity = 0;
};

Result<RunResult> run_engine(const DecodeBenchOptions& o, const ModelPreset& model, const std::string& predictor,
                             double sparsity, int64_t context) {
  EngineConfig c;
  c.model = model;
  c.layers = o.layers;
  c.next_n = o.next_n;
  c.acceptance_rate = o.acceptance_rate;
  c.predictor = predictor;
  c.predictor_config.target_sparsity = sparsity;
  c.latent_dtype = o.latent == "bf16" ? LatentDtype::kBf16 : LatentDtype::kFp8;
  c.threads = o.threads;
  c.seed = o.seed;
  c.measure_attn_err = o.attn_err && predictor != "all-keep";
  const int64_t max_tokens = context * model.compress_ratio * 11 / 10 + int64_t{o.steps + o.warmup} * o.next_n + 8;
  auto engine = DecodeEngine::create(c, o.batch, max_tokens);
  if (!engine.ok()) return engine.status();
  for (int32_t b = 0; b < o.batch; ++b) {
    // Ragged prompts, 0.9–1.1× the context, deterministic.
    const int64_t tokens = context * model.compress_ratio * (90 + (b * 7) % 21) / 100;
    SPIN_RETURN_IF_ERROR(engine.value()->add_request(b, tokens));
  }
  RunResult r;
  StepStats sum;
  int64_t tokens = 0, scored = 0, visible = 0;
  double err_sum = 0;
  int64_t err_rows = 0;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    StepStats st;
    SPIN_RETURN_IF_ERROR(engine.value()->step(&st));
    if (s < o.warmup) continue;
    sum.indexer_ms += st.indexer_ms;
    sum.topk_ms += st.topk_ms;
    sum.attention_ms += st.attention_ms;
    sum.predictor_ms += st.predictor_ms;
    sum.total_ms += st.total_ms;
    tokens += st.tokens;
    scored += st.scored_entries;
    visible += st.visible_entries;
    err_sum += st.attn_err_sum;
    err_rows += st.attn_err_rows;
  }
  const double n = o.steps;
  r.mean.indexer_ms = sum.indexer_ms / n;
  r.mean.topk_ms = sum.topk_ms / n;
  r.mean.attention_ms = sum.attention_ms / n;
  r.mean.predictor_ms = sum.predictor_ms / n;
  r.step_ms = sum.total_ms / n;
  r.tokens_per_s = static_cast<double>(tokens) / (sum.total_ms / 1e3);
  r.attn_err = err_rows > 0 ? err_sum / static_cast<double>(err_rows) : NAN;
  r.realised_sparsity = visible > 0 ? 1.0 - static_cast<double>(scored) / static_cast<double>(visible) : 0.0;
  return r;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

int run_decode_bench(const DecodeBenchOptions& o) {
  auto model = model_preset(o.model);
  if (!model.ok()) {
    fmt::print(stderr, "error: {}\n", model.status().to_string());
    return 2;
  }
  fmt::print("spin bench decode — {}: {} of {} indexer layers simulated ({} model layers), top-k {}, {} attention "
             "heads, latent {}, next_n {}, batch {}, {} timed steps (+{} warm-up)\n",
             model->name, o.layers, model->indexer_layers, model->model_layers, model->topk, model->attn_heads,
             o.latent, o.next_n, o.batch, o.steps, o.warmup);
  fmt::print("times are per step over all simulated layers; whole-model projection assumes the attention path is "
             "{:.0f}% of a full decode step\n\n", 100 * o.path_share);
  fmt::print("{:>8} {:>12} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}\n", "context",
             "predictor", "sparse", "realised", "step_ms", "idx_ms", "topk_ms", "attn_ms", "pred_ms", "tok/s",
             "speedup", "model", "predicted", "attn_err");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : o.contexts) {
    auto base = run_engine(o, model.value(), "all-keep", 0.0, context);
    if (!base.ok()) {
      fmt::print(stderr, "error: {}\n", base.status().to_string());
      return 1;
    }
    auto print = [&](const std::string& name, double sparsity, const RunResult& r, double speedup, double predicted) {
      const double model_speedup = 1.0 / (1.0 - o.path_share + o.path_share / speedup);
      fmt::print("{:>8} {:>12} {:>6.2f} {:>9.3f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.1f} {:>7.3f}x {:>7.3f}x "
                 "{:>8.3f}x {:>8.4f}\n",
                 context, name, sparsity, r.realised_sparsity, r.step_ms, r.mean.indexer_ms, r.mean.topk_ms,
                 r.mean.attention_ms, r.mean.predictor_ms, r.tokens_per_s, speedup, model_speedup, predicted,
                 r.attn_err);
      std::fflush(stdout);
      nlohmann::json rec = machine_json(o.threads);
      rec.update({{"bench", "decode"}, {"model", model->name}, {"layers", o.layers}, {"context", context},
                  {"batch", o.batch}, {"next_n", o.next_n}, {"predictor", name}, {"sparsity", sparsity},
                  {"sparsity_realised", r.realised_sparsity}, {"step_ms", r.step_ms}, {"tokens_per_s", r.tokens_per_s},
                  {"indexer_ms", r.mean.indexer_ms}, {"topk_ms", r.mean.topk_ms},
                  {"attention_ms", r.mean.attention_ms}, {"predictor_ms", r.mean.predictor_ms},
                  {"speedup_vs_all_keep", speedup}, {"predicted_speedup", predicted},
                  {"model_speedup_projection", model_speedup}, {"path_share", o.path_share},
                  {"attn_err", num(r.attn_err)}, {"latent", o.latent}, {"peak_rss_mib", peak_rss_mib()}});
      records.push_back(rec);
    };
    print("all-keep", 0.0, base.value(), 1.0, 1.0);
    const double indexer_share = base->mean.indexer_ms / base->step_ms;
    for (double sparsity : o.sparsities) {
      auto run = run_engine(o, model.value(), o.predictor, sparsity, context);
      if (!run.ok()) {
        fmt::print(stderr, "error: {}\n", run.status().to_string());
        return 1;
      }
      const double saved = indexer_share * run->realised_sparsity - run->mean.predictor_ms / base->step_ms;
      print(o.predictor, sparsity, run.value(), base->step_ms / run->step_ms, 1.0 / (1.0 - saved));
    }
  }
  fmt::print("\npeak RSS {:.0f} MiB\n", peak_rss_mib());
  return finish_records(o.json_path, records);
}

}  // namespace spin::bench
