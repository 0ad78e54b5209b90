// The fp32-FMA sparse MLA decode kernel for CPUs without a bf16 dot product (AVX2+FMA, AVX-512F,
// Arm NEON), written once against a small vector type `V` (as indexer_fp32_simd.h) and compiled
// per target by simd_avx2.cpp, simd_avx512f.cpp and simd_neon.cpp, each inside its own namespace
// (and, on x86, `#pragma GCC target`). Flash-decoding style; one task = one row × a group of heads
// (all of them unless there are fewer rows than threads: see attention_task_heads), in tiles of
// kAttentionTileEntries selected entries:
//  1. gather: each entry dequantised once per task to fp32 with vector code, bitwise equal to
//     decode_latent_entry (fp8: V::e4m3x16 gives code · 2^-8 exactly, times scale · 2^8 — one
//     rounding of the same exact product; bf16: a 16-bit shift). The next tile's entries are
//     prefetched while this one computes (random addresses: no hardware prefetcher follows them);
//  2. QK^T: S[entry, head] = scale · Σ_d k[entry, d] · q[head, d], dims summed in order with one
//     FMA each; register tiles of 6 entries × kHeadVectors head vectors, keys broadcast, queries
//     transposed once per task to [dim][head];
//  3. online softmax per head (heads are lanes), natural base: m' = max(m, max_e S),
//     α = exp(m − m'), P = exp(S − m'), l' = α·l + Σ_e P; exp is a Cephes-style degree-6
//     polynomial with exponent scaling (≈ 2 ulp; arguments clamped at −87.3, where exp is below
//     2^-126 and no longer matters beside the row's largest P = 1);
//  4. P·V in fp32: o[h, :] = α[h]·o[h, :] + Σ_e P[e, h]·v[e, :], register tiles of V::kPvHeads
//     heads × kPvVectors dim vectors, dim block outer so that the block's values (tile × 64 B on
//     AVX2) and P stay in L1 while every head passes over them. P stays fp32 whatever
//     AttentionOptions::bf16_probabilities says: rounding it would only lose precision here, as
//     there is no bf16 dot to feed.
// Each (row, head) result is a fixed sequence of fp32 operations (fixed tiles, fixed entry order,
// lanes never mixed, whatever micro-tile or task a head falls in), so results are bitwise
// identical for any thread count and heads_per_task.
// Measured (Sapphire Rapids, AVX2 forced, 1 thread, 128 heads, top-k 2048, fp8) before the
// vector gather and the P·V retiling: gather 25 %, QK^T 32 %, softmax 1.5 %, P·V 42 % of the time.
// (Include only from a target-specific .cpp, inside its namespace.)

inline constexpr int kQkEntries = 6;

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

// One cache entry → its 576 fp32 values, bitwise equal to decode_latent_entry for every scale the
// writer produces (any scale below 2^119, where scale · 2^8 is still exact).
template <class V>
inline void gather_entry(LatentDtype dtype, const uint8_t* entry, float* key) {
  if (dtype == LatentDtype::kBf16) {
    for (int32_t d = 0; d < kMlaHeadDim; d += 16) V::bf16x16(entry + 2 * d, key + d);
    return;
  }
  for (int32_t t = 0; t < kMlaNumTiles; ++t) {
    float scale;
    std::memcpy(&scale, entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, 4);
    const typename V::Reg s = V::set1(scale * 256.0f);  // undoes e4m3x16's 2^-8
    for (int32_t d = t * kMlaTileDim; d < (t + 1) * kMlaTileDim; d += 16) {
      V::e4m3x16(entry + LatentPageLayout::kFp8LatentOffset + d, key + d);
#pragma GCC unroll 4
      for (int32_t j = 0; j < 16; j += V::kLanes) V::store(key + d + j, V::mul(V::load(key + d + j), s));
    }
  }
  for (int32_t j = 0; j < kMlaRopeDim; j += 16) {
    V::bf16x16(entry + LatentPageLayout::kFp8RopeOffset + 2 * j, key + kMlaLatentDim + j);
  }
}

// H heads × kPvVectors dim vectors of o: acc = α·o, then += P[e, h]·v[e, block] for e < count, in
// entry order. keys/o start at the dim block; p/alpha/o at the first head.
template <class V, int H>
inline void pv_micro(const float* keys, const float* p, int32_t count, int32_t padded, const float* alpha, float* o) {
  constexpr int D = V::kPvVectors;
  typename V::Reg acc[H][D];
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) {
    const typename V::Reg a = V::broadcast(alpha + i);
#pragma GCC unroll 4
    for (int j = 0; j < D; ++j) acc[i][j] = V::mul(a, V::load(o + i * kMlaLatentDim + j * V::kLanes));
  }
  for (int32_t e = 0; e < count; ++e) {
    typename V::Reg v[D];
#pragma GCC unroll 4
    for (int j = 0; j < D; ++j) v[j] = V::load(keys + e * kMlaHeadDim + j * V::kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < H; ++i) {
      const typename V::Reg pe = V::broadcast(p + e * padded + i);
#pragma GCC unroll 4
      for (int j = 0; j < D; ++j) acc[i][j] = V::fma(pe, v[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < H; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < D; ++j) V::store(o + i * kMlaLatentDim + j * V::kLanes, acc[i][j]);
  }
}

// The last `rest` (< V::kPvHeads) heads of a dim block.
template <class V, int H>
inline void pv_rest(int32_t rest, const float* keys, const float* p, int32_t count, int32_t padded,
                    const float* alpha, float* o) {
  if constexpr (H > 0) {
    if (rest == H) {
      pv_micro<V, H>(keys, p, count, padded, alpha, o);
    } else {
      pv_rest<V, H - 1>(rest, keys, p, count, padded, alpha, o);
    }
  }
}

// o[h, :] = alpha[h]·o[h, :] + Σ_e P[e, h]·v[e, :] for every head of the task. Dim blocks outer:
// one block of the tile's values (count × kPvVectors vectors) and the tile's P stay in L1 while
// every head tile passes over them.
template <class V>
void pv_tile(const float* keys, const float* p, int32_t count, int32_t padded, const float* alpha, float* o) {
  constexpr int H = V::kPvHeads;
  for (int32_t d0 = 0; d0 < kMlaLatentDim; d0 += V::kPvVectors * V::kLanes) {
    int32_t h = 0;
    for (; h + H <= padded; h += H) pv_micro<V, H>(keys + d0, p + h, count, padded, alpha + h, o + h * kMlaLatentDim + d0);
    pv_rest<V, H - 1>(padded - h, keys + d0, p + h, count, padded, alpha + h, o + h * kMlaLatentDim + d0);
  }
}

// Padded heads per task. Requested (AttentionOptions::heads_per_task): rounded up to whole head
// chunks. Auto: all of the row's heads, halved while that leaves the threads unevenly loaded (fewer
// than two tasks per thread and not a multiple of the thread count) — each task re-gathers the
// row's entries, so groups stay as large as the balance allows. Only which thread computes a head
// depends on it, never the head's arithmetic.
template <class V>
int32_t attention_task_heads(int64_t rows, int32_t padded, int num_threads, int heads_per_task) {
  constexpr int32_t chunk = attention_chunk<V>();
  auto round_up = [&](int32_t h) { return std::min(padded, (h + chunk - 1) / chunk * chunk); };
  if (heads_per_task > 0) return round_up(heads_per_task);
  int32_t group = padded;
  auto tasks = [&](int32_t g) { return rows * ((padded + g - 1) / g); };
  while (group > chunk && tasks(group) < 2 * int64_t{num_threads} && tasks(group) % num_threads != 0) {
    group = round_up(group / 2);
  }
  return group;
}

// Per-thread scratch for tasks of up to `width` padded heads.
struct Fp32AttentionScratch {
  std::vector<int32_t> selected;
  std::vector<float> qt, keys, s, o, m, l, alpha;
  Fp32AttentionScratch(const SparseAttentionParams& p, int32_t width)
      : selected(static_cast<size_t>(p.topk) + p.n_extra),
        qt(static_cast<size_t>(kMlaHeadDim) * width),
        keys(static_cast<size_t>(kAttentionTileEntries) * kMlaHeadDim),
        s(static_cast<size_t>(kAttentionTileEntries) * width),
        o(static_cast<size_t>(width) * kMlaLatentDim),
        m(width),
        l(width),
        alpha(width) {}
};

// The task's queries as fp32 [dim][width] (heads past `real` zero: their outputs are never stored).
inline void transpose_task_queries(const SparseAttentionParams& p, int64_t row, int32_t h0, int32_t width,
                                   int32_t real, float* qt) {
  std::fill_n(qt, static_cast<size_t>(kMlaHeadDim) * width, 0.0f);
  for (int32_t j = 0; j < real; ++j) {
    const uint16_t* qh = p.q + (row * p.num_heads + h0 + j) * kMlaHeadDim;
    for (int32_t d = 0; d < kMlaHeadDim; ++d) qt[static_cast<size_t>(d) * width + j] = bf16_to_float(qh[d]);
  }
}

// One task: row `row`, padded heads [h0, h0 + width) of its n selected entries.
template <class V>
void fp32_attention_task(const SparseAttentionParams& p, int64_t row, int32_t h0, int32_t width, int32_t n,
                         Fp32AttentionScratch& w) {
  const int32_t heads = p.num_heads;
  const int32_t b = static_cast<int32_t>(row / p.next_n);
  const int32_t real = std::min(width, heads - h0);
  constexpr int32_t kTile = kAttentionTileEntries;
  transpose_task_queries(p, row, h0, width, real, w.qt.data());
  std::fill_n(w.m.begin(), width, -std::numeric_limits<float>::infinity());
  std::fill_n(w.l.begin(), width, 0.0f);
  std::fill_n(w.o.begin(), static_cast<size_t>(width) * kMlaLatentDim, 0.0f);
  const int64_t entry_bytes = LatentPageLayout{p.dtype, p.page_size}.entry_bytes();
  for (int32_t t0 = 0; t0 < n; t0 += kTile) {
    const int32_t count = std::min(kTile, n - t0);
    for (int32_t e = 0; e < count; ++e) {
      gather_entry<V>(p.dtype, attention_entry(p, b, w.selected[t0 + e]), w.keys.data() + e * kMlaHeadDim);
    }
    // Fetch the next tile's entries into L2 (at random addresses: no hardware prefetcher follows
    // them) while this tile computes — after this tile's gather, not interleaved with it, where
    // the prefetches' DRAM misses held the fill buffers the gather's L2 hits need (gather 2× slower).
    // Written inline on purpose: GCC deletes calls to a function whose only effect is prefetching
    // (it is "const" to its IPA analysis); measured: the gather took 3× longer with a helper.
    for (int32_t i = t0 + kTile; i < std::min(n, t0 + 2 * kTile); ++i) {
      const uint8_t* next = attention_entry(p, b, w.selected[i]);
      for (int64_t line = 0; line < entry_bytes; line += 64) __builtin_prefetch(next + line, 0, 2);
      __builtin_prefetch(next + entry_bytes - 1, 0, 2);
    }
    qk_all<V>(w.keys.data(), count, w.qt.data(), width, p.softmax_scale, w.s.data());
    softmax_tile<V>(w.s.data(), count, width, w.m.data(), w.l.data(), w.alpha.data());
    pv_tile<V>(w.keys.data(), w.s.data(), count, width, w.alpha.data(), w.o.data());
  }
  float* out = p.out + (row * heads + h0) * kMlaLatentDim;
  for (int32_t j = 0; j < real; ++j) {
    for (int32_t d = 0; d < kMlaLatentDim; ++d) out[j * kMlaLatentDim + d] = w.o[j * kMlaLatentDim + d] / w.l[j];
    if (p.lse != nullptr) p.lse[row * heads + h0 + j] = w.m[j] + std::log(w.l[j]);
  }
}

template <class V>
void run_fp32_attention(const SparseAttentionParams& p, int num_threads, int heads_per_task) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
  constexpr int32_t chunk = attention_chunk<V>();
  const int32_t padded = (heads + chunk - 1) / chunk * chunk;
  const int32_t group = attention_task_heads<V>(rows, padded, num_threads, heads_per_task);
  const int32_t groups = (padded + group - 1) / group;
  const int64_t tasks = rows * groups;
#pragma omp parallel num_threads(num_threads)
  {
    Fp32AttentionScratch w(p, group);
    int64_t selected_row = -1;
    int32_t n = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t row = task / groups;
      const int32_t h0 = static_cast<int32_t>(task % groups) * group;
      if (row != selected_row) {
        n = attention_selected_entries(p, row, w.selected.data());
        selected_row = row;
      }
      if (n == 0) {
        const int32_t real = std::min(group, heads - h0);
        std::fill_n(p.out + (row * heads + h0) * kMlaLatentDim, int64_t{real} * kMlaLatentDim, 0.0f);
        if (p.lse != nullptr) std::fill_n(p.lse + row * heads + h0, real, -std::numeric_limits<float>::infinity());
        continue;
      }
      fp32_attention_task<V>(p, row, h0, std::min(group, padded - h0), n, w);
    }
  }
}
