// `spin diagnose` through the built binary: the table, --json (valid, with sources) and --out,
// and refusals of flags outside their ranges (exit code 2, one line).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "test_util.h"

namespace {

TEST(ToolsDiagnose, TableJsonAndOut) {
  CliRun t = run_spin("diagnose --gpu h200 --context 65536 --batch 64");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("indexer share"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("sources:"), std::string::npos);
  spin::testing::TempDir dir;
  const std::string out = dir.file("d.json");
  CliRun j = run_spin("diagnose --json --gpu b200 --model deepseek-v4-flash --sparsity 0.3 --sparsity 0.5 --out " + out);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto parsed = nlohmann::json::parse(j.out);
  EXPECT_EQ(parsed["sparsity"].size(), 2u);
  EXPECT_EQ(parsed["model"], "deepseek-v4-flash");
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(ss.str()), parsed);
}

TEST(ToolsDiagnose, RefusesBadFlags) {
  for (const char* args : {"diagnose --gpu a100", "diagnose --batch 0", "diagnose --sparsity 1.0",
                           "diagnose --next-n 9", "diagnose --model gpt"}) {
    CliRun r = run_spin(args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("spin: error:"), std::string::npos) << args << ": " << r.out;
  }
}

}  // namespace
