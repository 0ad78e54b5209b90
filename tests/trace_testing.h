// Shared helpers of the trace file tests (tests/eval_trace_test.cpp, eval_score_trace_test.cpp):
// raw file bytes, and corrupt files made by rewriting a good file's tensors with one change.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "trace/safetensors.h"
#include "spin/trace.h"
#include "test_util.h"

namespace spin::testing {

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A safetensors file's metadata and tensors, owned and editable.
struct OwnedTensor {
  st::Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
struct Contents {
  std::map<std::string, std::string> metadata;
  std::map<std::string, OwnedTensor> tensors;
};

inline Contents load_contents(const std::string& path) {
  Contents c;
  auto f = st::SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return c;
  c.metadata = f->metadata();
  for (const auto& name : f->names()) {
    auto t = f->tensor(name).value();
    c.tensors[name] = {t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  }
  return c;
}

// Writes `c` to `path` and opens it as a trace: what the reader says about it.
inline Status open_contents(const Contents& c, const std::string& path) {
  std::vector<st::TensorSpec> specs;
  for (const auto& [name, t] : c.tensors) specs.push_back({name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  const Status w = st::write_safetensors(path, specs, c.metadata);
  if (!w.ok()) return w;
  return TraceReader::open(path).status();
}

// Element i of tensor `name`, as a T.
template <typename T>
void set_element(Contents& c, const std::string& name, size_t i, T v) {
  std::memcpy(c.tensors.at(name).bytes.data() + i * sizeof(T), &v, sizeof(T));
}

// A fixture over a plain and an MTP file (written by SetUp of the derived test): each corruption
// must fail with one kDataLoss line that contains `needle`.
class CorruptFileTest : public ::testing::Test {
 protected:
  void load_good(const std::string& plain, const std::string& mtp) {
    plain_ = load_contents(plain);
    mtp_ = load_contents(mtp);
    ASSERT_TRUE(open_contents(plain_, dir_.file("check")).ok());
    ASSERT_TRUE(open_contents(mtp_, dir_.file("check")).ok());
  }
  void expect(const Contents& c, const std::string& needle) {
    const Status s = open_contents(c, dir_.file("bad"));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos)
        << "message: " << s.message() << "\nexpected to contain: " << needle;
  }
  TempDir dir_;
  Contents plain_, mtp_;
};

}  // namespace spin::testing
