// Memory budget (see spin/memory.h).
#include "spin/memory.h"

#include <omp.h>
#include <unistd.h>

#include <fmt/format.h>

namespace spin {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{1} << 34;
}

int64_t memory_budget_bytes() { return physical_memory_bytes() / 10 * 8; }

Status check_fits_in_memory(double bytes, const std::string& what) {
  const double limit = static_cast<double>(memory_budget_bytes());
  if (bytes > limit) {
    return {StatusCode::kResourceExhausted,
            fmt::format("{} needs about {:.1f} GiB, more than the {:.1f} GiB this machine can give it "
                        "(80 % of {:.1f} GiB)",
                        what, bytes / 1073741824.0, limit / 1073741824.0,
                        static_cast<double>(physical_memory_bytes()) / 1073741824.0)};
  }
  return ok_status();
}

int max_threads() {
  const int n = omp_get_num_procs();
  return n > 0 ? n : 1;
}

}  // namespace spin
