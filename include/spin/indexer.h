// spin/indexer.h — lightning-indexer scoring over the paged key cache (DSA; layout: spin/geometry.h).
//
// For request b, row r (one of next_n query rows) and visible entry s:
//
//   I[r,s] = k_scale[s] · Σ_h w[r,h] · ReLU( Σ_d q[r,h,d] · k[s,d] )     q, k: e4m3; w, I: fp32
//
// Row r of next_n sees entries [0, visible_entries(ctx_len, next_n, r, compress_ratio)): the rule
// of spin/geometry.h (V3.2: t+1 tokens at token position t = ctx_len - next_n + r; V4 CSA layers:
// compressed row s visible iff s < floor((t+1)/4)).
//
// Either every visible entry is scored, or only the entries of a sorted list of logical blocks
// (a block = block_pages consecutive logical pages). Every output column in [0, logits_cols)
// that is not scored — masked out, not visible, or beyond the context — is written as -inf, so
// the buffer never holds garbage (unlike DeepGEMM with clean_logits=False).
//
// IndexerParams is a flat, C-style struct (pointers, int32/int64 sizes and strides, no STL) so the
// same struct can later be handed to a CUDA launcher unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "spin/geometry.h"
#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

inline constexpr int32_t kMaxIndexerHeads = 128;

struct IndexerParams {
  // --- Key cache of one indexer layer (layout: spin/geometry.h) -----------------------------------
  const uint8_t* key_cache = nullptr;  // [num_pages, page_size · 132] bytes
  int32_t page_size = kDefaultPageSize;
  int32_t num_pages = 0;
  const int32_t* block_table = nullptr;  // [batch, block_table_stride]: logical → physical page
  int32_t block_table_stride = 0;
  // --- Requests ---------------------------------------------------------------------------------
  int32_t batch = 0;
  const int64_t* context_lens = nullptr;  // [batch]: tokens cached, including this step's rows
  int32_t next_n = 1;                     // rows per request, 1..4
  int32_t compress_ratio = 1;             // tokens per cache entry (1: V3.2, 4: V4 CSA)
  // --- Queries ----------------------------------------------------------------------------------
  int32_t num_heads = 64;
  const uint8_t* q = nullptr;        // [batch, next_n, num_heads, 128] e4m3, scale-free
  const float* weights = nullptr;    // [batch, next_n, num_heads] with every scale folded in
  // --- Optional block mask (CSR over requests); null block_offsets = score every visible entry --
  const int32_t* block_ids = nullptr;      // sorted, unique logical block ids of each request
  const int32_t* block_offsets = nullptr;  // [batch + 1]: request b owns ids [offsets[b], offsets[b+1])
  int32_t block_pages = 1;                 // pages per block
  // --- Output -----------------------------------------------------------------------------------
  float* logits = nullptr;        // [batch · next_n, logits_stride] fp32
  int64_t logits_stride = 0;
  int64_t logits_cols = 0;        // columns written per row (≥ the longest visible row)
};

enum class IndexerImpl {
  kAuto = 0,     // the fastest this CPU supports
  kAvx512Bf16,   // AVX-512 BF16 dot products (vdpbf16ps), fp32 accumulation
  kAvx512F,      // AVX-512F fp32 FMA (Skylake-X, Cascade Lake: AVX-512 without BF16)
  kAvx2,         // AVX2 + FMA + F16C fp32 FMA (Zen 2/3, Haswell and later)
  kNeonBf16,     // Arm NEON BF16 dot products (BFDOT; FEAT_BF16: Neoverse V1/V2/N2, Graviton 3/4, Grace)
  kNeon,         // Arm NEON fp32 FMA (every aarch64 CPU)
  kPortable,     // plain C++ fp32, auto-vectorised; any x86-64 / any ISA
  kReference,    // scalar, double accumulation: the ground truth
};
const char* indexer_impl_name(IndexerImpl impl);

struct IndexerOptions {
  IndexerImpl impl = IndexerImpl::kAuto;
  int num_threads = 0;  // 0 = OpenMP default; results are bitwise identical for any value
};

// Checks every field once, in a fixed order; the message names the field and what is supported.
Status validate_indexer_params(const IndexerParams& params);

// Validates, then scores with the chosen implementation. A SIMD path this CPU lacks fails with
// kInvalidArgument naming it; kAuto never fails for that reason.
Status indexer_scores(const IndexerParams& params, const IndexerOptions& options = {});

// The indexer formula over fp32 keys — hisa's pooled block keys and spin-hybrid's probe:
//   out[i] = Σ_h w[h] · ReLU(q[h] · keys[i]),   keys [count, 128], q [heads, 128], w [heads]
// (the heads summed in order, only positive dots). One thread. The paths are the indexer's
// fp32-FMA ones: kAuto takes this CPU's widest (avx512f, avx2 or neon; a bf16 path runs its
// ISA's fp32 kernel, as the keys have no bf16 form), kPortable plain C++, kReference double
// accumulation. Paths differ from each other in the last bits only; each is deterministic.
Status score_fp32_keys(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out,
                       IndexerImpl impl = IndexerImpl::kAuto);

// Whether this CPU can run `impl` (kAuto, kPortable and kReference: always).
bool indexer_impl_supported(IndexerImpl impl);
// Every implementation, fastest first (kAuto excluded): what `--impl` accepts.
const std::vector<IndexerImpl>& indexer_impls();

// The implementation kAuto picks on this machine: the first supported of avx512bf16, avx512f,
// avx2, neon, portable — except on Intel cores with AVX-512F, where avx512f (measured faster there than
// the bf16 kernel; see indexer.cpp).
IndexerImpl indexer_best_impl();

}  // namespace spin
