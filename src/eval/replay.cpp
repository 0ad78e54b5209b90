// Trace replay: closed/open-loop replay of a predictor against a trace's all-keep ground truth
// (replay_scoring.cpp builds it; see spin/lab/replay.h), and the indexer cost unit that prices it.
#include "spin/lab/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "eval/scored_trace.h"
#include "predict/hisa.h"
#include "predict/pooling.h"
#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/predictor_inputs.h"
#include "spin/topk.h"

namespace spin {

using replay_internal::at_row;

bool replayed_as_prefill(const ScoredTrace& st, int64_t s, const ReplayOptions& options) {
  if (s == 0) return options.warm_start;
  return options.prefill_jumps && s < st.steps && context_jump_is_prefill(st.ctx_len[s - 1], st.ctx_len[s], st.next_n);
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

}  // namespace spin
