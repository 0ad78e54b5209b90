// spin/geometry.h — the one place the cache geometry is spelled out: the indexer key page, the
// MLA latent page, and the visibility rule ("entries a row sees"). The cache, the kernels, the
// predictors (hisa reads keys itself), the engine and the trace tools all take them from here.
//
// Indexer key page (one per indexer layer; vLLM's `[num_blocks, block_size, 132]` uint8 indexer
// cache, DeepGEMM's paged-logits input):
//
//   [ page_size × 128 bytes of e4m3 key values | page_size × 4 bytes of fp32 UE8M0 scales ]
//
// so entry `o` of physical page `p` has its values at p·page_bytes + o·128 and its scale at
// p·page_bytes + page_size·128 + 4·o (8448 bytes per page at the default page_size 64).
//
// MLA latent page (one per layer, same page tables): page_size entries, entry-major, in one of two
// entry layouts — bf16 [latent 512 | rope 64] (1152 B), or FlashMLA V3.2 `fp8_ds_mla` (656 B):
// [512 e4m3 latent | 4 fp32 UE8M0 scales, one per 128-dim tile | 64 bf16 rope].
//
// Visibility: a step of a request appends next_n query rows (1 for plain decode, 1 + draft tokens
// under MTP verification) and `context_len` counts the tokens cached including them. Row r sees
// the tokens up to its own position t = context_len - next_n + r, i.e. t + 1 tokens, which hold
// floor((t + 1) / compress_ratio) entries (compress_ratio 1 on V3.2; 4 on V4 CSA layers, where
// token t sees compressed row s iff s < floor((t + 1) / 4)); clamped at 0.
#pragma once

#include <cstdint>

#include "spin/numerics.h"

namespace spin {

// ---------------------------------------------------------------------------------------------
// Indexer key page.

inline constexpr int32_t kDefaultPageSize = 64;
inline constexpr int32_t kEntryValueBytes = kIndexerHeadDim;                 // 128 e4m3 codes
inline constexpr int32_t kEntryScaleBytes = 4;                               // one fp32 scale
inline constexpr int32_t kEntryBytes = kEntryValueBytes + kEntryScaleBytes;  // 132

// Offsets inside one page.
struct IndexerPageLayout {
  int32_t page_size = kDefaultPageSize;

  constexpr int64_t page_bytes() const { return int64_t{page_size} * kEntryBytes; }
  constexpr int64_t value_offset(int32_t entry) const { return int64_t{entry} * kEntryValueBytes; }
  constexpr int64_t scale_offset(int32_t entry) const {
    return int64_t{page_size} * kEntryValueBytes + int64_t{entry} * kEntryScaleBytes;
  }
};
static_assert(IndexerPageLayout{64}.page_bytes() == 8448, "vLLM V3.2 indexer page is 8448 bytes");
static_assert(IndexerPageLayout{64}.value_offset(1) == 128, "values are entry-major, 128 B each");
static_assert(IndexerPageLayout{64}.scale_offset(0) == 8192, "scales follow all 64 value rows");
static_assert(IndexerPageLayout{64}.scale_offset(63) == 8444, "last scale ends the page");
static_assert(IndexerPageLayout{1}.page_bytes() == 132, "page_size 1 is one 132-byte entry");

// ---------------------------------------------------------------------------------------------
// MLA latent page.

inline constexpr int32_t kMlaLatentDim = 512;                         // d_v: the latent (nope) part
inline constexpr int32_t kMlaRopeDim = 64;                            // the rope part of the key
inline constexpr int32_t kMlaHeadDim = kMlaLatentDim + kMlaRopeDim;   // d_qk = 576
inline constexpr int32_t kMlaTileDim = 128;                           // fp8 scale tile
inline constexpr int32_t kMlaNumTiles = kMlaLatentDim / kMlaTileDim;  // 4 scales per entry

enum class LatentDtype : int32_t {
  kBf16 = 0,  // 576 bf16 per entry
  kFp8 = 1,   // FlashMLA V3.2 fp8_ds_mla, 656 B per entry
};
constexpr const char* latent_dtype_name(LatentDtype dtype) {
  return dtype == LatentDtype::kBf16 ? "bf16" : dtype == LatentDtype::kFp8 ? "fp8" : "unknown";
}

// Byte offsets inside one page and one entry.
struct LatentPageLayout {
  LatentDtype dtype = LatentDtype::kFp8;
  int32_t page_size = kDefaultPageSize;

  // kBf16 entry: bf16 value d (0..575) at 2·d; latent d < 512, rope 512 + j.
  static constexpr int64_t kBf16EntryBytes = int64_t{kMlaHeadDim} * 2;    // 1152
  static constexpr int64_t kBf16RopeOffset = int64_t{kMlaLatentDim} * 2;  // 1024
  // kFp8 entry: e4m3 latent code d at d; fp32 scale of tile t at 512 + 4·t; bf16 rope j at 528 + 2·j.
  static constexpr int64_t kFp8LatentOffset = 0;
  static constexpr int64_t kFp8ScaleOffset = kMlaLatentDim;                             // 512
  static constexpr int64_t kFp8RopeOffset = kFp8ScaleOffset + 4 * kMlaNumTiles;         // 528
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

// ---------------------------------------------------------------------------------------------
// Visibility.

// Entries row `row` (0..next_n-1) of a step sees, see the banner. With compress_ratio 1,
// context_len may equally be read as the entries cached (V3.2: one entry per token).
constexpr int64_t visible_entries(int64_t context_len, int32_t next_n, int32_t row,
                                  int32_t compress_ratio = 1) {
  const int64_t tokens = context_len - next_n + row + 1;
  return tokens <= 0 ? 0 : tokens / compress_ratio;
}
static_assert(visible_entries(100, 4, 0) == 97 && visible_entries(100, 4, 3) == 100, "MTP rows");
static_assert(visible_entries(2, 4, 0) == 0, "clamped at 0");
static_assert(visible_entries(40, 3, 0, 4) == 9 && visible_entries(40, 3, 2, 4) == 10, "V4: (t+1)/4");

}  // namespace spin
