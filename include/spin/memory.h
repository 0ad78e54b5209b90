// spin/memory.h — how much memory one spin job may plan to hold on this machine. The engine's
// pool, trace generation, replay and the benchmarks size themselves against it and refuse, in
// GiB and before allocating, what would not fit.
#pragma once

#include <cstdint>

namespace spin {

// Physical memory of this machine (sysconf), or 16 GiB where it cannot be read.
int64_t physical_memory_bytes();
// 80 % of it: the rest is left to the operating system and other processes.
int64_t memory_budget_bytes();

}  // namespace spin
