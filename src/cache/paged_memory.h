// What every paged cache shares: its page memory and the check of a position span against a
// request's page table. The indexer key cache and the MLA latent cache differ only in layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spin/status.h"

namespace spin::detail {

// 64-byte aligned, zeroed memory for `bytes` of pages (free with std::free), with a transparent
// huge-page hint: the kernels read entries at random positions, where 4 KiB pages make nearly
// every access a TLB miss (attention measured 2–5 % faster). nullptr when the allocation fails.
uint8_t* allocate_page_memory(size_t bytes);

// Positions [first_position, first_position + count) of a request: every logical page they need
// is in its table (num_pages_in_table long) and maps to a physical page in [0, num_pages).
Status check_page_span(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position, int64_t count,
                       int32_t page_size, int32_t num_pages);

}  // namespace spin::detail
