// All-keep ground truth: score_trace runs the real indexer and top-k kernels over a key trace (or
// takes a score trace's scores) into a ScoredTrace, and trace_facts summarises it (see spin/lab/replay.h).
#include "spin/lab/replay.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "eval/scored_trace.h"
#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/memory.h"
#include "spin/topk.h"

namespace spin {

using replay_internal::at_row;

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

// The truth of one (layer, step): top-k over the step's rows of `cols` logit columns (-inf past
// each row's visible prefix), then each row's visible scores and its top-k kept in `st`. Both
// trace kinds end here, so they give bitwise the same truth.
Status keep_scored_rows(const std::vector<float>& logits, int64_t cols, const std::vector<int64_t>& visible,
                        int32_t l, int64_t s, int threads, ScoredTrace* st, std::vector<int32_t>* topk_out) {
  const int32_t k = st->topk, next_n = st->next_n;
  topk_out->resize(static_cast<size_t>(next_n) * k);
  TopkParams tp{logits.data(), cols, next_n, cols, visible.data(), k, topk_out->data(), k};
  SPIN_RETURN_IF_ERROR(at_row(topk(tp, {TopkImpl::kAuto, threads}), l, s));
  for (int32_t j = 0; j < next_n; ++j) {
    const size_t i = st->index(l, s, j);
    st->visible_entries[i] = visible[j];
    st->scores[i].assign(logits.begin() + j * cols, logits.begin() + j * cols + visible[j]);
    st->truth[i].assign(topk_out->begin() + j * k, topk_out->begin() + (j + 1) * k);
  }
  return ok_status();
}
}  // namespace

Result<std::shared_ptr<const ScoredTrace>> score_trace(const Trace& trace, const ScoreOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_trace(trace));
  const TraceMeta& m = trace.meta;
  auto header = scored_header(m, trace.ctx_len, trace.accepted, options);
  if (!header.ok()) return header.status();
  std::shared_ptr<ScoredTrace> st = std::move(header).value();
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
      SPIN_RETURN_IF_ERROR(keep_scored_rows(logits, cols, visible_entries, l, s, threads, st.get(), &topk_out));
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
      SPIN_RETURN_IF_ERROR(keep_scored_rows(logits, cols, visible, l, s, threads, st.get(), &topk_out));
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

bool has_keys(const ScoredTrace& scored) { return scored.has_keys; }
bool has_probe(const ScoredTrace& scored) { return !scored.probe.empty(); }
int32_t probe_block_entries(const ScoredTrace& scored) { return scored.probe_block_entries; }

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

}  // namespace spin
