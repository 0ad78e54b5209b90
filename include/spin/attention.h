// spin/attention.h — sparse MLA decode attention over the top-k entries (DSA core attention,
// DESIGN.md §1, §3; FlashMLA's sparse decode, absorbed "MQA" form: one shared latent KV head).
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
// consumers here (the W_UV absorption, DESIGN.md §5's attn_err) want it unrounded, and rounding
// to bf16 is one call for a caller that needs it. Cost: 2 · rows · heads · |S_r| · (576 + 512) FLOP.
//
// Extra indices are the V4 sliding-window entries: they address the same cache and page table as
// `indices` (V4 decode already addresses one logical space, [128-slot window | compressed rows]).
//
// The latent cache is paged like the indexer cache (same block tables, logical → physical page),
// one entry per token (or per compressed row), in one of two entry-major layouts:
//   kBf16: 576 bf16 [latent 512 | rope 64], 1152 B per entry.
//   kFp8:  FlashMLA V3.2 `fp8_ds_mla`, 656 B per entry: [512 e4m3 latent | 4 fp32 scales, one per
//          128-dim latent tile | 64 bf16 rope]. Scales are UE8M0 powers of two computed exactly as
//          spin::ue8m0_scale / quantize_e4m3_block128 do (spin/numerics.h); the reader accepts any
//          positive fp32 scale, but the fast kernel is exact only for powers of two (see below).
//          (FlashMLA's test quantiser floors the scale at 1e-4 rather than amax at 1e-4, so tiles
//          with amax < 0.0448 get other bytes there; both read back through the same formula.)
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

#include <cstddef>
#include <cstdint>
#include <memory>

#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

inline constexpr int32_t kMlaLatentDim = 512;                      // d_v: the latent (nope) part
inline constexpr int32_t kMlaRopeDim = 64;                         // the rope part of the key
inline constexpr int32_t kMlaHeadDim = kMlaLatentDim + kMlaRopeDim;  // d_qk = 576
inline constexpr int32_t kMlaTileDim = 128;                        // fp8 scale tile
inline constexpr int32_t kMlaNumTiles = kMlaLatentDim / kMlaTileDim;  // 4 scales per entry
inline constexpr int32_t kMaxAttentionHeads = 128;

enum class LatentDtype : int32_t {
  kBf16 = 0,  // 576 bf16 per entry
  kFp8 = 1,   // FlashMLA V3.2 fp8_ds_mla, 656 B per entry
};
const char* latent_dtype_name(LatentDtype dtype);

// Byte offsets inside one page and one entry; the only place the layouts are spelled out.
struct LatentPageLayout {
  LatentDtype dtype = LatentDtype::kFp8;
  int32_t page_size = 64;

  // kBf16 entry: bf16 value d (0..575) at 2·d; latent d < 512, rope 512 + j.
  static constexpr int64_t kBf16EntryBytes = int64_t{kMlaHeadDim} * 2;  // 1152
  static constexpr int64_t kBf16RopeOffset = int64_t{kMlaLatentDim} * 2;  // 1024
  // kFp8 entry: e4m3 latent code d at d; fp32 scale of tile t at 512 + 4·t; bf16 rope j at 528 + 2·j.
  static constexpr int64_t kFp8LatentOffset = 0;
  static constexpr int64_t kFp8ScaleOffset = kMlaLatentDim;                          // 512
  static constexpr int64_t kFp8RopeOffset = kFp8ScaleOffset + 4 * kMlaNumTiles;      // 528
  static constexpr int64_t kFp8EntryBytes = kFp8RopeOffset + 2 * int64_t{kMlaRopeDim};  // 656

  constexpr int64_t entry_bytes() const {
    return dtype == LatentDtype::kBf16 ? kBf16EntryBytes : kFp8EntryBytes;
  }
  constexpr int64_t page_bytes() const { return int64_t{page_size} * entry_bytes(); }
  // Entry `entry` (0..page_size) of a page starts here; entries are contiguous (entry-major).
  constexpr int64_t entry_offset(int32_t entry) const { return int64_t{entry} * entry_bytes(); }
};
static_assert(LatentPageLayout::kBf16EntryBytes == 1152, "bf16 entry: 576 values × 2 B");
static_assert(LatentPageLayout::kFp8EntryBytes == 656, "FlashMLA V3.2 fp8_ds_mla: 656 B per token");
static_assert(LatentPageLayout::kFp8ScaleOffset == 512, "4 fp32 scales follow the 512 e4m3 codes");
static_assert(LatentPageLayout::kFp8RopeOffset == 528, "64 bf16 rope values follow the scales");
static_assert(LatentPageLayout{LatentDtype::kFp8, 64}.page_bytes() == 41984, "64 × 656 B");
static_assert(LatentPageLayout{LatentDtype::kBf16, 64}.page_bytes() == 73728, "64 × 1152 B");
static_assert(LatentPageLayout{LatentDtype::kFp8, 64}.entry_offset(63) == 63 * 656, "entry-major");
static_assert(LatentPageLayout{LatentDtype::kBf16, 1}.page_bytes() == 1152, "page_size 1 is one entry");

// One entry: fp32 [576] = [latent 512 | rope 64] → bytes in `dtype`'s layout (entry_bytes long).
// kBf16 rounds every value to bf16 (RNE); kFp8 quantises each 128-dim latent tile with
// quantize_e4m3_block128 (UE8M0 scale) and rounds the rope to bf16. Values must be finite.
void encode_latent_entry(LatentDtype dtype, const float* values, uint8_t* entry);
// The inverse: bytes → fp32 [576], e4m3 · scale computed in fp32 (exact for power-of-two scales).
void decode_latent_entry(LatentDtype dtype, const uint8_t* entry, float* values);

// The MLA latent cache of one layer: num_pages pages in the layout above, 64-byte aligned,
// addressed through the same request page tables as the indexer cache.
class LatentCache {
 public:
  static Result<LatentCache> create(LatentDtype dtype, int32_t page_size, int32_t num_pages);

  LatentPageLayout layout() const { return layout_; }
  LatentDtype dtype() const { return layout_.dtype; }
  int32_t num_pages() const { return num_pages_; }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size_bytes() const { return static_cast<size_t>(layout_.page_bytes()) * num_pages_; }

  // Encodes `count` fp32 entries [count, 576] and stores them at request positions
  // [first_position, first_position + count) through the request's page table (pages[logical]).
  // Everything is checked before anything is written: a failed call leaves the cache unchanged.
  Status write(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position, const float* entries,
               int64_t count);
  // Reads one entry back, decoded to fp32 [576] — for tests and tools, not hot paths.
  Status read_entry(const int32_t* pages, int64_t num_pages_in_table, int64_t position, float* values) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  LatentCache(LatentPageLayout layout, int32_t num_pages, std::unique_ptr<uint8_t[], FreeDeleter> data)
      : layout_(layout), num_pages_(num_pages), data_(std::move(data)) {}
  Status check_span(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                    int64_t count) const;

  LatentPageLayout layout_;
  int32_t num_pages_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
};

struct SparseAttentionParams {
  // --- Latent cache of one layer (layout above) ------------------------------------------------
  const uint8_t* latent_cache = nullptr;  // [num_pages, page_size · entry_bytes] bytes
  LatentDtype dtype = LatentDtype::kFp8;
  int32_t page_size = 64;
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
  kPortable,     // plain C++ fp32, auto-vectorised; any ISA
  kReference,    // scalar, double accumulation: the ground truth
};
const char* attention_impl_name(AttentionImpl impl);

struct AttentionOptions {
  AttentionImpl impl = AttentionImpl::kAuto;
  int num_threads = 0;     // 0 = OpenMP default; results are bitwise identical for any value
  // Heads per parallel task of the AVX-512 kernel: 0 = auto (the largest that still gives every
  // thread two tasks), or 16, 32, 64, 128. Every head's arithmetic is independent of its task, so
  // results are bitwise identical for any value; it only trades parallelism against gathering
  // (dequantising) the same entries once per task.
  int heads_per_task = 0;
  // Round the softmax probabilities to bf16 before P·V, as FlashMLA does, so that P·V also runs on
  // vdpbf16ps (half the instructions of fp32 FMAs; measured +25–30 % for the whole kernel). Each
  // probability gains a relative error ≤ 2^-9, so |Δo| ≤ 2^-9 · max|v| per output. false: fp32
  // P·V (~1e-6). Only the AVX-512 kernel uses it; the reference and portable paths are fp32.
  bool bf16_probabilities = true;
};

// Checks every field once, in a fixed order; the message names the field and what is supported.
Status validate_sparse_attention_params(const SparseAttentionParams& params);

// Validates, then computes o (and lse) with the chosen implementation. kAvx512Bf16 on a CPU
// without it fails with kInvalidArgument; kAuto never fails for that reason.
Status sparse_attention(const SparseAttentionParams& params, const AttentionOptions& options = {});

// The implementation kAuto picks on this machine.
AttentionImpl attention_best_impl();

}  // namespace spin
