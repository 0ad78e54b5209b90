// Paged indexer key cache: page allocation, request page tables, quantised writes.
// The byte layout itself is defined (and static_assert-ed) in spin/geometry.h.
#include "spin/cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/errors.h"

namespace spin {

// ---------------------------------------------------------------------------------------------
// PageAllocator

PageAllocator::PageAllocator(int32_t num_pages) : in_use_(static_cast<size_t>(std::max(num_pages, 0))) {
  free_.reserve(in_use_.size());
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

Status PageAllocator::allocate(int32_t* page) {
  if (free_.empty()) {
    return resource_exhausted("page pool exhausted: all {} pages are in use (free pages of "
                              "finished requests, or create a larger pool)", in_use_.size());
  }
  *page = free_.back();
  free_.pop_back();
  in_use_[*page] = true;
  return ok_status();
}

Status PageAllocator::release(int32_t page) {
  if (page < 0 || page >= num_pages()) {
    return out_of_range("cannot release page {}: the pool has pages [0, {})", page, num_pages());
  }
  if (!in_use_[page]) return failed_precondition("page {} released twice (it is not allocated)", page);
  in_use_[page] = false;
  // Keep free_ sorted descending so allocation stays "lowest id first" (deterministic layouts).
  free_.insert(std::upper_bound(free_.begin(), free_.end(), page, std::greater<>()), page);
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// RequestPages

Status RequestPages::reserve(int64_t num_entries, int32_t page_size, PageAllocator& allocator) {
  if (page_size <= 0) return invalid_argument("page_size must be ≥ 1, got {}", page_size);
  if (num_entries < 0) return invalid_argument("num_entries must be ≥ 0, got {}", num_entries);
  const int64_t needed = (num_entries + page_size - 1) / page_size;
  const size_t before = pages_.size();
  while (static_cast<int64_t>(pages_.size()) < needed) {
    int32_t page = -1;
    Status status = allocator.allocate(&page);
    if (!status.ok()) {
      while (pages_.size() > before) {  // undo this call's allocations: all or nothing
        (void)allocator.release(pages_.back());
        pages_.pop_back();
      }
      return status;
    }
    pages_.push_back(page);
  }
  return ok_status();
}

Status RequestPages::release_all(PageAllocator& allocator) {
  // Release every page even if one fails, so nothing leaks; report the first failure.
  Status first = ok_status();
  for (int32_t page : pages_) {
    Status s = allocator.release(page);
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  pages_.clear();
  return first;
}

// ---------------------------------------------------------------------------------------------
// IndexerKeyCache

Result<IndexerKeyCache> IndexerKeyCache::create(int32_t page_size, int32_t num_pages) {
  auto buffer = allocate("indexer", page_size, IndexerPageLayout{page_size}.page_bytes(), num_pages);
  if (!buffer.ok()) return buffer.status();
  return IndexerKeyCache(std::move(buffer).value());
}

Status IndexerKeyCache::write_quantized(const int32_t* pages, int64_t num_pages_in_table,
                                        int64_t first_position, const uint8_t* values,
                                        const float* scales, int64_t count) {
  SPIN_RETURN_IF_ERROR(check_span(pages, num_pages_in_table, first_position, count));
  for (int64_t i = 0; i < count; ++i) {
    if (!(std::isfinite(scales[i]) && scales[i] > 0.0f)) {
      return invalid_argument("scale of entry {} is {}; scales must be finite and > 0", i, scales[i]);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t pos = first_position + i;
    const int32_t offset = offset_in_page(pos);
    uint8_t* page = page_of(pages, pos);
    std::memcpy(page + layout().value_offset(offset), values + i * kEntryValueBytes, kEntryValueBytes);
    std::memcpy(page + layout().scale_offset(offset), &scales[i], sizeof(float));
  }
  return ok_status();
}

Status IndexerKeyCache::write_keys(const int32_t* pages, int64_t num_pages_in_table,
                                   int64_t first_position, const float* keys, int64_t count,
                                   const KeyQuantOptions& options) {
  SPIN_RETURN_IF_ERROR(check_span(pages, num_pages_in_table, first_position, count));
  for (int64_t i = 0; i < count * kIndexerHeadDim; ++i) {
    if (!std::isfinite(keys[i])) {
      return invalid_argument("key {} dim {} is {}; keys must be finite", i / kIndexerHeadDim,
                              i % kIndexerHeadDim, keys[i]);
    }
  }
  float rotated[kIndexerHeadDim];
  uint8_t codes[kIndexerHeadDim];
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(rotated, keys + i * kIndexerHeadDim, sizeof(rotated));
    if (options.hadamard) hadamard128(rotated);
    const float scale = quantize_e4m3_block128(rotated, codes);
    SPIN_RETURN_IF_ERROR(write_quantized(pages, num_pages_in_table, first_position + i, codes, &scale, 1));
  }
  return ok_status();
}

Status IndexerKeyCache::write_keys_bf16(const int32_t* pages, int64_t num_pages_in_table,
                                        int64_t first_position, const uint16_t* keys, int64_t count,
                                        const KeyQuantOptions& options) {
  if (count > 0 && keys == nullptr) return invalid_argument("keys is null");
  std::vector<float> widened(static_cast<size_t>(std::max<int64_t>(count, 0)) * kIndexerHeadDim);
  for (size_t i = 0; i < widened.size(); ++i) widened[i] = bf16_to_float(keys[i]);
  return write_keys(pages, num_pages_in_table, first_position, widened.data(), count, options);
}

Status IndexerKeyCache::read_entry(const int32_t* pages, int64_t num_pages_in_table, int64_t position,
                                   uint8_t* values, float* scale) const {
  SPIN_RETURN_IF_ERROR(check_span(pages, num_pages_in_table, position, 1));
  const int32_t offset = offset_in_page(position);
  const uint8_t* page = page_of(pages, position);
  std::memcpy(values, page + layout().value_offset(offset), kEntryValueBytes);
  std::memcpy(scale, page + layout().scale_offset(offset), sizeof(float));
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Queries

Status quantize_queries(const float* q, const float* weights, int32_t rows, int32_t num_heads,
                        uint8_t* q_out, float* weights_out, const KeyQuantOptions& options) {
  if (rows < 0 || num_heads <= 0) {
    return invalid_argument("rows must be ≥ 0 and num_heads ≥ 1 (got rows={}, num_heads={})", rows,
                            num_heads);
  }
  if (rows > 0 && (q == nullptr || weights == nullptr || q_out == nullptr || weights_out == nullptr)) {
    return invalid_argument("quantize_queries: null buffer");
  }
  const int64_t n = int64_t{rows} * num_heads;
  for (int64_t i = 0; i < n * kIndexerHeadDim; ++i) {
    if (!std::isfinite(q[i])) return invalid_argument("query element {} is {}; must be finite", i, q[i]);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(weights[i])) return invalid_argument("weight {} is {}; must be finite", i, weights[i]);
  }
  const float fold = 1.0f / std::sqrt(float{kIndexerHeadDim}) / std::sqrt(static_cast<float>(num_heads));
  float rotated[kIndexerHeadDim];
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(rotated, q + i * kIndexerHeadDim, sizeof(rotated));
    if (options.hadamard) hadamard128(rotated);
    const float scale = quantize_e4m3_block128(rotated, q_out + i * kIndexerHeadDim);
    weights_out[i] = weights[i] * scale * fold;
  }
  return ok_status();
}

}  // namespace spin
