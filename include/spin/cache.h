// spin/cache.h — the paged caches, byte-compatible with vLLM / DeepGEMM / FlashMLA: the indexer
// key cache (quantised writes) and the MLA latent cache, both over one PagedBuffer, plus the page
// allocator and request page tables they share. Byte layouts: spin/geometry.h.
//
// Pages are handed out by a PageAllocator shared by all requests (and all layers: every layer
// uses the same block table, as in vLLM). A request's logical page i lives in physical page
// block_table[i].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "spin/geometry.h"
#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

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

// What both paged caches share: num_pages pages of page_bytes each in one 64-byte aligned, zeroed
// allocation (with a transparent huge-page hint: the kernels read entries at random positions,
// where 4 KiB pages make nearly every access a TLB miss; attention measured 2–5 % faster), and
// the check of a span of request positions against a request's page table. The caches below add
// only their layout and their writes.
class PagedBuffer {
 public:
  int32_t page_size() const { return page_size_; }
  int32_t num_pages() const { return num_pages_; }
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size_bytes() const { return static_cast<size_t>(page_bytes_) * static_cast<size_t>(num_pages_); }

 protected:
  // Fails with kInvalidArgument for a page_size or num_pages below 1, kResourceExhausted when the
  // memory is not there; `what` names the pages in the message ("indexer", "latent fp8").
  static Result<PagedBuffer> allocate(const char* what, int32_t page_size, int64_t page_bytes, int32_t num_pages);
  // Positions [first_position, first_position + count): every logical page they need is in the
  // table (num_pages_in_table long) and maps to a physical page in [0, num_pages).
  Status check_span(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                    int64_t count) const;
  // The page holding request position `position` (after check_span).
  uint8_t* page_of(const int32_t* pages, int64_t position) {
    return data_.get() + int64_t{pages[position / page_size_]} * page_bytes_;
  }
  const uint8_t* page_of(const int32_t* pages, int64_t position) const {
    return data_.get() + int64_t{pages[position / page_size_]} * page_bytes_;
  }
  int32_t offset_in_page(int64_t position) const { return static_cast<int32_t>(position % page_size_); }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  PagedBuffer(int32_t page_size, int64_t page_bytes, int32_t num_pages, uint8_t* data)
      : page_size_(page_size), page_bytes_(page_bytes), num_pages_(num_pages), data_(data) {}

  int32_t page_size_ = 0;
  int64_t page_bytes_ = 0;
  int32_t num_pages_ = 0;
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
};

// The key cache of one indexer layer: num_pages pages in IndexerPageLayout.
class IndexerKeyCache : public PagedBuffer {
 public:
  static Result<IndexerKeyCache> create(int32_t page_size, int32_t num_pages);

  IndexerPageLayout layout() const { return IndexerPageLayout{page_size()}; }

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
  explicit IndexerKeyCache(PagedBuffer buffer) : PagedBuffer(std::move(buffer)) {}
};

// One latent entry: fp32 [576] = [latent 512 | rope 64] → bytes in `dtype`'s layout (entry_bytes
// long). kBf16 rounds every value to bf16 (RNE); kFp8 quantises each 128-dim latent tile with
// quantize_e4m3_block128 (UE8M0 scale) and rounds the rope to bf16. Values must be finite.
// (FlashMLA's test quantiser floors the scale at 1e-4 rather than amax at 1e-4, so tiles with
// amax < 0.0448 get other bytes there; both read back through the same formula.)
void encode_latent_entry(LatentDtype dtype, const float* values, uint8_t* entry);
// The inverse: bytes → fp32 [576], e4m3 · scale computed in fp32 (exact for power-of-two scales).
void decode_latent_entry(LatentDtype dtype, const uint8_t* entry, float* values);

// The MLA latent cache of one layer: num_pages pages in LatentPageLayout, addressed through the
// same request page tables as the indexer cache.
class LatentCache : public PagedBuffer {
 public:
  static Result<LatentCache> create(LatentDtype dtype, int32_t page_size, int32_t num_pages);

  LatentPageLayout layout() const { return LatentPageLayout{dtype_, page_size()}; }
  LatentDtype dtype() const { return dtype_; }

  // Encodes `count` fp32 entries [count, 576] and stores them at request positions
  // [first_position, first_position + count) through the request's page table (pages[logical]).
  // Everything is checked before anything is written: a failed call leaves the cache unchanged.
  Status write(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position, const float* entries,
               int64_t count);
  // Reads one entry back, decoded to fp32 [576] — for tests and tools, not hot paths.
  Status read_entry(const int32_t* pages, int64_t num_pages_in_table, int64_t position, float* values) const;

 private:
  LatentCache(PagedBuffer buffer, LatentDtype dtype) : PagedBuffer(std::move(buffer)), dtype_(dtype) {}

  LatentDtype dtype_ = LatentDtype::kFp8;
};

// Quantises indexer queries the way vLLM's fused q-rope-quant does: one UE8M0 scale per
// (row, head) over 128 dims, e4m3 values, and the q scale folded into the head weights together
// with 128^-0.5 · num_heads^-0.5, so the kernels see scale-free e4m3 q and fp32 weights.
//   q [rows, num_heads, 128] fp32, weights [rows, num_heads] fp32 (raw weights_proj output)
//   → q_out [rows, num_heads, 128] e4m3, weights_out [rows, num_heads] fp32.
Status quantize_queries(const float* q, const float* weights, int32_t rows, int32_t num_heads,
                        uint8_t* q_out, float* weights_out, const KeyQuantOptions& options = {});

}  // namespace spin
