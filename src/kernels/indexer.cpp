// Indexer front end: argument validation (once, in a fixed order), tiling and dispatch.
// The math lives in the implementations; see spin/indexer.h for what is computed.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "kernels/cpu_features.h"
#include "kernels/indexer_internal.h"
#include "spin/cache.h"
#include "spin/cpu.h"
#include "spin/memory.h"

namespace spin {

const char* indexer_impl_name(IndexerImpl impl) {
  switch (impl) {
    case IndexerImpl::kAuto: return "auto";
    case IndexerImpl::kAvx512Bf16: return "avx512bf16";
    case IndexerImpl::kAvx512F: return "avx512f";
    case IndexerImpl::kAvx2: return "avx2";
    case IndexerImpl::kNeonBf16: return "neon_bf16";
    case IndexerImpl::kNeon: return "neon";
    case IndexerImpl::kPortable: return "portable";
    case IndexerImpl::kReference: return "reference";
  }
  return "unknown";
}

namespace {

int64_t entries_in_cache(const IndexerParams& p, int32_t b) {
  return visible_entries(p.context_lens[b], p.next_n, p.next_n - 1, p.compress_ratio);
}

}  // namespace

// One flat list of checks (~80 lines) on purpose: their order is part of the contract (the first
// error reported is the most basic one), and it reads top to bottom here.
Status validate_indexer_params(const IndexerParams& p) {
  // Sizes first, then pointers, then contents — so the first error is the most basic one.
  if (p.page_size < 1) return invalid_argument("page_size must be ≥ 1, got {}", p.page_size);
  if (p.num_pages < 0) return invalid_argument("num_pages must be ≥ 0, got {}", p.num_pages);
  if (p.batch < 0) return invalid_argument("batch must be ≥ 0, got {}", p.batch);
  if (p.next_n < 1 || p.next_n > kMaxNextN) {
    return invalid_argument("next_n (rows per request) must be in [1, {}], got {}", kMaxNextN, p.next_n);
  }
  if (p.compress_ratio < 1) return invalid_argument("compress_ratio must be ≥ 1, got {}", p.compress_ratio);
  if (p.num_heads < 1 || p.num_heads > kMaxIndexerHeads) {
    return invalid_argument("num_heads must be in [1, {}], got {}", kMaxIndexerHeads, p.num_heads);
  }
  if (p.block_pages < 1) return invalid_argument("block_pages must be ≥ 1, got {}", p.block_pages);
  if (p.block_table_stride < 0) {
    return invalid_argument("block_table_stride must be ≥ 0, got {}", p.block_table_stride);
  }
  if (p.batch == 0) return ok_status();
  if (p.context_lens == nullptr) return invalid_argument("context_lens is null");
  if (p.q == nullptr || p.weights == nullptr) return invalid_argument("q or weights is null");
  if (p.logits == nullptr) return invalid_argument("logits is null");
  if (p.block_offsets != nullptr && p.block_offsets[p.batch] > 0 && p.block_ids == nullptr) {
    return invalid_argument("block_offsets selects {} blocks but block_ids is null", p.block_offsets[p.batch]);
  }
  if (p.logits_cols < 0 || p.logits_stride < p.logits_cols) {
    return invalid_argument("need 0 ≤ logits_cols ≤ logits_stride, got cols={} stride={}", p.logits_cols,
                            p.logits_stride);
  }
  for (int32_t b = 0; b < p.batch; ++b) {
    if (p.context_lens[b] < 0) {
      return invalid_argument("context_lens[{}] = {} is negative", b, p.context_lens[b]);
    }
    const int64_t entries = entries_in_cache(p, b);
    if (entries > p.logits_cols) {
      return invalid_argument("request {} has {} visible entries but logits_cols is {}", b, entries,
                              p.logits_cols);
    }
    const int64_t pages = (entries + p.page_size - 1) / p.page_size;
    if (pages > p.block_table_stride) {
      return out_of_range("request {} needs {} pages for {} entries but block_table_stride is {}", b,
                          pages, entries, p.block_table_stride);
    }
    if (pages > 0 && p.block_table == nullptr) return invalid_argument("block_table is null");
    for (int64_t lp = 0; lp < pages; ++lp) {
      const int32_t phys = p.block_table[int64_t{b} * p.block_table_stride + lp];
      if (phys < 0 || phys >= p.num_pages) {
        return out_of_range("block_table[{}][{}] = {} is outside the cache's pages [0, {})", b, lp, phys,
                            p.num_pages);
      }
    }
    if (pages > 0 && p.key_cache == nullptr) return invalid_argument("key_cache is null");
    if (p.block_offsets != nullptr) {
      const int32_t begin = p.block_offsets[b];
      const int32_t end = p.block_offsets[b + 1];
      if (begin < 0 || end < begin) {
        return invalid_argument("block_offsets[{}..{}] = [{}, {}) is not a valid range", b, b + 1, begin, end);
      }
      const int64_t block_entries = int64_t{p.block_pages} * p.page_size;
      const int64_t n_blocks = (entries + block_entries - 1) / block_entries;
      for (int32_t i = begin; i < end; ++i) {
        const int32_t id = p.block_ids[i];
        if (id < 0 || id >= n_blocks) {
          return out_of_range("request {} selects block {}, but its {} entries form blocks [0, {})", b, id,
                              entries, n_blocks);
        }
        if (i > begin && id <= p.block_ids[i - 1]) {
          return invalid_argument("request {}: block ids must be sorted ascending and unique ({} after {})",
                                  b, id, p.block_ids[i - 1]);
        }
      }
    }
  }
  const int64_t n_weights = int64_t{p.batch} * p.next_n * p.num_heads;
  for (int64_t i = 0; i < n_weights; ++i) {
    if (std::isnan(p.weights[i]) || std::isinf(p.weights[i])) {
      return invalid_argument("weights[{}] (request {}, row {}, head {}) is {}; weights must be finite", i,
                              i / (int64_t{p.next_n} * p.num_heads), (i / p.num_heads) % p.next_n,
                              i % p.num_heads, p.weights[i]);
    }
  }
  return ok_status();
}

namespace detail {

std::vector<IndexerTile> plan_indexer_tiles(const IndexerParams& p) {
  std::vector<IndexerTile> tiles;
  auto add_page = [&](int32_t b, int64_t logical_page, int64_t entries) {
    const int64_t begin = logical_page * p.page_size;
    const int64_t end = std::min(begin + p.page_size, entries);
    const int32_t phys = p.block_table[int64_t{b} * p.block_table_stride + logical_page];
    for (int64_t e = begin; e < end; e += kTileEntries) {
      tiles.push_back({b, phys, e, static_cast<int32_t>(std::min<int64_t>(kTileEntries, end - e))});
    }
  };
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t entries = entries_in_cache(p, b);
    const int64_t pages = (entries + p.page_size - 1) / p.page_size;
    if (p.block_offsets == nullptr) {
      for (int64_t lp = 0; lp < pages; ++lp) add_page(b, lp, entries);
      continue;
    }
    for (int32_t i = p.block_offsets[b]; i < p.block_offsets[b + 1]; ++i) {
      const int64_t first = int64_t{p.block_ids[i]} * p.block_pages;
      for (int64_t lp = first; lp < std::min(first + p.block_pages, pages); ++lp) add_page(b, lp, entries);
    }
  }
  return tiles;
}

void fill_logits_neg_inf(const IndexerParams& p, int num_threads) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < rows; ++r) {
    std::fill_n(p.logits + r * p.logits_stride, p.logits_cols, neg_inf);
  }
}

}  // namespace detail

bool indexer_impl_supported(IndexerImpl impl) {
  switch (impl) {
    case IndexerImpl::kAvx512Bf16: return detail::cpu_has_avx512bf16();
    case IndexerImpl::kAvx512F: return detail::cpu_has_avx512f();
    case IndexerImpl::kAvx2: return detail::cpu_has_avx2_fma();
    case IndexerImpl::kNeonBf16: return detail::cpu_has_neon_bf16();
    case IndexerImpl::kNeon: return detail::cpu_has_neon();
    default: return true;
  }
}

const std::vector<IndexerImpl>& indexer_impls() {
  static const std::vector<IndexerImpl> impls = {IndexerImpl::kAvx512Bf16, IndexerImpl::kAvx512F, IndexerImpl::kAvx2,
                                                 IndexerImpl::kNeonBf16, IndexerImpl::kNeon, IndexerImpl::kPortable,
                                                 IndexerImpl::kReference};
  return impls;
}

IndexerImpl indexer_best_impl() {
  if (detail::cpu_prefers_fp32_fma_to_bf16_dot()) return IndexerImpl::kAvx512F;
  for (IndexerImpl impl : indexer_impls()) {
    if (indexer_impl_supported(impl)) return impl;
  }
  return IndexerImpl::kPortable;
}

Status score_fp32_keys(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out,
                       IndexerImpl impl) {
  SPIN_RETURN_IF_ERROR(cpu_cap_status());
  if (count < 0) return invalid_argument("score_fp32_keys: count must be ≥ 0, got {}", count);
  if (heads < 1 || heads > 1024) return invalid_argument("score_fp32_keys: heads must be 1..1024, got {}", heads);
  if (q == nullptr || w == nullptr || (count > 0 && (keys == nullptr || out == nullptr))) {
    return invalid_argument("score_fp32_keys: null keys, q, w or out");
  }
  if (impl == IndexerImpl::kAuto) impl = indexer_best_impl();
  if (!indexer_impl_supported(impl)) {
    return invalid_argument("score_fp32_keys: impl {} requested but {}; this CPU runs {} (or use auto)",
                            indexer_impl_name(impl), cpu_lacks_note(indexer_impl_name(impl)),
                            indexer_impl_name(indexer_best_impl()));
  }
  switch (impl) {
    case IndexerImpl::kReference: detail::fp32_keys_run_reference(keys, count, q, w, heads, out); break;
#if SPIN_X86_KERNELS
    case IndexerImpl::kAvx512Bf16:  // fp32 keys: the bf16 machine's fp32 kernel
    case IndexerImpl::kAvx512F: detail::fp32_keys_run_avx512f(keys, count, q, w, heads, out); break;
    case IndexerImpl::kAvx2: detail::fp32_keys_run_avx2(keys, count, q, w, heads, out); break;
#endif
#if SPIN_NEON_KERNELS
    case IndexerImpl::kNeonBf16:
    case IndexerImpl::kNeon: detail::fp32_keys_run_neon(keys, count, q, w, heads, out); break;
#endif
    default: detail::fp32_keys_run_portable(keys, count, q, w, heads, out); break;
  }
  return ok_status();
}

Status indexer_scores(const IndexerParams& params, const IndexerOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_indexer_params(params));
  if (options.num_threads < 0 || options.num_threads > max_threads()) {
    // An unbounded count would have OpenMP start that many threads (100000 exhausts the process).
    return invalid_argument("num_threads must be in 0..{} (this machine's logical CPUs; 0 = all), got {}",
                            max_threads(), options.num_threads);
  }
  SPIN_RETURN_IF_ERROR(cpu_cap_status());
  // An enum value outside the list (a cast from a bad int) would otherwise run the portable path.
  const auto& known = indexer_impls();
  if (options.impl != IndexerImpl::kAuto && std::find(known.begin(), known.end(), options.impl) == known.end())
    return invalid_argument("indexer impl {} is not a known implementation", static_cast<int>(options.impl));
  IndexerImpl impl = options.impl == IndexerImpl::kAuto ? indexer_best_impl() : options.impl;
  if (!indexer_impl_supported(impl)) {
    return invalid_argument("indexer impl {} requested but {}; this CPU runs {} (or use auto)", indexer_impl_name(impl),
                            cpu_lacks_note(indexer_impl_name(impl)), indexer_impl_name(indexer_best_impl()));
  }
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  if (impl == IndexerImpl::kReference) {
    detail::indexer_run_reference(params);
    return ok_status();
  }
  detail::fill_logits_neg_inf(params, threads);
  const std::vector<detail::IndexerTile> tiles = detail::plan_indexer_tiles(params);
  switch (impl) {
#if SPIN_X86_KERNELS
    case IndexerImpl::kAvx512Bf16: detail::indexer_run_avx512bf16(params, tiles, threads); break;
    case IndexerImpl::kAvx512F: detail::indexer_run_avx512f(params, tiles, threads); break;
    case IndexerImpl::kAvx2: detail::indexer_run_avx2(params, tiles, threads); break;
#endif
#if SPIN_NEON_KERNELS
    case IndexerImpl::kNeonBf16: detail::indexer_run_neon_bf16(params, tiles, threads); break;
    case IndexerImpl::kNeon: detail::indexer_run_neon(params, tiles, threads); break;
#endif
    default: detail::indexer_run_portable(params, tiles, threads); break;
  }
  return ok_status();
}

}  // namespace spin
