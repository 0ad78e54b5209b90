// `spin advise` through the built binary: the screen and --json (the fields the issue names) on a
// tiny scenario run and on a recorded trace, "cannot pay here" when the rest of the step dwarfs the
// indexer, and one error line each for an unknown model or GPU, a tolerance outside (0, 1) and a
// trace of another geometry than the named model.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "spin/lab/workload.h"
#include "spin/trace.h"
#include "cli_run.h"
#include "test_util.h"

namespace {

// A small generated trace at `topk` (2048 = DeepSeek-V3.2's geometry, 512 = V4-Flash's top-k).
std::string write_small_trace(const spin::testing::TempDir& dir, const std::string& name, int32_t topk) {
  spin::WorkloadParams p = spin::scenario_params("doc-qa-10k").value();
  p.prompt_tokens = 4096;
  p.steps = 6;
  p.layers = 1;
  p.topk = topk;
  const std::string path = dir.file(name);
  auto trace = spin::generate_workload(p);
  EXPECT_TRUE(trace.ok()) << trace.status().to_string();
  EXPECT_TRUE(spin::write_trace(trace.value(), path).ok());
  return path;
}

// The smallest run that still replays something: one scenario request, few steps, two sparsities.
const std::string kTiny =
    " --scenario doc-qa-10k --requests 1 --steps 4 --layers 1 --sparsity 0.3 --sparsity 0.5 --no-cpu-tail --threads 2";

TEST(ToolsAdvise, JsonCarriesTheAnswer) {
  spin::testing::TempDir dir;
  const std::string out = dir.file("advice.json");
  CliRun r = run_spin("advise --json --out " + out + kTiny);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  for (const char* key : {"indexer_share", "topk_share", "recommended_sparsity", "expected_gain", "verdict",
                          "vllm_line", "quality", "step", "tolerance", "pays", "sources"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["quality"].size(), 4u);  // spin's default and the paper's spin × 2 sparsities
  EXPECT_EQ(j["quality"][0]["config"], "spin");
  EXPECT_EQ(j["quality"][2]["config"], "paper");
  EXPECT_DOUBLE_EQ(j["tolerance"].get<double>(), 0.5);
  EXPECT_GT(j["indexer_share"].get<double>(), 0.0);
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(ss.str()), j);
}

TEST(ToolsAdvise, ScreenOnARecordedTrace) {
  spin::testing::TempDir dir;
  const std::string trace = write_small_trace(dir, "mine.st", 2048);
  CliRun r = run_spin("advise --trace " + trace + " --sparsity 0.3 --no-cpu-tail --threads 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("indexer share"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Recommendation:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(trace), std::string::npos) << r.out;
}

TEST(ToolsAdvise, RestOfTheStepDwarfingTheIndexerCannotPay) {
  CliRun r = run_spin("advise --json --other-ms 100000" + kTiny);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_FALSE(j["pays"].get<bool>());
  EXPECT_NE(j["verdict"].get<std::string>().find("spin cannot pay here"), std::string::npos) << j["verdict"];
  EXPECT_TRUE(j["vllm_line"].is_null());
}

TEST(ToolsAdvise, BadInputIsOneClearError) {
  spin::testing::TempDir dir;
  const std::string v4_trace = write_small_trace(dir, "v4.st", 512);
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{{"advise --model gpt", "model"},
                                         {"advise --gpu a100", "GPU"},
                                         {"advise --tolerance 0", "(0, 1)"},
                                         {"advise --tolerance 1", "(0, 1)"},
                                         {"advise --tolerance -0.2", "(0, 1)"},
                                         {"advise --tolerance nan", "(0, 1)"},
                                         {"advise --trace " + v4_trace, "geometry"}}) {
    CliRun r = run_spin(c.args + " --no-cpu-tail");
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("spin: error:", 0), 0u) << c.args << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.args << ": " << r.out;
  }
  CliRun missing = run_spin("advise --no-cpu-tail --trace " + dir.file("none.st"));
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_EQ(missing.out.rfind("spin: error:", 0), 0u) << missing.out;
}

}  // namespace
