// The `spin` command's shared pieces: how a subcommand is registered, how flags are checked, how
// errors and progress are shown. Every flag gets a range and a meaning here, checked while the
// command line is parsed — before any work starts — and every failure is one line on stderr:
//   spin: error: <what is wrong, naming the flag, file, tensor, layer, step or row>
// Exit codes: 0 success, 1 a failure while working (I/O, a corrupt file, too little memory),
// 2 a command line that cannot be run. A signal still ends the process as that signal.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "spin/cpu.h"
#include "spin/status.h"

namespace spin::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A subcommand and what it runs once the whole command line has parsed and passed its checks.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Each registers its subcommands (and their flags' checks) on `app`.
std::vector<Command> add_eval_commands(CLI::App& app);    // eval, calibrate, config
std::vector<Command> add_replay_command(CLI::App& app);   // replay
std::vector<Command> add_trace_commands(CLI::App& app);   // trace gen, trace info, trace convert
std::vector<Command> add_bench_commands(CLI::App& app);   // bench indexer|topk|predictor|decode
std::vector<Command> add_diagnose_command(CLI::App& app); // diagnose
std::vector<Command> add_advise_command(CLI::App& app);   // advise

inline Status invalid_argument_status(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}

// Prints "spin: error: <status>"; returns kExitFailure.
int fail(const Status& status);
// Prints "spin: error: <message>"; returns kExitUsage.
int usage_error(const std::string& message);

// ---- flag checks (CLI11 validators: each rejects NaN and ±inf, and names the allowed range) -----
CLI::Validator int_range(int64_t lo, int64_t hi);
CLI::Validator real_range(double lo, double hi, bool hi_open = false);  // [lo, hi] or [lo, hi)
CLI::Validator open_range(double lo, double hi);  // (lo, hi)
CLI::Validator positive_seconds();            // (0, 3600]
CLI::Validator one_of(const std::vector<std::string>& names, const std::string& what);
// A target sparsity, checked by the library's own PredictorConfig rules (so `--sparsity x` and
// `--set target_sparsity=x` say the same thing).
CLI::Validator sparsity();
// Checks that FILE can be written: spin/files.h's rules (links followed, no device, writable dir).
CLI::Validator output_file();
CLI::Validator output_dir();
CLI::Validator threads();                     // 0 (= all) .. 1024

// A kernel path: "auto" or the name of one of `impls`; a known path this CPU lacks is refused by
// name, saying which path the CPU runs (checked while parsing, as every other flag).
template <typename Impl>
CLI::Validator kernel_path(const std::vector<Impl>& impls, const char* (*name)(Impl), bool (*supported)(Impl),
                           Impl (*best)()) {
  std::string list = "auto";
  for (Impl i : impls) list += std::string(", ") + name(i);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        if (s == "auto") return {};
        for (Impl i : impls) {
          if (s != name(i)) continue;
          return supported(i) ? std::string() : s + ": " + cpu_lacks_note(s) + " (it runs " + name(best()) + ")";
        }
        return "unknown kernel path '" + s + "'; supported: " + list;
      },
      "one of: " + list);
}

// Largest sizes the command line accepts for generated or benchmarked data (entries of one
// request, steps): 2^24 entries is 16M tokens, 16× the longest context a DSA model serves.
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

// kResourceExhausted when `bytes` is over spin's memory budget (spin/memory.h); `what` says what
// needs it.
Status check_fits_in_memory(double bytes, const std::string& what);

// A one-line progress bar on a terminal; on a pipe or file, one line per new stage label.
class Progress {
 public:
  void update(const std::string& stage, double fraction);
  void done();

 private:
  std::chrono::steady_clock::time_point last_{};
  std::string last_stage_;
  bool dirty_ = false;
};

}  // namespace spin::cli
