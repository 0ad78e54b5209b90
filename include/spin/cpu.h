// spin/cpu.h — which CPU the kernels think they run on.
//
// Every kernel front end (spin/indexer.h, spin/attention.h) picks its path from the CPU's
// features, read once. The environment variable SPIN_CPU caps them for the whole process, so a
// test suite, `spin eval` or a serving engine runs as it would on a smaller CPU of the same
// clock: `SPIN_CPU=avx2 spin eval` takes the AVX2+FMA paths everywhere on an AVX-512 machine,
// and forcing a path above the cap is refused by name, as on a CPU that lacks it.
//
// Levels, widest first: x86-64 avx512bf16 > avx512f > avx2 > portable; aarch64 neon_bf16 >
// neon > portable. Unset, empty or "native": no cap. A cap above what the CPU has changes
// nothing (the CPU's own features still decide). A name this build does not know, or one of the
// other ISA, is an error every kernel call returns (cpu_cap_status), never a silent fallback.
#pragma once

#include <string>

#include "spin/status.h"

namespace spin {

// ok, or why SPIN_CPU cannot be used ("SPIN_CPU=avx3: unknown level; use one of ...").
Status cpu_cap_status();
// SPIN_CPU as read: "native" when unset or empty.
const std::string& cpu_cap_name();
// The CPU's model name (/proc/cpuinfo), "unknown" where there is none.
const std::string& cpu_model_name();
// One line for reports and benchmark headers:
// "Intel(R) Xeon(R) Processor; kernel ISAs avx2 (SPIN_CPU=avx2; the CPU has avx512bf16 avx512f avx2)".
std::string cpu_summary();
// Why the kernel path `path` (an impl name: avx512f, neon, ...) may not run in this process:
// "this CPU lacks it", or "SPIN_CPU=avx2 leaves it out (the CPU has avx512bf16 avx512f avx2)".
std::string cpu_lacks_note(const std::string& path);

}  // namespace spin
