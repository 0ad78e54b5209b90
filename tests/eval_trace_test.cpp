// Trace files (spin/trace.h): bit-exact round trip, one specific error per corrupt file, no crash
// on truncated or scrambled bytes, atomic writes, and the Python recorder's output.
#include "spin/trace.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "trace/safetensors.h"
#include "test_util.h"
#include "trace_testing.h"

namespace spin {
namespace {

namespace fs = std::filesystem;

using spin::testing::TempDir;
using testing::Contents;
using testing::load_contents;
using testing::open_contents;
using testing::read_bytes;
using testing::write_bytes;

// A small random trace. e4m3 codes avoid the NaN codes; scales are powers of two (UE8M0).
Trace make_trace(int layers, int next_n, int heads, int64_t entries, std::vector<int64_t> ctx,
                 bool draft, uint32_t seed) {
  std::mt19937 rng(seed);
  auto code = [&rng] {
    const auto c = static_cast<uint8_t>(rng() & 0xFF);
    return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c ^ 0x01) : c;
  };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Trace t;
  t.meta.model = "test-model";
  t.meta.num_layers = layers;
  t.meta.next_n = next_n;
  t.meta.num_heads = heads;
  t.meta.page_size = 16;
  t.meta.topk = 32;
  t.meta.compress_ratio = 1;
  t.ctx_len = std::move(ctx);
  const auto steps = static_cast<size_t>(t.ctx_len.size());
  if (next_n > 1) {
    for (size_t s = 0; s < steps; ++s) t.accepted.push_back(static_cast<int32_t>(rng() % next_n));
  }
  for (int l = 0; l < layers; ++l) {
    TraceLayer L;
    for (int64_t i = 0; i < entries * 128; ++i) L.k.push_back(code());
    for (int64_t i = 0; i < entries; ++i) L.k_scale.push_back(std::ldexp(1.0f, int(rng() % 8) - 6));
    for (size_t i = 0; i < steps * next_n * heads * 128; ++i) L.q.push_back(code());
    for (size_t i = 0; i < steps * next_n * heads; ++i) L.w.push_back(normal(rng));
    if (draft) {
      for (size_t i = 0; i < steps * (next_n - 1) * 128; ++i) L.k_draft.push_back(code());
      for (size_t i = 0; i < steps * (next_n - 1); ++i) L.k_draft_scale.push_back(0.5f);
    }
    t.layers.push_back(std::move(L));
  }
  return t;
}

// 2 layers, plain decode, 4 heads, 200 entries, 5 steps.
Trace plain_trace() { return make_trace(2, 1, 4, 200, {150, 160, 170, 185, 200}, false, 1); }
// 3 layers, MTP next_n 3 with draft keys, 64 heads (the real count).
Trace mtp_trace() { return make_trace(3, 3, 64, 90, {40, 43, 44, 47, 50, 51, 53, 60}, true, 2); }

template <typename T>
bool same_bytes(std::span<const T> a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  return b.empty() || std::memcmp(a.data(), b.data(), b.size() * sizeof(T)) == 0;
}

void expect_same(const TraceReader& r, const Trace& t) {
  EXPECT_EQ(r.meta().model, t.meta.model);
  EXPECT_EQ(r.meta().num_layers, t.meta.num_layers);
  EXPECT_EQ(r.meta().next_n, t.meta.next_n);
  EXPECT_EQ(r.meta().num_heads, t.meta.num_heads);
  EXPECT_EQ(r.meta().page_size, t.meta.page_size);
  EXPECT_EQ(r.meta().topk, t.meta.topk);
  EXPECT_EQ(r.meta().compress_ratio, t.meta.compress_ratio);
  EXPECT_EQ(r.meta().extra, t.meta.extra);
  ASSERT_EQ(r.steps(), t.steps());
  EXPECT_TRUE(same_bytes(r.ctx_len(), t.ctx_len));
  EXPECT_TRUE(same_bytes(r.accepted(), t.accepted));
  EXPECT_EQ(r.has_draft_keys(), !t.layers[0].k_draft.empty());
  for (int l = 0; l < t.meta.num_layers; ++l) {
    const TraceLayer& L = t.layers[l];
    EXPECT_EQ(r.entries(l), static_cast<int64_t>(L.k_scale.size()));
    EXPECT_TRUE(same_bytes(r.k(l), L.k)) << l;
    EXPECT_TRUE(same_bytes(r.k_scale(l), L.k_scale)) << l;
    // Per-step and per-row views tile the tensors exactly.
    std::vector<uint8_t> q;
    std::vector<float> w;
    std::vector<uint8_t> kd;
    std::vector<float> kds;
    for (int64_t s = 0; s < r.steps(); ++s) {
      for (int j = 0; j < t.meta.next_n; ++j) {
        const auto qr = r.q(l, s, j);
        const auto wr = r.w(l, s, j);
        ASSERT_EQ(qr.size(), size_t(t.meta.num_heads) * 128);
        ASSERT_EQ(wr.size(), size_t(t.meta.num_heads));
        q.insert(q.end(), qr.begin(), qr.end());
        w.insert(w.end(), wr.begin(), wr.end());
      }
      EXPECT_EQ(r.q(l, s).size(), size_t(t.meta.next_n) * t.meta.num_heads * 128);
      const auto d = r.k_draft(l, s);
      kd.insert(kd.end(), d.begin(), d.end());
      const auto ds = r.k_draft_scale(l, s);
      kds.insert(kds.end(), ds.begin(), ds.end());
    }
    EXPECT_EQ(q, L.q);
    EXPECT_EQ(std::memcmp(w.data(), L.w.data(), w.size() * 4), 0);
    EXPECT_EQ(w.size(), L.w.size());
    EXPECT_EQ(kd, L.k_draft);
    EXPECT_EQ(kds.size(), L.k_draft_scale.size());
  }
}

// ---------------------------------------------------------------------------------------------
// Round trip

TEST(Trace, RoundTripIsBitExact) {
  TempDir dir;
  for (const Trace& t : {plain_trace(), mtp_trace()}) {
    Trace tt = t;
    tt.meta.extra["recorded_by"] = "unit test";
    const std::string path = dir.file("t.safetensors");
    ASSERT_TRUE(write_trace(tt, path).ok());
    auto r = TraceReader::open(path);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_same(r.value(), tt);
    EXPECT_EQ(r->file_size(), fs::file_size(path));
    // Zero-copy: float views point into the mapping and are aligned.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->w(0).data()) % 4, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->ctx_len().data()) % 8, 0u);

    // to_trace / read_trace copy everything; rewriting gives the identical file.
    auto back = read_trace(path);
    ASSERT_TRUE(back.ok());
    const std::string path2 = dir.file("t2.safetensors");
    ASSERT_TRUE(write_trace(back.value(), path2).ok());
    EXPECT_EQ(read_bytes(path), read_bytes(path2));

    // from_memory reads the same bytes the same way.
    const auto bytes = read_bytes(path);
    auto m = TraceReader::from_memory(bytes.data(), bytes.size());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    expect_same(m.value(), tt);
    EXPECT_EQ(m->path(), "<memory>");
  }
}

TEST(Trace, VisibilityFollowsCtxLenAndCompressRatio) {
  TempDir dir;
  Trace t = mtp_trace();  // next_n 3, ctx_len[0] = 40
  ASSERT_TRUE(write_trace(t, dir.file("a")).ok());
  auto r = TraceReader::open(dir.file("a"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->visible_entries(0, 0), 38);  // [0, 40 - 3 + 0 + 1)
  EXPECT_EQ(r->visible_entries(0, 2), 40);
  EXPECT_EQ(r->visible_entries(7, 2), 60);
  EXPECT_EQ(r->visible_entries(8, 0), 0);  // out of range
  EXPECT_TRUE(r->q(0, 8).empty());
  EXPECT_TRUE(r->w(3, 0).empty());

  t.meta.compress_ratio = 4;  // V4: token t sees floor((t + 1) / 4) rows
  ASSERT_TRUE(write_trace(t, dir.file("b")).ok());
  auto r4 = TraceReader::open(dir.file("b"));
  ASSERT_TRUE(r4.ok());
  EXPECT_EQ(r4->visible_entries(0, 0), 9);   // token 37 -> 38 / 4
  EXPECT_EQ(r4->visible_entries(0, 2), 10);  // token 39 -> 40 / 4
}

TEST(Trace, AcceptsFloat8DtypeForCodes) {
  // safetensors.torch writes torch.float8_e4m3fn tensors as F8_E4M3: same bytes as U8.
  TempDir dir;
  const Trace t = plain_trace();
  std::vector<st::TensorSpec> specs;
  specs.push_back({"ctx_len", st::Dtype::kI64, {5}, t.ctx_len.data(), 40});
  for (int l = 0; l < 2; ++l) {
    const TraceLayer& L = t.layers[l];
    specs.push_back({"layer." + std::to_string(l) + ".k", st::Dtype::kF8E4M3, {200, 128},
                     L.k.data(), L.k.size()});
    specs.push_back({"layer." + std::to_string(l) + ".k_scale", st::Dtype::kF32, {200},
                     L.k_scale.data(), L.k_scale.size() * 4});
    specs.push_back({"layer." + std::to_string(l) + ".q", st::Dtype::kF8E4M3, {5, 1, 4, 128},
                     L.q.data(), L.q.size()});
    specs.push_back({"layer." + std::to_string(l) + ".w", st::Dtype::kF32, {5, 1, 4}, L.w.data(),
                     L.w.size() * 4});
  }
  std::map<std::string, std::string> md = {
      {"format", "spin-trace"}, {"version", "1"}, {"model", "test-model"},
      {"num_layers", "2"},      {"next_n", "1"},  {"num_heads", "4"},
      {"page_size", "16"},      {"topk", "32"},   {"compress_ratio", "1"}};
  ASSERT_TRUE(st::write_safetensors(dir.file("f8"), specs, md).ok());
  auto r = TraceReader::open(dir.file("f8"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  expect_same(r.value(), t);
}

TEST(Trace, MisalignedTensorsAreReadThroughACopy) {
  // A hand-written file may put an F32 tensor at an odd offset; the reader must still give
  // aligned, correct views.
  const Trace t = make_trace(1, 1, 4, 20, {10, 20}, false, 3);
  const TraceLayer& L = t.layers[0];
  nlohmann::json h;
  h["__metadata__"] = {{"format", "spin-trace"}, {"version", "1"}, {"model", "test-model"},
                       {"num_layers", "1"},      {"next_n", "1"},  {"num_heads", "4"},
                       {"page_size", "16"},      {"topk", "32"},   {"compress_ratio", "1"}};
  std::vector<uint8_t> data;
  auto put = [&](const std::string& name, const char* dtype, std::vector<int64_t> shape,
                 const void* p, size_t n) {
    h[name] = {{"dtype", dtype},
               {"shape", shape},
               {"data_offsets", {data.size(), data.size() + n}}};
    const auto* b = static_cast<const uint8_t*>(p);
    data.insert(data.end(), b, b + n);
  };
  const uint8_t odd[3] = {1, 2, 3};
  put("extra_bytes", "U8", {3}, odd, 3);
  put("ctx_len", "I64", {2}, t.ctx_len.data(), 16);
  put("layer.0.k", "U8", {20, 128}, L.k.data(), L.k.size());
  put("layer.0.k_scale", "F32", {20}, L.k_scale.data(), L.k_scale.size() * 4);
  put("layer.0.q", "U8", {2, 1, 4, 128}, L.q.data(), L.q.size());
  put("layer.0.w", "F32", {2, 1, 4}, L.w.data(), L.w.size() * 4);
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> file(8);
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), data.begin(), data.end());
  // The data starts 8-aligned (vector storage, padded header), so ctx_len at data offset 3 and
  // the F32 tensors after the odd-sized ones are misaligned in `file`.
  auto r = TraceReader::from_memory(file.data(), file.size());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->ctx_len().data()) % 8, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->w(0).data()) % 4, 0u);
  expect_same(r.value(), t);
}

TEST(Trace, DescribeSummarises) {
  TempDir dir;
  ASSERT_TRUE(write_trace(mtp_trace(), dir.file("m.safetensors")).ok());
  auto r = TraceReader::open(dir.file("m.safetensors"));
  ASSERT_TRUE(r.ok());
  const std::string d = describe(r.value());
  for (const char* needle :
       {"model           test-model", "indexer layers  3", "steps           8",
        "rows per step   3 (MTP: 2 draft tokens", "draft keys recorded",
        "heads           64 x 128", "entries         90 per layer",
        "ctx_len         40..60 tokens", "page_size       16 entries", "topk            32",
        "compress_ratio  1", "MiB on disk", "m.safetensors"}) {
    EXPECT_NE(d.find(needle), std::string::npos) << needle << "\n" << d;
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: rewrite the good file's tensors with one change, expect one specific error.

class CorruptTrace : public testing::CorruptFileTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_trace(plain_trace(), dir_.file("plain")).ok());
    ASSERT_TRUE(write_trace(mtp_trace(), dir_.file("mtp")).ok());
    load_good(dir_.file("plain"), dir_.file("mtp"));
  }
};

TEST_F(CorruptTrace, Metadata) {
  Contents c = plain_;
  c.metadata.erase("format");
  expect(c, "not a spin trace: safetensors metadata has no \"format\"");
  c = plain_;
  c.metadata["format"] = "llama-trace";
  expect(c, "metadata format = \"llama-trace\", expected \"spin-trace\"");
  c = plain_;
  c.metadata["version"] = "2";
  expect(c, "trace version \"2\" is not supported (this build reads version 1)");
  c = plain_;
  c.metadata.erase("model");
  expect(c, "metadata has no \"model\"");
  c = plain_;
  c.metadata["topk"] = "2048x";
  expect(c, "metadata topk = \"2048x\", expected a decimal integer");
  c = plain_;
  c.metadata["next_n"] = "0";
  expect(c, "metadata next_n = \"0\"");
  c = plain_;
  c.metadata.erase("num_heads");
  expect(c, "metadata has no \"num_heads\"");
  // Every size a file claims has a documented maximum, checked before it is used.
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"topk", "2147483647", "topk = 2147483647 is above the supported maximum 65536"},
           {"num_layers", "1025", "num_layers = 1025 is above the supported maximum 1024"},
           {"next_n", "17", "next_n = 17 is above the supported maximum 16"},
           {"num_heads", "1025", "num_heads = 1025 is above the supported maximum 1024"},
           {"page_size", "65537", "page_size = 65537 is above the supported maximum 65536"},
           {"compress_ratio", "65", "compress_ratio = 65 is above the supported maximum 64"}}) {
    c = plain_;
    c.metadata[key] = value;
    expect(c, message);
  }
}

TEST_F(CorruptTrace, MissingTensorWrongDtypeWrongShape) {
  Contents c = plain_;
  c.tensors.erase("layer.1.k_scale");
  expect(c, "missing tensor layer.1.k_scale");
  c = plain_;
  c.tensors.erase("ctx_len");
  expect(c, "missing tensor ctx_len");
  c = plain_;
  c.tensors.at("layer.1.w").dtype = st::Dtype::kI32;
  expect(c, "tensor layer.1.w has dtype I32, expected F32");
  c = plain_;
  c.tensors.at("layer.0.k").dtype = st::Dtype::kI8;
  expect(c, "tensor layer.0.k has dtype I8, expected U8 (or F8_E4M3)");
  c = plain_;
  c.tensors.at("layer.0.q").shape = {5, 4, 1, 128};
  expect(c, "tensor layer.0.q has shape [5, 4, 1, 128], expected [5, 1, 4, 128]");
  c = plain_;
  c.tensors.at("layer.0.k").shape = {400, 64};
  expect(c, "tensor layer.0.k has shape [400, 64], expected [any, 128]");
  c = plain_;
  c.tensors.at("layer.0.k_scale").shape = {100, 2};
  expect(c, "tensor layer.0.k_scale has shape [100, 2], expected [200]");
  c = mtp_;
  c.tensors.erase("accepted");
  expect(c, "missing tensor accepted");
}

TEST_F(CorruptTrace, LayerCountMismatch) {
  Contents c = plain_;
  c.metadata["num_layers"] = "1";
  expect(c, "tensor layer.1.k is beyond metadata num_layers = 1 (layers 0..0)");
  c = plain_;
  c.metadata["num_layers"] = "3";
  expect(c, "missing tensor layer.2.k");
  c = plain_;
  c.tensors["layer.0.kscale"] = c.tensors.at("layer.0.k_scale");
  expect(c, "unknown tensor layer.0.kscale");
  c = plain_;
  c.tensors["layer.x.k"] = c.tensors.at("layer.0.k_scale");
  expect(c, "tensor layer.x.k does not follow layer.{l}.{name}");
  c = plain_;
  c.tensors["layer.01.k"] = c.tensors.at("layer.1.k");
  expect(c, "tensor layer.01.k does not follow layer.{l}.{name}");
  // Unrelated extra tensors are allowed.
  c = plain_;
  c.tensors["token_ids"] = c.tensors.at("ctx_len");
  EXPECT_TRUE(open_contents(c, dir_.file("ok")).ok());
}

TEST_F(CorruptTrace, NonFiniteAndNonPositiveValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Contents c = plain_;
  testing::set_element(c, "layer.0.w", 7, nan);  // heads 4: step 1, row 0, head 3
  expect(c, "layer.0.w[step 1, row 0, head 3] = nan, expected a finite weight");
  c = plain_;
  testing::set_element(c, "layer.1.w", 19, -inf);
  expect(c, "layer.1.w[step 4, row 0, head 3] = -inf");
  c = plain_;
  testing::set_element(c, "layer.1.k_scale", 3, 0.0f);
  expect(c, "layer.1.k_scale[3] = 0, expected a finite scale > 0");
  c = plain_;
  testing::set_element(c, "layer.0.k_scale", 199, -1.0f);
  expect(c, "layer.0.k_scale[199] = -1");
  c = plain_;
  testing::set_element(c, "layer.0.k_scale", 0, inf);
  expect(c, "layer.0.k_scale[0] = inf");
  c = plain_;
  testing::set_element<uint8_t>(c, "layer.1.k", 128 * 5 + 9, 0xFF);
  expect(c, "layer.1.k[entry 5, dim 9] holds the e4m3 NaN code 0xff");
  c = plain_;
  testing::set_element<uint8_t>(c, "layer.0.q", 2 * 512 + 3 * 128 + 127, 0x7F);
  expect(c, "layer.0.q[step 2, row 0, head 3, dim 127] holds the e4m3 NaN code 0x7f");
  c = mtp_;
  testing::set_element(c, "layer.2.k_draft_scale", 5, nan);
  expect(c, "layer.2.k_draft_scale[step 2, draft 1] = nan");
  c = mtp_;
  testing::set_element<uint8_t>(c, "layer.0.k_draft", 3 * 128 + 1, 0x7F);
  expect(c, "layer.0.k_draft[step 1, draft 1, dim 1] holds the e4m3 NaN code");
  // Negative weights are legal (head gates).
  c = plain_;
  testing::set_element(c, "layer.0.w", 0, -3.0f);
  EXPECT_TRUE(open_contents(c, dir_.file("ok")).ok());
}

TEST_F(CorruptTrace, CtxLenAndAccepted) {
  Contents c = plain_;
  testing::set_element<int64_t>(c, "ctx_len", 2, 160);
  expect(c, "ctx_len is not strictly increasing: ctx_len[2] = 160 after ctx_len[1] = 160");
  c = plain_;
  testing::set_element<int64_t>(c, "ctx_len", 3, 100);
  expect(c, "ctx_len[3] = 100 after ctx_len[2] = 170");
  c = plain_;
  testing::set_element<int64_t>(c, "ctx_len", 0, 0);
  expect(c, "ctx_len[0] = 0 is below next_n = 1");
  c = mtp_;
  testing::set_element<int64_t>(c, "ctx_len", 0, -5);
  expect(c, "ctx_len[0] = -5 is below next_n = 3");
  c = plain_;
  testing::set_element<int64_t>(c, "ctx_len", 4, 201);
  expect(c, "the last step (ctx_len 201 tokens, compress_ratio 1) sees 201 entries but "
            "layer.0.k holds only 200");
  c = mtp_;
  testing::set_element<int32_t>(c, "accepted", 4, 3);
  expect(c, "accepted[4] = 3, expected 0..2");
  c = mtp_;
  testing::set_element<int32_t>(c, "accepted", 0, -1);
  expect(c, "accepted[0] = -1");
  c = plain_;
  c.tensors["ctx_len"].shape = {0};
  c.tensors["ctx_len"].bytes.clear();
  expect(c, "ctx_len is empty");
}

TEST_F(CorruptTrace, DraftKeys) {
  Contents c = mtp_;
  c.tensors.erase("layer.1.k_draft");
  c.tensors.erase("layer.1.k_draft_scale");
  expect(c, "draft keys must be given for every layer or none: layer.0.k_draft is present but "
            "layer.1.k_draft is missing");
  c = mtp_;
  c.tensors.erase("layer.2.k_draft_scale");
  expect(c, "missing tensor layer.2.k_draft_scale");
  c = mtp_;
  c.tensors.erase("layer.0.k_draft");
  c.tensors.erase("layer.1.k_draft");
  c.tensors.erase("layer.2.k_draft");
  expect(c, "tensor layer.0.k_draft_scale is present without layer.0.k_draft");
  c = mtp_;
  c.tensors.at("layer.0.k_draft").shape = {8, 3, 128};
  c.tensors.at("layer.0.k_draft").bytes.resize(8 * 3 * 128);
  expect(c, "tensor layer.0.k_draft has shape [8, 3, 128], expected [8, 2, 128]");
}

// Truncation at many offsets and scrambled header bytes: always an error or a valid trace,
// never a crash (ASan/UBSan builds check the "never").
TEST_F(CorruptTrace, TruncatedAnywhere) {
  const auto bytes = read_bytes(dir_.file("plain"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  int tried = 0;
  for (size_t n = 0; n < bytes.size(); n += (n < 8 + header_len + 64 ? 1 : 61)) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    auto r = TraceReader::from_memory(cut.data(), cut.size());
    ASSERT_FALSE(r.ok()) << "truncated at " << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    if (n < 8) {
      EXPECT_NE(r.status().message().find("file is " + std::to_string(n) + " bytes"),
                std::string::npos);
    } else if (n < 8 + header_len) {
      EXPECT_NE(r.status().message().find("header length field says"), std::string::npos);
    } else {
      EXPECT_NE(r.status().message().find("data bytes of the file (truncated?)"),
                std::string::npos)
          << r.status().message();
    }
    ++tried;
  }
  EXPECT_GT(tried, 1000);
  // The same through a real file.
  write_bytes(dir_.file("cut"), std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
  auto r = TraceReader::open(dir_.file("cut"));
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
}

TEST_F(CorruptTrace, ScrambledHeaderBytesNeverCrash) {
  const auto bytes = read_bytes(dir_.file("mtp"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  std::mt19937 rng(7);
  int rejected = 0, total = 0;
  const uint8_t specials[] = {'0', '9', '-', '"', '[', ']', '{', '}', ',', ':', 0, 0xFF};
  auto b = bytes;  // mutated in place, one byte at a time, and restored
  for (size_t i = 0; i < 8 + header_len; ++i) {
    for (int v = 0; v < 3; ++v) {
      b[i] = v == 0 ? static_cast<uint8_t>(bytes[i] ^ 0xFF)
                    : (v == 1 ? specials[rng() % sizeof specials] : static_cast<uint8_t>(rng()));
      auto r = TraceReader::from_memory(b.data(), b.size());
      b[i] = bytes[i];
      ++total;
      if (!r.ok()) {
        ++rejected;
        EXPECT_FALSE(r.status().message().empty());
        continue;
      }
      // Whatever was accepted must be fully usable.
      (void)describe(r.value());
      for (int l = 0; l < r->num_layers(); ++l) {
        for (int64_t s = 0; s < r->steps(); ++s) {
          EXPECT_EQ(r->w(l, s).size(), size_t(r->meta().next_n) * r->meta().num_heads);
        }
      }
    }
  }
  // Most flips break the JSON, a name, a number or a shape; a few hit the model string or padding.
  EXPECT_GT(rejected, total * 3 / 4) << rejected << " of " << total;
}

// ---------------------------------------------------------------------------------------------
// Atomic writes

TEST(TraceWrite, NoTempFileAndNoClobberOnFailure) {
  TempDir dir;
  const Trace good = plain_trace();
  const std::string path = dir.file("trace.safetensors");
  ASSERT_TRUE(write_trace(good, path).ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trace.safetensors"});
  const auto before = read_bytes(path);

  // An invalid trace is refused before anything is written.
  Trace bad = good;
  bad.layers[1].w[3] = std::numeric_limits<float>::quiet_NaN();
  const Status s = write_trace(bad, path);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer.1.w[step 0, row 0, head 3] = nan"), std::string::npos)
      << s.message();
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trace.safetensors"});

  // A directory that does not exist: an I/O error, nothing created.
  const Status s2 = write_trace(good, dir.file("no/such/dir/t.safetensors"));
  EXPECT_EQ(s2.code(), StatusCode::kIoError);
  EXPECT_NE(s2.message().find("cannot create a temporary file"), std::string::npos)
      << s2.message();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trace.safetensors"});

  // The target is a directory: refused before a temporary file exists, the directory untouched.
  fs::create_directories(dir.file("taken/x"));
  const Status s3 = write_trace(good, dir.file("taken"));
  EXPECT_EQ(s3.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s3.message().find("is a directory: refusing to replace it"), std::string::npos) << s3.message();
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"taken", "trace.safetensors"}));
  EXPECT_TRUE(fs::is_directory(dir.file("taken/x")));

  // Overwriting with another good trace replaces the file whole.
  const Trace other = mtp_trace();
  ASSERT_TRUE(write_trace(other, path).ok());
  auto r = TraceReader::open(path);
  ASSERT_TRUE(r.ok());
  expect_same(r.value(), other);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"taken", "trace.safetensors"}));
}

TEST(TraceWrite, ValidateTraceChecksSizes) {
  Trace t = plain_trace();
  EXPECT_TRUE(validate_trace(t).ok());
  t.layers[0].q.pop_back();
  EXPECT_NE(validate_trace(t).message().find("layer.0.q has 2559 bytes"), std::string::npos)
      << validate_trace(t).message();
  t = plain_trace();
  t.layers.pop_back();
  EXPECT_NE(validate_trace(t).message().find("1 layers but meta.num_layers = 2"),
            std::string::npos);
  t = mtp_trace();
  t.accepted.clear();
  EXPECT_NE(validate_trace(t).message().find("accepted has 0 values"), std::string::npos);
  t = mtp_trace();
  t.layers[1].k_draft.clear();
  t.layers[1].k_draft_scale.clear();
  EXPECT_NE(validate_trace(t).message().find("every layer or none"), std::string::npos);
  t = plain_trace();
  t.ctx_len = {150, 150, 170, 185, 200};
  EXPECT_NE(validate_trace(t).message().find("not strictly increasing"), std::string::npos);
  t = plain_trace();
  t.meta.page_size = 0;
  EXPECT_NE(validate_trace(t).message().find("page_size = 0"), std::string::npos);
}

// Weights that could overflow an fp32 score — or the head sum before its key scale multiplies
// it (the fuzzer found w = 2e38 with k_scale = 1e-21) — are refused, naming the row.
TEST(TraceWrite, WeightsThatCouldOverflowScoresAreRefused) {
  Trace t = plain_trace();
  t.layers[1].w[4 * 3 + 2] = 1e38f;  // step 3, row 0, head 2
  EXPECT_NE(validate_trace(t).message().find("layer.1.w [step 3, row 0]: head weights with"), std::string::npos)
      << validate_trace(t).message();
  t = plain_trace();
  for (float& s : t.layers[0].k_scale) s = 1e-21f;
  t.layers[0].w[0] = 2e38f;
  EXPECT_NE(validate_trace(t).message().find("can overflow fp32 scores"), std::string::npos);
  t = plain_trace();
  t.layers[0].w[0] = 1e30f;  // Σ|w|·128·448² ≈ 2.6e37: every score stays finite
  EXPECT_TRUE(validate_trace(t).ok()) << validate_trace(t).message();
}

// ---------------------------------------------------------------------------------------------
// The Python recorder example writes files this reader accepts.

TEST(TraceExample, PythonRecorderOutputIsAccepted) {
  // The first python3 on PATH may be a private one without numpy; Debian's python3-numpy (which
  // scripts/install-deps.sh installs) lives under /usr/bin/python3.
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (std::system((std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy; skipping examples/record_trace.py";
  const fs::path script = fs::path(__FILE__).parent_path().parent_path() / "examples" /
                          "record_trace.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  TempDir dir;
  for (const char* mode : {"", " --next-n 3"}) {
    const std::string out = dir.file("py.safetensors");
    const std::string cmd = python + " '" + script.string() + "' '" + out + "'" + mode;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto r = TraceReader::open(out);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GE(r->steps(), 1);
    EXPECT_EQ(r->meta().num_heads, 64);
    if (std::string(mode).empty()) {
      EXPECT_EQ(r->meta().next_n, 1);
    } else {
      EXPECT_EQ(r->meta().next_n, 3);
      EXPECT_EQ(r->accepted().size(), size_t(r->steps()));
      EXPECT_TRUE(r->has_draft_keys());
    }
    EXPECT_FALSE(describe(r.value()).empty());
  }
}

}  // namespace
}  // namespace spin
