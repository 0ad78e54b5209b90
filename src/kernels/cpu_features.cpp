// CPU feature checks and the SPIN_CPU cap (see cpu_features.h and spin/cpu.h).
#include "kernels/cpu_features.h"

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "core/errors.h"
#include "spin/cpu.h"

#if SPIN_X86_KERNELS
#include <cpuid.h>
#endif
#if SPIN_NEON_KERNELS && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace spin {
namespace {

// The instruction sets the kernel paths are built on, one flag per path that has its own.
struct Features {
  bool avx512bf16 = false;
  bool avx512f = false;
  bool avx2_fma = false;
  bool neon_bf16 = false;
  bool neon = false;
};

#if SPIN_X86_KERNELS
// F16C straight from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

Features hardware_features() {
  Features f;
#if SPIN_X86_KERNELS
  __builtin_cpu_init();
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi") &&
                 __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
#if SPIN_NEON_KERNELS
  f.neon = true;  // AdvSIMD is part of the base aarch64 ISA
#if defined(__linux__) && defined(HWCAP2_BF16)
  f.neon_bf16 = (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;  // the kernel's word for FEAT_BF16
#endif
#endif
  return f;
}

struct Level {
  const char* name;
  Features allows;
};

// This build's levels, widest first, and the other ISA's names (refused with a reason of their own).
#if SPIN_X86_KERNELS
constexpr Level kLevels[] = {{"avx512bf16", {true, true, true, false, false}},
                             {"avx512f", {false, true, true, false, false}},
                             {"avx2", {false, false, true, false, false}},
                             {"portable", {}}};
constexpr const char* kOtherIsaLevels[] = {"neon_bf16", "neon"};
constexpr const char* kOtherIsa = "an aarch64";
#elif SPIN_NEON_KERNELS
constexpr Level kLevels[] = {{"neon_bf16", {false, false, false, true, true}},
                             {"neon", {false, false, false, false, true}},
                             {"portable", {}}};
constexpr const char* kOtherIsaLevels[] = {"avx512bf16", "avx512f", "avx2"};
constexpr const char* kOtherIsa = "an x86-64";
#else
constexpr Level kLevels[] = {{"portable", {}}};
constexpr const char* kOtherIsaLevels[] = {"avx512bf16", "avx512f", "avx2", "neon_bf16", "neon"};
constexpr const char* kOtherIsa = "a SIMD";
#endif

std::string level_list() {
  std::string list = "native";
  for (const Level& l : kLevels) list += fmt::format(", {}", l.name);
  return list;
}

struct Cap {
  std::string name = "native";
  Status status;
  Features allows{true, true, true, true, true};
};

Cap parse_cap(const char* env) {
  Cap cap;
  if (env == nullptr || *env == '\0' || std::string(env) == "native") return cap;
  cap.name = env;
  for (const Level& l : kLevels) {
    if (cap.name == l.name) {
      cap.allows = l.allows;
      return cap;
    }
  }
  cap.allows = {};  // every call is refused anyway; nothing wider may run meanwhile
  for (const char* other : kOtherIsaLevels) {
    if (cap.name == other) {
      cap.status = invalid_argument("SPIN_CPU={} is {} level; this build knows {}", cap.name, kOtherIsa, level_list());
      return cap;
    }
  }
  cap.status = invalid_argument("SPIN_CPU={}: unknown level; use one of {}", cap.name, level_list());
  return cap;
}

// Read once: a process runs one CPU, and every path choice in it must agree.
const Features& hardware() {
  static const Features f = hardware_features();
  return f;
}
const Cap& cap() {
  static const Cap c = parse_cap(std::getenv("SPIN_CPU"));
  return c;
}

std::string read_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

// Each flag's name (the kernel path built on it), widest first.
constexpr std::pair<bool Features::*, const char*> kIsaNames[] = {{&Features::avx512bf16, "avx512bf16"},
                                                                 {&Features::avx512f, "avx512f"},
                                                                 {&Features::avx2_fma, "avx2"},
                                                                 {&Features::neon_bf16, "neon_bf16"},
                                                                 {&Features::neon, "neon"}};

// The ISAs of `f`, widest first: "avx512bf16 avx512f avx2", or "none".
std::string isa_names(const Features& f) {
  std::string s;
  for (const auto& [flag, name] : kIsaNames) {
    if (!(f.*flag)) continue;
    if (!s.empty()) s += ' ';
    s += name;
  }
  return s.empty() ? "none" : s;
}

bool has_path(const Features& f, const std::string& path) {
  for (const auto& [flag, name] : kIsaNames) {
    if (path == name) return f.*flag;
  }
  return false;
}

// What the kernels may use: the CPU's features under the cap, fixed for the process.
const Features& allowed() {
  static const Features a = [] {
    Features f;
    for (const auto& [flag, name] : kIsaNames) f.*flag = hardware().*flag && cap().allows.*flag;
    return f;
  }();
  return a;
}

}  // namespace

Status cpu_cap_status() { return cap().status; }
const std::string& cpu_cap_name() { return cap().name; }

const std::string& cpu_model_name() {
  static const std::string name = read_model_name();
  return name;
}

std::string cpu_summary() {
  std::string s = fmt::format("{}; kernel ISAs: {}", cpu_model_name(), isa_names(allowed()));
  if (!cap().status.ok()) return s + fmt::format(" ({})", cap().status.message());
  if (cap().name != "native") s += fmt::format(" (SPIN_CPU={}; the CPU has {})", cap().name, isa_names(hardware()));
  return s;
}

std::string cpu_lacks_note(const std::string& path) {
  if (cap().name == "native" || !has_path(hardware(), path)) return "this CPU lacks it";
  return fmt::format("SPIN_CPU={} leaves it out (the CPU has {})", cap().name, isa_names(hardware()));
}
namespace detail {

bool cpu_has_avx512bf16() { return allowed().avx512bf16; }
bool cpu_has_avx512f() { return allowed().avx512f; }
bool cpu_has_avx2_fma() { return allowed().avx2_fma; }
bool cpu_has_neon() { return allowed().neon; }
bool cpu_has_neon_bf16() { return allowed().neon_bf16; }

bool cpu_is_intel() {
#if SPIN_X86_KERNELS
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

bool cpu_prefers_fp32_fma_to_bf16_dot() { return cpu_is_intel() && cpu_has_avx512f(); }

}  // namespace detail
}  // namespace spin
