// The safetensors container: round trip, layout as the Python package writes it, and one
// specific error per malformed header (src/trace/safetensors.h).
#include "trace/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace spin::st {
namespace {

namespace fs = std::filesystem;

using spin::testing::TempDir;

// A raw file: [u64 len][header][data]; the header is used as given (no padding added).
std::vector<uint8_t> raw(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

Status parse_raw(const std::string& header, size_t data_bytes) {
  const auto bytes = raw(header, data_bytes);
  auto f = SafetensorsFile::from_memory(bytes.data(), bytes.size());
  return f.status();
}

void expect_error(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << needle;
}

TEST(Safetensors, RoundTripLayoutAndAlignment) {
  TempDir dir;
  const std::vector<uint8_t> u8 = {1, 2, 3};  // odd size: would misalign what follows
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  const std::vector<int64_t> i64 = {-1, 1LL << 40};
  const std::vector<int32_t> empty;
  const std::vector<TensorSpec> specs = {
      {"a_bytes", Dtype::kU8, {3}, u8.data(), u8.size()},
      {"b_floats", Dtype::kF32, {2, 3}, f32.data(), f32.size() * 4},
      {"c_longs", Dtype::kI64, {2}, i64.data(), i64.size() * 8},
      {"d_empty", Dtype::kI32, {0, 5}, empty.data(), 0},
  };
  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(write_safetensors(path, specs, {{"k", "v"}, {"n", "3"}}).ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"t.safetensors"});  // no temp file left

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata().at("k"), "v");
  EXPECT_EQ(f->metadata().at("n"), "3");
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a_bytes", "b_floats", "c_longs", "d_empty"}));
  for (const auto& spec : specs) {
    auto t = f->tensor(spec.name);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->dtype, spec.dtype);
    EXPECT_EQ(t->shape, spec.shape);
    ASSERT_EQ(t->nbytes, spec.nbytes);
    if (spec.nbytes > 0) {
      EXPECT_EQ(std::memcmp(t->data, spec.data, spec.nbytes), 0);
    }
    EXPECT_TRUE(t->aligned()) << spec.name;
  }
  EXPECT_FALSE(f->tensor("nope").ok());

  // The bytes follow the Python package: 8-byte-multiple header padded with spaces, larger
  // itemsizes first.
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n));
  EXPECT_EQ(header["c_longs"]["data_offsets"][0], 0);
  EXPECT_EQ(header["b_floats"]["data_offsets"][0], 16);
  EXPECT_EQ(header["a_bytes"]["data_offsets"], nlohmann::json({40, 43}));
  EXPECT_EQ(bytes.size(), 8 + n + 43);
}

TEST(Safetensors, WriterRejectsBadSpecsBeforeTouchingDisk) {
  TempDir dir;
  const std::vector<float> f(4);
  const std::string path = dir.file("x.safetensors");
  std::vector<TensorSpec> bad_size = {{"w", Dtype::kF32, {5}, f.data(), 16}};
  expect_error(write_safetensors(path, bad_size, {}), "need 20");
  std::vector<TensorSpec> dup = {{"w", Dtype::kF32, {4}, f.data(), 16},
                                 {"w", Dtype::kF32, {4}, f.data(), 16}};
  expect_error(write_safetensors(path, dup, {}), "appears twice");
  std::vector<TensorSpec> reserved = {{"__metadata__", Dtype::kU8, {0}, nullptr, 0}};
  expect_error(write_safetensors(path, reserved, {}), "reserved");
  std::vector<TensorSpec> null = {{"w", Dtype::kF32, {4}, nullptr, 16}};
  expect_error(write_safetensors(path, null, {}), "null");
  std::vector<TensorSpec> neg = {{"w", Dtype::kF32, {-4}, f.data(), 16}};
  expect_error(write_safetensors(path, neg, {}), "negative");
  std::vector<TensorSpec> utf8 = {{"w\xff", Dtype::kF32, {4}, f.data(), 16}};
  expect_error(write_safetensors(path, utf8, {}), "UTF-8");
  EXPECT_TRUE(dir.entries().empty());
}

TEST(Safetensors, OneClearErrorPerMalformedHeader) {
  const auto tensor = [](const std::string& body) { return "{\"t\": " + body + "}"; };
  {
    std::vector<uint8_t> b = {1, 2, 3};
    expect_error(SafetensorsFile::from_memory(b.data(), b.size()).status(), "file is 3 bytes");
    expect_error(SafetensorsFile::from_memory(nullptr, 0).status(), "file is 0 bytes");
  }
  {
    auto b = raw("{}", 0);
    const uint64_t big = 1000;
    std::memcpy(b.data(), &big, 8);
    expect_error(SafetensorsFile::from_memory(b.data(), b.size()).status(),
                 "header length field says 1000 bytes but only 2 bytes follow");
  }
  EXPECT_TRUE(parse_raw("{}", 0).ok());
  EXPECT_TRUE(parse_raw("{}      ", 0).ok());
  expect_error(parse_raw("{\"t\": ", 0), "not valid JSON");
  expect_error(parse_raw("[1, 2]", 0), "header is a JSON array, expected an object");
  expect_error(parse_raw("{\"__metadata__\": {\"a\": 1}}", 0),
               "__metadata__[\"a\"] is a JSON number, expected a string");
  expect_error(parse_raw("{\"__metadata__\": []}", 0), "__metadata__ is a JSON array");
  expect_error(parse_raw(tensor("3"), 0), "tensor \"t\" header entry is a JSON number");
  expect_error(parse_raw(tensor("{\"shape\": [1], \"data_offsets\": [0, 4]}"), 4),
               "tensor \"t\" has no dtype");
  expect_error(parse_raw(tensor("{\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]}"), 4),
               "dtype is a JSON number");
  expect_error(parse_raw(tensor("{\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}"),
                         4),
               "unknown dtype \"F33\"");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"data_offsets\": [0, 4]}"), 4),
               "tensor \"t\" has no shape");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}"),
                         4),
               "shape is a JSON number");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}"),
                         4),
               "shape holds -1");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}"),
                         4),
               "shape holds 1.5");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [1]}"), 4),
               "tensor \"t\" has no data_offsets");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}"), 4),
               "data_offsets is [0], expected [begin, end]");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}"),
                         4),
               "end before begin");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}"),
                         3),
               "run past the 3 data bytes");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}"),
                         8),
               "holds 4 bytes but dtype F32 and shape [2] need 8");
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
                                "\"data_offsets\": [0, 4]}"),
                         8),
               "overflows 64-bit");
  // A zero dimension makes the tensor empty even when the other dims are huge.
  EXPECT_TRUE(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 0], "
                               "\"data_offsets\": [0, 0]}"),
                        0)
                  .ok());
  expect_error(parse_raw("{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
                         " \"b\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [2, 6]}}",
                         6),
               "tensors \"a\" [0, 4) and \"b\" [2, 6) overlap");
  // What the reference reader also refuses: a gap between tensors, a first tensor that does not
  // start at 0, bytes after the last tensor, a NUL byte in the header. Stricter than it: a key
  // named twice (it keeps the last one silently).
  const std::string a4 = "\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}";
  expect_error(parse_raw("{" + a4 + ", \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]}}", 8),
               "2 unused data bytes before tensor \"b\" [6, 8)");
  expect_error(parse_raw(tensor("{\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}"), 4),
               "2 unused data bytes before tensor \"t\"");
  expect_error(parse_raw("{" + a4 + "}", 5), "1 trailing bytes after the last tensor");
  expect_error(parse_raw("{}", 3), "3 trailing bytes after the last tensor");
  std::string with_nul = "{\"__metadata__\": {\"a\": \"x_y\"}}";
  with_nul[with_nul.rfind('_')] = '\0';
  expect_error(parse_raw(with_nul, 0), "NUL byte at offset 33");
  expect_error(parse_raw(std::string("{}\0\0\0\0\0\0", 8), 0), "NUL byte at offset 10");
  expect_error(parse_raw("{" + a4 + ", " + a4 + "}", 4), "header names \"a\" twice");
  expect_error(parse_raw("{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}", 0), "header names \"k\" twice");
  expect_error(parse_raw("{\"__metadata__\": {}, \"__metadata__\": {}}", 0), "header names \"__metadata__\" twice");
  EXPECT_TRUE(parse_raw("{\"x\": {\"k\": 1}, \"y\": {\"k\": 1}}", 0).code() != StatusCode::kOk);  // not tensors
  EXPECT_TRUE(parse_raw("{" + a4 + ", \"z\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [4, 4]}}", 4).ok());
  // Deeply nested junk is reported briefly, without recursion trouble.
  expect_error(parse_raw(tensor("{\"dtype\": \"F32\", \"shape\": [" + std::string(5000, '[') +
                                std::string(5000, ']') + "], \"data_offsets\": [0, 4]}"),
                         4),
               "shape holds a JSON array");
}

TEST(Safetensors, OpenReportsFileSystemErrors) {
  TempDir dir;
  expect_error(SafetensorsFile::open(dir.file("missing.safetensors")).status(), "cannot open");
  fs::create_directory(dir.file("sub"));
  expect_error(SafetensorsFile::open(dir.file("sub")).status(), "not a regular file");
  // A named pipe is refused at once, without waiting for a writer to open it.
  ASSERT_EQ(mkfifo(dir.file("pipe").c_str(), 0600), 0);
  expect_error(SafetensorsFile::open(dir.file("pipe")).status(), "not a regular file");
  std::ofstream(dir.file("empty")).close();
  expect_error(SafetensorsFile::open(dir.file("empty")).status(), "file is 0 bytes");
}

// A file changed under an open reader never faults it. Up to copy_below_bytes it is read
// into memory (truncating the file changes nothing the reader shows); above, it is mapped and
// check_unchanged() reports the truncation before a read of the lost tail could raise SIGBUS.
TEST(Safetensors, TruncatedUnderAnOpenReader) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::vector<float> values(4096, 1.5f);
  const std::vector<TensorSpec> specs = {{"x", Dtype::kF32, {4096}, values.data(), values.size() * 4}};
  ASSERT_TRUE(write_safetensors(path, specs, {}).ok());
  auto copied = SafetensorsFile::open(path);
  auto mapped = SafetensorsFile::open(path, /*copy_below_bytes=*/0);
  ASSERT_TRUE(copied.ok() && mapped.ok());
  EXPECT_FALSE(copied->mapped());
  EXPECT_TRUE(mapped->mapped());
  ASSERT_EQ(::truncate(path.c_str(), 16), 0);
  EXPECT_TRUE(copied->check_unchanged().ok());
  const TensorView x = copied->tensor("x").value();
  float last = 0;
  std::memcpy(&last, x.data + 4095 * 4, 4);  // the old contents, after the file lost them
  EXPECT_EQ(last, 1.5f);
  const Status lost = mapped->check_unchanged();
  EXPECT_EQ(lost.code(), StatusCode::kDataLoss);
  expect_error(lost, "shrank");
}

TEST(Safetensors, PathWithANulByteIsRefused) {
  TempDir dir;
  const std::string path = dir.file("a.st") + std::string(1, '\0') + ".bak";
  expect_error(SafetensorsFile::open(path).status(), "NUL");
  std::vector<float> v(4, 0.0f);
  const std::vector<TensorSpec> specs = {{"x", Dtype::kF32, {4}, v.data(), 16}};
  expect_error(write_safetensors(path, specs, {}), "NUL");
  EXPECT_FALSE(fs::exists(dir.file("a.st")));
}

}  // namespace
}  // namespace spin::st
