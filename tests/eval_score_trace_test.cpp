// Score traces (kind=scores, spin/trace.h): bit-exact round trips (F32 written, F16 and BF16 read),
// and every corrupt file gives one clear error naming the tensor or field; columns beyond a row's
// visible prefix are ignored whatever they hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>

#include "trace/safetensors.h"
#include "spin/numerics.h"
#include "spin/trace.h"
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

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A score trace whose values are small multiples of 1/8 (exact in F16 and BF16), with -inf inside
// the visible prefix and NaN / +inf padding beyond it (which the reader must ignore).
ScoreTrace make_scores(int layers, int next_n, int64_t entries, std::vector<int64_t> ctx) {
  ScoreTrace t;
  t.meta.kind = TraceKind::kScores;
  t.meta.model = "unit-test";
  t.meta.num_layers = layers;
  t.meta.next_n = next_n;
  t.meta.page_size = 16;
  t.meta.topk = 32;
  t.ctx_len = std::move(ctx);
  if (next_n > 1) {
    for (size_t s = 0; s < t.ctx_len.size(); ++s) t.accepted.push_back(static_cast<int32_t>(s % next_n));
  }
  std::mt19937 rng(11);
  for (int l = 0; l < layers; ++l) {
    t.entries.push_back(entries);
    std::vector<float>& v = t.scores.emplace_back();
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < next_n; ++j) {
        const int64_t visible = visible_entries(t.ctx_len[s], next_n, j, 1);
        for (int64_t e = 0; e < entries; ++e) {
          float x = static_cast<float>(static_cast<int>(rng() % 512) - 256) / 8.0f;
          if (e < visible && e % 37 == 5) x = -kInf;        // scored, lowest
          if (e >= visible) x = (e % 2) ? kNaN : kInf;       // padding: ignored
          v.push_back(x);
        }
      }
    }
  }
  return t;
}

ScoreTrace plain_scores() { return make_scores(2, 1, 120, {90, 100, 101, 110, 120}); }
ScoreTrace mtp_scores() { return make_scores(1, 3, 70, {40, 42, 45, 47, 50, 60}); }

void expect_same(const TraceReader& r, const ScoreTrace& t) {
  ASSERT_EQ(r.kind(), TraceKind::kScores);
  EXPECT_EQ(r.meta().model, t.meta.model);
  EXPECT_EQ(r.num_layers(), t.meta.num_layers);
  EXPECT_EQ(r.meta().next_n, t.meta.next_n);
  EXPECT_EQ(r.steps(), t.steps());
  EXPECT_TRUE(std::equal(r.ctx_len().begin(), r.ctx_len().end(), t.ctx_len.begin(), t.ctx_len.end()));
  EXPECT_TRUE(std::equal(r.accepted().begin(), r.accepted().end(), t.accepted.begin(), t.accepted.end()));
  for (int l = 0; l < t.meta.num_layers; ++l) {
    EXPECT_EQ(r.entries(l), t.entries[l]);
    ASSERT_EQ(r.scores(l).size(), t.scores[l].size());
    EXPECT_EQ(0, std::memcmp(r.scores(l).data(), t.scores[l].data(), t.scores[l].size() * 4)) << "layer " << l;
    // Key views are empty on a score trace.
    EXPECT_TRUE(r.k(l).empty());
    EXPECT_TRUE(r.q(l, 0, 0).empty());
  }
  EXPECT_EQ(r.scores(0, 1, 0).size(), size_t(t.entries[0]));
  EXPECT_EQ(r.scores(0, 1, 0).data(), r.scores(0).data() + t.meta.next_n * t.entries[0]);
}

TEST(ScoreTrace, RoundTripIsBitExact) {
  TempDir dir;
  for (const ScoreTrace& t : {plain_scores(), mtp_scores()}) {
    const std::string path = dir.file("s.safetensors");
    ASSERT_TRUE(write_score_trace(t, path).ok());
    auto r = TraceReader::open(path);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_same(r.value(), t);
    EXPECT_EQ(r->meta().extra.count("kind"), 0u);  // kind is a field, not an extra
    // Copy out, write again: the same bytes.
    auto back = read_score_trace(path);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    const std::string path2 = dir.file("s2.safetensors");
    ASSERT_TRUE(write_score_trace(back.value(), path2).ok());
    EXPECT_EQ(read_bytes(path), read_bytes(path2));
    // The other kind's reader refuses in one line naming the kind.
    auto as_keys = read_trace(path);
    ASSERT_FALSE(as_keys.ok());
    EXPECT_NE(as_keys.status().message().find("kind=scores"), std::string::npos);
    // describe names the kind.
    EXPECT_NE(describe(r.value()).find("scores (the indexer's output"), std::string::npos);
  }
}

// F16 and BF16 scores are widened exactly at open; non-finite padding stays ignored.
TEST(ScoreTrace, ReadsF16AndBf16) {
  TempDir dir;
  const ScoreTrace t = mtp_scores();
  for (st::Dtype dtype : {st::Dtype::kF16, st::Dtype::kBF16}) {
    std::vector<uint16_t> half(t.scores[0].size());
    for (size_t i = 0; i < half.size(); ++i) {
      const float x = t.scores[0][i];
      uint16_t h = 0;
      if (dtype == st::Dtype::kBF16) {
        h = bf16_from_float(x);
      } else if (std::isnan(x)) {
        h = 0x7E00;
      } else if (std::isinf(x)) {
        h = x > 0 ? 0x7C00 : 0xFC00;
      } else {  // multiples of 1/8 in [-32, 32): exact in F16
        const float a = std::fabs(x);
        int exp = 0;
        const float m = std::frexp(a, &exp);  // a = m · 2^exp, m in [0.5, 1)
        h = a == 0 ? 0 : static_cast<uint16_t>(((exp - 1 + 15) << 10) | static_cast<uint16_t>((m * 2 - 1) * 1024));
        if (x < 0) h |= 0x8000;
      }
      half[i] = h;
    }
    std::vector<st::TensorSpec> specs = {
        {"ctx_len", st::Dtype::kI64, {t.steps()}, t.ctx_len.data(), t.ctx_len.size() * 8},
        {"accepted", st::Dtype::kI32, {t.steps()}, t.accepted.data(), t.accepted.size() * 4},
        {"layer.0.scores", dtype, {t.steps(), 3, t.entries[0]}, half.data(), half.size() * 2}};
    const std::map<std::string, std::string> md = {{"format", "spin-trace"}, {"version", "1"}, {"kind", "scores"},
                                                   {"model", "unit-test"},   {"num_layers", "1"}, {"next_n", "3"},
                                                   {"page_size", "16"},      {"topk", "32"},     {"compress_ratio", "1"}};
    const std::string path = dir.file("h.safetensors");
    ASSERT_TRUE(st::write_safetensors(path, specs, md).ok());
    auto r = TraceReader::open(path);
    ASSERT_TRUE(r.ok()) << st::dtype_name(dtype) << ": " << r.status().to_string();
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < 3; ++j) {
        const int64_t visible = r->visible_entries(s, j);
        const auto row = r->scores(0, s, j);
        for (int64_t e = 0; e < visible; ++e) {
          ASSERT_EQ(row[e], t.row(0, s, j)[e]) << st::dtype_name(dtype) << " step " << s << " row " << j << " entry " << e;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: the good file's tensors with one change, one specific error.

class CorruptScoreTrace : public testing::CorruptFileTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_score_trace(plain_scores(), dir_.file("plain")).ok());
    ASSERT_TRUE(write_score_trace(mtp_scores(), dir_.file("mtp")).ok());
    load_good(dir_.file("plain"), dir_.file("mtp"));
  }
};

TEST_F(CorruptScoreTrace, WrongDtypeAndShape) {
  Contents c = plain_;
  c.tensors["layer.0.scores"].dtype = st::Dtype::kI32;
  expect(c, "tensor layer.0.scores has dtype I32, expected F32 (or F16, BF16)");
  c = plain_;
  c.tensors["layer.1.scores"].shape = {5, 2, 60};
  expect(c, "tensor layer.1.scores has shape [5, 2, 60], expected [5, 1, any]");
  c = plain_;
  c.tensors["layer.1.scores"].shape = {600};
  expect(c, "tensor layer.1.scores has shape [600]");
  c = plain_;
  c.tensors.erase("layer.1.scores");
  expect(c, "missing tensor layer.1.scores");
  c = plain_;
  c.tensors["layer.2.scores"] = c.tensors["layer.0.scores"];
  expect(c, "tensor layer.2.scores is beyond metadata num_layers = 2");
  c = plain_;
  c.tensors["layer.0.k"] = {st::Dtype::kU8, {120, 128}, std::vector<uint8_t>(120 * 128)};
  expect(c, "unknown tensor layer.0.k");
}

TEST_F(CorruptScoreTrace, EntriesBelowTheVisiblePrefix) {
  Contents c = plain_;
  for (const char* name : {"layer.0.scores", "layer.1.scores"}) {
    testing::OwnedTensor& t = c.tensors[name];
    t.shape = {5, 1, 119};  // the last step sees 120
    t.bytes.resize(5 * 119 * 4);
  }
  expect(c, "layer.0.scores has only 119 columns (entries < the visible prefix)");
}

TEST_F(CorruptScoreTrace, NanOrPlusInfInsideTheVisiblePrefix) {
  Contents c = plain_;
  testing::set_element(c, "layer.1.scores", 120 * 2 + 7, kNaN);  // step 2, row 0, entry 7 (sees 101)
  expect(c, "layer.1.scores[step 2, row 0, entry 7] = nan inside the row's 101 visible entries");
  c = plain_;
  testing::set_element(c, "layer.0.scores", 100, kInf);  // step 0, entry 89 = the last visible one is 89
  testing::set_element(c, "layer.0.scores", 89, kInf);
  expect(c, "layer.0.scores[step 0, row 0, entry 89] = inf");
  // -inf inside and NaN just past the prefix are fine.
  c = plain_;
  testing::set_element(c, "layer.0.scores", 3, -kInf);
  testing::set_element(c, "layer.0.scores", 90, kNaN);
  EXPECT_TRUE(open_contents(c, dir_.file("ok")).ok());
}

TEST_F(CorruptScoreTrace, AcceptedAndCtxLen) {
  Contents c = mtp_;
  c.tensors.erase("accepted");
  expect(c, "missing tensor accepted (I32 [steps], required since next_n = 3 > 1)");
  c = mtp_;
  testing::set_element<int32_t>(c, "accepted", 2, 3);
  expect(c, "accepted[2] = 3, expected 0..2");
  c = mtp_;
  testing::set_element<int32_t>(c, "accepted", 0, -1);
  expect(c, "accepted[0] = -1");
  c = mtp_;
  c.tensors["accepted"].dtype = st::Dtype::kI64;
  c.tensors["accepted"].shape = {3};
  expect(c, "tensor accepted has dtype I64, expected I32");
  c = plain_;
  testing::set_element<int64_t>(c, "ctx_len", 2, 100);
  expect(c, "ctx_len is not strictly increasing: ctx_len[2] = 100 after ctx_len[1] = 100");
  c = mtp_;
  testing::set_element<int64_t>(c, "ctx_len", 0, 2);
  expect(c, "ctx_len[0] = 2 is below next_n = 3");
  c = plain_;
  c.tensors["ctx_len"].dtype = st::Dtype::kI32;
  c.tensors["ctx_len"].shape = {10};
  expect(c, "tensor ctx_len has dtype I32, expected I64");
}

TEST_F(CorruptScoreTrace, Metadata) {
  Contents c = plain_;
  c.metadata["kind"] = "logits";
  expect(c, "metadata kind = \"logits\", expected \"keys\" (indexer inputs) or \"scores\"");
  c = plain_;
  c.metadata.erase("topk");
  expect(c, "metadata has no \"topk\"");
  c = plain_;
  c.metadata["next_n"] = "0";
  expect(c, "metadata next_n = \"0\"");
  // num_heads is optional on a score trace, and kept when given.
  c = plain_;
  c.metadata["num_heads"] = "8";
  EXPECT_TRUE(open_contents(c, dir_.file("ok")).ok());
  // Without kind, the same tensors are read as a key trace, which has no layer.{l}.k.
  c = plain_;
  c.metadata.erase("kind");
  const Status s = open_contents(c, dir_.file("bad"));
  EXPECT_FALSE(s.ok());
}

TEST_F(CorruptScoreTrace, TruncatedAnywhere) {
  const auto bytes = read_bytes(dir_.file("mtp"));
  for (size_t n = 0; n < bytes.size(); n += 7) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(n));
    auto r = TraceReader::from_memory(cut.data(), cut.size());
    ASSERT_FALSE(r.ok()) << "truncated at " << n;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().to_string();
    EXPECT_FALSE(r.status().message().empty());
  }
  std::ofstream(dir_.file("cut"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                          static_cast<std::streamsize>(bytes.size() - 1));
  auto r = TraceReader::open(dir_.file("cut"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
}

TEST(ScoreTraceWrite, ValidateChecksSizesAndValues) {
  ScoreTrace t = plain_scores();
  EXPECT_TRUE(validate_score_trace(t).ok());
  t.scores[1].pop_back();
  EXPECT_EQ(validate_score_trace(t).code(), StatusCode::kInvalidArgument);
  t = mtp_scores();
  t.accepted.clear();
  EXPECT_EQ(validate_score_trace(t).code(), StatusCode::kInvalidArgument);
  t = plain_scores();
  t.scores[0][3] = kNaN;
  const Status s = validate_score_trace(t);
  EXPECT_NE(s.message().find("layer.0.scores[step 0, row 0, entry 3]"), std::string::npos) << s.message();
  // Nothing is written for an invalid trace.
  TempDir dir;
  EXPECT_FALSE(write_score_trace(t, dir.file("x")).ok());
  EXPECT_TRUE(dir.entries().empty());
}

// ---------------------------------------------------------------------------------------------
// The block probe (layer.{l}.probe): round trips, F16, and one clear error per corruption.

// `t` with a probe of `pbe` entries per block (0 = page_size): multiples of 1/8, -inf in block 1,
// NaN / +inf padding past each row's visible blocks (ignored).
ScoreTrace with_probe(ScoreTrace t, int32_t pbe) {
  t.probe_block_entries = pbe;
  std::mt19937 rng(5);
  for (int l = 0; l < t.meta.num_layers; ++l) {
    std::vector<float>& v = t.probe.emplace_back();
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < t.meta.next_n; ++j) {
        const int64_t seen = (visible_entries(t.ctx_len[s], t.meta.next_n, j, 1) + t.probe_entries() - 1) /
                             t.probe_entries();
        for (int64_t b = 0; b < t.probe_blocks(l); ++b) {
          float x = static_cast<float>(static_cast<int>(rng() % 256) - 128) / 8.0f;
          if (b == 1) x = -kInf;
          if (b >= seen) x = (b % 2) ? kNaN : kInf;
          v.push_back(x);
        }
      }
    }
  }
  return t;
}

TEST(ScoreTraceProbe, RoundTripIsBitExactAndDescribed) {
  TempDir dir;
  for (const ScoreTrace& t : {with_probe(plain_scores(), 0), with_probe(mtp_scores(), 8)}) {
    const std::string path = dir.file("p.safetensors");
    ASSERT_TRUE(write_score_trace(t, path).ok());
    auto r = TraceReader::open(path);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_same(r.value(), t);
    ASSERT_TRUE(r->has_probe());
    EXPECT_EQ(r->probe_block_entries(), t.probe_entries());
    EXPECT_EQ(r->meta().extra.count("probe_block_entries"), 0u);  // a field, not an extra
    for (int l = 0; l < t.meta.num_layers; ++l) {
      EXPECT_EQ(r->probe_blocks(l), t.probe_blocks(l));
      ASSERT_EQ(r->probe(l).size(), t.probe[l].size());
      EXPECT_EQ(0, std::memcmp(r->probe(l).data(), t.probe[l].data(), t.probe[l].size() * 4));
    }
    EXPECT_EQ(r->probe(0, 1, 0).data(), r->probe(0).data() + t.meta.next_n * t.probe_blocks(0));
    EXPECT_NE(describe(r.value()).find("recorded, " + std::to_string(t.probe_entries()) + " entries per pooled key"),
              std::string::npos);
    auto back = read_score_trace(path);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->probe_block_entries, t.probe_entries());  // written explicitly
    const std::string path2 = dir.file("p2.safetensors");
    ASSERT_TRUE(write_score_trace(back.value(), path2).ok());
    EXPECT_EQ(read_bytes(path), read_bytes(path2));
  }
  // Without a probe: none reported, and the same bytes as before the format had one.
  ASSERT_TRUE(write_score_trace(plain_scores(), dir.file("n")).ok());
  auto r = TraceReader::open(dir.file("n"));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_probe());
  EXPECT_EQ(r->probe_block_entries(), 0);
  EXPECT_TRUE(r->probe(0).empty());
  EXPECT_NE(describe(r.value()).find("block probe     not recorded"), std::string::npos) << describe(r.value());
}

TEST(ScoreTraceProbe, ReadsBf16) {
  TempDir dir;
  const ScoreTrace t = with_probe(mtp_scores(), 8);
  ASSERT_TRUE(write_score_trace(t, dir.file("p")).ok());
  Contents c = load_contents(dir.file("p"));
  testing::OwnedTensor& probe = c.tensors["layer.0.probe"];
  std::vector<uint8_t> half;
  for (float x : t.probe[0]) {
    const uint16_t h = bf16_from_float(x);  // multiples of 1/8 in [-16, 16): exact
    half.push_back(static_cast<uint8_t>(h & 0xFF));
    half.push_back(static_cast<uint8_t>(h >> 8));
  }
  probe = {st::Dtype::kBF16, probe.shape, half};
  ASSERT_TRUE(open_contents(c, dir.file("h")).ok());
  auto r = TraceReader::open(dir.file("h"));
  ASSERT_TRUE(r.ok());
  for (int64_t s = 0; s < t.steps(); ++s) {
    for (int j = 0; j < 3; ++j) {
      const int64_t seen = (r->visible_entries(s, j) + 7) / 8;
      for (int64_t b = 0; b < seen; ++b) ASSERT_EQ(r->probe(0, s, j)[b], t.probe_row(0, s, j)[b]) << s << " " << j << " " << b;
    }
  }
}

class CorruptProbe : public CorruptScoreTrace {
 protected:
  void SetUp() override {
    CorruptScoreTrace::SetUp();
    ASSERT_TRUE(write_score_trace(with_probe(plain_scores(), 0), dir_.file("probe")).ok());
    probe_ = load_contents(dir_.file("probe"));
    ASSERT_TRUE(open_contents(probe_, dir_.file("check")).ok());
  }
  Contents probe_;
};

TEST_F(CorruptProbe, DtypeShapeAndLayers) {
  Contents c = probe_;
  c.tensors["layer.1.probe"].dtype = st::Dtype::kI32;
  expect(c, "tensor layer.1.probe has dtype I32, expected F32 (or F16, BF16)");
  c = probe_;
  c.tensors["layer.0.probe"].shape = {5, 1, 7};  // 120 entries / 16 = 8 blocks
  c.tensors["layer.0.probe"].bytes.resize(5 * 7 * 4);
  expect(c, "tensor layer.0.probe has shape [5, 1, 7], expected [5, 1, 8] (steps, next_n, ceil(entries / "
            "probe_block_entries) blocks)");
  c = probe_;
  c.tensors.erase("layer.1.probe");
  expect(c, "a probe must be given for every layer or none: layer.0.probe is present but layer.1.probe is missing");
  c = probe_;
  c.tensors.erase("layer.0.probe");
  expect(c, "a probe must be given for every layer or none: layer.1.probe is present but layer.0.probe is missing");
  c = probe_;
  c.tensors["layer.2.probe"] = c.tensors["layer.0.probe"];
  expect(c, "tensor layer.2.probe is beyond metadata num_layers = 2");
}

TEST_F(CorruptProbe, Metadata) {
  Contents c = probe_;
  c.metadata["probe_block_entries"] = "0";
  expect(c, "metadata probe_block_entries = \"0\", expected a decimal integer");
  c = probe_;
  c.metadata["probe_block_entries"] = "2000000";
  expect(c, "metadata probe_block_entries = 2000000, expected an integer in 1..1048576");
  c = probe_;
  c.metadata["probe_block_entries"] = "32";  // 4 blocks, but the tensors hold 8
  expect(c, "tensor layer.0.probe has shape [5, 1, 8], expected [5, 1, 4]");
  c = plain_;
  c.metadata["probe_block_entries"] = "16";
  expect(c, "metadata probe_block_entries is set but there is no tensor layer.0.probe");
  // Absent metadata: page_size.
  c = probe_;
  c.metadata.erase("probe_block_entries");
  ASSERT_TRUE(open_contents(c, dir_.file("ok")).ok());
  EXPECT_EQ(TraceReader::open(dir_.file("ok"))->probe_block_entries(), 16);
}

TEST_F(CorruptProbe, NanOrPlusInfInsideTheVisibleBlocks) {
  Contents c = probe_;
  testing::set_element(c, "layer.1.probe", 8 * 2 + 4, kNaN);  // step 2, row 0, block 4 (sees 101 entries = 7 blocks)
  expect(c, "layer.1.probe[step 2, row 0, block 4] = nan inside the row's 7 visible blocks");
  c = probe_;
  testing::set_element(c, "layer.0.probe", 5, kInf);  // step 0 sees 90 entries = 6 blocks: block 5 is the last
  expect(c, "layer.0.probe[step 0, row 0, block 5] = inf");
  // -inf and FLT_MAX inside, NaN just past the visible blocks: fine.
  c = probe_;
  testing::set_element(c, "layer.0.probe", 0, -kInf);
  testing::set_element(c, "layer.0.probe", 4, std::numeric_limits<float>::max());
  testing::set_element(c, "layer.0.probe", 6, kNaN);
  EXPECT_TRUE(open_contents(c, dir_.file("ok")).ok());
}

TEST(ScoreTraceProbeWrite, ValidateChecksSizesAndValues) {
  ScoreTrace t = with_probe(plain_scores(), 0);
  EXPECT_TRUE(validate_score_trace(t).ok());
  t.probe[1].pop_back();
  Status s = validate_score_trace(t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer.1.probe has 39 values, expected steps 5 x next_n 1 x blocks 8"), std::string::npos)
      << s.message();
  t = with_probe(plain_scores(), 0);
  t.probe.pop_back();
  EXPECT_NE(validate_score_trace(t).message().find("1 probe layers but 2 score layers"), std::string::npos);
  t = plain_scores();
  t.probe_block_entries = 16;
  EXPECT_NE(validate_score_trace(t).message().find("probe_block_entries = 16 but there is no probe"),
            std::string::npos);
  t = with_probe(plain_scores(), -3);
  EXPECT_NE(validate_score_trace(t).message().find("probe_block_entries = -3"), std::string::npos);
  t = with_probe(plain_scores(), 0);
  t.probe[0][2] = kNaN;  // step 0, row 0, block 2
  s = validate_score_trace(t);
  EXPECT_NE(s.message().find("layer.0.probe[step 0, row 0, block 2] = nan"), std::string::npos) << s.message();
  TempDir dir;
  EXPECT_FALSE(write_score_trace(t, dir.file("x")).ok());
  EXPECT_TRUE(dir.entries().empty());
}

// ---------------------------------------------------------------------------------------------
// The Python score-trace example writes files this reader accepts (F32 and F16, plain and MTP).

TEST(ScoreTraceExample, PythonRecorderOutputIsAccepted) {
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (std::system((std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy; skipping examples/record_score_trace.py";
  const fs::path script = fs::path(__FILE__).parent_path().parent_path() / "examples" / "record_score_trace.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  TempDir dir;
  for (const char* mode : {"", " --next-n 3", " --f16"}) {
    const std::string out = dir.file("py.safetensors");
    const std::string cmd = python + " '" + script.string() + "' '" + out + "'" + mode + " >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto r = TraceReader::open(out);
    ASSERT_TRUE(r.ok()) << mode << ": " << r.status().to_string();
    EXPECT_EQ(r->kind(), TraceKind::kScores);
    EXPECT_EQ(r->meta().next_n, std::string(mode) == " --next-n 3" ? 3 : 1);
    // The tool output appended mid-way is a ctx_len jump.
    const auto ctx = r->ctx_len();
    bool jump = false;
    for (size_t s = 1; s < ctx.size(); ++s) jump |= ctx[s] - ctx[s - 1] > r->meta().next_n;
    EXPECT_TRUE(jump);
  }
}

}  // namespace
}  // namespace spin
