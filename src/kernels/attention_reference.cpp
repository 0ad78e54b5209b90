// Plain C++ sparse-attention paths (no ISA-specific code):
//  * the scalar reference — boring loops, entries dequantised exactly in double, double
//    accumulation, a two-pass softmax: the ground truth the fast kernels are compared against;
//  * the portable fp32 path, for CPUs without any of the SIMD paths (AVX-512 BF16, AVX-512F,
//    AVX2, NEON) — two passes per row (scores, then
//    softmax and P·V), with the query transposed [dim][head] so the inner loops run over heads or
//    dims and vectorise without reassociating any sum.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_internal.h"
#include "spin/numerics.h"

namespace spin::detail {

namespace {

// Entry bytes → exact values in double (e4m3 · fp32 scale needs ≤ 28 significant bits).
void decode_entry_double(LatentDtype dtype, const uint8_t* entry, double* values) {
  if (dtype == LatentDtype::kBf16) {
    for (int32_t d = 0; d < kMlaHeadDim; ++d) {
      uint16_t bits;
      std::memcpy(&bits, entry + 2 * d, 2);
      values[d] = double{bf16_to_float(bits)};
    }
    return;
  }
  for (int32_t d = 0; d < kMlaLatentDim; ++d) {
    float scale;
    std::memcpy(&scale, entry + LatentPageLayout::kFp8ScaleOffset + 4 * (d / kMlaTileDim), 4);
    values[d] = double{e4m3_to_float(entry[LatentPageLayout::kFp8LatentOffset + d])} * double{scale};
  }
  for (int32_t j = 0; j < kMlaRopeDim; ++j) {
    uint16_t bits;
    std::memcpy(&bits, entry + LatentPageLayout::kFp8RopeOffset + 2 * j, 2);
    values[kMlaLatentDim + j] = double{bf16_to_float(bits)};
  }
}

void write_empty_row(const SparseAttentionParams& p, int64_t row) {
  std::fill_n(p.out + row * p.num_heads * kMlaLatentDim, int64_t{p.num_heads} * kMlaLatentDim, 0.0f);
  if (p.lse != nullptr) {
    std::fill_n(p.lse + row * p.num_heads, p.num_heads, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace

void attention_run_reference(const SparseAttentionParams& p) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
  std::vector<int32_t> selected(static_cast<size_t>(p.topk) + p.n_extra);
  std::vector<double> entry(kMlaHeadDim);
  std::vector<double> q(static_cast<size_t>(heads) * kMlaHeadDim);
  std::vector<double> acc(static_cast<size_t>(heads) * kMlaLatentDim);
  std::vector<double> max_score(heads);
  std::vector<double> sum(heads);
  std::vector<double> scores;
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t b = static_cast<int32_t>(row / p.next_n);
    const int32_t n = attention_selected_entries(p, row, selected.data());
    if (n == 0) {
      write_empty_row(p, row);
      continue;
    }
    for (size_t i = 0; i < q.size(); ++i) q[i] = double{bf16_to_float(p.q[row * heads * kMlaHeadDim + i])};
    // Pass 1: scores [n, heads].
    scores.assign(static_cast<size_t>(n) * heads, 0.0);
    for (int32_t e = 0; e < n; ++e) {
      decode_entry_double(p.dtype, attention_entry(p, b, selected[e]), entry.data());
      for (int32_t h = 0; h < heads; ++h) {
        double dot = 0.0;
        for (int32_t d = 0; d < kMlaHeadDim; ++d) dot += q[h * kMlaHeadDim + d] * entry[d];
        scores[static_cast<size_t>(e) * heads + h] = double{p.softmax_scale} * dot;
      }
    }
    // Pass 2: max, Σ exp, Σ exp · latent.
    std::fill(max_score.begin(), max_score.end(), -std::numeric_limits<double>::infinity());
    for (int32_t e = 0; e < n; ++e) {
      for (int32_t h = 0; h < heads; ++h) max_score[h] = std::max(max_score[h], scores[static_cast<size_t>(e) * heads + h]);
    }
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int32_t e = 0; e < n; ++e) {
      decode_entry_double(p.dtype, attention_entry(p, b, selected[e]), entry.data());
      for (int32_t h = 0; h < heads; ++h) {
        const double w = std::exp(scores[static_cast<size_t>(e) * heads + h] - max_score[h]);
        sum[h] += w;
        for (int32_t d = 0; d < kMlaLatentDim; ++d) acc[h * kMlaLatentDim + d] += w * entry[d];
      }
    }
    float* out = p.out + row * heads * kMlaLatentDim;
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t d = 0; d < kMlaLatentDim; ++d) {
        out[h * kMlaLatentDim + d] = static_cast<float>(acc[h * kMlaLatentDim + d] / sum[h]);
      }
      if (p.lse != nullptr) p.lse[row * heads + h] = static_cast<float>(max_score[h] + std::log(sum[h]));
    }
  }
}

void attention_run_portable(const SparseAttentionParams& p, int num_threads) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<int32_t> selected(static_cast<size_t>(p.topk) + p.n_extra);
    std::vector<float> entry(kMlaHeadDim);
    std::vector<float> q_t(static_cast<size_t>(kMlaHeadDim) * heads);  // [dim][head]
    std::vector<float> acc(heads);
    std::vector<float> max_score(heads);
    std::vector<float> sum(heads);
    std::vector<float> o(static_cast<size_t>(heads) * kMlaLatentDim);
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t row = 0; row < rows; ++row) {
      const int32_t b = static_cast<int32_t>(row / p.next_n);
      const int32_t n = attention_selected_entries(p, row, selected.data());
      if (n == 0) {
        write_empty_row(p, row);
        continue;
      }
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t d = 0; d < kMlaHeadDim; ++d) {
          q_t[static_cast<size_t>(d) * heads + h] = bf16_to_float(p.q[(row * heads + h) * kMlaHeadDim + d]);
        }
      }
      // Pass 1: scores [n, heads]; each dot summed in dimension order.
      scores.resize(static_cast<size_t>(n) * heads);
      for (int32_t e = 0; e < n; ++e) {
        decode_latent_entry(p.dtype, attention_entry(p, b, selected[e]), entry.data());
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int32_t d = 0; d < kMlaHeadDim; ++d) {
          const float kd = entry[d];
          const float* qd = q_t.data() + static_cast<size_t>(d) * heads;
          for (int32_t h = 0; h < heads; ++h) acc[h] += qd[h] * kd;
        }
        for (int32_t h = 0; h < heads; ++h) scores[static_cast<size_t>(e) * heads + h] = p.softmax_scale * acc[h];
      }
      // Pass 2: weights in place, then P·V in entry order.
      std::fill(max_score.begin(), max_score.end(), -std::numeric_limits<float>::infinity());
      for (int32_t e = 0; e < n; ++e) {
        for (int32_t h = 0; h < heads; ++h) {
          max_score[h] = std::max(max_score[h], scores[static_cast<size_t>(e) * heads + h]);
        }
      }
      std::fill(sum.begin(), sum.end(), 0.0f);
      std::fill(o.begin(), o.end(), 0.0f);
      for (int32_t e = 0; e < n; ++e) {
        decode_latent_entry(p.dtype, attention_entry(p, b, selected[e]), entry.data());
        for (int32_t h = 0; h < heads; ++h) {
          const float w = std::exp(scores[static_cast<size_t>(e) * heads + h] - max_score[h]);
          sum[h] += w;
          float* oh = o.data() + static_cast<size_t>(h) * kMlaLatentDim;
          for (int32_t d = 0; d < kMlaLatentDim; ++d) oh[d] += w * entry[d];
        }
      }
      float* out = p.out + row * heads * kMlaLatentDim;
      for (int32_t h = 0; h < heads; ++h) {
        const float inv = 1.0f / sum[h];
        for (int32_t d = 0; d < kMlaLatentDim; ++d) out[h * kMlaLatentDim + d] = o[h * kMlaLatentDim + d] * inv;
        if (p.lse != nullptr) p.lse[row * heads + h] = max_score[h] + std::log(sum[h]);
      }
    }
  }
}

}  // namespace spin::detail
