// The `spin` command as a user meets it: every bad flag, file or output of the hardening issue
// gets exit code < 128, one line "spin: error: ...", and leaves every file as it was; then a
// seeded random search over argument vectors of every subcommand holds the same properties
// (run under ASan+UBSan too, where the binary is instrumented).
//
// The binary under test is SPIN_BINARY (set by CMake). Each run happens in a fresh working
// directory holding a tiny valid trace, a link to it, a named pipe, a corrupt file and a
// directory; after each run the test checks the exit status, stderr, the directory listing and
// the trace's bytes. A cross build (cmake/aarch64-linux-gnu.cmake) runs it through the emulator
// CMake names in SPIN_EMULATOR (qemu-user), as a host without binfmt_misc cannot exec it directly.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "spin/trace.h"
#include "test_util.h"

namespace spin {
namespace {

namespace fs = std::filesystem;
using spin::testing::TempDir;

// execv of SPIN_BINARY with argv = {SPIN_BINARY, args...}, through SPIN_EMULATOR where set;
// returns only on failure.
void exec_spin(const std::vector<const char*>& args) {
  std::vector<char*> argv;
#ifdef SPIN_EMULATOR
  argv.push_back(const_cast<char*>(SPIN_EMULATOR));
#endif
  argv.push_back(const_cast<char*>(SPIN_BINARY));
  for (const char* a : args) argv.push_back(const_cast<char*>(a));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A tiny valid trace: one layer, 2 heads, page 4, top-k 4, 6 steps over 40 entries.
Trace tiny_trace() {
  Trace t;
  t.meta.model = "cli-test";
  t.meta.num_layers = 1;
  t.meta.num_heads = 2;
  t.meta.page_size = 4;
  t.meta.topk = 4;
  const int steps = 6, entries = 40;
  for (int s = 0; s < steps; ++s) t.ctx_len.push_back(entries - steps + 1 + s);
  TraceLayer L;
  std::mt19937 rng(7);
  for (int i = 0; i < entries * 128; ++i) L.k.push_back(static_cast<uint8_t>(rng() % 0x7E));
  L.k_scale.assign(entries, 0.5f);
  for (int i = 0; i < steps * 2 * 128; ++i) L.q.push_back(static_cast<uint8_t>(rng() % 0x7E));
  L.w.assign(steps * 2, 0.25f);
  t.layers.push_back(std::move(L));
  return t;
}

// Rewrites one metadata value of a safetensors file in place of its header (length updated).
void patch_metadata(const std::string& path, const std::string& key, const std::string& value) {
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  header["__metadata__"][key] = value;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  // Tensor offsets are relative to the data section, so the data bytes move along unchanged.
  const uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  out += text + bytes.substr(8 + n);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

struct RunResult {
  int status = 0;  // as waitpid gives it
  bool timed_out = false;
  std::string err;
};

// A working directory with the inputs a user might hand to spin, and a place for captured output.
class Workspace {
 public:
  Workspace() {
    EXPECT_TRUE(write_trace(tiny_trace(), dir_.file("t.st")).ok());
    fs::create_symlink("t.st", dir_.file("link.st"));
    EXPECT_EQ(mkfifo(dir_.file("pipe").c_str(), 0600), 0);
    std::ofstream(dir_.file("bad.st"), std::ios::binary) << std::string("\x10\0\0\0\0\0\0\0{\"a\":1}junk", 19);
    fs::create_directory(dir_.file("dir"));
    trace_bytes_ = read_file(dir_.file("t.st"));
    baseline_ = dir_.entries();
  }

  // Runs SPIN_BINARY with `args` in the workspace; killed (SIGKILL) after `limit`.
  // `env`: "NAME=value" entries set in the child only.
  RunResult run(const std::vector<std::string>& args, std::chrono::seconds limit = std::chrono::seconds(60),
                const std::vector<std::string>& env = {}) {
    limit *= spin::testing::test_slowdown();
    const std::string err_path = out_.file("stderr");
    const pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir_.path().c_str()) != 0) _exit(126);
      const int out = open("/dev/null", O_WRONLY);
      const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int in = open("/dev/null", O_RDONLY);
      dup2(out, 1);
      dup2(err, 2);
      dup2(in, 0);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));  // the child's own copy
      std::vector<const char*> argv;
      for (const std::string& a : args) argv.push_back(a.c_str());
      exec_spin(argv);
      _exit(127);
    }
    RunResult r;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (waitpid(pid, &r.status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &r.status, 0);
        r.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    r.err = read_file(err_path);
    return r;
  }

  // The inputs are untouched and nothing is left but the files a successful run wrote; those are
  // removed so the next run starts from the same state.
  void check_and_reset(const RunResult& r, const std::string& what) {
    EXPECT_EQ(read_file(dir_.file("t.st")), trace_bytes_) << what << ": the input trace changed";
    EXPECT_TRUE(fs::is_symlink(dir_.file("link.st"))) << what;
    EXPECT_TRUE(fs::is_fifo(dir_.file("pipe"))) << what;
    EXPECT_TRUE(fs::is_directory(dir_.file("dir"))) << what;
    const bool ok = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
    for (const std::string& e : dir_.entries()) {
      if (std::find(baseline_.begin(), baseline_.end(), e) != baseline_.end()) continue;
      EXPECT_TRUE(ok) << what << ": a failed run left " << e;
      EXPECT_EQ(e.find(".tmp-"), std::string::npos) << what << ": temporary file left: " << e;
      fs::remove_all(dir_.file(e));
    }
    for (const auto& e : fs::directory_iterator(dir_.file("dir"))) {
      ADD_FAILURE() << what << ": wrote into dir/: " << e.path();
      fs::remove_all(e.path());
    }
  }

  std::string file(const std::string& name) const { return dir_.file(name); }
  // Files added by the test itself become part of the state every run must leave as it was.
  void keep_current_files() { baseline_ = dir_.entries(); }

 private:
  TempDir dir_, out_;
  std::string trace_bytes_;
  std::vector<std::string> baseline_;
};

std::string joined(const std::vector<std::string>& args) {
  std::string s = "spin";
  for (const std::string& a : args) s += " '" + (a.size() > 40 ? a.substr(0, 40) + "...(" + std::to_string(a.size()) + " bytes)" : a) + "'";
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A failure is exactly one "spin: error:" line, the last one; progress lines may come before it.
void expect_one_error_line(const RunResult& r, const std::string& what) {
  ASSERT_FALSE(r.timed_out) << what << ": did not finish";
  ASSERT_TRUE(WIFEXITED(r.status)) << what << ": ended by signal " << WTERMSIG(r.status) << "\n" << r.err;
  const int code = WEXITSTATUS(r.status);
  EXPECT_LT(code, 128) << what;
  const auto lines = lines_of(r.err);
  int errors = 0;
  for (const std::string& l : lines) errors += l.rfind("spin: error: ", 0) == 0;
  if (code == 0) {
    EXPECT_EQ(errors, 0) << what << "\n" << r.err;
    return;
  }
  EXPECT_EQ(errors, 1) << what << "\n" << r.err;
  ASSERT_FALSE(lines.empty()) << what;
  EXPECT_EQ(lines.back().rfind("spin: error: ", 0), 0u) << what << "\n" << r.err;
  for (const std::string& l : lines) {
    EXPECT_EQ(l.find("Sanitizer"), std::string::npos) << what << "\n" << r.err;
    EXPECT_EQ(l.find("runtime error"), std::string::npos) << what << "\n" << r.err;
  }
}

struct Case {
  std::vector<std::string> args;
  std::string needle;  // part of the one error line
};

// Every case the hardening issue lists (its wording in the comments), and their neighbours.
TEST(Cli, EveryReportedCaseFailsCleanly) {
  Workspace ws;
  // "a valid trace whose metadata says topk=2147483647" (was bad_alloc after 8.4 GB)
  ASSERT_TRUE(write_trace(tiny_trace(), ws.file("huge_topk.st")).ok());
  patch_metadata(ws.file("huge_topk.st"), "topk", "2147483647");
  // "a finite but huge weight (1e38)" (was "score … is +inf" naming nothing)
  Trace heavy = tiny_trace();
  heavy.layers[0].w[5] = 1e38f;
  ASSERT_TRUE(write_trace(heavy, ws.file("heavy.st")).ok() == false);  // the writer refuses it too
  heavy.layers[0].w[5] = 0.25f;
  ASSERT_TRUE(write_trace(heavy, ws.file("heavy.st")).ok());
  {
    std::string bytes = read_file(ws.file("heavy.st"));
    const float big = 1e38f, normal = 0.25f;
    const std::string needle(reinterpret_cast<const char*>(&normal), 4);
    const size_t at = bytes.rfind(needle);  // w is the last F32 tensor in name order after k_scale
    ASSERT_NE(at, std::string::npos);
    bytes.replace(at, 4, std::string(reinterpret_cast<const char*>(&big), 4));
    std::ofstream(ws.file("heavy.st"), std::ios::binary | std::ios::trunc) << bytes;
  }
  ws.keep_current_files();
  const std::vector<Case> cases = {
      {{"replay", "huge_topk.st"}, "topk = 2147483647 is above the supported maximum 65536"},
      {{"bench", "decode", "--steps", "0"}, "--steps: 0 is outside 1..100000"},
      {{"diagnose", "--gpu", "a100"}, "--gpu"},
      {{"diagnose", "--context", "0"}, "--context: 0 is outside"},
      {{"diagnose", "--sparsity", "1"}, "--sparsity"},
      {{"bench", "decode", "--source", "t.st", "--context", "100"}, "--context comes from --source t.st"},
      {{"bench", "decode", "--source", "t.st", "--next-n", "2"}, "--next-n comes from --source t.st"},
      {{"bench", "decode", "--source", "nope.st"}, "'nope.st' is neither random, a scenario"},
      {{"bench", "decode", "--source", "t.st", "--layers", "1", "--steps", "9"}, "t.st has 6 steps, the bench needs 11"},
      {{"bench", "decode", "--source", "t.st", "--layers", "2"}, "t.st has 1 layers, --layers asks for 2"},
      {{"bench", "indexer", "--context", "999999999999"}, "--context: 999999999999 is outside"},
      {{"bench", "indexer", "--sparsity", "1.5"}, "target_sparsity 1.5 is outside [0, 1)"},
      {{"bench", "topk", "--topk", "-1"}, "--topk: -1 is outside 1..65536"},
      {{"trace", "gen", "--context", "999999999999", "--out", "x.st"}, "--context: 999999999999 is outside"},
      // hangs
      {{"trace", "gen", "--layers", "100000", "--out", "x.st"}, "--layers: 100000 is outside 1..1024"},
      {{"trace", "gen", "--scenario", "cached-507k", "--layers", "1000", "--out", "x.st"}, "GiB"},
      {{"trace", "info", "pipe"}, "pipe is not a regular file"},
      {{"replay", "pipe"}, "pipe is not a regular file"},
      // data destroyed
      {{"replay", "t.st", "--dump-topk", "t.st"}, "is the input t.st: refusing to overwrite an input"},
      {{"replay", "t.st", "--dump-topk", "link.st"}, "refusing to overwrite an input"},
      {{"replay", "link.st", "--json", "t.st"}, "refusing to overwrite an input"},
      {{"replay", "t.st", "--json", "/dev/full"}, "/dev/full is a character device: refusing to replace it"},
      {{"trace", "gen", "--out", "/dev/null", "--steps", "2"}, "is a character device"},
      {{"trace", "gen", "--out", "dir", "--steps", "2"}, "dir is a directory"},
      // flags silently ignored or wrong
      {{"replay", "t.st", "--sparsity", "-0.1"}, "--sparsity: target_sparsity -0.1 is outside [0, 1)"},
      {{"replay", "t.st", "--set", "target_sparsity=-0.1"}, "--set: target_sparsity -0.1 is outside [0, 1)"},
      {{"replay", "t.st", "--preset", "papers"}, "unknown preset 'papers'; supported: default, paper"},
      {{"eval", "--preset", "Paper", "--quick"}, "unknown preset 'Paper'; supported: default, paper"},
      {{"replay", "t.st", "--set", "preset=x"}, "--set: unknown preset 'x'; supported: default, paper"},
      {{"replay", "t.st", "--sparsity", "nan"}, "'nan' is not a finite number"},
      {{"replay", "t.st", "--explore", "-1"}, "--explore: explore_ratio -1 is outside [0, 1]"},
      {{"replay", "t.st", "--set", "topk=1024"}, "--set topk=1024 contradicts the trace, whose topk is 4"},
      {{"replay", "t.st", "--set", "page_size=32"}, "--set page_size=32 contradicts the trace, whose page_size is 4"},
      {{"bench", "indexer", "--context", "0"}, "--context: 0 is outside"},
      {{"trace", "gen", "--steps", "0", "--out", "x.st"}, "--steps: 0 is outside"},
      {{"bench", "indexer", "--threads", "-3"}, "--threads: -3 is outside 0..1024"},
      {{"eval", "--threads", "-3"}, "--threads: -3 is outside 0..1024"},
      {{"bench", "indexer", "--sparsity", "nan"}, "'nan' is not a finite number"},
      {{"bench", "predictor", "--steps", "0"}, "--steps: 0 is outside"},
      {{"bench", "decode", "--latent", "bogus"}, "unknown --latent 'bogus'; supported: fp8, bf16"},
      // unclear or late errors
      {{"replay", "t.st", "--open-loop", "--dump-topk", "d.st"}, "--dump-topk needs a closed-loop replay"},
      {{"replay", "heavy.st"}, "layer.0.w [step 5, row 0]: head weights"},
      {{"bogus"}, "unknown command 'bogus' for 'spin'; commands: eval"},
      {{"bench", "bogus"}, "unknown command 'bogus' for 'spin bench'"},
      {{"eval", "--out", "t.st"}, "output directory t.st exists and is a regular file"},
      {{"replay", "t.st", "--json", "missing/dir/x.json"}, "directory missing/dir does not exist"},
      {{"bench", "decode", "--context", "9223372036854775807"}, "is outside 1..16777216"},
      {{"bench", "decode", "--context", "16777216", "--batch", "1024", "--steps", "1"}, "GiB"},
      {{"replay", "bad.st"}, "bad.st"},
      {{"replay", "t.st", "--predictor", "nope"}, "unknown predictor 'nope'"},
  };
  for (const Case& c : cases) {
    const std::string what = joined(c.args);
    const RunResult r = ws.run(c.args);
    expect_one_error_line(r, what);
    EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << what;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << what << "\nexpected: " << c.needle << "\ngot: " << r.err;
    ws.check_and_reset(r, what);
  }
}

// Score traces: convert a key trace, describe and replay the result (hisa through the converted
// block probe); hisa refuses a score trace without the probe in one line.
TEST(Cli, ScoreTracesConvertReplayAndRefuseHisa) {
  Workspace ws;
  const RunResult conv = ws.run({"trace", "convert", "t.st", "--to", "scores", "--out", "s.st"});
  expect_one_error_line(conv, "trace convert");
  ASSERT_TRUE(WIFEXITED(conv.status) && WEXITSTATUS(conv.status) == 0) << conv.err;
  auto r = TraceReader::open(ws.file("s.st"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->kind(), TraceKind::kScores);
  EXPECT_TRUE(r->has_probe());
  ScoreTrace bare = r->to_score_trace();
  bare.probe.clear();
  bare.probe_block_entries = 0;
  ASSERT_TRUE(write_score_trace(bare, ws.file("np.st")).ok());
  ws.keep_current_files();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"trace", "info", "s.st"}, {"replay", "s.st", "--predictor", "spin", "--sparsity", "0.5"},
           {"replay", "s.st", "--predictor", "hisa", "--sparsity", "0.5"},
           {"replay", "s.st", "--predictor", "oracle", "--open-loop"},
           {"eval", "--trace", "s.st", "--trace", "t.st", "--quick", "--out", "ev"},
           // a trace named by a path: its plot files are named without the path's slashes
           {"eval", "--trace", "./s.st", "--quick", "--out", "ev"}}) {
    const RunResult ok = ws.run(args);
    expect_one_error_line(ok, joined(args));
    EXPECT_TRUE(WIFEXITED(ok.status) && WEXITSTATUS(ok.status) == 0) << joined(args) << "\n" << ok.err;
    ws.check_and_reset(ok, joined(args));
  }
  const std::vector<Case> cases = {
      {{"replay", "np.st", "--predictor", "hisa"}, "--predictor hisa needs the indexer's keys and queries or a block probe"},
      {{"trace", "convert", "s.st", "--to", "scores", "--out", "x.st"}, "is already a score trace"},
      {{"trace", "convert", "t.st", "--to", "keys", "--out", "x.st"}, "unknown trace kind 'keys'; supported: scores"},
      {{"trace", "convert", "t.st", "--out", "t.st"}, "refusing to overwrite an input"},
      {{"trace", "convert", "bad.st", "--out", "x.st"}, "bad.st"},
      {{"eval", "--trace", "bad.st", "--out", "ev"}, "bad.st"},
  };
  for (const Case& c : cases) {
    const std::string what = joined(c.args);
    const RunResult res = ws.run(c.args);
    expect_one_error_line(res, what);
    EXPECT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) != 0) << what;
    EXPECT_NE(res.err.find(c.needle), std::string::npos) << what << "\nexpected: " << c.needle << "\ngot: " << res.err;
    ws.check_and_reset(res, what);
  }
  const RunResult hisa = ws.run({"replay", "np.st", "--predictor", "hisa"});
  EXPECT_EQ(WEXITSTATUS(hisa.status), 2);  // a command line that cannot be run on this input
}

// `replay --topk K` measures at top-k K: the same numbers as the trace rewritten with topk K in its
// metadata (the truth is the top-K of the same scores), and a --set topk that contradicts K fails.
TEST(Cli, ReplayReadsATraceAtAnotherTopk) {
  Workspace ws;
  const RunResult conv = ws.run({"trace", "convert", "t.st", "--to", "scores", "--out", "s.st"});
  ASSERT_TRUE(WIFEXITED(conv.status) && WEXITSTATUS(conv.status) == 0) << conv.err;
  auto r = TraceReader::open(ws.file("s.st"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ScoreTrace at8 = r->to_score_trace();
  ASSERT_EQ(at8.meta.topk, 4);
  at8.meta.topk = 8;
  ASSERT_TRUE(write_score_trace(at8, ws.file("s8.st")).ok());
  ws.keep_current_files();
  const auto replay_json = [&](std::vector<std::string> args, const std::string& out) {
    for (const char* a : {"--predictor", "spin", "--sparsity", "0.5", "--json"}) args.emplace_back(a);
    args.push_back(out);
    const RunResult res = ws.run(args);
    EXPECT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0) << joined(args) << "\n" << res.err;
    return nlohmann::json::parse(read_file(ws.file(out)));
  };
  for (const char* trace : {"s.st", "t.st"}) {  // a score trace, and a key trace scored by the indexer
    const nlohmann::json own = replay_json({"replay", trace}, "own.json");
    const nlohmann::json at_8 = replay_json({"replay", trace, "--topk", "8"}, "k8.json");
    EXPECT_NE(own["recall_mean"], at_8["recall_mean"]) << trace << ": --topk changed nothing";
    if (std::string(trace) == "s.st") {
      const nlohmann::json rewritten = replay_json({"replay", "s8.st"}, "s8.json");
      for (const char* key : {"recall_mean", "miss_p99", "sparsity_mean", "work_fraction", "config"})
        EXPECT_EQ(at_8[key], rewritten[key]) << key;
    }
  }
  const std::vector<Case> cases = {
      {{"replay", "s.st", "--topk", "0"}, "--topk: 0 is outside 1..65536"},
      {{"replay", "s.st", "--topk", "8", "--set", "topk=4"}, "--set topk=4 contradicts the trace, whose topk is 8"},
  };
  for (const Case& c : cases) {
    const RunResult res = ws.run(c.args);
    EXPECT_TRUE(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 2) << joined(c.args) << "\n" << res.err;
    EXPECT_NE(res.err.find(c.needle), std::string::npos) << joined(c.args) << "\ngot: " << res.err;
  }
}

// The same checks hold when the output is valid: a link is written through, never replaced.
TEST(Cli, OutputsFollowLinksAndNeverReplaceThem) {
  Workspace ws;
  fs::create_symlink("target.json", ws.file("out-link.json"));
  const RunResult r = ws.run({"replay", "t.st", "--json", "out-link.json", "--dump-topk", "dump.st"});
  expect_one_error_line(r, "replay --json link");
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(ws.file("out-link.json")));
  EXPECT_TRUE(fs::is_regular_file(ws.file("target.json")));
  EXPECT_NE(read_file(ws.file("target.json")).find("\"recall_mean\""), std::string::npos);
  EXPECT_TRUE(TraceReader::open(ws.file("dump.st")).ok() == false);  // a top-k dump, not a trace
  EXPECT_GT(fs::file_size(ws.file("dump.st")), 0u);
}

// `bench decode --source` replays a trace's keys, queries and acceptance and reports recall.
TEST(Cli, DecodeBenchReplaysATraceSource) {
  Workspace ws;
  const RunResult r = ws.run({"bench", "decode", "--source", "t.st", "--steps", "4", "--layers", "1", "--batch", "2",
                              "--sparsity", "0.5", "--json", "decode.json"});
  ASSERT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.err;
  const nlohmann::json records = nlohmann::json::parse(read_file(ws.file("decode.json")));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1]["source"], "t.st");
  EXPECT_EQ(records[1]["context"], 34);  // the trace's prompt: ctx_len[0] − next_n = 35 − 1
  EXPECT_TRUE(records[1]["recall"].is_number());
  EXPECT_GE(records[1]["recall"].get<double>(), 0.0);
  EXPECT_LE(records[1]["recall"].get<double>(), 1.0);
  // The step's tail over requests and steps (nearest rank): p99 never below p50.
  for (const auto& rec : records) {
    EXPECT_GT(rec["step_p50_ms"].get<double>(), 0.0);
    EXPECT_GE(rec["step_p99_ms"].get<double>(), rec["step_p50_ms"].get<double>());
  }
}

// A signal in the middle of writing a large output removes the temporary file and still ends
// the process as that signal.
TEST(Cli, InterruptedWriteLeavesNothing) {
  Workspace ws;
  const std::string dir = fs::path(ws.file("t.st")).parent_path();
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    exec_spin({"trace", "gen", "--scenario", "doc-qa-94k", "--layers", "16", "--steps", "64", "--out", "big.st"});
    _exit(127);
  }
  bool saw_temp = false;
  for (int i = 0; i < 30000 * spin::testing::test_slowdown() && !saw_temp; ++i) {
    for (const auto& e : fs::directory_iterator(dir)) saw_temp |= e.path().filename().string().find("big.st.tmp-") == 0;
    if (!saw_temp) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!saw_temp) GTEST_SKIP() << "the write finished before it could be interrupted";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) GTEST_SKIP() << "the write finished before the signal";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find("big.st"), std::string::npos) << "left: " << e.path();
  }
}

// ---- random argument vectors ---------------------------------------------------------------

const std::vector<std::string> kHostile = {
    "-1", "0", "nan", "inf", "-inf", "1e400", "999999999999", "9223372036854775807", "-9223372036854775809",
    "", "abc", "0x10", "1.5", "-0", " 3", "3 ", "\xff\xfe", std::string(3000, 'A'), "--", "-", "=", "1e-320"};

struct Grammar {
  std::vector<std::string> path;  // subcommand words
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;  // flag and its sane values
  bool slow_when_valid = false;  // must get at least one hostile value (a valid run takes minutes)
};

// Outputs a user might name. For replay, t.st and link.st are the input and must be refused; for
// the other commands they are just existing files (replaced like a compiler replaces its output),
// so those get old.txt instead.
const std::vector<std::string> kReplayOutputs = {"o.json", "o.st", "t.st", "link.st", "dir", "/dev/full",
                                                 "/dev/null", "no/such/o.json", "pipe", ""};
const std::vector<std::string> kOutputs = {"o.json", "o.st", "old.txt", "dir", "/dev/full", "/dev/null",
                                           "no/such/o.json", "pipe", ""};

std::vector<Grammar> grammars() {
  const std::vector<std::string> small_ctx = {"1", "64", "1000", "4096"};
  return {
      {{"eval"}, {{"--scenario", {"doc-qa-10k", "bogus"}}, {"--quick", {}}, {"--out", {"rep", "t.st", "dir"}},
                  {"--seed", {"1", "18446744073709551615"}}, {"--threads", {"1", "2"}}, {"--set", {"alpha=0.5", "alpha=2", "x"}}},
       true},
      {{"calibrate"}, {{"--iterations", {"1"}}, {"--write", kOutputs}}, true},
      {{"advise"},
       {{"--model", {"deepseek-v3.2", "deepseek-v4-pro", "gpt"}}, {"--gpu", {"h200", "b200", "a100"}},
        {"--context", {"1", "131072"}}, {"--batch", {"1", "64"}}, {"--tolerance", {"0.3", "0", "1"}},
        {"--trace", {"t.st", "bad.st", "none.st", "dir"}}, {"--at-model-topk", {}}, {"--json", {}}, {"--out", kOutputs}},
       true},
      {{"config"}, {}},
      {{"replay", "t.st"},
       {{"--predictor", {"spin", "prev-iter", "oracle", "hisa", "nope"}}, {"--sparsity", {"0", "0.3", "0.99"}},
        {"--explore", {"0", "0.5", "1"}}, {"--pooling", {"max", "mean", "topk-hits", "lse"}},
        {"--mtp-update", {"prefix", "row0", "all-rows"}}, {"--open-loop", {}}, {"--cold-start", {}},
        {"--set", {"alpha=0.3", "topk=4", "topk=8", "seed=3", "combine=max", "block_pages=2"}}, {"--json", kReplayOutputs},
        {"--dump-topk", kReplayOutputs}}},
      {{"replay", "bad.st"}, {{"--predictor", {"spin"}}}},
      {{"replay", "link.st"}, {{"--json", kReplayOutputs}}},
      {{"trace", "gen"},
       {{"--scenario", {"doc-qa-10k", "agentic-mtp", "bogus"}}, {"--out", kOutputs}, {"--context", small_ctx},
        {"--steps", {"1", "3"}}, {"--layers", {"1", "2"}}, {"--next-n", {"1", "3", "5"}}, {"--seed", {"3"}}}},
      {{"trace", "info"}, {{"t.st", {}}, {"pipe", {}}, {"bad.st", {}}, {"dir", {}}, {"none.st", {}}}},
      {{"bench", "indexer"},
       {{"--context", small_ctx}, {"--rows", {"1", "2", "5"}}, {"--sparsity", {"0", "0.5"}},
        {"--impl", {"auto", "portable", "reference", "avx512bf16", "bogus"}}, {"--min-time", {"0.001", "0"}},
        {"--threads", {"1", "2"}}, {"--json", kOutputs}}},
      {{"bench", "topk"},
       {{"--context", small_ctx}, {"--topk", {"1", "2048", "65536"}}, {"--min-time", {"0.001"}},
        {"--threads", {"1"}}, {"--json", kOutputs}}},
      {{"bench", "predictor"},
       {{"--context", small_ctx}, {"--predictor", {"spin", "hisa", "nope"}}, {"--sparsity", {"0.5"}},
        {"--steps", {"1", "3"}}, {"--threads", {"1"}}, {"--json", kOutputs}}},
      {{"bench", "attention"},
       {{"--rows", {"1", "2", "300"}}, {"--heads", {"8", "64", "129"}}, {"--topk", {"16", "512"}},
        {"--latent", {"fp8", "bf16", "int4"}}, {"--impl", {"auto", "avx2", "portable", "reference", "bogus"}},
        {"--min-time", {"0.001"}}, {"--threads", {"1"}}, {"--json", kOutputs}}},
      {{"bench", "quant"},
       {{"--entries", {"64", "1000", "63"}}, {"--min-time", {"0.001"}}, {"--json", kOutputs}}},
      {{"bench", "decode"},
       {{"--model", {"deepseek-v3.2", "deepseek-v4-flash", "gpt"}}, {"--context", {"64", "1024"}},
        {"--batch", {"1", "2"}}, {"--layers", {"1", "100"}}, {"--steps", {"1", "2"}}, {"--sparsity", {"0.5"}},
        {"--predictor", {"spin", "all-keep"}}, {"--next-n", {"1", "2"}}, {"--acceptance", {"0.5", "1.5"}},
        {"--latent", {"fp8", "bf16"}}, {"--path-share", {"0.5", "0"}}, {"--threads", {"1"}}, {"--json", kOutputs}}},
  };
}

// Argument vectors that must be cheap to run when valid (small contexts, few steps).
std::vector<std::string> random_args(std::mt19937_64& rng, const Grammar& g) {
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> args = g.path;
  std::vector<size_t> order(g.flags.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i : order) {
    if (pick(3) == 0) continue;
    const auto& [flag, values] = g.flags[i];
    args.push_back(flag);
    if (values.empty()) continue;  // a switch (or, for trace info, the file itself)
    if (pick(4) == 0) {
      args.push_back(kHostile[pick(kHostile.size())]);
    } else {
      args.push_back(values[pick(values.size())]);
    }
  }
  // Cheap by construction: the sweeps of the benchmarks and generator need their small sizes.
  const bool needs_context = (g.path[0] == "bench" && g.path[1] != "attention" && g.path[1] != "quant") || (g.path.size() > 1 && g.path[1] == "gen");
  if (needs_context && std::find(args.begin(), args.end(), "--context") == args.end()) {
    args.insert(args.end(), {"--context", "512"});
  }
  if (g.path.size() > 1 && g.path[1] == "gen" && std::find(args.begin(), args.end(), "--out") == args.end()) {
    args.insert(args.end(), {"--out", "g.st"});
  }
  if (g.path.size() > 1 && g.path[1] == "gen" && std::find(args.begin(), args.end(), "--steps") == args.end()) {
    args.insert(args.end(), {"--steps", "2"});
  }
  if (g.path.size() > 1 && g.path[1] == "attention") {
    if (std::find(args.begin(), args.end(), "--min-time") == args.end()) args.insert(args.end(), {"--min-time", "0.001"});
    if (std::find(args.begin(), args.end(), "--topk") == args.end()) args.insert(args.end(), {"--topk", "64"});
    if (std::find(args.begin(), args.end(), "--rows") == args.end()) args.insert(args.end(), {"--rows", "1"});
  }
  if (g.path.size() > 1 && (g.path[1] == "indexer" || g.path[1] == "topk") &&
      std::find(args.begin(), args.end(), "--min-time") == args.end()) {
    args.insert(args.end(), {"--min-time", "0.001"});
  }
  if (g.path.size() > 1 && g.path[1] == "predictor" && std::find(args.begin(), args.end(), "--steps") == args.end()) {
    args.insert(args.end(), {"--steps", "2"});
  }
  if (g.path.size() > 1 && g.path[1] == "decode") {
    if (std::find(args.begin(), args.end(), "--steps") == args.end()) args.insert(args.end(), {"--steps", "1"});
    if (std::find(args.begin(), args.end(), "--batch") == args.end()) args.insert(args.end(), {"--batch", "1"});
    if (std::find(args.begin(), args.end(), "--layers") == args.end()) args.insert(args.end(), {"--layers", "1"});
  }
  if (g.slow_when_valid) args.insert(args.end(), {"--threads", "-1"});  // never runs for minutes
  if (pick(10) == 0) args.insert(args.begin() + static_cast<std::ptrdiff_t>(pick(args.size() + 1)), kHostile[pick(kHostile.size())]);
  return args;
}

TEST(Cli, RandomArgumentVectorsNeverCrashHangOrDestroy) {
  Workspace ws;
  std::ofstream(ws.file("old.txt")) << "an existing output\n";
  ws.keep_current_files();
  std::mt19937_64 rng(20261201);
  const auto g = grammars();
  const auto budget = std::chrono::seconds(150);  // a bound on the test's length, not a check
  const auto start = std::chrono::steady_clock::now();
  int runs = 0, failures = 0;
  while (runs < 400 && std::chrono::steady_clock::now() - start < budget) {
    const std::vector<std::string> args = random_args(rng, g[static_cast<size_t>(rng() % g.size())]);
    const std::string what = joined(args);
    const RunResult r = ws.run(args);
    expect_one_error_line(r, what);
    ws.check_and_reset(r, what);
    ++runs;
    failures += !(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    if (::testing::Test::HasFailure()) break;  // the first counterexample is the useful one
  }
  std::printf("[ cli fuzz ] %d argument vectors, %d refused, %d ran\n", runs, failures, runs - failures);
  EXPECT_GE(runs, std::max(5, 50 / spin::testing::test_slowdown()));  // under qemu: fewer in the budget
}

// SPIN_CPU (spin/cpu.h): a name spin does not know, or another ISA's, is one error line before
// any work; a path the cap leaves out is refused naming the cap; the cap is printed with results.
TEST(Cli, SpinCpuIsCheckedAndNamed) {
  Workspace ws;
  const auto seconds = std::chrono::seconds(60);
  RunResult r = ws.run({"trace", "info", "t.st"}, seconds, {"SPIN_CPU=avx3"});
  expect_one_error_line(r, "SPIN_CPU=avx3");
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.err.find("SPIN_CPU=avx3: unknown level; use one of native"), std::string::npos) << r.err;
  ws.check_and_reset(r, "SPIN_CPU=avx3");
#if defined(__x86_64__)
  const std::string other_isa = "neon", own_path = "avx2", floor_path = "portable";
#else
  const std::string other_isa = "avx2", own_path = "neon", floor_path = "portable";
#endif
  r = ws.run({"trace", "info", "t.st"}, seconds, {"SPIN_CPU=" + other_isa});
  expect_one_error_line(r, "SPIN_CPU=" + other_isa);
  EXPECT_NE(r.err.find("level; this build knows"), std::string::npos) << r.err;
  ws.check_and_reset(r, "SPIN_CPU=" + other_isa);

  // Capped at portable, the ISA's own SIMD path is refused by name (the cap's, or the CPU's lack).
  const std::vector<std::string> bench = {"bench", "indexer", "--context", "256", "--rows", "1", "--sparsity", "0",
                                          "--impl"};
  std::vector<std::string> forced = bench;
  forced.push_back(own_path);
  r = ws.run(forced, seconds, {"SPIN_CPU=portable"});
  expect_one_error_line(r, "SPIN_CPU=portable --impl " + own_path);
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  const bool named = r.err.find("SPIN_CPU=portable leaves it out") != std::string::npos ||
                     r.err.find("this CPU lacks it") != std::string::npos;
  EXPECT_TRUE(named) << r.err;
  ws.check_and_reset(r, "SPIN_CPU=portable --impl");

  // The floor runs, and its record names the cap.
  forced = bench;
  forced.push_back(floor_path);
  forced.insert(forced.end(), {"--json", "capped.json"});
  r = ws.run(forced, std::chrono::seconds(120), {"SPIN_CPU=portable"});
  expect_one_error_line(r, "SPIN_CPU=portable bench");
  ASSERT_EQ(WEXITSTATUS(r.status), 0) << r.err;
  const nlohmann::json records = nlohmann::json::parse(read_file(ws.file("capped.json")));
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records[0]["spin_cpu"], "portable");
  EXPECT_NE(records[0]["kernels"].get<std::string>().find("SPIN_CPU=portable"), std::string::npos) << records[0];
  ws.check_and_reset(r, "SPIN_CPU=portable bench");
}

}  // namespace
}  // namespace spin
