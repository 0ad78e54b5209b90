// The fp32-FMA sparse MLA decode kernel for CPUs without a bf16 dot product (AVX2+FMA, AVX-512F,
// Arm NEON), written once against a small vector type `V` (as indexer_fp32_simd.h) and compiled
// per target by simd_avx2.cpp, simd_avx512f.cpp and simd_neon.cpp, each inside its own namespace
// (and, on x86, `#pragma GCC target`). Flash-decoding style, one task per row (all heads), tiles of
// kAttentionTileEntries selected entries:
//  1. gather: each entry dequantised once per task to fp32 (decode_latent_entry: exact);
//  2. QK^T: S[entry, head] = scale · Σ_d k[entry, d] · q[head, d], dims summed in order with one
//     FMA each; register tiles of 6 entries × kHeadVectors head vectors, keys broadcast, queries
//     transposed once per row to [dim][head];
//  3. online softmax per head (heads are lanes), natural base: m' = max(m, max_e S),
//     α = exp(m − m'), P = exp(S − m'), l' = α·l + Σ_e P; exp is a Cephes-style degree-6
//     polynomial with exponent scaling (≈ 2 ulp; arguments clamped at −87.3, where exp is below
//     2^-126 and no longer matters beside the row's largest P = 1);
//  4. P·V in fp32: o[h, :] = α[h]·o[h, :] + Σ_e P[e, h]·v[e, :], 4 heads × kPvVectors dim vectors
//     of accumulators. P stays fp32 whatever AttentionOptions::bf16_probabilities says: rounding
//     it would only lose precision here, as there is no bf16 dot to feed.
// Each (row, head) result is a fixed sequence of fp32 operations (fixed tiles, fixed entry order,
// lanes never mixed), so results are bitwise identical for any thread count.
// (Include only from a target-specific .cpp, inside its namespace.)

inline constexpr int kQkEntries = 6;
inline constexpr int kPvHeads = 4;

template <class V>
constexpr int32_t attention_chunk() {
  return V::kLanes * V::kHeadVectors;
}

// exp(x) for x ≤ 0 (or −inf), lane by lane.
template <class V>
inline typename V::Reg exp_nonpositive(typename V::Reg x) {
  x = V::max(x, V::set1(-87.3f));
  const typename V::Reg n = V::round(V::mul(x, V::set1(1.44269504f)));
  typename V::Reg r = V::fma(n, V::set1(-0.693359375f), x);
  r = V::fma(n, V::set1(2.12194440e-4f), r);
  typename V::Reg poly = V::set1(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    poly = V::fma(poly, r, V::set1(c));
  }
  poly = V::fma(poly, V::mul(r, r), V::add(r, V::set1(1.0f)));  // 1 + r + r²·P(r)
  return V::mul(poly, V::pow2(n));
}

// S[e, chunk] = scale · keys[e] · q for E entries and one chunk of heads.
template <class V, int E>
inline void qk_tile(const float* keys, const float* qt, int32_t padded, float scale, float* s) {
  constexpr int H = V::kHeadVectors;
  typename V::Reg acc[E][H];
  dot_tile<V, E, kMlaHeadDim>(keys, qt, padded, acc);
  const typename V::Reg vs = V::set1(scale);
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) V::store(s + e * padded + j * V::kLanes, V::mul(acc[e][j], vs));
  }
}

template <class V>
void qk_all(const float* keys, int32_t count, const float* qt, int32_t padded, float scale, float* s) {
  for (int32_t chunk = 0; chunk < padded; chunk += attention_chunk<V>()) {
    int32_t e = 0;
    for (; e + kQkEntries <= count; e += kQkEntries) {
      qk_tile<V, kQkEntries>(keys + e * kMlaHeadDim, qt + chunk, padded, scale, s + e * padded + chunk);
    }
    const float* k = keys + e * kMlaHeadDim;
    float* out = s + e * padded + chunk;
    switch (count - e) {
      case 5: qk_tile<V, 5>(k, qt + chunk, padded, scale, out); break;
      case 4: qk_tile<V, 4>(k, qt + chunk, padded, scale, out); break;
      case 3: qk_tile<V, 3>(k, qt + chunk, padded, scale, out); break;
      case 2: qk_tile<V, 2>(k, qt + chunk, padded, scale, out); break;
      case 1: qk_tile<V, 1>(k, qt + chunk, padded, scale, out); break;
      default: break;
    }
  }
}

// Online-softmax update of one tile: S becomes P in place; alpha[h] = exp(m_old − m_new).
template <class V>
void softmax_tile(float* s, int32_t count, int32_t padded, float* m, float* l, float* alpha) {
  for (int32_t h = 0; h < padded; h += V::kLanes) {
    typename V::Reg tile_max = V::load(s + h);
    for (int32_t e = 1; e < count; ++e) tile_max = V::max(tile_max, V::load(s + e * padded + h));
    const typename V::Reg m_old = V::load(m + h);
    const typename V::Reg m_new = V::max(m_old, tile_max);
    const typename V::Reg a = exp_nonpositive<V>(V::sub(m_old, m_new));
    typename V::Reg sum = V::zero();
    for (int32_t e = 0; e < count; ++e) {
      const typename V::Reg pe = exp_nonpositive<V>(V::sub(V::load(s + e * padded + h), m_new));
      V::store(s + e * padded + h, pe);
      sum = V::add(sum, pe);
    }
    V::store(l + h, V::fma(a, V::load(l + h), sum));
    V::store(m + h, m_new);
    V::store(alpha + h, a);
  }
}

// o[h, :] = alpha[h]·o[h, :] + Σ_e P[e, h]·v[e, :] for every head.
template <class V>
void pv_tile(const float* keys, const float* p, int32_t count, int32_t padded, const float* alpha, float* o) {
  constexpr int D = V::kPvVectors;
  for (int32_t h = 0; h < padded; h += kPvHeads) {
    for (int32_t d0 = 0; d0 < kMlaLatentDim; d0 += D * V::kLanes) {
      typename V::Reg acc[kPvHeads][D];
#pragma GCC unroll 4
      for (int i = 0; i < kPvHeads; ++i) {
        const typename V::Reg a = V::broadcast(alpha + h + i);
#pragma GCC unroll 4
        for (int j = 0; j < D; ++j) acc[i][j] = V::mul(a, V::load(o + (h + i) * kMlaLatentDim + d0 + j * V::kLanes));
      }
      for (int32_t e = 0; e < count; ++e) {
        typename V::Reg v[D];
#pragma GCC unroll 4
        for (int j = 0; j < D; ++j) v[j] = V::load(keys + e * kMlaHeadDim + d0 + j * V::kLanes);
#pragma GCC unroll 4
        for (int i = 0; i < kPvHeads; ++i) {
          const typename V::Reg pe = V::broadcast(p + e * padded + h + i);
#pragma GCC unroll 4
          for (int j = 0; j < D; ++j) acc[i][j] = V::fma(pe, v[j], acc[i][j]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < kPvHeads; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < D; ++j) V::store(o + (h + i) * kMlaLatentDim + d0 + j * V::kLanes, acc[i][j]);
      }
    }
  }
}

template <class V>
void run_fp32_attention(const SparseAttentionParams& p, int num_threads) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
  constexpr int32_t chunk = attention_chunk<V>();
  const int32_t padded = (heads + chunk - 1) / chunk * chunk;
  constexpr int32_t kTile = kAttentionTileEntries;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<int32_t> selected(static_cast<size_t>(p.topk) + p.n_extra);
    std::vector<float> qt(static_cast<size_t>(kMlaHeadDim) * padded);
    std::vector<float> keys(static_cast<size_t>(kTile) * kMlaHeadDim);
    std::vector<float> s(static_cast<size_t>(kTile) * padded);
    std::vector<float> o(static_cast<size_t>(padded) * kMlaLatentDim);
    std::vector<float> m(padded), l(padded), alpha(padded);
#pragma omp for schedule(dynamic, 1)
    for (int64_t row = 0; row < rows; ++row) {
      const int32_t b = static_cast<int32_t>(row / p.next_n);
      const int32_t n = attention_selected_entries(p, row, selected.data());
      float* out = p.out + row * heads * kMlaLatentDim;
      if (n == 0) {
        std::fill_n(out, int64_t{heads} * kMlaLatentDim, 0.0f);
        if (p.lse != nullptr) std::fill_n(p.lse + row * heads, heads, -std::numeric_limits<float>::infinity());
        continue;
      }
      std::fill(qt.begin(), qt.end(), 0.0f);
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t d = 0; d < kMlaHeadDim; ++d) {
          qt[static_cast<size_t>(d) * padded + h] = bf16_to_float(p.q[(row * heads + h) * kMlaHeadDim + d]);
        }
      }
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(o.begin(), o.end(), 0.0f);
      for (int32_t t0 = 0; t0 < n; t0 += kTile) {
        const int32_t count = std::min(kTile, n - t0);
        for (int32_t e = 0; e < count; ++e) {
          decode_latent_entry(p.dtype, attention_entry(p, b, selected[t0 + e]), keys.data() + e * kMlaHeadDim);
        }
        qk_all<V>(keys.data(), count, qt.data(), padded, p.softmax_scale, s.data());
        softmax_tile<V>(s.data(), count, padded, m.data(), l.data(), alpha.data());
        pv_tile<V>(keys.data(), s.data(), count, padded, alpha.data(), o.data());
      }
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t d = 0; d < kMlaLatentDim; ++d) out[h * kMlaLatentDim + d] = o[h * kMlaLatentDim + d] / l[h];
        if (p.lse != nullptr) p.lse[row * heads + h] = m[h] + std::log(l[h]);
      }
    }
  }
}
