// spin/memory.h — how much memory one spin job may plan to hold on this machine. The engine's
// pool, trace generation, replay and the benchmarks size themselves against it and refuse, in
// GiB and before allocating, what would not fit.
#pragma once

#include <cstdint>
#include <string>

#include "spin/status.h"

namespace spin {

// Physical memory of this machine (sysconf), or 16 GiB where it cannot be read.
int64_t physical_memory_bytes();
// 80 % of it: the rest is left to the operating system and other processes.
int64_t memory_budget_bytes();
// kResourceExhausted when `bytes` is over the budget, in GiB ("a 3.0 GiB trace needs about 6.0 GiB,
// more than the 4.8 GiB this machine can give it (80 % of 6.0 GiB)"); `what` says what needs it.
// The CLI, the serving object, the workload generator and the Python bindings all refuse with it.
Status check_fits_in_memory(double bytes, const std::string& what);
// Logical CPUs this process may use (OpenMP's count): the most threads a kernel call accepts. A
// larger request is refused by name rather than starting thousands of OpenMP threads.
int max_threads();

}  // namespace spin
