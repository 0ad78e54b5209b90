// spin/cache.h — the paged indexer key cache, byte-compatible with vLLM / DeepGEMM.
//
// One page of one indexer layer holds `page_size` entries:
//
//   [ page_size × 128 bytes of e4m3 key values | page_size × 4 bytes of fp32 UE8M0 scales ]
//
// so entry `o` of physical page `p` has its values at p·page_bytes + o·128 and its scale at
// p·page_bytes + page_size·128 + 4·o (8448 bytes per page at the default page_size 64). This is
// vLLM's `[num_blocks, block_size, 132]` uint8 indexer cache and DeepGEMM's paged-logits input.
//
// Pages are handed out by a PageAllocator shared by all requests (and all layers: every layer
// uses the same block table, as in vLLM). A request's logical page i lives in physical page
// block_table[i].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

inline constexpr int32_t kDefaultPageSize = 64;
inline constexpr int32_t kEntryValueBytes = kIndexerHeadDim;               // 128 e4m3 codes
inline constexpr int32_t kEntryScaleBytes = 4;                             // one fp32 scale
inline constexpr int32_t kEntryBytes = kEntryValueBytes + kEntryScaleBytes;  // 132

// Offsets inside one page; the only place the layout is spelled out.
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

// Hands out physical page ids in [0, num_pages). Not thread-safe: one scheduler owns it.
class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);
  // Takes the lowest free page id (deterministic), or fails with kResourceExhausted.
  Status allocate(int32_t* page);
  // Returns a page; freeing a page that is not allocated is an error, never silently ignored.
  Status release(int32_t page);
  int32_t num_pages() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

 private:
  std::vector<int32_t> free_;  // kept sorted descending so back() is the lowest id
  std::vector<bool> in_use_;
};

// One request's logical → physical page map, grown as its context grows.
class RequestPages {
 public:
  // Makes room for `num_entries` entries, allocating pages as needed. On failure nothing is
  // allocated (pages already taken by this call are returned).
  Status reserve(int64_t num_entries, int32_t page_size, PageAllocator& allocator);
  Status release_all(PageAllocator& allocator);
  const std::vector<int32_t>& pages() const { return pages_; }

 private:
  std::vector<int32_t> pages_;
};

// How keys are turned into cache entries.
struct KeyQuantOptions {
  // Rotate by the Sylvester Hadamard(128) before quantising (DeepSeek's rotate_activation).
  // vLLM omits it; it only changes the quantisation error, never the exact q·k.
  bool hadamard = false;
};

// The key cache of one indexer layer: num_pages pages in the layout above, 64-byte aligned.
class IndexerKeyCache {
 public:
  static Result<IndexerKeyCache> create(int32_t page_size, int32_t num_pages);

  IndexerPageLayout layout() const { return layout_; }
  int32_t num_pages() const { return num_pages_; }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size_bytes() const { return static_cast<size_t>(layout_.page_bytes()) * num_pages_; }

  // Quantises `count` fp32 keys [count, 128] and stores them at request positions
  // [first_position, first_position + count) through the request's page table.
  Status write_keys(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                    const float* keys, int64_t count, const KeyQuantOptions& options = {});
  // Same for bf16 keys (raw bf16 bits).
  Status write_keys_bf16(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                         const uint16_t* keys, int64_t count, const KeyQuantOptions& options = {});
  // Stores already-quantised entries (e4m3 values [count,128] + scales [count]) verbatim.
  Status write_quantized(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                         const uint8_t* values, const float* scales, int64_t count);
  // Reads one entry back (values + scale) — for tests, traces and tools, not hot paths.
  Status read_entry(const int32_t* pages, int64_t num_pages_in_table, int64_t position,
                    uint8_t* values, float* scale) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  IndexerKeyCache(IndexerPageLayout layout, int32_t num_pages, std::unique_ptr<uint8_t[], FreeDeleter> data)
      : layout_(layout), num_pages_(num_pages), data_(std::move(data)) {}
  Status check_span(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                    int64_t count) const;

  IndexerPageLayout layout_;
  int32_t num_pages_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
};

// Quantises indexer queries the way vLLM's fused q-rope-quant does: one UE8M0 scale per
// (row, head) over 128 dims, e4m3 values, and the q scale folded into the head weights together
// with 128^-0.5 · num_heads^-0.5, so the kernels see scale-free e4m3 q and fp32 weights.
//   q [rows, num_heads, 128] fp32, weights [rows, num_heads] fp32 (raw weights_proj output)
//   → q_out [rows, num_heads, 128] e4m3, weights_out [rows, num_heads] fp32.
Status quantize_queries(const float* q, const float* weights, int32_t rows, int32_t num_heads,
                        uint8_t* q_out, float* weights_out, const KeyQuantOptions& options = {});

}  // namespace spin
