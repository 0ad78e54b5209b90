// `spin bench decode`: batched DSA decode steps (predictor → masked indexer → top-k → sparse MLA
// attention → observe) for a model preset, all-keep and a predictor on identical data in one run.
//
// Reports per step (medians over the timed steps): tokens/s of the attention path, the step time's
// tail (p50 and p99, nearest rank, over every request's every timed step: a batched step is each of
// its requests' latency for that token, so the percentiles over steps are those over requests and
// steps), the stage breakdown (indexer_ms, topk_ms,
// attention_ms, predictor_ms), speedup_vs_all_keep measured in the same run, the cost model's
// prediction beside it — 1 / (1 − (indexer share · realised sparsity − predictor share)) — and
// attn_err = ‖o − o_all_keep‖ / ‖o_all_keep‖ (mean over rows). Each predictor run is paired with
// its own all-keep engine, steps interleaved, so both see the same machine conditions. A whole-model projection assumes
// the attention path is `--path-share` of a full decode step (stated in the output).
// With --source (a scenario or a key trace) the indexer replays those keys, queries and acceptance
// instead of random ones, so recall (of the all-keep top-k) and attn_err measure the predictor on
// dynamics that mean something, beside its speed; latents and attention queries stay random.
// Reproduce: spin bench decode --model deepseek-v3.2 --context 131072 --batch 8 --sparsity 0.5
//            spin bench decode --source doc-qa-94k --batch 2 --sparsity 0.5
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
#include "spin/lab/engine.h"
#include "spin/lab/metrics.h"
#include "spin/trace.h"
#include "spin/lab/workload.h"

namespace spin::bench {
namespace {

struct RunResult {
  StepStats mean;  // per-stage medians over the timed steps
  double step_ms = 0;
  double step_p50_ms = 0, step_p99_ms = 0;  // over requests and steps (nearest rank)
  double tokens_per_s = 0;
  double attn_err = NAN;
  double recall = NAN;
  double realised_sparsity = 0;
};

// Per-step samples of one engine, reduced to medians.
struct Samples {
  std::vector<double> indexer, topk, attention, predictor, total, tokens;
  SampleStats request_steps;  // each request's step latency: the batched step's time, once per request
  int32_t requests = 1;       // the batch
  int64_t scored = 0, visible = 0, err_rows = 0, recall_rows = 0;
  double err_sum = 0, recall_sum = 0;

  void add(const StepStats& st) {
    indexer.push_back(st.indexer_ms);
    topk.push_back(st.topk_ms);
    attention.push_back(st.attention_ms);
    predictor.push_back(st.predictor_ms);
    total.push_back(st.total_ms);
    for (int64_t r = 0; r < requests; ++r) request_steps.add(st.total_ms);
    tokens.push_back(static_cast<double>(st.tokens));
    scored += st.scored_entries;
    visible += st.visible_entries;
    err_sum += st.attn_err_sum;
    err_rows += st.attn_err_rows;
    recall_sum += st.recall_sum;
    recall_rows += st.recall_rows;
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
    r.step_p50_ms = request_steps.percentile(50);
    r.step_p99_ms = request_steps.percentile(99);
    double all_tokens = 0;
    for (double t : tokens) all_tokens += t;
    r.tokens_per_s = all_tokens / static_cast<double>(tokens.size()) / (r.step_ms / 1e3);
    r.attn_err = err_rows > 0 ? err_sum / static_cast<double>(err_rows) : NAN;
    r.recall = recall_rows > 0 ? recall_sum / static_cast<double>(recall_rows) : NAN;
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

template <typename... Args>
Status source_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}

// The replayed inputs of --source, with what owns their memory (a generated trace or a reader).
struct Source {
  std::string label = "random";
  Trace generated;
  std::optional<TraceReader> reader;
  IndexerInputs inputs;
  TraceMeta meta;
  bool replayed() const { return label != "random"; }
};

// Borrowed views of one trace layer's tensors, whichever owns them.
struct LayerViews {
  const uint8_t* k;
  const float* k_scale;
  const uint8_t* q;
  const float* w;
};

Status fill_inputs(Source* s, int64_t entries, int32_t steps, const int64_t* ctx_len, const int32_t* accepted,
                   const std::vector<LayerViews>& layers) {
  IndexerInputs& in = s->inputs;
  in.steps = steps;
  in.next_n = s->meta.next_n;
  in.num_heads = s->meta.num_heads;
  in.entries = entries;
  in.ctx_len = ctx_len;
  in.accepted = s->meta.next_n > 1 ? accepted : nullptr;
  for (const LayerViews& v : layers) {
    if (v.k == nullptr) return source_error("{} holds no keys (a score trace): --source needs a key trace", s->label);
    in.keys.push_back(v.k);
    in.key_scales.push_back(v.k_scale);
    in.queries.push_back(v.q);
    in.weights.push_back(v.w);
  }
  return ok_status();
}

// A scenario is generated for the bench's layers and steps; anything else is opened as a trace.
Result<std::unique_ptr<Source>> open_source(const DecodeBenchOptions& o) {
  auto s = std::make_unique<Source>();
  s->label = o.source;
  if (o.source == "random") return s;
  const int32_t steps = o.warmup + o.steps;
  const auto& names = scenario_names();
  std::vector<LayerViews> views;
  if (std::find(names.begin(), names.end(), o.source) != names.end()) {
    auto params = scenario_params(o.source);
    if (!params.ok()) return params.status();
    params->layers = o.layers;
    params->steps = steps;
    params->seed = o.seed;
    auto trace = generate_workload(params.value());
    if (!trace.ok()) return trace.status();
    s->generated = std::move(trace).value();
    s->meta = s->generated.meta;
    for (const TraceLayer& l : s->generated.layers) views.push_back({l.k.data(), l.k_scale.data(), l.q.data(), l.w.data()});
    const int64_t entries = static_cast<int64_t>(s->generated.layers[0].k_scale.size());
    SPIN_RETURN_IF_ERROR(fill_inputs(s.get(), entries, steps, s->generated.ctx_len.data(),
                                     s->generated.accepted.data(), views));
    return s;
  }
  auto reader = TraceReader::open(o.source);
  if (!reader.ok()) return reader.status();
  s->reader.emplace(std::move(reader).value());
  const TraceReader& r = *s->reader;
  s->meta = r.meta();
  if (r.num_layers() < o.layers) {
    return source_error("{} has {} layers, --layers asks for {}", o.source, r.num_layers(), o.layers);
  }
  if (r.steps() < steps) {
    return source_error("{} has {} steps, the bench needs {} (--steps {} + {} warm-up)", o.source, r.steps(),
                            steps, o.steps, o.warmup);
  }
  for (int l = 0; l < o.layers; ++l) {
    views.push_back({r.k(l).empty() ? nullptr : r.k(l).data(), r.k_scale(l).data(), r.q(l).data(), r.w(l).data()});
  }
  SPIN_RETURN_IF_ERROR(fill_inputs(s.get(), r.entries(0), steps, r.ctx_len().data(),
                                   r.accepted().empty() ? nullptr : r.accepted().data(), views));
  return s;
}

// The model preset with the source's geometry (a trace fixes page size, top-k, heads and ratio).
ModelPreset model_for(ModelPreset model, const Source& s) {
  if (!s.replayed()) return model;
  model.page_size = s.meta.page_size;
  model.topk = s.meta.topk;
  model.index_heads = s.meta.num_heads;
  model.compress_ratio = s.meta.compress_ratio;
  return model;
}

EngineConfig engine_config(const DecodeBenchOptions& o, const ModelPreset& model, const std::string& predictor,
                           double sparsity) {
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
  return c;
}

Result<std::unique_ptr<DecodeEngine>> make_engine(const DecodeBenchOptions& o, const ModelPreset& model,
                                                  const Source& source, const std::string& predictor,
                                                  double sparsity, int64_t context) {
  EngineConfig c = engine_config(o, model, predictor, sparsity);
  if (source.replayed()) {  // every request replays the source from its prompt
    const IndexerInputs& in = source.inputs;
    c.next_n = in.next_n;
    c.inputs = &in;
    auto engine = DecodeEngine::create(c, o.batch, in.ctx_len[in.steps - 1]);
    if (!engine.ok()) return engine.status();
    for (int32_t b = 0; b < o.batch; ++b) SPIN_RETURN_IF_ERROR(engine.value()->add_request(b, in.prompt_tokens()));
    return engine;
  }
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
                                                 const Source& source, double sparsity, int64_t context) {
  auto base = make_engine(o, model, source, "all-keep", 0.0, context);
  if (!base.ok()) return base.status();
  auto spin = make_engine(o, model, source, o.predictor, sparsity, context);
  if (!spin.ok()) return spin.status();
  Samples base_samples, spin_samples;
  base_samples.requests = spin_samples.requests = o.batch;
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

Result<DecodeTail> measure_decode_tail(const DecodeBenchOptions& o, double sparsity) {
  auto preset = model_preset(o.model);
  if (!preset.ok()) return preset.status();
  auto source = open_source(o);
  if (!source.ok()) return source.status();
  const ModelPreset model = model_for(preset.value(), *source.value());
  auto pair = run_pair(o, model, *source.value(), sparsity, o.contexts.front());
  if (!pair.ok()) return pair.status();
  return DecodeTail{pair->first.step_p50_ms, pair->first.step_p99_ms, pair->second.step_p50_ms, pair->second.step_p99_ms};
}

int run_decode_bench(const DecodeBenchOptions& o) {
  auto preset = model_preset(o.model);
  if (!preset.ok()) {
    fmt::print(stderr, "spin: error: {}\n", preset.status().to_string());
    return 2;
  }
  auto source = open_source(o);
  if (!source.ok()) {
    fmt::print(stderr, "spin: error: {}\n", source.status().to_string());
    return 1;
  }
  const Source& src = *source.value();
  const ModelPreset model = model_for(preset.value(), src);
  const std::vector<int64_t> contexts =
      src.replayed() ? std::vector<int64_t>{src.inputs.prompt_tokens() / model.compress_ratio} : o.contexts;
  const int32_t next_n = src.replayed() ? src.inputs.next_n : o.next_n;
  fmt::print("spin bench decode — {}: {} of {} indexer layers simulated ({} model layers), top-k {}, {} attention "
             "heads, latent {}, next_n {}, batch {}, {} timed steps (+{} warm-up)\n",
             model.name, o.layers, model.indexer_layers, model.model_layers, model.topk, model.attn_heads,
             o.latent, next_n, o.batch, o.steps, o.warmup);
  fmt::print("cpu: {}\nkernels: {}\n", cpu_summary(), kernels_of(o).to_string());
  if (src.replayed()) {
    fmt::print("source: {} ({}; page {}, top-k {}, {} heads): the indexer replays its keys, queries and acceptance; "
               "latents and attention queries are random, every request replays the same inputs\n",
               src.label, src.meta.model, src.meta.page_size, src.meta.topk, src.meta.num_heads);
  } else {
    fmt::print("source: random keys and queries (speed only: recall and attn_err mean little; see --source)\n");
  }
  fmt::print("times are per step over all simulated layers; whole-model projection assumes the attention path is "
             "{:.0f}% of a full decode step\n\n", 100 * o.path_share);
  fmt::print("{:>8} {:>12} {:>6} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7}\n",
             "context", "predictor", "sparse", "realised", "step_ms", "p50_ms", "p99_ms", "idx_ms", "topk_ms", "attn_ms", "pred_ms",
             "tok/s", "speedup", "model", "predicted", "attn_err", "recall");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : contexts) {
    // cost_fraction, measured: the indexer time the run spends (its masked indexer
    // plus the predictor's select/observe, probe included) over all-keep's indexer time.
    auto print = [&](const std::string& name, double sparsity, const RunResult& r, double speedup, double predicted,
                     double full_indexer_ms) {
      const double model_speedup = 1.0 / (1.0 - o.path_share + o.path_share / speedup);
      fmt::print("{:>8} {:>12} {:>6.2f} {:>9.3f} {:>9.2f} {:>8.2f} {:>8.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>8.1f} "
                 "{:>7.3f}x {:>7.3f}x {:>8.3f}x {:>8.4f} {:>7.4f}\n",
                 context, name, sparsity, r.realised_sparsity, r.step_ms, r.step_p50_ms, r.step_p99_ms, r.mean.indexer_ms, r.mean.topk_ms,
                 r.mean.attention_ms, r.mean.predictor_ms, r.tokens_per_s, speedup, model_speedup, predicted,
                 r.attn_err, r.recall);
      std::fflush(stdout);
      nlohmann::json rec = machine_json(o.threads);
      rec.update({{"bench", "decode"}, {"model", model.name}, {"layers", o.layers}, {"context", context},
                  {"batch", o.batch}, {"next_n", next_n}, {"source", src.label}, {"predictor", name}, {"sparsity", sparsity},
                  {"sparsity_realised", r.realised_sparsity}, {"step_ms", r.step_ms}, {"step_p50_ms", r.step_p50_ms},
                  {"step_p99_ms", r.step_p99_ms}, {"tokens_per_s", r.tokens_per_s},
                  {"indexer_ms", r.mean.indexer_ms}, {"topk_ms", r.mean.topk_ms},
                  {"attention_ms", r.mean.attention_ms}, {"predictor_ms", r.mean.predictor_ms},
                  {"speedup_vs_all_keep", speedup}, {"predicted_speedup", predicted},
                  {"model_speedup_projection", model_speedup}, {"path_share", o.path_share},
                  {"attn_err", num(r.attn_err)}, {"recall", num(r.recall)}, {"latent", o.latent}, {"peak_rss_mib", peak_rss_mib()},
                  {"kernels", kernels_of(o).to_string()},
                  {"cost_fraction", num((r.mean.indexer_ms + r.mean.predictor_ms) / full_indexer_ms)}});
      records.push_back(rec);
    };
    for (double sparsity : o.sparsities) {
      auto pair = run_pair(o, model, src, sparsity, context);
      if (!pair.ok()) {
        fmt::print(stderr, "spin: error: {}\n", pair.status().to_string());
        return 1;
      }
      const RunResult& base = pair->first;
      const RunResult& run = pair->second;
      const double saved = base.mean.indexer_ms / base.step_ms * run.realised_sparsity - run.mean.predictor_ms / base.step_ms;
      print("all-keep", 0.0, base, 1.0, 1.0, base.mean.indexer_ms);
      print(o.predictor, sparsity, run, base.step_ms / run.step_ms, 1.0 / (1.0 - saved), base.mean.indexer_ms);
    }
  }
  fmt::print("\npeak RSS {:.0f} MiB\n", peak_rss_mib());
  return finish_records(o.json_path, records);
}

}  // namespace spin::bench
