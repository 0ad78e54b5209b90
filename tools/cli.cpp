// The `spin` command's shared pieces (see cli.h).
#include "cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "spin/files.h"
#include "spin/memory.h"
#include "spin/predict.h"

namespace spin::cli {

int fail(const Status& status) {
  fmt::print(stderr, "spin: error: {}\n", status.to_string());
  return kExitFailure;
}

int usage_error(const std::string& message) {
  fmt::print(stderr, "spin: error: {}\n", message);
  return kExitUsage;
}

namespace {

// Whole-string numeric parses: "12abc", "", " 3" and out-of-range values are refused.
bool parse_int(const std::string& s, int64_t* out) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parse_real(const std::string& s, double* out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string from_status(const Status& s) { return s.ok() ? std::string() : s.message(); }

}  // namespace

CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parse_int(s, &v)) return fmt::format("'{}' is not an integer in {}..{}", s, lo, hi);
        if (v < lo || v > hi) return fmt::format("{} is outside {}..{}", v, lo, hi);
        return {};
      },
      fmt::format("INT in {}..{}", lo, hi));
}

CLI::Validator real_range(double lo, double hi, bool hi_open) {
  const std::string range = fmt::format("[{}, {}{}", lo, hi, hi_open ? ")" : "]");
  return CLI::Validator(
      [lo, hi, hi_open, range](std::string& s) -> std::string {
        double v = 0;
        if (!parse_real(s, &v) || !std::isfinite(v)) return fmt::format("'{}' is not a finite number in {}", s, range);
        if (v < lo || v > hi || (hi_open && v == hi)) return fmt::format("{} is outside {}", v, range);
        return {};
      },
      "REAL in " + range);
}

CLI::Validator open_range(double lo, double hi) {
  const std::string range = fmt::format("({}, {})", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        if (!parse_real(s, &v) || !std::isfinite(v)) return fmt::format("'{}' is not a finite number in {}", s, range);
        if (!(v > lo && v < hi)) return fmt::format("{} is outside {}", v, range);
        return {};
      },
      "REAL in " + range);
}

CLI::Validator positive_seconds() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!parse_real(s, &v) || !(v > 0 && v <= 3600)) return fmt::format("'{}' is not a time in (0, 3600] seconds", s);
        return {};
      },
      "SECONDS in (0, 3600]");
}

CLI::Validator one_of(const std::vector<std::string>& names, const std::string& what) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return CLI::Validator(
      [names, list, what](std::string& s) -> std::string {
        for (const std::string& n : names)
          if (s == n) return {};
        return fmt::format("unknown {} '{}'; supported: {}", what, s, list);
      },
      "one of: " + list);
}

CLI::Validator sparsity() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        PredictorConfig c;
        const Status set = c.set("target_sparsity", s);
        return from_status(set.ok() ? c.validate() : set);
      },
      "REAL in [0, 1)");
}

CLI::Validator output_file() {
  return CLI::Validator([](std::string& s) -> std::string { return from_status(check_output_path(s)); }, "FILE");
}

CLI::Validator output_dir() {
  return CLI::Validator([](std::string& s) -> std::string { return from_status(check_output_dir(s)); }, "DIR");
}

CLI::Validator threads() { return int_range(0, 1024).description("THREADS in 0..1024 (0 = all)"); }

Status check_fits_in_memory(double bytes, const std::string& what) {
  return spin::check_fits_in_memory(bytes, what);  // one message for the CLI and the library
}

void Progress::update(const std::string& stage, double fraction) {
  const bool tty = isatty(fileno(stderr));
  const auto now = std::chrono::steady_clock::now();
  if (tty) {
    if (now - last_ < std::chrono::milliseconds(100) && fraction < 1.0) return;
    last_ = now;
    const int width = 30;
    const int filled = static_cast<int>(fraction * width + 0.5);
    fmt::print(stderr, "\r\033[K[{}{}] {:3.0f}%  {}", std::string(static_cast<size_t>(filled), '#'),
               std::string(static_cast<size_t>(width - filled), '.'), 100 * fraction, stage);
    dirty_ = true;
  } else {
    const std::string key = stage.substr(0, stage.find(':'));
    const std::string kind = stage.substr(stage.find(':') + 1, 10);
    if (key + kind != last_stage_) {
      fmt::print(stderr, "{:3.0f}%  {}\n", 100 * fraction, stage);
      last_stage_ = key + kind;
    }
  }
}

void Progress::done() {
  if (dirty_) fmt::print(stderr, "\r\033[K");
  dirty_ = false;
}

}  // namespace spin::cli
