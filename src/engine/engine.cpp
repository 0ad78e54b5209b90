// Batched DSA decode engine (see spin/lab/engine.h for what a step does and what is simulated).
#include "spin/lab/engine.h"
#include "spin/memory.h"

#include <omp.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "engine/inputs.h"
#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/predictor_inputs.h"
#include "spin/topk.h"

namespace spin {

EngineKernels EngineKernels::reference() {
  EngineKernels k;
  k.indexer.impl = IndexerImpl::kReference;
  k.topk.impl = TopkImpl::kReference;
  k.attention.impl = AttentionImpl::kReference;
  return k;
}

std::string EngineKernels::to_string() const {
  // kAuto is printed with what it resolves to on this machine.
  const IndexerImpl indexer_impl = indexer.impl == IndexerImpl::kAuto ? indexer_best_impl() : indexer.impl;
  const AttentionImpl attention_impl = attention.impl == AttentionImpl::kAuto ? attention_best_impl() : attention.impl;
  return fmt::format("indexer={}{} topk={} attention={}{} heads_per_task={} bf16_probabilities={}",
                     indexer_impl_name(indexer.impl),
                     indexer.impl == IndexerImpl::kAuto ? fmt::format("({})", indexer_impl_name(indexer_impl)) : "",
                     topk_impl_name(topk.impl), attention_impl_name(attention.impl),
                     attention.impl == AttentionImpl::kAuto
                         ? fmt::format("({})", attention_impl_name(attention_impl))
                         : "",
                     attention.heads_per_task, attention.bf16_probabilities ? 1 : 0);
}

namespace {

using engine_inputs::InputSource;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int64_t entries_for_tokens(const EngineConfig& c, int64_t tokens) { return tokens / c.model.compress_ratio; }

int64_t pages_per_request(const EngineConfig& c, int64_t max_tokens) {
  const int64_t entries = entries_for_tokens(c, max_tokens + c.next_n) + 1;
  return (entries + c.model.page_size - 1) / c.model.page_size;
}

// |a ∩ b| and |b| of two top-k rows (position-ascending, -1 padded, as topk() writes them).
std::pair<int32_t, int32_t> topk_overlap(const int32_t* a, const int32_t* b, int32_t k) {
  int32_t i = 0, j = 0, hits = 0;
  while (i < k && j < k && a[i] >= 0 && b[j] >= 0) {
    if (a[i] == b[j]) {
      ++hits, ++i, ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  int32_t wanted = 0;
  while (wanted < k && b[wanted] >= 0) ++wanted;
  return {hits, wanted};
}

}  // namespace

int64_t engine_memory_bytes(const EngineConfig& c, int32_t requests, int64_t max_tokens) {
  const int64_t pages = int64_t{requests} * pages_per_request(c, max_tokens) + requests;
  const LatentPageLayout latent{c.latent_dtype, c.model.page_size};
  const int64_t cache = pages * c.layers * (IndexerPageLayout{c.model.page_size}.page_bytes() + latent.page_bytes());
  const int64_t rows = int64_t{requests} * c.next_n;
  const int64_t max_entries = entries_for_tokens(c, max_tokens + c.next_n) + 1;
  const int64_t logits = rows * max_entries * 4 * (c.measure_attn_err ? 2 : 1);
  const int64_t attention = rows * c.model.attn_heads * (kMlaLatentDim * 4 * (c.measure_attn_err ? 2 : 1) + kMlaHeadDim * 2);
  PredictorConfig pc = c.predictor_config;  // page_size and topk are the model's (create() sets them too)
  pc.page_size = c.model.page_size;
  pc.topk = c.model.topk;
  const PredictorInfo* info = find_predictor(c.predictor);  // create() refuses an unknown name
  const double predictor =
      info && !info->keeps_all ? requests * planned_bytes(*info, pc, c.layers, max_entries, c.next_n) : 0.0;
  return cache + logits + attention + static_cast<int64_t>(predictor);
}

struct DecodeEngine::Impl {
  EngineConfig cfg;
  int32_t max_requests = 0;
  int64_t max_tokens = 0;
  PageAllocator allocator{0};
  std::vector<IndexerKeyCache> index_caches;  // per layer
  std::vector<LatentCache> latent_caches;     // per layer
  struct Request {
    int64_t id = 0;
    int64_t tokens = 0;  // accepted tokens in the cache
    int64_t step = 0;
    RequestPages pages;
    std::unique_ptr<BlockPredictor> predictor;  // null for all-keep
    // This step is a prefill (the prompt at step 0, or a context jump of the inputs: a tool output):
    // every block is scored and observe_prefill takes rows 0..accepted, as replay does.
    bool prefill = false;
    int32_t accepted = 0;  // this step's accepted drafts, drawn before the step runs
    std::vector<std::vector<float>> last_out;   // [layer][rows · heads · 512]
    std::vector<std::vector<int32_t>> last_topk;  // [layer][rows · topk]
  };
  std::vector<Request> requests;
  std::unique_ptr<InputSource> inputs;  // synthetic, or cfg.inputs replayed
  int threads = 1;
  EngineKernels kernels;  // cfg.kernels with every num_threads set to `threads`
  // The shape of the open step (set by append_tokens and size_buffers).
  int32_t batch = 0, max_pages = 1, n_extra = 0;
  int64_t rows = 0, max_entries = 1;
  bool predicted = false;  // a predictor chooses the blocks (not all-keep)
  // Step scratch, reused.
  std::vector<int32_t> block_table, block_ids, block_offsets, topk_out, topk_full, extra;
  std::vector<int64_t> ctx_lens, visible_entries;  // [batch], [rows]
  std::vector<uint8_t> q_index;
  std::vector<float> w_index, logits, logits_full, out, out_full;
  std::vector<uint16_t> q_attn;
  std::vector<Selection> selections;

  Request* find(int64_t id) {
    for (Request& r : requests) {
      if (r.id == id) return &r;
    }
    return nullptr;
  }

  // Writes entries [first, last) of every layer for request r: the source's indexer keys, and
  // random latents (keyed on seed, layer, request and position, so any two engines with the same
  // seed hold the same data).
  void fill_entries(const Request& r, int64_t first, int64_t last) {
    const int32_t page_size = cfg.model.page_size;
    const IndexerPageLayout ilayout{page_size};
    for (int32_t l = 0; l < cfg.layers; ++l) {
      uint8_t* icache = index_caches[l].data();
      uint8_t* lcache = latent_caches[l].data();
      const LatentPageLayout llayout = latent_caches[l].layout();
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t e = first; e < last; ++e) {
        const int32_t phys = r.pages.pages()[e / page_size];
        const int32_t o = static_cast<int32_t>(e % page_size);
        uint8_t* key = icache + phys * ilayout.page_bytes() + ilayout.value_offset(o);
        float* scale = reinterpret_cast<float*>(icache + phys * ilayout.page_bytes() + ilayout.scale_offset(o));
        inputs->index_key(l, r.id, e, key, scale);
        uint8_t* entry = lcache + phys * llayout.page_bytes() + llayout.entry_offset(o);
        engine_inputs::write_random_latent(cfg.seed, l, r.id, e, llayout.dtype, entry);
      }
    }
  }

  // Whether request r's step is a prefill: its first, or one whose inputs' context grew by more
  // than the step's rows (the same rule as replay: context_jump_is_prefill).
  bool is_prefill_step(const Request& r) const { return r.step == 0 || inputs->context_jumps(r.step); }

  // ---- The stages of one step (DecodeEngine::step runs and times them in order) ---------------

  // 1. Appends this step's next_n tokens (their keys and latents) to every request's caches, and
  // sets the step's shape: the block table, each request's context and each row's visible entries.
  Status append_tokens() {
    batch = static_cast<int32_t>(requests.size());
    rows = int64_t{batch} * cfg.next_n;
    max_entries = 1;
    max_pages = 1;
    ctx_lens.assign(static_cast<size_t>(batch), 0);
    for (int32_t b = 0; b < batch; ++b) {
      Request& r = requests[b];
      SPIN_RETURN_IF_ERROR(inputs->check_step(r.id, r.step, r.tokens + cfg.next_n));
      const int64_t ctx = inputs->step_context(r.step, r.tokens);
      if (ctx > max_tokens + cfg.next_n) {
        return out_of_range("request {} reached the engine's max_tokens ({})", r.id, max_tokens);
      }
      const int64_t before = entries_for_tokens(cfg, r.tokens);
      const int64_t after = entries_for_tokens(cfg, ctx);
      SPIN_RETURN_IF_ERROR(r.pages.reserve(after + 1, cfg.model.page_size, allocator));
      fill_entries(r, before, after);
      r.prefill = is_prefill_step(r);
      r.accepted = inputs->accepted_drafts(r.id, r.step);
      r.tokens = ctx - cfg.next_n;  // a jump of the inputs' context arrived as a prompt
      ctx_lens[b] = ctx;
      max_entries = std::max(max_entries, after);
      max_pages = std::max(max_pages, static_cast<int32_t>(r.pages.pages().size()));
    }
    block_table.assign(static_cast<size_t>(batch) * max_pages, 0);
    for (int32_t b = 0; b < batch; ++b) {
      const auto& pages = requests[b].pages.pages();
      std::copy(pages.begin(), pages.end(), block_table.begin() + int64_t{b} * max_pages);
    }
    visible_entries.resize(static_cast<size_t>(rows));
    for (int32_t b = 0; b < batch; ++b) {
      for (int32_t j = 0; j < cfg.next_n; ++j) {
        visible_entries[b * cfg.next_n + j] =
            spin::visible_entries(ctx_lens[b], cfg.next_n, j, cfg.model.compress_ratio);
      }
    }
    return ok_status();
  }

  // Sizes the per-layer buffers for the step's shape.
  void size_buffers() {
    const int32_t attn_heads = cfg.model.attn_heads, index_heads = cfg.model.index_heads;
    n_extra = std::min<int32_t>(cfg.model.window, static_cast<int32_t>(max_entries));
    logits.resize(static_cast<size_t>(rows) * max_entries);
    topk_out.resize(static_cast<size_t>(rows) * cfg.model.topk);
    out.resize(static_cast<size_t>(rows) * attn_heads * kMlaLatentDim);
    q_index.resize(static_cast<size_t>(rows) * index_heads * kIndexerHeadDim);
    w_index.resize(static_cast<size_t>(rows) * index_heads);
    q_attn.resize(static_cast<size_t>(rows) * attn_heads * kMlaHeadDim);
    extra.assign(static_cast<size_t>(rows) * std::max(n_extra, 1), -1);
    selections.resize(static_cast<size_t>(batch));
    predicted = !find_predictor(cfg.predictor)->keeps_all;  // create() checked the name
  }

  // Queries of layer l (the source's indexer queries, random attention queries) and the V4 window.
  void make_queries(int32_t l) {
    const int32_t next_n = cfg.next_n;
    const int32_t attn_heads = cfg.model.attn_heads, index_heads = cfg.model.index_heads;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t row = 0; row < rows; ++row) {
      const Request& r = requests[row / next_n];
      const int64_t position = ctx_lens[row / next_n] - next_n + row % next_n;
      inputs->index_query(l, r.id, r.step, static_cast<int32_t>(row % next_n), position,
                          q_index.data() + row * index_heads * kIndexerHeadDim, w_index.data() + row * index_heads);
      engine_inputs::write_random_attn_query(cfg.seed, l, r.id, position, attn_heads,
                                             q_attn.data() + row * attn_heads * kMlaHeadDim);
      // V4: the newest `window` entries of the row (cost-equivalent stand-in for the SWA window).
      for (int32_t i = 0; i < n_extra; ++i) {
        const int64_t e = visible_entries[row] - 1 - i;
        extra[row * n_extra + i] = e >= 0 ? static_cast<int32_t>(e) : -1;
      }
    }
  }

  // A prefill step scores every block (prefill computes the full rows anyway); nothing is predicted.
  void select_all(int64_t num_entries, Selection* sel) const {
    const int64_t block_entries = int64_t{cfg.model.page_size} * cfg.predictor_config.block_pages;
    const auto n_blocks = static_cast<int32_t>((num_entries + block_entries - 1) / block_entries);
    sel->blocks.resize(static_cast<size_t>(n_blocks));
    for (int32_t b = 0; b < n_blocks; ++b) sel->blocks[b] = b;
  }

  // 2. The predictor of every request chooses layer l's blocks; block_ids/offsets are their CSR.
  Status select_blocks(int32_t l) {
    const int32_t next_n = cfg.next_n, index_heads = cfg.model.index_heads;
    block_ids.clear();
    block_offsets.assign(1, 0);
    for (int32_t b = 0; b < batch; ++b) {
      Request& r = requests[b];
      HisaView hisa;
      hisa.key_cache = index_caches[l].data();
      hisa.page_size = cfg.model.page_size;
      hisa.block_table = r.pages.pages().data();
      hisa.num_entries = entries_for_tokens(cfg, ctx_lens[b]);
      hisa.q = q_index.data() + int64_t{b} * next_n * index_heads * kIndexerHeadDim;
      hisa.w = w_index.data() + int64_t{b} * next_n * index_heads;
      hisa.num_heads = index_heads;
      hisa.num_cache_pages = allocator.num_pages();
      StepInput in;
      in.step = r.step;
      in.num_entries = hisa.num_entries;
      in.next_n = next_n;
      in.visible_entries = cfg.model.compress_ratio > 1 ? visible_entries.data() + int64_t{b} * next_n : nullptr;
      PredictorInputs reads;
      reads.hisa = &hisa;
      in.inputs = &reads;
      if (r.prefill) {
        select_all(hisa.num_entries, &selections[b]);
      } else {
        SPIN_RETURN_IF_ERROR(r.predictor->select(l, in, &selections[b]));
      }
      block_ids.insert(block_ids.end(), selections[b].blocks.begin(), selections[b].blocks.end());
      block_offsets.push_back(static_cast<int32_t>(block_ids.size()));
    }
    return ok_status();
  }

  // 3. Indexer over the selected blocks (all blocks for all-keep), all requests in one call.
  IndexerParams indexer_params(int32_t l) {
    IndexerParams ip;
    ip.key_cache = index_caches[l].data();
    ip.page_size = cfg.model.page_size;
    ip.num_pages = allocator.num_pages();
    ip.block_table = block_table.data();
    ip.block_table_stride = max_pages;
    ip.batch = batch;
    ip.context_lens = ctx_lens.data();
    ip.next_n = cfg.next_n;
    ip.compress_ratio = cfg.model.compress_ratio;
    ip.num_heads = cfg.model.index_heads;
    ip.q = q_index.data();
    ip.weights = w_index.data();
    ip.logits = logits.data();
    ip.logits_stride = max_entries;
    ip.logits_cols = max_entries;
    if (predicted) {
      ip.block_ids = block_ids.data();
      ip.block_offsets = block_offsets.data();
      ip.block_pages = cfg.predictor_config.block_pages;
    }
    return ip;
  }

  // 4. Top-k per row.
  TopkParams topk_params() {
    const int32_t k = cfg.model.topk;
    TopkParams tp{logits.data(), max_entries,     static_cast<int32_t>(rows), max_entries,
                  visible_entries.data(), k, topk_out.data(), k};
    if (predicted) {  // read only the scored blocks: the same result as over the -inf-padded rows
      tp.block_ids = block_ids.data();
      tp.block_offsets = block_offsets.data();
      tp.rows_per_mask = cfg.next_n;
      tp.block_entries = int64_t{cfg.model.page_size} * cfg.predictor_config.block_pages;
    }
    return tp;
  }

  // 5. Sparse MLA attention of layer l over the top-k (+ window).
  SparseAttentionParams attention_params(int32_t l) {
    SparseAttentionParams ap;
    ap.latent_cache = latent_caches[l].data();
    ap.dtype = cfg.latent_dtype;
    ap.page_size = cfg.model.page_size;
    ap.num_pages = allocator.num_pages();
    ap.block_table = block_table.data();
    ap.block_table_stride = max_pages;
    ap.batch = batch;
    ap.next_n = cfg.next_n;
    ap.visible_entries = visible_entries.data();
    ap.num_heads = cfg.model.attn_heads;
    ap.q = q_attn.data();
    ap.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kMlaHeadDim));
    ap.indices = topk_out.data();
    ap.topk = cfg.model.topk;
    ap.extra_indices = n_extra > 0 ? extra.data() : nullptr;
    ap.n_extra = n_extra;
    ap.out = out.data();
    return ap;
  }

  // 6. Every row's scores and top-k to its predictor: buffered until commit, or, in a prefill, the
  // kept rows 0..accepted observed at once (rejected drafts were never tokens of the sequence).
  Status observe(int32_t l) {
    const int32_t k = cfg.model.topk;
    for (int32_t b = 0; b < batch; ++b) {
      const Request& r = requests[b];
      for (int32_t j = 0; j < cfg.next_n; ++j) {
        const int64_t row = int64_t{b} * cfg.next_n + j;
        RowScores rs;
        rs.scores = logits.data() + row * max_entries;
        rs.num_cols = max_entries;
        rs.visible_entries = visible_entries[row];
        rs.scored_blocks = selections[b].blocks.data();
        rs.num_scored_blocks = static_cast<int64_t>(selections[b].blocks.size());
        rs.topk_positions = topk_out.data() + row * k;
        if (!r.prefill) {
          SPIN_RETURN_IF_ERROR(r.predictor->observe(l, j, rs));
        } else if (j <= r.accepted) {
          SPIN_RETURN_IF_ERROR(r.predictor->observe_prefill(l, r.step, rs));
        }
      }
    }
    return ok_status();
  }

  // Entries seen and scored by layer l's rows; each request's attention output kept for tests.
  void record_layer(int32_t l, StepStats* stats) {
    const int64_t row_values = int64_t{cfg.model.attn_heads} * kMlaLatentDim;
    for (int64_t row = 0; row < rows; ++row) {
      stats->visible_entries += visible_entries[row];
      int64_t scored = 0;
      const float* lr = logits.data() + row * max_entries;
      for (int64_t e = 0; e < visible_entries[row]; ++e) scored += lr[e] != -std::numeric_limits<float>::infinity();
      stats->scored_entries += scored;
    }
    for (int32_t b = 0; b < batch; ++b) {
      const float* o = out.data() + int64_t{b} * cfg.next_n * row_values;
      requests[b].last_out[l].assign(o, o + cfg.next_n * row_values);
      const int32_t* t = topk_out.data() + int64_t{b} * cfg.next_n * cfg.model.topk;
      requests[b].last_topk[l].assign(t, t + int64_t{cfg.next_n} * cfg.model.topk);
    }
  }

  // 7. Untimed: the all-keep output of the same step (default kernels), compared with `out`.
  Status measure_attn_err(const IndexerParams& ip, const TopkParams& tp, const SparseAttentionParams& ap,
                          StepStats* stats) {
    IndexerParams full = ip;
    full.block_ids = nullptr;
    full.block_offsets = nullptr;
    logits_full.resize(logits.size());
    full.logits = logits_full.data();
    SPIN_RETURN_IF_ERROR(indexer_scores(full, {IndexerImpl::kAuto, threads}));
    topk_full.resize(topk_out.size());
    TopkParams ftp = tp;
    ftp.scores = logits_full.data();
    ftp.out = topk_full.data();
    ftp.block_offsets = nullptr;  // every entry was scored
    SPIN_RETURN_IF_ERROR(topk(ftp, {TopkImpl::kAuto, threads}));
    out_full.resize(out.size());
    SparseAttentionParams fap = ap;
    fap.indices = topk_full.data();
    fap.out = out_full.data();
    SPIN_RETURN_IF_ERROR(sparse_attention(fap, {AttentionImpl::kAuto, threads}));
    // Quality counts decode rows only, as replay does: a prefill row scored everything.
    const int32_t k = cfg.model.topk;
    for (int64_t row = 0; row < rows; ++row) {
      if (requests[row / cfg.next_n].prefill) continue;
      const auto [hits, wanted] = topk_overlap(topk_out.data() + row * k, topk_full.data() + row * k, k);
      if (wanted > 0) {
        stats->recall_sum += static_cast<double>(hits) / static_cast<double>(wanted);
        ++stats->recall_rows;
      }
    }
    const int64_t row_values = int64_t{cfg.model.attn_heads} * kMlaLatentDim;
    for (int64_t row = 0; row < rows; ++row) {
      if (requests[row / cfg.next_n].prefill) continue;
      double diff = 0, norm = 0;
      const float* a = out.data() + row * row_values;
      const float* f = out_full.data() + row * row_values;
      for (int64_t i = 0; i < row_values; ++i) {
        diff += (double{a[i]} - f[i]) * (double{a[i]} - f[i]);
        norm += double{f[i]} * f[i];
      }
      if (norm > 0) {
        stats->attn_err_sum += std::sqrt(diff / norm);
        ++stats->attn_err_rows;
      }
    }
    return ok_status();
  }

  // 8. Verification: the accepted drafts (drawn in append_tokens), the predictors' commit (a
  // prefill's rows were observed already), the sequences advanced.
  Status verify(StepStats* stats) {
    for (Request& r : requests) {
      if (r.predictor && !r.prefill) SPIN_RETURN_IF_ERROR(r.predictor->commit(r.accepted));
      r.tokens += r.accepted + 1;
      ++r.step;
      stats->tokens += r.accepted + 1;
    }
    return ok_status();
  }
};

DecodeEngine::DecodeEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DecodeEngine::~DecodeEngine() = default;

Result<std::unique_ptr<DecodeEngine>> DecodeEngine::create(const EngineConfig& config, int32_t requests,
                                                           int64_t max_tokens, int64_t memory_limit_bytes) {
  EngineConfig c = config;
  if (c.layers < 1 || c.layers > c.model.indexer_layers) {
    return invalid_argument("layers must be in [1, {}] for {}, got {}", c.model.indexer_layers, c.model.name, c.layers);
  }
  if (c.next_n < 1 || c.next_n > kMaxNextN) return invalid_argument("next_n must be in [1, {}], got {}", kMaxNextN, c.next_n);
  if (!(c.acceptance_rate >= 0 && c.acceptance_rate <= 1)) {
    return invalid_argument("acceptance_rate must be in [0, 1], got {}", c.acceptance_rate);
  }
  if (requests < 1 || max_tokens < 1) return invalid_argument("requests and max_tokens must be ≥ 1");
  // Bounds that keep every size product of the memory estimate inside int64.
  if (requests > 65536 || max_tokens > (int64_t{1} << 26)) {
    return invalid_argument("requests ({}) must be ≤ 65536 and max_tokens ({}) ≤ 2^26", requests, max_tokens);
  }
  SPIN_RETURN_IF_ERROR(engine_inputs::check_trace_inputs(c, max_tokens));
  c.predictor_config.page_size = c.model.page_size;
  c.predictor_config.topk = c.model.topk;
  SPIN_RETURN_IF_ERROR(c.predictor_config.validate());
  auto probe = make_predictor(c.predictor, c.predictor_config, c.layers, 0);  // the name and config
  if (!probe.ok()) return probe.status();
  const int64_t need = engine_memory_bytes(c, requests, max_tokens);
  const int64_t limit = memory_limit_bytes > 0 ? memory_limit_bytes : memory_budget_bytes();
  if (need > limit) {
    return resource_exhausted(
        "{} requests × {} tokens × {} layers of {} need {:.2f} GiB, more than the {:.2f} GiB available "
        "(use fewer layers, a shorter context, a smaller batch or --latent fp8)",
        requests, max_tokens, c.layers, c.model.name, static_cast<double>(need) / (1 << 30),
        static_cast<double>(limit) / (1 << 30));
  }
  auto impl = std::make_unique<Impl>();
  impl->cfg = c;
  impl->max_requests = requests;
  impl->max_tokens = max_tokens;
  impl->inputs = engine_inputs::make_input_source(c);
  impl->threads = c.threads > 0 ? c.threads : omp_get_max_threads();
  impl->kernels = c.kernels;
  impl->kernels.indexer.num_threads = impl->threads;
  impl->kernels.topk.num_threads = impl->threads;
  impl->kernels.attention.num_threads = impl->threads;
  const int64_t pages = c.pool_pages > 0 ? c.pool_pages : int64_t{requests} * pages_per_request(c, max_tokens) + requests;
  if (pages > INT32_MAX) return invalid_argument("{} pages exceed int32 page ids", pages);
  impl->allocator = PageAllocator(static_cast<int32_t>(pages));
  for (int32_t l = 0; l < c.layers; ++l) {
    auto icache = IndexerKeyCache::create(c.model.page_size, static_cast<int32_t>(pages));
    if (!icache.ok()) return icache.status();
    impl->index_caches.push_back(std::move(icache).value());
    auto lcache = LatentCache::create(c.latent_dtype, c.model.page_size, static_cast<int32_t>(pages));
    if (!lcache.ok()) return lcache.status();
    impl->latent_caches.push_back(std::move(lcache).value());
  }
  return std::unique_ptr<DecodeEngine>(new DecodeEngine(std::move(impl)));
}

Status DecodeEngine::add_request(int64_t request_id, int64_t prompt_tokens) {
  Impl& m = *impl_;
  if (m.find(request_id) != nullptr) return invalid_argument("request {} is already active", request_id);
  if (static_cast<int32_t>(m.requests.size()) >= m.max_requests) {
    return resource_exhausted("the engine was created for {} concurrent requests", m.max_requests);
  }
  if (prompt_tokens < 1 || prompt_tokens > m.max_tokens) {
    return invalid_argument("prompt_tokens must be in [1, {}], got {}", m.max_tokens, prompt_tokens);
  }
  SPIN_RETURN_IF_ERROR(m.inputs->check_prompt(prompt_tokens));
  Impl::Request r;
  r.id = request_id;
  r.tokens = prompt_tokens;
  // Room for the prompt and this step's rows; later steps grow it one page at a time.
  SPIN_RETURN_IF_ERROR(r.pages.reserve(entries_for_tokens(m.cfg, prompt_tokens + m.cfg.next_n) + 1,
                                       m.cfg.model.page_size, m.allocator));
  if (!find_predictor(m.cfg.predictor)->keeps_all) {  // all-keep: the plain indexer, no predictor
    auto p = make_predictor(m.cfg.predictor, m.cfg.predictor_config, m.cfg.layers, request_id);
    if (!p.ok()) {
      (void)r.pages.release_all(m.allocator);
      return p.status();
    }
    r.predictor = std::move(p).value();
  }
  r.last_out.resize(static_cast<size_t>(m.cfg.layers));
  r.last_topk.resize(static_cast<size_t>(m.cfg.layers));
  m.fill_entries(r, 0, entries_for_tokens(m.cfg, prompt_tokens));
  m.requests.push_back(std::move(r));
  return ok_status();
}

Status DecodeEngine::retire(int64_t request_id) {
  Impl& m = *impl_;
  for (auto it = m.requests.begin(); it != m.requests.end(); ++it) {
    if (it->id == request_id) {
      Status s = it->pages.release_all(m.allocator);
      m.requests.erase(it);
      return s;
    }
  }
  return invalid_argument("request {} is not active", request_id);
}

int32_t DecodeEngine::active_requests() const { return static_cast<int32_t>(impl_->requests.size()); }
int32_t DecodeEngine::free_pages() const { return impl_->allocator.num_free(); }
const EngineConfig& DecodeEngine::config() const { return impl_->cfg; }
int64_t DecodeEngine::tokens(int64_t request_id) const {
  for (const auto& r : impl_->requests) {
    if (r.id == request_id) return r.tokens;
  }
  return -1;
}
const std::vector<float>* DecodeEngine::last_output(int64_t request_id, int32_t layer) const {
  for (const auto& r : impl_->requests) {
    if (r.id == request_id && layer >= 0 && layer < static_cast<int32_t>(r.last_out.size())) return &r.last_out[layer];
  }
  return nullptr;
}

const std::vector<int32_t>* DecodeEngine::last_topk(int64_t request_id, int32_t layer) const {
  for (const auto& r : impl_->requests) {
    if (r.id == request_id && layer >= 0 && layer < static_cast<int32_t>(r.last_topk.size())) return &r.last_topk[layer];
  }
  return nullptr;
}

// The stages are Impl's methods above; this runs them in order and times each.
Status DecodeEngine::step(StepStats* stats) {
  Impl& m = *impl_;
  *stats = StepStats{};
  const auto step_start = Clock::now();
  if (m.requests.empty()) return ok_status();
  auto t0 = Clock::now();
  SPIN_RETURN_IF_ERROR(m.append_tokens());
  stats->cache_ms += ms_since(t0);
  m.size_buffers();
  for (int32_t l = 0; l < m.cfg.layers; ++l) {
    t0 = Clock::now();
    m.make_queries(l);
    stats->cache_ms += ms_since(t0);

    t0 = Clock::now();
    if (m.predicted) SPIN_RETURN_IF_ERROR(m.select_blocks(l));
    stats->predictor_ms += ms_since(t0);

    const IndexerParams ip = m.indexer_params(l);
    t0 = Clock::now();
    SPIN_RETURN_IF_ERROR(indexer_scores(ip, m.kernels.indexer));
    stats->indexer_ms += ms_since(t0);

    const TopkParams tp = m.topk_params();
    t0 = Clock::now();
    SPIN_RETURN_IF_ERROR(topk(tp, m.kernels.topk));
    stats->topk_ms += ms_since(t0);

    const SparseAttentionParams ap = m.attention_params(l);
    t0 = Clock::now();
    SPIN_RETURN_IF_ERROR(sparse_attention(ap, m.kernels.attention));
    stats->attention_ms += ms_since(t0);

    t0 = Clock::now();
    if (m.predicted) SPIN_RETURN_IF_ERROR(m.observe(l));
    stats->predictor_ms += ms_since(t0);

    m.record_layer(l, stats);
    if (m.cfg.measure_attn_err && m.predicted) SPIN_RETURN_IF_ERROR(m.measure_attn_err(ip, tp, ap, stats));
  }
  t0 = Clock::now();
  SPIN_RETURN_IF_ERROR(m.verify(stats));
  stats->predictor_ms += ms_since(t0);
  stats->rows = m.rows;
  for (const Impl::Request& r : m.requests) stats->prefill_rows += r.prefill ? m.cfg.next_n : 0;
  stats->total_ms = stats->indexer_ms + stats->topk_ms + stats->attention_ms + stats->predictor_ms;
  stats->wall_ms = ms_since(step_start);
  return ok_status();
}

}  // namespace spin
