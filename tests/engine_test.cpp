// Decode engine: a batched step equals each request run alone through the scalar reference
// kernels; continuous batching; pool exhaustion; memory refusal; determinism across threads;
// replayed indexer inputs (keys, queries, contexts and acceptance of a trace).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "spin/lab/engine.h"

namespace spin {
namespace {

// A small model with the real structure (64 indexer heads, MLA 576/512) and hostile geometry.
ModelPreset tiny_model(int32_t compress_ratio = 1) {
  ModelPreset m;
  m.name = "tiny";
  m.model_layers = 4;
  m.indexer_layers = 3;
  m.index_heads = 64;
  m.topk = 37;
  m.page_size = 5;
  m.compress_ratio = compress_ratio;
  m.attn_heads = 8;
  m.window = compress_ratio > 1 ? 6 : 0;
  return m;
}

EngineConfig tiny_config(const std::string& predictor, int32_t next_n = 1, int32_t compress_ratio = 1) {
  EngineConfig c;
  c.model = tiny_model(compress_ratio);
  c.layers = 2;
  c.next_n = next_n;
  c.predictor = predictor;
  c.predictor_config.target_sparsity = 0.4;
  c.predictor_config.local_blocks = 1;
  c.seed = 7;
  return c;
}

std::unique_ptr<DecodeEngine> make(const EngineConfig& c, int32_t requests, int64_t max_tokens = 600) {
  auto e = DecodeEngine::create(c, requests, max_tokens);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

// Relative L2 distance of two outputs.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    n += double{b[i]} * b[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

TEST(Engine, BatchedStepEqualsEachRequestAloneOnReferenceKernels) {
  for (const char* predictor : {"all-keep", "spin"}) {
    for (int32_t next_n : {1, 3}) {
      for (int32_t ratio : {1, 4}) {
        SCOPED_TRACE(std::string(predictor) + " next_n " + std::to_string(next_n) + " ratio " + std::to_string(ratio));
        const EngineConfig c = tiny_config(predictor, next_n, ratio);
        const std::vector<int64_t> prompts = {230, 7 * ratio, 151};  // ragged, one shorter than top-k
        auto batched = make(c, 3);
        for (int32_t b = 0; b < 3; ++b) ASSERT_TRUE(batched->add_request(100 + b, prompts[b]).ok());
        StepStats st;
        for (int s = 0; s < 3; ++s) ASSERT_TRUE(batched->step(&st).ok());
        for (int32_t b = 0; b < 3; ++b) {
          EngineConfig rc = c;
          rc.kernels = EngineKernels::reference();
          auto alone = make(rc, 1);
          ASSERT_TRUE(alone->add_request(100 + b, prompts[b]).ok());
          for (int s = 0; s < 3; ++s) ASSERT_TRUE(alone->step(&st).ok());
          EXPECT_EQ(alone->tokens(100 + b), batched->tokens(100 + b));
          for (int32_t l = 0; l < c.layers; ++l) {
            const std::vector<float>* got = batched->last_output(100 + b, l);
            const std::vector<float>* want = alone->last_output(100 + b, l);
            ASSERT_NE(got, nullptr);
            ASSERT_NE(want, nullptr);
            ASSERT_EQ(got->size(), want->size());
            // Fast kernels vs the double-accumulation references (bf16 products, fp32 sums);
            // a different top-k set (a near-tie decided differently) would show as a large error.
            EXPECT_LT(rel_diff(*got, *want), 2e-3) << "request " << b << " layer " << l;
          }
        }
      }
    }
  }
}

TEST(Engine, ContinuousBatchingAdmitsAndRetiresBetweenSteps) {
  auto e = make(tiny_config("spin"), 3);
  const int32_t free0 = e->free_pages();
  ASSERT_TRUE(e->add_request(1, 100).ok());
  ASSERT_TRUE(e->add_request(2, 40).ok());
  StepStats st;
  ASSERT_TRUE(e->step(&st).ok());
  EXPECT_EQ(st.tokens, 2);
  EXPECT_EQ(e->tokens(1), 101);
  ASSERT_TRUE(e->retire(1).ok());
  ASSERT_TRUE(e->add_request(3, 300).ok());
  ASSERT_TRUE(e->step(&st).ok());
  EXPECT_EQ(e->active_requests(), 2);
  EXPECT_EQ(e->tokens(2), 42);
  EXPECT_EQ(e->tokens(3), 301);
  EXPECT_EQ(e->tokens(1), -1);
  EXPECT_EQ(e->retire(1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->add_request(2, 10).code(), StatusCode::kInvalidArgument);  // already active
  ASSERT_TRUE(e->retire(2).ok());
  ASSERT_TRUE(e->retire(3).ok());
  EXPECT_EQ(e->free_pages(), free0);  // every page came back
}

TEST(Engine, PoolExhaustionIsAClearErrorAndLeaksNothing) {
  EngineConfig c = tiny_config("all-keep");
  c.pool_pages = 30;  // 150 entries in all
  auto e = make(c, 4);
  ASSERT_TRUE(e->add_request(1, 100).ok());
  const int32_t free_before = e->free_pages();
  const Status s = e->add_request(2, 100);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("exhausted"), std::string::npos) << s.message();
  EXPECT_EQ(e->free_pages(), free_before);
  EXPECT_EQ(e->active_requests(), 1);
}

TEST(Engine, RefusesWhatMemoryCannotHold) {
  EngineConfig c = tiny_config("all-keep");
  c.model = model_preset("deepseek-v3.2").value();
  c.layers = 61;
  auto e = DecodeEngine::create(c, 64, 1 << 20, int64_t{1} << 30);
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("GiB"), std::string::npos);
  EXPECT_GT(engine_memory_bytes(c, 64, 1 << 20), int64_t{1} << 40);  // ~2 TiB of caches
  c.layers = 62;
  EXPECT_EQ(DecodeEngine::create(c, 1, 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(model_preset("gpt-5").ok());
}

TEST(Engine, DeterministicAcrossThreadCounts) {
  std::vector<std::vector<float>> outputs;
  for (int threads : {1, 2, 1}) {
    EngineConfig c = tiny_config("spin", 2);
    c.threads = threads;
    auto e = make(c, 2);
    ASSERT_TRUE(e->add_request(1, 200).ok());
    ASSERT_TRUE(e->add_request(2, 90).ok());
    StepStats st;
    for (int s = 0; s < 4; ++s) ASSERT_TRUE(e->step(&st).ok());
    outputs.push_back(*e->last_output(1, 1));
    outputs.back().insert(outputs.back().end(), e->last_output(2, 0)->begin(), e->last_output(2, 0)->end());
  }
  ASSERT_EQ(outputs[0].size(), outputs[1].size());
  EXPECT_EQ(0, std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(outputs[0].data(), outputs[2].data(), outputs[0].size() * 4));
}

TEST(Engine, SkipsBlocksAtTheTargetSparsity) {
  auto e = make(tiny_config("spin"), 2);
  ASSERT_TRUE(e->add_request(1, 500).ok());
  ASSERT_TRUE(e->add_request(2, 400).ok());
  StepStats st;
  ASSERT_TRUE(e->step(&st).ok());  // the first step stands for the prefill: scored in full
  EXPECT_EQ(st.scored_entries, st.visible_entries);
  ASSERT_TRUE(e->step(&st).ok());
  ASSERT_GT(st.visible_entries, 0);
  const double realised = 1.0 - static_cast<double>(st.scored_entries) / static_cast<double>(st.visible_entries);
  EXPECT_NEAR(realised, 0.4, 0.05);
  EXPECT_GT(st.indexer_ms, 0.0);
  EXPECT_EQ(st.total_ms, st.indexer_ms + st.topk_ms + st.attention_ms + st.predictor_ms);
}

// Indexer inputs as a trace would hold them: a prompt of `prompt` tokens, then `steps` steps of
// next_n rows accepting `accepted` drafts each (one step jumps by a 40-token tool output). Keys of
// the first `hot` entries are strong, so the top-k has a structure a predictor can learn.
struct OwnedInputs {
  std::vector<std::vector<uint8_t>> k, q;
  std::vector<std::vector<float>> k_scale, w;
  std::vector<int64_t> ctx_len;
  std::vector<int32_t> accepted;
  IndexerInputs view;
};

std::unique_ptr<OwnedInputs> make_inputs(int32_t layers, int32_t next_n, int32_t steps, int64_t prompt, uint8_t salt) {
  auto o = std::make_unique<OwnedInputs>();
  int64_t tokens = prompt;
  for (int32_t s = 0; s < steps; ++s) {
    if (s == 3) tokens += 40;
    o->ctx_len.push_back(tokens + next_n);
    o->accepted.push_back(next_n > 1 ? s % next_n : 0);
    tokens += o->accepted.back() + 1;
  }
  const int64_t entries = o->ctx_len.back() + 8;
  uint32_t x = 12345u + salt;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  for (int32_t l = 0; l < layers; ++l) {
    o->k.emplace_back(static_cast<size_t>(entries) * 128);
    for (auto& v : o->k.back()) v = static_cast<uint8_t>((next() >> 24) & 0x77);  // finite e4m3 codes
    o->k_scale.emplace_back(static_cast<size_t>(entries), 1.0f);
    o->q.emplace_back(static_cast<size_t>(steps) * next_n * 64 * 128);
    for (auto& v : o->q.back()) v = static_cast<uint8_t>((next() >> 24) & 0x37);  // positive: ReLU passes
    o->w.emplace_back(static_cast<size_t>(steps) * next_n * 64, 0.01f);
  }
  IndexerInputs& in = o->view;
  in.steps = steps;
  in.next_n = next_n;
  in.num_heads = 64;
  in.entries = entries;
  for (int32_t l = 0; l < layers; ++l) {
    in.keys.push_back(o->k[l].data());
    in.key_scales.push_back(o->k_scale[l].data());
    in.queries.push_back(o->q[l].data());
    in.weights.push_back(o->w[l].data());
  }
  in.ctx_len = o->ctx_len.data();
  in.accepted = next_n > 1 ? o->accepted.data() : nullptr;
  return o;
}

TEST(EngineInputs, ReplaysTheInputsContextsAndAcceptance) {
  auto inputs = make_inputs(2, 2, 6, 300, 0);
  EngineConfig c = tiny_config("spin", 2);
  c.predictor_config.target_sparsity = 0.0;  // every block: the top-k is the all-keep one
  c.measure_attn_err = true;
  c.inputs = &inputs->view;
  auto e = make(c, 2);
  ASSERT_TRUE(e->add_request(1, inputs->view.prompt_tokens()).ok());
  ASSERT_TRUE(e->add_request(2, inputs->view.prompt_tokens()).ok());
  for (int32_t s = 0; s < 6; ++s) {
    StepStats st;
    ASSERT_TRUE(e->step(&st).ok()) << s;
    EXPECT_EQ(e->tokens(1), inputs->ctx_len[s] - 2 + inputs->accepted[s] + 1) << s;
    // Steps 0 (the prompt) and 3 (the tool output) are prefills: observed, not measured.
    const bool prefill = s == 0 || s == 3;
    EXPECT_EQ(st.prefill_rows, prefill ? st.rows : 0) << s;
    if (prefill) {
      EXPECT_EQ(st.recall_rows, 0) << s;
      continue;
    }
    ASSERT_GT(st.recall_rows, 0);
    EXPECT_EQ(st.recall_sum, static_cast<double>(st.recall_rows)) << s;
    EXPECT_LT(st.attn_err_sum / static_cast<double>(st.attn_err_rows), 1e-6) << s;
  }
  StepStats st;
  const Status past_end = e->step(&st);
  EXPECT_EQ(past_end.code(), StatusCode::kOutOfRange) << past_end.to_string();
}

TEST(EngineInputs, OutputsFollowTheInputsAndNotTheThreadCount) {
  auto inputs = make_inputs(2, 1, 4, 250, 0);
  auto other = make_inputs(2, 1, 4, 250, 1);
  auto run = [](const OwnedInputs& in, int threads) {
    EngineConfig c = tiny_config("spin");
    c.inputs = &in.view;
    c.threads = threads;
    auto e = make(c, 1);
    EXPECT_TRUE(e->add_request(5, in.view.prompt_tokens()).ok());
    StepStats st;
    for (int s = 0; s < 4; ++s) EXPECT_TRUE(e->step(&st).ok());
    return *e->last_output(5, 1);
  };
  const std::vector<float> a = run(*inputs, 1), b = run(*inputs, 2), c = run(*other, 1);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  EXPECT_GT(rel_diff(a, c), 1e-3);  // other keys and queries → another top-k → another output
}

TEST(EngineInputs, RefusesInputsThatDoNotFit) {
  auto inputs = make_inputs(2, 2, 4, 200, 0);
  EngineConfig c = tiny_config("spin", 1);  // next_n 1 against inputs of next_n 2
  c.inputs = &inputs->view;
  EXPECT_FALSE(DecodeEngine::create(c, 1, 600).ok());
  c.next_n = 2;
  c.layers = 3;  // the inputs hold 2 layers
  EXPECT_FALSE(DecodeEngine::create(c, 1, 600).ok());
  c.layers = 2;
  c.model.index_heads = 32;
  EXPECT_FALSE(DecodeEngine::create(c, 1, 600).ok());
  c.model.index_heads = 64;
  EXPECT_FALSE(DecodeEngine::create(c, 1, 100).ok());  // contexts beyond max_tokens
  auto e = make(c, 1);
  EXPECT_EQ(e->add_request(1, 150).code(), StatusCode::kInvalidArgument);  // not the inputs' prompt
  EXPECT_TRUE(e->add_request(1, inputs->view.prompt_tokens()).ok());
}

}  // namespace
}  // namespace spin
