// Sparse MLA attention front end: argument validation (once, in a fixed order) and dispatch. The
// math lives in the implementations; see spin/attention.h for what is computed. The latent cache
// it reads is src/cache/latent_cache.cpp.
#include <omp.h>

#include <vector>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "kernels/cpu_features.h"
#include "kernels/attention_internal.h"
#include "spin/attention.h"
#include "spin/cpu.h"

namespace spin {

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAuto: return "auto";
    case AttentionImpl::kAvx512Bf16: return "avx512bf16";
    case AttentionImpl::kAvx512F: return "avx512f";
    case AttentionImpl::kAvx2: return "avx2";
    case AttentionImpl::kNeon: return "neon";
    case AttentionImpl::kPortable: return "portable";
    case AttentionImpl::kReference: return "reference";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

// Checks one index list of one row; `what` names the list in messages.
Status check_row_indices(const SparseAttentionParams& p, const char* what, const int32_t* idx, int32_t count,
                         int64_t row) {
  const int32_t b = static_cast<int32_t>(row / p.next_n);
  const int64_t capacity = int64_t{p.block_table_stride} * p.page_size;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t s = idx[i];
    if (s == -1) continue;
    if (s < -1) {
      return invalid_argument("{}[{}][{}] = {}: an index is a request-local entry position ≥ 0, or -1 to skip",
                              what, row, i, s);
    }
    if (p.visible_entries != nullptr && s >= p.visible_entries[row]) {
      return out_of_range("{}[{}][{}] = {} but row {} (request {}, row {} of {}) sees only entries [0, {})", what,
                          row, i, s, row, b, row % p.next_n, p.next_n, p.visible_entries[row]);
    }
    if (s >= capacity) {
      return out_of_range("{}[{}][{}] = {} needs logical page {}, but block_table_stride is {}", what, row, i, s,
                          s / p.page_size, p.block_table_stride);
    }
    const int64_t lp = s / p.page_size;
    const int32_t phys = p.block_table[int64_t{b} * p.block_table_stride + lp];
    if (phys < 0 || phys >= p.num_pages) {
      return out_of_range("block_table[{}][{}] = {} (for {}[{}][{}] = {}) is outside the cache's pages [0, {})", b,
                          lp, phys, what, row, i, s, p.num_pages);
    }
  }
  return ok_status();
}

}  // namespace

Status validate_sparse_attention_params(const SparseAttentionParams& p) {
  // Sizes first, then pointers, then contents — so the first error is the most basic one.
  if (p.dtype != LatentDtype::kBf16 && p.dtype != LatentDtype::kFp8) {
    return invalid_argument("dtype {} is not a latent cache dtype (bf16 = 0, fp8 = 1)", static_cast<int32_t>(p.dtype));
  }
  if (p.page_size < 1) return invalid_argument("page_size must be ≥ 1, got {}", p.page_size);
  if (p.num_pages < 0) return invalid_argument("num_pages must be ≥ 0, got {}", p.num_pages);
  if (p.block_table_stride < 0) {
    return invalid_argument("block_table_stride must be ≥ 0, got {}", p.block_table_stride);
  }
  if (p.batch < 0) return invalid_argument("batch must be ≥ 0, got {}", p.batch);
  if (p.next_n < 1 || p.next_n > kMaxNextN) {
    return invalid_argument("next_n (rows per request) must be in [1, {}], got {}", kMaxNextN, p.next_n);
  }
  if (p.num_heads < 1 || p.num_heads > kMaxAttentionHeads) {
    return invalid_argument("num_heads must be in [1, {}], got {}", kMaxAttentionHeads, p.num_heads);
  }
  if (p.topk < 0) return invalid_argument("topk must be ≥ 0, got {}", p.topk);
  if (p.n_extra < 0) return invalid_argument("n_extra must be ≥ 0, got {}", p.n_extra);
  if (int64_t{p.topk} + p.n_extra > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("topk + n_extra = {} does not fit in int32", int64_t{p.topk} + p.n_extra);
  }
  if (!std::isfinite(p.softmax_scale)) {
    return invalid_argument("softmax_scale is {}; it must be finite (e.g. 576^-0.5)", p.softmax_scale);
  }
  if (p.batch == 0) return ok_status();
  if (p.q == nullptr) return invalid_argument("q is null");
  if (p.out == nullptr) return invalid_argument("out is null");
  if (p.topk > 0 && p.indices == nullptr) return invalid_argument("indices is null but topk is {}", p.topk);
  if (p.n_extra > 0 && p.extra_indices == nullptr) {
    return invalid_argument("extra_indices is null but n_extra is {}", p.n_extra);
  }
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int64_t q_values = rows * p.num_heads * kMlaHeadDim;
  for (int64_t i = 0; i < q_values; ++i) {
    if ((p.q[i] & 0x7F80) == 0x7F80) {  // bf16 exponent all ones: inf or NaN
      return invalid_argument("q[{}][{}][{}] is {}; q must be finite", i / (int64_t{p.num_heads} * kMlaHeadDim),
                              (i / kMlaHeadDim) % p.num_heads, i % kMlaHeadDim, bf16_to_float(p.q[i]));
    }
  }
  bool any_valid = false;
  for (int64_t i = 0; i < rows * p.topk && !any_valid; ++i) any_valid = p.indices[i] >= 0;
  for (int64_t i = 0; i < rows * p.n_extra && !any_valid; ++i) any_valid = p.extra_indices[i] >= 0;
  if (any_valid && p.block_table == nullptr) return invalid_argument("block_table is null");
  if (any_valid && p.latent_cache == nullptr) return invalid_argument("latent_cache is null");
  for (int64_t row = 0; row < rows; ++row) {
    if (p.visible_entries != nullptr && p.visible_entries[row] < 0) {
      return invalid_argument("visible_entries[{}] = {} is negative", row, p.visible_entries[row]);
    }
    SPIN_RETURN_IF_ERROR(check_row_indices(p, "indices", p.indices + row * p.topk, p.topk, row));
    SPIN_RETURN_IF_ERROR(check_row_indices(p, "extra_indices", p.extra_indices + row * p.n_extra, p.n_extra, row));
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Dispatch

bool attention_impl_supported(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAvx512Bf16: return detail::cpu_has_avx512bf16();
    case AttentionImpl::kAvx512F: return detail::cpu_has_avx512f();
    case AttentionImpl::kAvx2: return detail::cpu_has_avx2_fma();
    case AttentionImpl::kNeon: return detail::cpu_has_neon();
    default: return true;
  }
}

const std::vector<AttentionImpl>& attention_impls() {
  static const std::vector<AttentionImpl> impls = {AttentionImpl::kAvx512Bf16, AttentionImpl::kAvx512F,
                                                   AttentionImpl::kAvx2, AttentionImpl::kNeon, AttentionImpl::kPortable,
                                                   AttentionImpl::kReference};
  return impls;
}

AttentionImpl attention_best_impl() {
  if (detail::cpu_prefers_fp32_fma_to_bf16_dot()) return AttentionImpl::kAvx512F;
  for (AttentionImpl impl : attention_impls()) {
    if (attention_impl_supported(impl)) return impl;
  }
  return AttentionImpl::kPortable;
}

Status sparse_attention(const SparseAttentionParams& params, const AttentionOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_sparse_attention_params(params));
  if (options.num_threads < 0) return invalid_argument("num_threads must be ≥ 0, got {}", options.num_threads);
  if (options.heads_per_task != 0 && options.heads_per_task != 16 && options.heads_per_task != 32 &&
      options.heads_per_task != 64 && options.heads_per_task != 128) {
    return invalid_argument("heads_per_task must be 0 (auto), 16, 32, 64 or 128, got {}", options.heads_per_task);
  }
  SPIN_RETURN_IF_ERROR(cpu_cap_status());
  const AttentionImpl impl = options.impl == AttentionImpl::kAuto ? attention_best_impl() : options.impl;
  if (!attention_impl_supported(impl)) {
    return invalid_argument("attention impl {} requested but {}; this CPU runs {} (or use auto)",
                            attention_impl_name(impl), cpu_lacks_note(attention_impl_name(impl)), attention_impl_name(attention_best_impl()));
  }
  if (params.batch == 0) return ok_status();
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  switch (impl) {
    case AttentionImpl::kReference: detail::attention_run_reference(params); break;
#if SPIN_X86_KERNELS
    case AttentionImpl::kAvx512Bf16:
      detail::attention_run_avx512bf16(params, threads, options.heads_per_task, options.bf16_probabilities);
      break;
    case AttentionImpl::kAvx512F: detail::attention_run_avx512f(params, threads, options.heads_per_task); break;
    case AttentionImpl::kAvx2: detail::attention_run_avx2(params, threads, options.heads_per_task); break;
#endif
#if SPIN_NEON_KERNELS
    case AttentionImpl::kNeon: detail::attention_run_neon(params, threads, options.heads_per_task); break;
#endif
    default: detail::attention_run_portable(params, threads); break;
  }
  return ok_status();
}

}  // namespace spin
