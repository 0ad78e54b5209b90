// What a replay writes or converts: the key trace → score trace conversion (all-keep scores plus
// hisa's block probe), the memory estimate, replay's JSON line and the top-k dump.
#include "spin/lab/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "trace/safetensors.h"
#include "eval/scored_trace.h"
#include "predict/hisa.h"
#include "spin/predictor_inputs.h"
#include "spin/trace.h"

namespace spin {

using replay_internal::at_row;

namespace {

// hisa's block score (predict/hisa.h) of every row of `layer`, written as the score trace's probe
// [steps, next_n, ceil(entries / page_size)]: the same HisaKeys, fed the same committed prefix
// (row 0's visible entries) step by step, so hisa ranks the converted trace exactly as the key
// trace. Blocks past a row's visible ones are -inf (ignored by the reader).
Result<std::vector<float>> hisa_probe(const Trace& trace, const ScoredTrace& st, int32_t layer, int64_t entries) {
  PredictorConfig config;
  config.page_size = st.page_size;
  config.block_pages = 1;
  const int64_t blocks = blocks_for_entries(config, entries);
  std::vector<float> probe(static_cast<size_t>(st.steps * st.next_n * blocks), -std::numeric_limits<float>::infinity());
  HisaKeys keys(config.block_entries());
  std::vector<float> scratch;
  for (int64_t s = 0; s < st.steps; ++s) {
    HisaView v;
    v.key_cache = st.caches[layer].data();
    v.page_size = st.page_size;
    v.block_table = st.identity_pages.data();
    v.num_entries = st.entries_at(s);
    v.q = trace.layers[layer].q.data() + static_cast<size_t>(s) * st.next_n * st.num_heads * kIndexerHeadDim;
    v.w = trace.layers[layer].w.data() + static_cast<size_t>(s) * st.next_n * st.num_heads;
    v.num_heads = st.num_heads;
    v.num_cache_pages = static_cast<int64_t>(st.identity_pages.size());
    SPIN_RETURN_IF_ERROR(at_row(keys.update(v, st.visible_entries[st.index(layer, s, 0)]), layer, s));
    for (int32_t j = 0; j < st.next_n; ++j) {
      const int64_t n = blocks_for_entries(config, st.visible_entries[st.index(layer, s, j)]);
      int64_t scored = 0;
      SPIN_RETURN_IF_ERROR(at_row(keys.score(v, j, n, config.block_entries(), probe.data() + (s * st.next_n + j) * blocks,
                                             &scored, &scratch),
                                  layer, s));
    }
  }
  return probe;
}

}  // namespace

Result<ScoreTrace> all_keep_score_trace(const Trace& trace, const ScoreOptions& options) {
  auto scored = score_trace(trace, options);
  if (!scored.ok()) return scored.status();
  const ScoredTrace& st = *scored.value();
  ScoreTrace out;
  out.meta = trace.meta;
  out.meta.kind = TraceKind::kScores;
  out.meta.extra.erase("probe_block_entries");  // the field below says it
  out.probe_block_entries = st.page_size;
  out.ctx_len = trace.ctx_len;
  out.accepted = trace.accepted;
  for (int32_t l = 0; l < st.layers; ++l) {
    const int64_t entries = static_cast<int64_t>(trace.layers[l].k_scale.size());
    out.entries.push_back(entries);
    std::vector<float>& rows = out.scores.emplace_back(static_cast<size_t>(st.steps * st.next_n * entries),
                                                       -std::numeric_limits<float>::infinity());
    for (int64_t s = 0; s < st.steps; ++s) {
      for (int32_t j = 0; j < st.next_n; ++j) {
        const std::vector<float>& v = st.scores[st.index(l, s, j)];
        std::copy(v.begin(), v.end(), rows.begin() + (s * st.next_n + j) * entries);
      }
    }
    auto probe = hisa_probe(trace, st, l, entries);
    if (!probe.ok()) return probe.status();
    out.probe.push_back(std::move(probe).value());
  }
  return out;
}

double replay_memory_bytes(const TraceReader& r, bool keep_topk) {
  const TraceMeta& m = r.meta();
  double row_entries = 0;  // Σ over steps and rows of the entries a row sees
  for (int64_t s = 0; s < r.steps(); ++s) {
    for (int32_t j = 0; j < m.next_n; ++j) row_entries += static_cast<double>(r.visible_entries(s, j));
  }
  double cache_entries = 0;  // a score trace builds no cache
  for (int32_t l = 0; l < m.num_layers && r.kind() == TraceKind::kKeys; ++l) cache_entries += static_cast<double>(r.entries(l));
  const double rows = static_cast<double>(m.num_layers) * static_cast<double>(r.steps()) * m.next_n;
  const double topk_bytes = rows * m.topk * sizeof(int32_t);
  return static_cast<double>(r.file_size())                         // the trace, read into memory
         + cache_entries * (kIndexerHeadDim + sizeof(float))         // paged fp8 caches
         + static_cast<double>(m.num_layers) * row_entries * sizeof(float)  // all-keep scores
         + topk_bytes * (keep_topk ? 2 : 1);                          // all-keep (and kept) top-k
}

std::string replay_json(const std::string& trace_path, const ReplayResult& result, const TraceFacts& facts) {
  const QualityStats& q = result.quality;
  nlohmann::json out = {
      {"trace", trace_path}, {"predictor", result.predictor}, {"open_loop", result.open_loop},
      {"config", result.config.to_string()}, {"samples", q.samples()},
      {"exact_by_construction", q.exact_by_construction()}, {"recall_mean", q.recall().mean()},
      {"miss_p50", q.miss().percentile(50)}, {"miss_p99", q.miss().percentile(99)}, {"miss_max", q.miss().max()},
      {"block_recall_mean", q.block_recall().mean()}, {"sparsity_mean", q.sparsity().mean()},
      {"block_sparsity_mean", q.block_sparsity().mean()}, {"pearson_mean", q.pearson().mean()},
      {"topk_recall_mean", q.topk_recall().mean()}, {"topk_block_share", facts.topk_block_share},
      {"prefill_steps", result.prefill_steps}, {"predictor_seconds", result.predictor_seconds},
      {"work_fraction", q.work_fraction()}, {"probe_fraction", q.probe_fraction()},
      {"overhead_fraction", result.overhead_fraction()}, {"cost_fraction", result.cost_fraction()},
      {"indexer_entry_seconds", result.indexer_entry_seconds}};
  for (auto& [k, v] : out.items()) {
    if (v.is_number_float() && !std::isfinite(v.get<double>())) v = nullptr;  // JSON has no NaN
  }
  return out.dump(2) + "\n";
}

Status write_topk_dump(const std::string& path, const Trace& trace, const ReplayResult& result) {
  return write_topk_dump(path, trace.steps(), trace.meta.next_n, result);
}

Status write_topk_dump(const std::string& path, int64_t steps, int32_t next_n, const ReplayResult& result) {
  if (result.topk.empty()) return failed_precondition("the replay kept no top-k (run it with keep_topk)");
  const int32_t k = result.config.topk;
  std::vector<std::vector<int32_t>> flat(result.topk.size());
  std::vector<st::TensorSpec> tensors;
  for (size_t l = 0; l < result.topk.size(); ++l) {
    for (const auto& row : result.topk[l]) flat[l].insert(flat[l].end(), row.begin(), row.end());
    tensors.push_back({"layer." + std::to_string(l) + ".topk", st::Dtype::kI32,
                       {steps, next_n, k}, flat[l].data(), flat[l].size() * sizeof(int32_t)});
  }
  return st::write_safetensors(path, tensors,
                               {{"format", "spin-topk"}, {"version", "1"}, {"predictor", result.predictor},
                                {"config", result.config.to_string()}});
}

}  // namespace spin

