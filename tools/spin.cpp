// The `spin` command: a thin front end over the library and the benchmarks. It registers the
// subcommands (cmd_*.cpp), parses and checks every flag before any work starts, runs the one
// subcommand given, and turns every failure into one line on stderr and an exit code < 128.
#include <fmt/format.h>

#include <exception>
#include <new>

#include "cli.h"
#include "spin/cpu.h"
#include "spin/files.h"

namespace {

using spin::cli::Command;

std::string names_of(CLI::App* level) {
  std::string out;
  for (CLI::App* sub : level->get_subcommands([](CLI::App*) { return true; })) {
    out += (out.empty() ? "" : ", ") + sub->get_name();
  }
  return out;
}

// "spin bogus" or "spin bench bogus": CLI11 would only say that a subcommand is required.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string token = argv[i];
    if (token.empty() || token[0] == '-') return {};
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return {};
    CLI::App* next = nullptr;
    for (CLI::App* sub : subs) {
      if (sub->get_name() == token) next = sub;
    }
    if (next == nullptr) {
      const std::string parent = level == &app ? "spin" : "spin " + level->get_name();
      return fmt::format("unknown command '{}' for '{}'; commands: {} (see {} --help)", token, parent,
                         names_of(level), parent);
    }
    level = next;
  }
  return {};
}

int run(int argc, char** argv) {
  CLI::App app{"spin — shadow predictive indexer for DeepSeek sparse attention (CPU reference)"};
  app.require_subcommand(1);
  app.footer("Environment: SPIN_CPU=native|avx512bf16|avx512f|avx2|portable (aarch64: native|neon_bf16|neon|portable) "
             "caps the kernel paths of the whole process, as on a smaller CPU; every benchmark and report names it.");
  std::vector<Command> commands;
  for (auto add : {spin::cli::add_eval_commands, spin::cli::add_replay_command, spin::cli::add_trace_commands,
                   spin::cli::add_bench_commands, spin::cli::add_diagnose_command,
                   spin::cli::add_advise_command}) {
    for (Command& c : add(app)) commands.push_back(std::move(c));
  }
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    return spin::cli::usage_error(unknown);
  }
  // Before parsing: the --impl checks ask which paths this process may run.
  if (spin::Status cap = spin::cpu_cap_status(); !cap.ok()) return spin::cli::usage_error(cap.message());
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return spin::cli::usage_error(e.what());
  }
  spin::remove_temp_files_on_signal();
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return spin::cli::usage_error("no command given (see spin --help)");
}

}  // namespace

int main(int argc, char** argv) {
  // The library reports errors as Status; these are the last line of defence, so that even a bug
  // ends with one readable line and a plain failure code rather than an abort.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "spin: error: out of memory\n");
  } catch (const std::exception& e) {
    fmt::print(stderr, "spin: error: internal error: {}\n", e.what());
  }
  return spin::cli::kExitFailure;
}
