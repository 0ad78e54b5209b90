// Memory budget (see spin/memory.h).
#include "spin/memory.h"

#include <unistd.h>

namespace spin {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{1} << 34;
}

int64_t memory_budget_bytes() { return physical_memory_bytes() / 10 * 8; }

}  // namespace spin
