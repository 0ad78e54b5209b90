// PagedBuffer (spin/cache.h): the page memory and span check both paged caches share.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "core/errors.h"
#include "spin/cache.h"

namespace spin {

void PagedBuffer::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

Result<PagedBuffer> PagedBuffer::allocate(const char* what, int32_t page_size, int64_t page_bytes,
                                          int32_t num_pages) {
  if (page_size <= 0) return invalid_argument("page_size must be ≥ 1, got {}", page_size);
  if (num_pages <= 0) return invalid_argument("num_pages must be ≥ 1, got {}", num_pages);
  const size_t bytes = static_cast<size_t>(page_bytes) * static_cast<size_t>(num_pages);
  const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
  auto* raw = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (raw == nullptr) {
    return resource_exhausted("cannot allocate {} bytes for {} {} pages of {} entries", bytes, num_pages, what,
                              page_size);
  }
#ifdef MADV_HUGEPAGE
  // A hint only; where transparent huge pages are off, nothing changes.
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t first_huge = (reinterpret_cast<uintptr_t>(raw) + (kHugePage - 1)) & ~(kHugePage - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(raw) + rounded;
  if (end > first_huge + kHugePage) {
    (void)madvise(reinterpret_cast<void*>(first_huge), (end - first_huge) & ~(kHugePage - 1), MADV_HUGEPAGE);
  }
#endif
  std::memset(raw, 0, rounded);
  return PagedBuffer(page_size, page_bytes, num_pages, raw);
}

Status PagedBuffer::check_span(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                               int64_t count) const {
  if (count < 0) return invalid_argument("count must be ≥ 0, got {}", count);
  if (first_position < 0) return invalid_argument("first_position must be ≥ 0, got {}", first_position);
  if (count == 0) return ok_status();
  if (pages == nullptr) return invalid_argument("page table is null");
  const int64_t last_page = (first_position + count - 1) / page_size_;
  if (last_page >= num_pages_in_table) {
    return out_of_range("positions [{}, {}) need logical page {}, but the page table has {} pages", first_position,
                        first_position + count, last_page, num_pages_in_table);
  }
  for (int64_t lp = first_position / page_size_; lp <= last_page; ++lp) {
    if (pages[lp] < 0 || pages[lp] >= num_pages_) {
      return out_of_range("logical page {} maps to physical page {}, outside the cache's [0, {})", lp, pages[lp],
                          num_pages_);
    }
  }
  return ok_status();
}

}  // namespace spin
