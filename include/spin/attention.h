// spin/attention.h — sparse MLA decode attention over the top-k entries (DSA core attention, which
// consumes spin/topk.h's output; FlashMLA's sparse decode, absorbed "MQA" form: one shared latent
// KV head).
//
// For row r (one query token of request b) and head h, over the selected entries s of
// S_r = [ indices[r, 0..topk) ‖ extra_indices[r, 0..n_extra) ] with every -1 skipped:
//
//   score[h,s] = softmax_scale · Σ_{d<576} q[r,h,d] · k_s[d]        k_s = [latent_s (512) | rope_s (64)]
//   p[h,s]     = exp(score[h,s]) / Σ_{s' ∈ S_r} exp(score[h,s'])
//   o[r,h,:]   = Σ_{s ∈ S_r} p[h,s] · latent_s                        [rows, heads, 512] fp32
//   lse[r,h]   = ln Σ_{s ∈ S_r} exp(score[h,s])                        [rows, heads] fp32 (optional)
//
// Shapes: q [rows, heads, 576] bf16 (absorbed q_nope 512 | q_rope 64, as FlashMLA takes it),
// indices [rows, topk] and extra_indices [rows, n_extra] int32 request-local entry positions, with
// rows = batch · next_n in request-major order. -1 means "no entry" and is skipped; any other
// index must address a written entry. Duplicates are NOT removed: an entry listed twice is two
// terms of the softmax (twice the weight), exactly as FlashMLA does; the indexer's top-k never
// emits duplicates, so this only matters for hand-made index lists. A row with no valid entry
// outputs o = 0 and lse = -inf (the log of an empty sum; FlashMLA's test reference reports +inf).
// Order inside S_r only changes fp32 rounding (the softmax is permutation-invariant).
// The output is fp32, not bf16 like FlashMLA's: the CPU kernels accumulate in fp32 anyway, the
// consumers here (the W_UV absorption, spin/lab/engine.h's attn_err) want it unrounded, and rounding
// to bf16 is one call for a caller that needs it. Cost: 2 · rows · heads · |S_r| · (576 + 512) FLOP.
//
// Extra indices are the V4 sliding-window entries: they address the same cache and page table as
// `indices` (V4 decode already addresses one logical space, [128-slot window | compressed rows]).
//
// The latent cache (spin/cache.h's LatentCache) is paged like the indexer cache (same block
// tables, logical → physical page), one entry per token (or per compressed row), in one of the two
// entry-major layouts of spin/geometry.h: kBf16 (1152 B) or FlashMLA V3.2 `fp8_ds_mla` (656 B).
// fp8 scales are UE8M0 powers of two computed exactly as spin::ue8m0_scale /
// quantize_e4m3_block128 do (spin/numerics.h); the reader accepts any positive fp32 scale, but the
// fast kernel is exact only for powers of two (see below).
// e4m3 has 4 significant bits and a power-of-two scale only moves the exponent, so e4m3 · 2^k is
// exactly representable in bf16 (8 significant bits, fp32's exponent range) for every k that
// keeps it inside fp32's normal range — which every scale the writer produces does (the smallest
// is ~2^-22, so the smallest nonzero value is ~2^-31). Dequantising
// fp8 → bf16 is therefore exact, and the fast kernel's bf16 products with fp32 accumulation
// reproduce the tensor-core math up to summation order.
//
// SparseAttentionParams is a flat, C-style struct (pointers, int32/int64 sizes, no STL) so the
// same struct can later be handed to a CUDA launcher unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "spin/cache.h"
#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

inline constexpr int32_t kMaxAttentionHeads = 128;

struct SparseAttentionParams {
  // --- Latent cache of one layer (layout: spin/geometry.h) ------------------------------------------------
  const uint8_t* latent_cache = nullptr;  // [num_pages, page_size · entry_bytes] bytes
  LatentDtype dtype = LatentDtype::kFp8;
  int32_t page_size = kDefaultPageSize;
  int32_t num_pages = 0;
  const int32_t* block_table = nullptr;  // [batch, block_table_stride]: logical → physical page
  int32_t block_table_stride = 0;
  // --- Requests and rows ------------------------------------------------------------------------
  int32_t batch = 0;
  int32_t next_n = 1;                          // rows per request, 1..kMaxNextN
  const int64_t* visible_entries = nullptr;    // optional [rows]: indices of row r must be below it
  // --- Queries ----------------------------------------------------------------------------------
  int32_t num_heads = 128;                     // 1..128 (V3.2: 128, V4-Flash: 64)
  const uint16_t* q = nullptr;                 // [rows, num_heads, 576] bf16 bits
  float softmax_scale = 0.0f;                  // finite; e.g. 576^-0.5 (times YaRN mscale²)
  // --- Selected entries -------------------------------------------------------------------------
  const int32_t* indices = nullptr;            // [rows, topk]; -1 = skip
  int32_t topk = 0;
  const int32_t* extra_indices = nullptr;      // optional [rows, n_extra] (V4 window); -1 = skip
  int32_t n_extra = 0;
  // --- Output -----------------------------------------------------------------------------------
  float* out = nullptr;                        // [rows, num_heads, 512] fp32
  float* lse = nullptr;                        // optional [rows, num_heads] fp32, natural log
};

enum class AttentionImpl {
  kAuto = 0,     // the fastest this CPU supports
  kAvx512Bf16,   // AVX-512 BF16 (vdpbf16ps) QK^T, online softmax, fp32-FMA P·V
  kAvx512F,      // AVX-512F fp32 FMA throughout (AVX-512 without BF16); P·V always fp32
  kAvx2,         // AVX2 + FMA fp32 FMA throughout (Zen 2/3, Haswell and later); P·V always fp32
  kNeon,         // Arm NEON fp32 FMA throughout (every aarch64 CPU); P·V always fp32
  kPortable,     // plain C++ fp32, auto-vectorised; any ISA
  kReference,    // scalar, double accumulation: the ground truth
};
const char* attention_impl_name(AttentionImpl impl);

struct AttentionOptions {
  AttentionImpl impl = AttentionImpl::kAuto;
  int num_threads = 0;     // 0 = OpenMP default; results are bitwise identical for any value
  // Heads per parallel task of the SIMD kernels: 0 = auto (avx512bf16: the largest that still
  // gives every thread two tasks; the fp32-FMA paths: the largest that loads the threads evenly —
  // two tasks per thread or a multiple of the thread count), or 16, 32, 64, 128 (the fp32 paths
  // round it up to their head chunk: 16 heads on AVX2 and NEON, 64 on AVX-512F). Every head's
  // arithmetic is independent of its task, so results are bitwise identical for any value; it only
  // trades parallelism against gathering (dequantising) the same entries once per task.
  int heads_per_task = 0;
  // Round the softmax probabilities to bf16 before P·V, as FlashMLA does, so that P·V also runs on
  // vdpbf16ps (half the instructions of fp32 FMAs; measured +25–30 % for the whole kernel). Each
  // probability gains a relative error ≤ 2^-9, so |Δo| ≤ 2^-9 · max|v| per output. false: fp32
  // P·V (~1e-6). Only the AVX-512 BF16 kernel uses it; every other path computes P·V in fp32.
  bool bf16_probabilities = true;
};

// Checks every field once, in a fixed order; the message names the field and what is supported.
Status validate_sparse_attention_params(const SparseAttentionParams& params);

// Validates, then computes o (and lse) with the chosen implementation. A SIMD path this CPU lacks
// fails with kInvalidArgument naming it; kAuto never fails for that reason.
Status sparse_attention(const SparseAttentionParams& params, const AttentionOptions& options = {});

// The implementation kAuto picks on this machine: the first supported of attention_impls(),
// except on Intel cores with AVX-512F, where avx512f (measured 1.6–2.9× faster there than the bf16
// kernel, as for the indexer; see cpu_features.h).
AttentionImpl attention_best_impl();
// Whether this CPU can run `impl` (kAuto, kPortable, kReference: always); every implementation,
// fastest first (kAuto excluded).
bool attention_impl_supported(AttentionImpl impl);
const std::vector<AttentionImpl>& attention_impls();

}  // namespace spin
