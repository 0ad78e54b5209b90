// The fp32-FMA indexer kernel for CPUs without a bf16 dot product (AVX2+FMA: Zen 2/3, Intel
// client parts; AVX-512F without BF16: Skylake-X, Cascade Lake; Arm NEON), written once against a
// small vector type `V` and compiled per target by simd_avx2.cpp, simd_avx512f.cpp and
// simd_neon.cpp, each inside its own namespace (and, on x86, `#pragma GCC target`), so the
// instantiations never meet at link time. `V` gives: kLanes, kHeadVectors (head vectors per micro-tile), zero, load, broadcast,
// fma, mul, max, reduce (fixed lane order) and e4m3x16 (16 codes → 16 floats).
//
// Math, per (row, head, entry): the dot over the 128 dims is summed in dimension order with one
// FMA per dim; then Σ_h w[h]·ReLU(dot) over heads in a fixed order, times k_scale. Results are the
// same for any thread count (OpenMP splits tiles, never a sum).
//
// e4m3 → fp32 without a lookup: the 7 magnitude bits shifted left by 7, with the sign moved to bit
// 15, are the fp16 bit pattern of the value times 2^-8 — for normal and subnormal codes alike, as
// fp16 has one more exponent bit and its subnormals reach 2^-24 — and F16C (NEON: FCVTL) converts
// fp16 exactly.
// Keys and queries are both scaled by 2^-8, so dots are scaled by exactly 2^-16 (every product of
// two e4m3 values is exact in fp32 and stays normal, so scaling commutes with every rounding); the
// score multiplies 2^16 back before the key scale. NaN codes (0x7F, 0xFF) never reach a kernel
// (the quantiser and the trace reader exclude them).
//
// Register blocking: kMicroEntries entries × kHeadVectors vectors of heads, accumulators in
// registers; per dimension, kHeadVectors query loads and kMicroEntries key broadcasts (from L1)
// feed kMicroEntries·kHeadVectors FMAs. Queries are transposed once per call to [dim][head].
// (Include only from a target-specific .cpp, inside its namespace.)

inline constexpr int kMicroEntries = 6;
inline constexpr float kUnscale = 65536.0f;  // 2^16: undoes the 2^-8 of both operands

template <class V>
constexpr int32_t heads_per_chunk() {
  return V::kLanes * V::kHeadVectors;
}

template <class V>
int32_t padded_heads_for(int32_t heads) {
  constexpr int32_t chunk = heads_per_chunk<V>();
  return (heads + chunk - 1) / chunk * chunk;
}

// 128 e4m3 codes → 128 floats scaled by 2^-8.
template <class V>
inline void convert_row(const uint8_t* src, float* dst) {
  for (int d = 0; d < kIndexerHeadDim; d += 16) V::e4m3x16(src + d, dst + d);
}

// Σ_{h in chunk} w[h] · ReLU(k_e · q_h) for E entries, added to out[e].
//   keys: E × 128 floats; qt: [128][padded] floats starting at the chunk; w: the chunk's weights.
template <class V, int E>
inline void micro_tile(const float* keys, const float* qt, int32_t padded, const float* w, float* out) {
  constexpr int H = V::kHeadVectors;
  typename V::Reg acc[E][H];
  dot_tile<V, E, kIndexerHeadDim>(keys, qt, padded, acc);
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
    typename V::Reg s = V::mul(V::max(acc[e][0], V::zero()), V::load(w));
#pragma GCC unroll 4
    for (int j = 1; j < H; ++j) s = V::fma(V::max(acc[e][j], V::zero()), V::load(w + j * V::kLanes), s);
    out[e] += V::reduce(s);
  }
}

template <class V, int E>
inline void micro_all_heads(const float* keys, const float* qt, int32_t padded, const float* w, float* out) {
  for (int32_t chunk = 0; chunk < padded; chunk += heads_per_chunk<V>()) {
    micro_tile<V, E>(keys, qt + chunk, padded, w + chunk, out);
  }
}

template <class V>
void score_entries(const float* keys, int32_t count, const float* qt, int32_t padded, const float* w, float* out) {
  std::fill_n(out, count, 0.0f);
  int32_t i = 0;
  for (; i + kMicroEntries <= count; i += kMicroEntries) {
    micro_all_heads<V, kMicroEntries>(keys + i * kIndexerHeadDim, qt, padded, w, out + i);
  }
  const float* k = keys + i * kIndexerHeadDim;
  switch (count - i) {
    case 5: micro_all_heads<V, 5>(k, qt, padded, w, out + i); break;
    case 4: micro_all_heads<V, 4>(k, qt, padded, w, out + i); break;
    case 3: micro_all_heads<V, 3>(k, qt, padded, w, out + i); break;
    case 2: micro_all_heads<V, 2>(k, qt, padded, w, out + i); break;
    case 1: micro_all_heads<V, 1>(k, qt, padded, w, out + i); break;
    default: break;
  }
}

// The indexer formula over fp32 keys (score_fp32_keys, spin/indexer.h): the same micro-tiles on
// keys that are already floats (pooled block keys), unscaled, one thread.
template <class V>
void score_fp32_keys(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out) {
  const int32_t padded = padded_heads_for<V>(heads);
  std::vector<float> qt(static_cast<size_t>(kIndexerHeadDim) * padded, 0.0f), wpad(static_cast<size_t>(padded), 0.0f);
  for (int32_t h = 0; h < heads; ++h) {
    for (int d = 0; d < kIndexerHeadDim; ++d) qt[static_cast<size_t>(d) * padded + h] = q[h * kIndexerHeadDim + d];
    wpad[static_cast<size_t>(h)] = w[h];
  }
  constexpr int64_t kChunk = 4096;  // keys per call of score_entries (its count is 32-bit)
  for (int64_t i = 0; i < count; i += kChunk) {
    score_entries<V>(keys + i * kIndexerHeadDim, static_cast<int32_t>(std::min(kChunk, count - i)), qt.data(), padded,
                     wpad.data(), out + i);
  }
}

// Scores the planned tiles (outputs already -inf filled), as every indexer implementation does.
template <class V>
void run_fp32_indexer(const IndexerParams& p, const std::vector<IndexerTile>& tiles, int num_threads) {
  const IndexerPageLayout layout{p.page_size};
  const int32_t heads = p.num_heads;
  const int32_t padded = padded_heads_for<V>(heads);
  const int64_t rows = int64_t{p.batch} * p.next_n;

  // Every row's query once: [row][dim][padded head] floats (scaled), and zero-padded weights.
  std::vector<float> qt(static_cast<size_t>(rows) * kIndexerHeadDim * padded, 0.0f);
  std::vector<float> wpad(static_cast<size_t>(rows) * padded, 0.0f);
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < rows; ++r) {
    alignas(64) float converted[kIndexerHeadDim];
    for (int32_t h = 0; h < heads; ++h) {
      convert_row<V>(p.q + (r * heads + h) * kIndexerHeadDim, converted);
      for (int d = 0; d < kIndexerHeadDim; ++d) qt[(r * kIndexerHeadDim + d) * padded + h] = converted[d];
      wpad[r * padded + h] = p.weights[r * heads + h];
    }
  }

  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const IndexerTile& tile = tiles[t];
    alignas(64) float keys[kTileEntries * kIndexerHeadDim];
    alignas(64) float scores[kTileEntries];
    const uint8_t* page = p.key_cache + tile.physical_page * layout.page_bytes();
    const int32_t first_offset = static_cast<int32_t>(tile.first_entry % p.page_size);
    for (int32_t i = 0; i < tile.count; ++i) {
      convert_row<V>(page + layout.value_offset(first_offset + i), keys + i * kIndexerHeadDim);
    }
    if (t + 1 < n_tiles) prefetch_tile_values(p, tiles[t + 1]);
    const int64_t context_len = p.context_lens[tile.request];
    for (int32_t r = 0; r < p.next_n; ++r) {
      const int64_t visible = visible_entries(context_len, p.next_n, r, p.compress_ratio);
      const int32_t count = static_cast<int32_t>(std::min<int64_t>(tile.count, visible - tile.first_entry));
      if (count <= 0) continue;
      const int64_t row = int64_t{tile.request} * p.next_n + r;
      score_entries<V>(keys, count, qt.data() + row * kIndexerHeadDim * padded, padded, wpad.data() + row * padded,
                       scores);
      write_tile_scores(p, tile, row, count, scores, kUnscale);
    }
  }
}
