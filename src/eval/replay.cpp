// Trace replay: all-keep ground truth (real indexer + top-k kernels) and closed/open-loop replay
// of a predictor against it (see spin/replay.h).
#include "spin/replay.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "eval/safetensors.h"
#include "predict/hisa.h"
#include "predict/pooling.h"
#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/predictor_inputs.h"
#include "spin/memory.h"
#include "spin/topk.h"

#include <nlohmann/json.hpp>

namespace spin {
namespace {

// Names where in the trace a failure happened ("layer 3, step 17, row 1: ...").
Status at_row(const Status& s, int32_t layer, int64_t step, int32_t row = -1) {
  if (s.ok()) return s;
  const std::string where = row >= 0 ? fmt::format("layer {}, step {}, row {}", layer, step, row)
                                     : fmt::format("layer {}, step {}", layer, step);
  return {s.code(), where + ": " + s.message()};
}

}  // namespace

class ScoredTrace {
 public:
  int32_t layers = 0;
  int32_t next_n = 1;
  int32_t num_heads = 64;
  int32_t topk = 2048;
  int32_t page_size = kDefaultPageSize;
  int32_t compress_ratio = 1;
  int64_t steps = 0;
  std::vector<int64_t> ctx_len;
  std::vector<int32_t> accepted;        // [steps], or empty
  bool has_keys = false;                // built from a key trace (caches below are filled)
  std::vector<IndexerKeyCache> caches;  // one per layer, pages in logical order
  std::vector<int32_t> identity_pages;  // logical page i = physical page i
  // Indexed by (layer · steps + step) · next_n + row.
  std::vector<std::vector<float>> scores;   // [visible] all-keep scores
  std::vector<std::vector<int32_t>> truth;  // [topk] all-keep top-k, -1 padded
  std::vector<int64_t> visible_entries;  // entries each row sees
  // A score trace's block probe (ScoreTrace::probe), [layers][steps, next_n, probe_blocks[l]]; empty if none.
  std::vector<std::vector<float>> probe;
  std::vector<int64_t> probe_blocks;  // [layers]
  int32_t probe_block_entries = 0;

  size_t index(int32_t l, int64_t s, int32_t j) const {
    return static_cast<size_t>((l * steps + s) * next_n + j);
  }
  int64_t entries_at(int64_t s) const {
    return spin::visible_entries(ctx_len[s], next_n, next_n - 1, compress_ratio);
  }
};

namespace {
Status check_topk_override(const ScoreOptions& options) {
  if (options.topk < 0 || options.topk > kTraceMaxTopk) {
    return invalid_argument("score options: topk {} is outside [0, {}] (0 = the trace's)", options.topk, kTraceMaxTopk);
  }
  if (options.threads < 0 || options.threads > max_threads()) {
    return invalid_argument("score options: threads {} is outside 0..{} (this machine's logical CPUs; 0 = all)",
                            options.threads, max_threads());
  }
  return ok_status();
}

// The scored trace's header, shared by both kinds: the trace's geometry, the truth's top-k.
Result<std::shared_ptr<ScoredTrace>> scored_header(const TraceMeta& m, const std::vector<int64_t>& ctx_len,
                                                   const std::vector<int32_t>& accepted, const ScoreOptions& options) {
  SPIN_RETURN_IF_ERROR(check_topk_override(options));
  auto st = std::make_shared<ScoredTrace>();
  st->layers = m.num_layers;
  st->next_n = m.next_n;
  st->num_heads = m.num_heads;
  st->topk = options.topk > 0 ? options.topk : m.topk;
  st->page_size = m.page_size;
  st->compress_ratio = m.compress_ratio;
  st->steps = static_cast<int64_t>(ctx_len.size());
  st->ctx_len = ctx_len;
  st->accepted = accepted;
  return st;
}
}  // namespace

Result<std::shared_ptr<const ScoredTrace>> score_trace(const Trace& trace, const ScoreOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_trace(trace));
  const TraceMeta& m = trace.meta;
  auto header = scored_header(m, trace.ctx_len, trace.accepted, options);
  if (!header.ok()) return header.status();
  std::shared_ptr<ScoredTrace> st = std::move(header).value();
  const int32_t k = st->topk;  // the truth's top-k
  st->has_keys = true;
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const int64_t entries = static_cast<int64_t>(trace.layers[0].k_scale.size());
  const int32_t pages = static_cast<int32_t>(std::max<int64_t>(1, (entries + m.page_size - 1) / m.page_size));
  st->identity_pages.resize(pages);
  for (int32_t i = 0; i < pages; ++i) st->identity_pages[i] = i;
  for (int32_t l = 0; l < m.num_layers; ++l) {
    auto cache = IndexerKeyCache::create(m.page_size, pages);
    if (!cache.ok()) return cache.status();
    SPIN_RETURN_IF_ERROR(cache->write_quantized(st->identity_pages.data(), pages, 0, trace.layers[l].k.data(),
                                                trace.layers[l].k_scale.data(), entries));
    st->caches.push_back(std::move(cache).value());
  }
  const size_t n = static_cast<size_t>(m.num_layers) * st->steps * m.next_n;
  st->scores.resize(n);
  st->truth.resize(n);
  st->visible_entries.resize(n);
  std::vector<float> logits;
  std::vector<int32_t> topk_out;
  const int64_t total = int64_t{m.num_layers} * st->steps;
  int64_t done = 0;
  for (int32_t l = 0; l < m.num_layers; ++l) {
    for (int64_t s = 0; s < st->steps; ++s) {
      const int64_t cols = std::max<int64_t>(1, st->entries_at(s));
      logits.resize(static_cast<size_t>(m.next_n) * cols);
      IndexerParams p;
      p.key_cache = st->caches[l].data();
      p.page_size = m.page_size;
      p.num_pages = pages;
      p.block_table = st->identity_pages.data();
      p.block_table_stride = pages;
      p.batch = 1;
      p.context_lens = &st->ctx_len[s];
      p.next_n = m.next_n;
      p.compress_ratio = m.compress_ratio;
      p.num_heads = m.num_heads;
      p.q = trace.layers[l].q.data() + static_cast<size_t>(s) * m.next_n * m.num_heads * kIndexerHeadDim;
      p.weights = trace.layers[l].w.data() + static_cast<size_t>(s) * m.next_n * m.num_heads;
      p.logits = logits.data();
      p.logits_stride = cols;
      p.logits_cols = cols;
      SPIN_RETURN_IF_ERROR(at_row(indexer_scores(p, {IndexerImpl::kAuto, threads}), l, s));
      std::vector<int64_t> visible_entries(static_cast<size_t>(m.next_n));
      for (int32_t j = 0; j < m.next_n; ++j) {
        visible_entries[j] = spin::visible_entries(st->ctx_len[s], m.next_n, j, m.compress_ratio);
      }
      topk_out.resize(static_cast<size_t>(m.next_n) * k);
      TopkParams tp{logits.data(), cols, m.next_n, cols, visible_entries.data(), k, topk_out.data(), k};
      SPIN_RETURN_IF_ERROR(at_row(topk(tp, {TopkImpl::kAuto, threads}), l, s));
      for (int32_t j = 0; j < m.next_n; ++j) {
        const size_t i = st->index(l, s, j);
        st->visible_entries[i] = visible_entries[j];
        st->scores[i].assign(logits.begin() + j * cols, logits.begin() + j * cols + visible_entries[j]);
        st->truth[i].assign(topk_out.begin() + j * k, topk_out.begin() + (j + 1) * k);
      }
      if (options.progress) options.progress(++done, total);
    }
  }
  return std::shared_ptr<const ScoredTrace>(std::move(st));
}

Result<std::shared_ptr<const ScoredTrace>> score_trace(const ScoreTrace& trace, const ScoreOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_score_trace(trace));
  const TraceMeta& m = trace.meta;
  auto header = scored_header(m, trace.ctx_len, trace.accepted, options);
  if (!header.ok()) return header.status();
  std::shared_ptr<ScoredTrace> st = std::move(header).value();
  const int32_t k = st->topk;  // the truth's top-k
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const size_t n = static_cast<size_t>(m.num_layers) * st->steps * m.next_n;
  st->scores.resize(n);
  st->truth.resize(n);
  st->visible_entries.resize(n);
  // The same top-k call as score_trace(Trace): rows of `cols` columns, -inf past each row's
  // visible prefix (what the indexer writes there), so both paths give bitwise the same truth.
  std::vector<float> logits;
  std::vector<int32_t> topk_out;
  std::vector<int64_t> visible(static_cast<size_t>(m.next_n));
  const int64_t total = int64_t{m.num_layers} * st->steps;
  int64_t done = 0;
  for (int32_t l = 0; l < m.num_layers; ++l) {
    for (int64_t s = 0; s < st->steps; ++s) {
      const int64_t cols = std::max<int64_t>(1, st->entries_at(s));
      logits.assign(static_cast<size_t>(m.next_n) * cols, -std::numeric_limits<float>::infinity());
      for (int32_t j = 0; j < m.next_n; ++j) {
        visible[j] = spin::visible_entries(st->ctx_len[s], m.next_n, j, m.compress_ratio);
        const float* row = trace.row(l, s, j);
        std::copy(row, row + visible[j], logits.begin() + j * cols);
      }
      topk_out.resize(static_cast<size_t>(m.next_n) * k);
      TopkParams tp{logits.data(), cols, m.next_n, cols, visible.data(), k, topk_out.data(), k};
      SPIN_RETURN_IF_ERROR(at_row(topk(tp, {TopkImpl::kAuto, threads}), l, s));
      for (int32_t j = 0; j < m.next_n; ++j) {
        const size_t i = st->index(l, s, j);
        st->visible_entries[i] = visible[j];
        st->scores[i].assign(logits.begin() + j * cols, logits.begin() + j * cols + visible[j]);
        st->truth[i].assign(topk_out.begin() + j * k, topk_out.begin() + (j + 1) * k);
      }
      if (options.progress) options.progress(++done, total);
    }
  }
  if (trace.has_probe()) {
    st->probe = trace.probe;
    st->probe_block_entries = trace.probe_entries();
    for (int32_t l = 0; l < m.num_layers; ++l) st->probe_blocks.push_back(trace.probe_blocks(l));
  }
  return std::shared_ptr<const ScoredTrace>(std::move(st));
}

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

bool has_keys(const ScoredTrace& scored) { return scored.has_keys; }
bool has_probe(const ScoredTrace& scored) { return !scored.probe.empty(); }
int32_t probe_block_entries(const ScoredTrace& scored) { return scored.probe_block_entries; }

bool replayed_as_prefill(const ScoredTrace& st, int64_t s, const ReplayOptions& options) {
  if (s == 0) return options.warm_start;
  return options.prefill_jumps && s < st.steps && context_jump_is_prefill(st.ctx_len[s - 1], st.ctx_len[s], st.next_n);
}

namespace {

// Max-pooled block scores of one row over its first `n_blocks` blocks (-inf where nothing is finite).
void max_pool_blocks(const std::vector<float>& scores, int64_t n_blocks, int32_t block_entries, std::vector<double>* out) {
  out->assign(static_cast<size_t>(n_blocks), -std::numeric_limits<double>::infinity());
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(scores.size()), n_blocks * block_entries);
  for (int64_t e = 0; e < n; ++e) (*out)[e / block_entries] = std::max<double>((*out)[e / block_entries], scores[e]);
}

// Pearson correlation over the blocks where both rows are finite (NaN with fewer than 3).
double finite_pearson(const std::vector<double>& a, const std::vector<double>& b) {
  double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
  int64_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    sa += a[i], sb += b[i], saa += a[i] * a[i], sbb += b[i] * b[i], sab += a[i] * b[i];
    ++n;
  }
  if (n < 3) return NAN;
  const double m = static_cast<double>(n);
  const double cov = sab - sa * sb / m, va = saa - sa * sa / m, vb = sbb - sb * sb / m;
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : NAN;
}

}  // namespace

Status check_trace_facts(const ScoredTrace& st, int32_t block_entries, int32_t layer) {
  if (block_entries < 1)
    return invalid_argument("trace facts: block_entries {} must be ≥ 1 (entries per block)", block_entries);
  if (layer >= st.layers)
    return out_of_range("trace facts: layer {} is outside [0, {})", layer, st.layers);
  return ok_status();
}

TraceFacts trace_facts(const ScoredTrace& st, int32_t block_entries, int32_t layer) {
  TraceFacts facts;
  if (!check_trace_facts(st, block_entries, layer).ok()) return facts;
  double share_sum = 0;
  double recall_sum = 0;
  int64_t recall_n = 0;
  int64_t visible_sum = 0;
  double pearson_sum = 0;
  int64_t pearson_n = 0;
  std::vector<double> pooled_prev, pooled;
  for (int32_t l = 0; l < st.layers; ++l) {
    if (layer >= 0 && l != layer) continue;
    for (int64_t s = 0; s < st.steps; ++s) {
      for (int32_t j = 0; j < st.next_n; ++j) {
        const size_t i = st.index(l, s, j);
        ++facts.samples;
        visible_sum += st.visible_entries[i];
        if (st.visible_entries[i] <= st.topk) {
          ++facts.exact_by_construction;
          continue;
        }
        const int64_t n_blocks = (st.visible_entries[i] + block_entries - 1) / block_entries;
        std::vector<char> hit(static_cast<size_t>(n_blocks), 0);
        int64_t hits = 0;
        for (int32_t pos : st.truth[i]) {
          if (pos >= 0 && !hit[pos / block_entries]) {
            hit[pos / block_entries] = 1;
            ++hits;
          }
        }
        share_sum += static_cast<double>(hits) / static_cast<double>(n_blocks);
        if (j == 0 && s > 0) {
          const size_t prev = st.index(l, s - 1, 0);
          recall_sum += recall(st.truth[prev], st.truth[i]);
          ++recall_n;
          // How stable block scores are between steps, over the blocks both steps see.
          const int64_t common = (st.visible_entries[prev] + block_entries - 1) / block_entries;
          max_pool_blocks(st.scores[prev], common, block_entries, &pooled_prev);
          max_pool_blocks(st.scores[i], common, block_entries, &pooled);
          const double r = finite_pearson(pooled_prev, pooled);
          if (std::isfinite(r)) {
            pearson_sum += r;
            ++pearson_n;
          }
        }
      }
    }
  }
  const int64_t measured = facts.samples - facts.exact_by_construction;
  facts.topk_block_share = measured > 0 ? share_sum / static_cast<double>(measured) : 0.0;
  facts.prev_step_topk_recall = recall_n > 0 ? recall_sum / static_cast<double>(recall_n) : 0.0;
  facts.prev_step_block_pearson = pearson_n > 0 ? pearson_sum / static_cast<double>(pearson_n) : NAN;
  facts.mean_visible_entries =
      facts.samples > 0 ? static_cast<double>(visible_sum) / static_cast<double>(facts.samples) : 0.0;
  return facts;
}

namespace {

using Clock = std::chrono::steady_clock;

int64_t scored_entries_in(const std::vector<int32_t>& blocks, int64_t visible, int32_t block_entries) {
  int64_t scored = 0;
  for (int32_t b : blocks) {
    const int64_t begin = int64_t{b} * block_entries;
    if (begin < visible) scored += std::min<int64_t>(block_entries, visible - begin);
  }
  return scored;
}

int64_t blocks_within(const std::vector<int32_t>& blocks, int64_t visible, int32_t block_entries) {
  int64_t n = 0;
  for (int32_t b : blocks) n += int64_t{b} * block_entries < visible;
  return n;
}

}  // namespace

namespace {

// Refuses a predictor that reads keys on a trace that has neither keys nor a probe.
Status check_keys_or_probe(const ReplayOptions& options, const ScoredTrace& st, bool with_keys) {
  if (predictor_needs_keys(options.predictor) && !with_keys && st.probe.empty()) {
    return failed_precondition(
        "predictor {} needs the indexer's keys and queries (it scores pooled block keys with the step's query); "
        "this score trace has only scores and no block probe (layer.{{l}}.probe): replay a key trace, a score "
        "trace with a probe (spin trace convert --to scores writes one), or a score-only predictor",
        options.predictor);
  }
  return ok_status();
}

// ... or whose probe is pooled over another block size than the (validated) config's.
Status check_probe_fits(const ReplayOptions& options, const ScoredTrace& st, bool with_keys,
                        const PredictorConfig& config) {
  if (predictor_needs_keys(options.predictor) && !with_keys && st.probe_block_entries != config.block_entries()) {
    return failed_precondition("predictor {} reads the trace's block probe, pooled over {} entries, but its blocks "
                               "hold {} (page_size {} x block_pages {}): replay it with block_pages {}",
                               options.predictor, st.probe_block_entries, config.block_entries(), config.page_size,
                               config.block_pages,
                               st.probe_block_entries % config.page_size == 0 ? st.probe_block_entries / config.page_size : 0);
  }
  return ok_status();
}

// One replay: the walk over (step, layer, row) in decode order, its reused buffers and its
// clocks. Closed and open loop share the walk; a row differs only in which scores the predictor
// sees (closed_row / open_row). `trace` (keys and queries, for hisa) may be null.
class Replayer {
 public:
  Replayer(const Trace* trace, const ScoredTrace& st, const ReplayOptions& options, PredictorConfig config,
           std::unique_ptr<BlockPredictor> predictor)
      : trace_(trace), st_(st), options_(options), config_(config), predictor_(std::move(predictor)),
        with_keys_(trace != nullptr && st.has_keys), E_(config.block_entries()),
        reuses_previous_topk_(find_predictor(options.predictor)->reuses_previous_topk),
        count_end_(options.count_to_step < 0 ? st.steps : options.count_to_step) {
    result_.predictor = options.predictor;
    result_.config = config;
    result_.open_loop = options.open_loop;
    result_.quality = QualityStats(st.topk);
    if (options.keep_topk) {
      result_.topk.assign(static_cast<size_t>(st.layers),
                          std::vector<std::vector<int32_t>>(static_cast<size_t>(st.steps * st.next_n)));
    }
    spin_topk_.resize(static_cast<size_t>(st.topk));
    true_topk_.resize(static_cast<size_t>(st.next_n) * st.topk);
    visible_entries_.resize(static_cast<size_t>(st.next_n));
  }

  Result<ReplayResult> run() {
    for (int64_t s = 0; s < st_.steps; ++s) {
      if (replayed_as_prefill(st_, s, options_)) {
        SPIN_RETURN_IF_ERROR(prefill_step(s));
      } else {
        SPIN_RETURN_IF_ERROR(decode_step(s));
      }
      if (options_.after_step) options_.after_step(s, *predictor_);
      if (options_.progress) options_.progress(s + 1, st_.steps);
    }
    result_.predictor_seconds = predictor_seconds_;
    result_.overhead_seconds = std::max(0.0, overhead_seconds_);
    // A key trace's own heads (the kernel it ran); for a score trace, whose scores may come from
    // anything (a real model's attention), the DSA indexer's 64.
    result_.indexer_entry_seconds = indexer_entry_seconds(st_.has_keys && st_.num_heads > 0 ? st_.num_heads : 64);
    return std::move(result_);
  }

 private:
  // The engine scored these rows in full (prefill): every predictor observes the kept rows
  // 0..accepted at once, whatever its MTP mode, and nothing here is a sample.
  Status prefill_step(int64_t s) {
    ++result_.prefill_steps;
    const int32_t accepted = accepted_at(s);
    for (int32_t l = 0; l < st_.layers; ++l) {
      for (int32_t j = 0; j < st_.next_n; ++j) {
        const size_t i = st_.index(l, s, j);
        if (options_.keep_topk) result_.topk[l][static_cast<size_t>(s * st_.next_n + j)] = st_.truth[i];
        if (j > accepted) continue;  // rejected drafts were never tokens of the sequence
        const RowScores rs = full_row(i);
        const auto t0 = Clock::now();
        SPIN_RETURN_IF_ERROR(at_row(predictor_->observe_prefill(l, s, rs), l, s, j));
        predictor_seconds_ += seconds_since(t0);
      }
    }
    return ok_status();
  }

  Status decode_step(int64_t s) {
    const bool counted = s >= options_.count_from_step && s < count_end_;
    for (int32_t l = 0; l < st_.layers; ++l) {
      SPIN_RETURN_IF_ERROR(select_layer(s, l, counted));
      for (int32_t j = 0; j < st_.next_n; ++j) {
        const size_t i = st_.index(l, s, j);
        RowQuality q;
        q.visible_entries = st_.visible_entries[i];
        q.visible_blocks = (q.visible_entries + E_ - 1) / E_;
        RowScores rs;
        rs.num_cols = q.visible_entries;
        rs.visible_entries = q.visible_entries;
        if (!options_.open_loop) {
          SPIN_RETURN_IF_ERROR(closed_row(s, l, j, &q, &rs));
        } else {
          SPIN_RETURN_IF_ERROR(open_row(s, l, j, &q, &rs));
        }
        if (counted) result_.quality.add(q);
        const auto t0 = Clock::now();
        SPIN_RETURN_IF_ERROR(at_row(predictor_->observe(l, j, rs), l, s, j));
        charge(seconds_since(t0), counted);
      }
    }
    const auto t0 = Clock::now();
    if (Status c = predictor_->commit(accepted_at(s)); !c.ok()) {
      return Status(c.code(), fmt::format("step {}: {}", s, c.message()));
    }
    charge(seconds_since(t0), counted);
    return ok_status();
  }

  // The predictor's select for layer l of step s, with the step's input (true top-k, the key
  // cache and query, or the recorded probe).
  Status select_layer(int64_t s, int32_t l, bool counted) {
    const int32_t next_n = st_.next_n;
    for (int32_t j = 0; j < next_n; ++j) {
      const size_t i = st_.index(l, s, j);
      std::copy(st_.truth[i].begin(), st_.truth[i].end(), true_topk_.begin() + int64_t{j} * st_.topk);
      visible_entries_[j] = st_.visible_entries[i];
    }
    HisaView hisa;
    if (trace_ != nullptr && st_.has_keys) {
      hisa.key_cache = st_.caches[l].data();
      hisa.page_size = st_.page_size;
      hisa.block_table = st_.identity_pages.data();
      hisa.num_entries = st_.entries_at(s);
      hisa.q = trace_->layers[l].q.data() + static_cast<size_t>(s) * next_n * st_.num_heads * kIndexerHeadDim;
      hisa.w = trace_->layers[l].w.data() + static_cast<size_t>(s) * next_n * st_.num_heads;
      hisa.num_heads = st_.num_heads;
      hisa.num_cache_pages = static_cast<int64_t>(st_.identity_pages.size());
    }
    StepInput in;
    in.step = s;
    in.num_entries = st_.entries_at(s);
    in.next_n = next_n;
    in.visible_entries = st_.compress_ratio > 1 ? visible_entries_.data() : nullptr;
    PredictorInputs inputs;
    inputs.true_topk = true_topk_.data();
    inputs.hisa = with_keys_ ? &hisa : nullptr;
    // The recorded probe of this step, [next_n][probe_blocks], at the blocks the predictor uses.
    if (!st_.probe.empty() && st_.probe_block_entries == E_) {
      inputs.block_probe = st_.probe[l].data() + s * next_n * st_.probe_blocks[l];
      inputs.block_probe_stride = st_.probe_blocks[l];
      inputs.block_probe_entries = st_.probe_block_entries;
    }
    in.inputs = &inputs;
    in.want_scores = options_.open_loop;
    const auto t0 = Clock::now();
    SPIN_RETURN_IF_ERROR(at_row(predictor_->select(l, in, &sel_), l, s));
    const double seconds = seconds_since(t0);
    predictor_seconds_ += seconds;
    if (counted) overhead_seconds_ += seconds - sel_.probe_seconds;
    return ok_status();
  }

  // Closed loop: only the union's blocks were scored (what the masked kernel writes); top-k runs
  // on them, and the row is judged against the truth.
  Status closed_row(int64_t s, int32_t l, int32_t j, RowQuality* q, RowScores* rs) {
    const size_t i = st_.index(l, s, j);
    const std::vector<float>& full = st_.scores[i];
    const int64_t visible = q->visible_entries, n_blocks = q->visible_blocks;
    keep_.assign(static_cast<size_t>(n_blocks), 0);
    for (int32_t b : sel_.blocks) {
      if (b < n_blocks) keep_[b] = 1;
    }
    masked_.assign(full.begin(), full.end());
    for (int64_t e = 0; e < visible; ++e) {
      if (!keep_[e / E_]) masked_[e] = -std::numeric_limits<float>::infinity();
    }
    TopkParams tp{masked_.data(), std::max<int64_t>(visible, 1), 1, visible, nullptr, st_.topk, spin_topk_.data(), st_.topk};
    const int32_t mask_offsets[2] = {0, static_cast<int32_t>(sel_.blocks.size())};
    tp.block_ids = sel_.blocks.data();  // read only the scored blocks' entries
    tp.block_offsets = mask_offsets;
    tp.block_entries = E_;
    SPIN_RETURN_IF_ERROR(at_row(topk(tp, {TopkImpl::kAuto, 1}), l, s, j));
    q->recall = recall(spin_topk_, st_.truth[i]);
    q->block_recall = block_recall(sel_.blocks, st_.truth[i], E_);
    q->scored_entries = scored_entries_in(sel_.blocks, visible, E_);
    q->scored_blocks = blocks_within(sel_.blocks, visible, E_);
    q->probe_entries = sel_.row_probed[j];
    if (options_.keep_topk) result_.topk[l][static_cast<size_t>(s * st_.next_n + j)] = spin_topk_;
    rs->scores = masked_.data();
    rs->scored_blocks = sel_.blocks.data();
    rs->num_scored_blocks = static_cast<int64_t>(sel_.blocks.size());
    rs->topk_positions = spin_topk_.data();
    return ok_status();
  }

  // Open loop: judge the ranking against the true pooled block scores, then show it all.
  Status open_row(int64_t s, int32_t l, int32_t j, RowQuality* q, RowScores* rs) {
    const size_t i = st_.index(l, s, j);
    *rs = full_row(i);
    const int64_t visible = q->visible_entries;
    // Open loop scores every block, so the step's top-k is the all-keep one: kept as such,
    // never left unwritten.
    if (options_.keep_topk) result_.topk[l][static_cast<size_t>(s * st_.next_n + j)] = st_.truth[i];
    SPIN_RETURN_IF_ERROR(at_row(pool_row(config_, *rs, &pooled_, &pool_scratch_), l, s, j));
    px_.clear();
    py_.clear();
    for (size_t k = 0; k < pooled_.blocks.size(); ++k) {
      const int32_t b = pooled_.blocks[k];
      if (j < static_cast<int32_t>(sel_.row_scores.size()) && b < static_cast<int32_t>(sel_.row_scores[j].size())) {
        px_.push_back(sel_.row_scores[j][b]);
        py_.push_back(pooled_.x[k]);
      }
    }
    q->pearson = pearson(px_.data(), py_.data(), static_cast<int64_t>(px_.size()));
    q->block_recall = block_recall(sel_.row_blocks[j], st_.truth[i], E_);
    q->scored_entries = scored_entries_in(sel_.row_blocks[j], visible, E_);
    q->scored_blocks = blocks_within(sel_.row_blocks[j], visible, E_);
    q->probe_entries = sel_.row_probed[j];
    if (s > 0 && reuses_previous_topk_) q->topk_recall = recall(st_.truth[st_.index(l, s - 1, j)], st_.truth[i]);
    return ok_status();
  }

  // Row i's all-keep scores over every visible block, with its true top-k.
  RowScores full_row(size_t i) {
    const int64_t visible = st_.visible_entries[i];
    const int64_t n_blocks = (visible + E_ - 1) / E_;
    all_blocks_.resize(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) all_blocks_[b] = static_cast<int32_t>(b);
    RowScores rs;
    rs.scores = st_.scores[i].data();
    rs.num_cols = visible;
    rs.visible_entries = visible;
    rs.scored_blocks = all_blocks_.data();
    rs.num_scored_blocks = n_blocks;
    rs.topk_positions = st_.truth[i].data();
    return rs;
  }

  int32_t accepted_at(int64_t s) const { return st_.accepted.empty() ? 0 : st_.accepted[s]; }
  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // Predictor time; on counted steps also its overhead (what the cost accounting charges).
  void charge(double seconds, bool counted) {
    predictor_seconds_ += seconds;
    if (counted) overhead_seconds_ += seconds;
  }

  const Trace* trace_;
  const ScoredTrace& st_;
  const ReplayOptions& options_;
  const PredictorConfig config_;
  std::unique_ptr<BlockPredictor> predictor_;
  const bool with_keys_;
  const int32_t E_;
  const bool reuses_previous_topk_;
  const int64_t count_end_;
  ReplayResult result_;
  double predictor_seconds_ = 0, overhead_seconds_ = 0;
  // Reused across rows.
  Selection sel_;
  std::vector<float> masked_;
  std::vector<int32_t> spin_topk_, true_topk_, all_blocks_;
  std::vector<int64_t> visible_entries_;
  std::vector<char> keep_;
  PooledRow pooled_;
  PoolScratch pool_scratch_;
  std::vector<double> px_, py_;
};

}  // namespace

static Result<ReplayResult> replay_impl(const Trace* trace, const ScoredTrace& st, const ReplayOptions& options) {
  PredictorConfig config = options.config;
  config.page_size = st.page_size;
  config.topk = st.topk;
  const bool with_keys = trace != nullptr && st.has_keys;
  SPIN_RETURN_IF_ERROR(check_keys_or_probe(options, st, with_keys));
  SPIN_RETURN_IF_ERROR(config.validate());
  SPIN_RETURN_IF_ERROR(check_probe_fits(options, st, with_keys, config));
  auto made = make_predictor(options.predictor, config, st.layers, /*request_id=*/0);
  if (!made.ok()) return made.status();
  return Replayer(trace, st, options, config, std::move(made).value()).run();
}

double ReplayResult::overhead_fraction() const {
  const double full = indexer_entry_seconds * quality.visible_entries_sum();
  return full > 0 ? overhead_seconds / full : std::numeric_limits<double>::quiet_NaN();
}

double ReplayResult::cost_fraction() const { return quality.work_fraction() + overhead_fraction(); }

namespace {

double measure_indexer_entry_seconds(int32_t num_heads) {
  constexpr int32_t kEntries = 32768;
  const IndexerPageLayout layout{kDefaultPageSize};
  const int32_t pages = kEntries / kDefaultPageSize;
  // Any bytes are valid e4m3 codes except NaN's: fill with a fixed small pattern, scale 1.
  std::vector<uint8_t> cache(static_cast<size_t>(pages) * layout.page_bytes());
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = static_cast<uint8_t>((i * 37) % 0x70);
  for (int32_t pg = 0; pg < pages; ++pg)
    for (int32_t o = 0; o < kDefaultPageSize; ++o) {
      const float one = 1.0f;
      std::memcpy(cache.data() + static_cast<size_t>(pg) * layout.page_bytes() + layout.scale_offset(o), &one,
                  sizeof one);
    }
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int32_t i = 0; i < pages; ++i) table[static_cast<size_t>(i)] = i;
  std::vector<uint8_t> q(static_cast<size_t>(num_heads) * kIndexerHeadDim, 0x30);
  std::vector<float> w(static_cast<size_t>(num_heads), 1.0f);
  std::vector<float> logits(kEntries);
  const int64_t len = kEntries;
  IndexerParams p;
  p.key_cache = cache.data();
  p.page_size = kDefaultPageSize;
  p.num_pages = pages;
  p.block_table = table.data();
  p.block_table_stride = pages;
  p.batch = 1;
  p.context_lens = &len;
  p.num_heads = num_heads;
  p.q = q.data();
  p.weights = w.data();
  p.logits = logits.data();
  p.logits_stride = kEntries;
  p.logits_cols = kEntries;
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    if (!indexer_scores(p, {IndexerImpl::kAuto, 1}).ok()) return std::numeric_limits<double>::quiet_NaN();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best / kEntries;
}

}  // namespace

double indexer_entry_seconds(int32_t num_heads) {
  static std::mutex mutex;
  static std::map<int32_t, double> measured;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = measured.find(num_heads);
  if (it == measured.end()) it = measured.emplace(num_heads, measure_indexer_entry_seconds(num_heads)).first;
  return it->second;
}

Result<ReplayResult> replay(const Trace& trace, const ScoredTrace& st, const ReplayOptions& options) {
  return replay_impl(&trace, st, options);
}

Result<ReplayResult> replay(const ScoredTrace& st, const ReplayOptions& options) {
  return replay_impl(nullptr, st, options);
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
