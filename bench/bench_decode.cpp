// `spin bench decode`: batched DSA decode steps (predictor → masked indexer → top-k → sparse MLA
// attention → observe) for a model preset, all-keep and a predictor on identical data in one run.
//
// Reports per step (medians over the timed steps): tokens/s of the attention path, the stage breakdown (indexer_ms, topk_ms,
// attention_ms, predictor_ms), speedup_vs_all_keep measured in the same run, the cost model's
// prediction beside it — 1 / (1 − (indexer share · realised sparsity − predictor share)) — and
// attn_err = ‖o − o_all_keep‖ / ‖o_all_keep‖ (mean over rows). Each predictor run is paired with
// its own all-keep engine, steps interleaved, so both see the same machine conditions. A whole-model projection assumes
// the attention path is `--path-share` of a full decode step (stated in the output).
// Reproduce: spin bench decode --model deepseek-v3.2 --context 131072 --batch 8 --sparsity 0.5
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bench_common.h"
#include "spin/engine.h"

namespace spin::bench {
namespace {

struct RunResult {
  StepStats mean;  // per-stage medians over the timed steps
  double step_ms = 0;
  double tokens_per_s = 0;
  double attn_err = NAN;
  double realised_sparsity = 0;
};

// Per-step samples of one engine, reduced to medians.
struct Samples {
  std::vector<double> indexer, topk, attention, predictor, total, tokens;
  int64_t scored = 0, visible = 0, err_rows = 0;
  double err_sum = 0;

  void add(const StepStats& st) {
    indexer.push_back(st.indexer_ms);
    topk.push_back(st.topk_ms);
    attention.push_back(st.attention_ms);
    predictor.push_back(st.predictor_ms);
    total.push_back(st.total_ms);
    tokens.push_back(static_cast<double>(st.tokens));
    scored += st.scored_entries;
    visible += st.visible_entries;
    err_sum += st.attn_err_sum;
    err_rows += st.attn_err_rows;
  }
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  // Medians over the timed steps: a stray page-fault burst or a busy neighbour moves one step, not
  // the result. Stage medians are taken separately, so they need not add up to step_ms.
  RunResult result() const {
    RunResult r;
    r.mean.indexer_ms = median(indexer);
    r.mean.topk_ms = median(topk);
    r.mean.attention_ms = median(attention);
    r.mean.predictor_ms = median(predictor);
    r.step_ms = median(total);
    double all_tokens = 0;
    for (double t : tokens) all_tokens += t;
    r.tokens_per_s = all_tokens / static_cast<double>(tokens.size()) / (r.step_ms / 1e3);
    r.attn_err = err_rows > 0 ? err_sum / static_cast<double>(err_rows) : NAN;
    r.realised_sparsity = visible > 0 ? 1.0 - static_cast<double>(scored) / static_cast<double>(visible) : 0.0;
    return r;
  }
};

// The engine's kernels: defaults, with the indexer and attention paths forced when named.
EngineKernels kernels_of(const DecodeBenchOptions& o) {
  EngineKernels k;
  for (IndexerImpl impl : indexer_impls()) {
    if (o.indexer_impl == indexer_impl_name(impl)) k.indexer.impl = impl;
  }
  for (AttentionImpl impl : attention_impls()) {
    if (o.attention_impl == attention_impl_name(impl)) k.attention.impl = impl;
  }
  return k;
}

Result<std::unique_ptr<DecodeEngine>> make_engine(const DecodeBenchOptions& o, const ModelPreset& model,
                                                  const std::string& predictor, double sparsity, int64_t context) {
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
  c.kernels = kernels_of(o);
  const int64_t max_tokens = context * model.compress_ratio * 11 / 10 + int64_t{o.steps + o.warmup} * o.next_n + 8;
  auto engine = DecodeEngine::create(c, o.batch, max_tokens);
  if (!engine.ok()) return engine.status();
  for (int32_t b = 0; b < o.batch; ++b) {
    // Ragged prompts, 0.9–1.1× the context, deterministic.
    const int64_t tokens = context * model.compress_ratio * (90 + (b * 7) % 21) / 100;
    SPIN_RETURN_IF_ERROR(engine.value()->add_request(b, tokens));
  }
  return engine;
}

// All-keep and the predictor on identical data, their steps interleaved (alternating which goes
// first), so that drift on a shared machine hits both alike; the speedup is the ratio of medians.
Result<std::pair<RunResult, RunResult>> run_pair(const DecodeBenchOptions& o, const ModelPreset& model,
                                                 double sparsity, int64_t context) {
  auto base = make_engine(o, model, "all-keep", 0.0, context);
  if (!base.ok()) return base.status();
  auto spin = make_engine(o, model, o.predictor, sparsity, context);
  if (!spin.ok()) return spin.status();
  Samples base_samples, spin_samples;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    StepStats a, b;
    if (s % 2 == 0) {
      SPIN_RETURN_IF_ERROR(base.value()->step(&a));
      SPIN_RETURN_IF_ERROR(spin.value()->step(&b));
    } else {
      SPIN_RETURN_IF_ERROR(spin.value()->step(&b));
      SPIN_RETURN_IF_ERROR(base.value()->step(&a));
    }
    if (s < o.warmup) continue;
    base_samples.add(a);
    spin_samples.add(b);
  }
  return std::make_pair(base_samples.result(), spin_samples.result());
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
    fmt::print(stderr, "spin: error: {}\n", model.status().to_string());
    return 2;
  }
  fmt::print("spin bench decode — {}: {} of {} indexer layers simulated ({} model layers), top-k {}, {} attention "
             "heads, latent {}, next_n {}, batch {}, {} timed steps (+{} warm-up)\n",
             model->name, o.layers, model->indexer_layers, model->model_layers, model->topk, model->attn_heads,
             o.latent, o.next_n, o.batch, o.steps, o.warmup);
  fmt::print("kernels: {}\n", kernels_of(o).to_string());
  fmt::print("times are per step over all simulated layers; whole-model projection assumes the attention path is "
             "{:.0f}% of a full decode step\n\n", 100 * o.path_share);
  fmt::print("{:>8} {:>12} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8}\n", "context",
             "predictor", "sparse", "realised", "step_ms", "idx_ms", "topk_ms", "attn_ms", "pred_ms", "tok/s",
             "speedup", "model", "predicted", "attn_err");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : o.contexts) {
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
                  {"attn_err", num(r.attn_err)}, {"latent", o.latent}, {"peak_rss_mib", peak_rss_mib()},
                  {"kernels", kernels_of(o).to_string()}});
      records.push_back(rec);
    };
    for (double sparsity : o.sparsities) {
      auto pair = run_pair(o, model.value(), sparsity, context);
      if (!pair.ok()) {
        fmt::print(stderr, "spin: error: {}\n", pair.status().to_string());
        return 1;
      }
      const RunResult& base = pair->first;
      const RunResult& run = pair->second;
      const double saved = base.mean.indexer_ms / base.step_ms * run.realised_sparsity - run.mean.predictor_ms / base.step_ms;
      print("all-keep", 0.0, base, 1.0, 1.0);
      print(o.predictor, sparsity, run, base.step_ms / run.step_ms, 1.0 / (1.0 - saved));
    }
  }
  fmt::print("\npeak RSS {:.0f} MiB\n", peak_rss_mib());
  return finish_records(o.json_path, records);
}

}  // namespace spin::bench
