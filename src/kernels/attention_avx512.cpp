// AVX-512 BF16 sparse MLA decode kernel (Zen 4, Sapphire Rapids and later); flash-decoding style.
//
// One task = one row × up to 128 heads (heads in SIMD lanes, padded to a multiple of 16 with zero
// queries), computed as sub-groups of ≤ 64 heads that share each gathered tile. A task walks the
// row's selected entries in tiles of kAttentionTileEntries:
//  1. gather: each entry is dequantised once per task into a bf16 key tile [tile][576]. fp8 codes
//     are widened by exponent arithmetic (code bits moved into an fp32, times 2^120, times the
//     power-of-two tile scale: exact) and rounded to bf16, which is exact too (spin/attention.h);
//     bf16 entries are copied. The next tile's entries are prefetched into L2 while this tile
//     computes (they sit at random addresses, so no hardware prefetcher follows them).
//  2. QK^T: S[entry, head] = Σ_d k[entry, d] · q[head, d] with vdpbf16ps (bf16 pairs, fp32
//     accumulation). Queries are packed once per task as [pair][head] words; the micro-kernel
//     broadcasts one key pair per entry and holds E entries × Z head vectors = 24 accumulators.
//  3. online softmax per head (vertical over entries: heads are lanes), in the log2 domain:
//     m' = max(m, max_e S), α = 2^(m-m'), P = 2^(S-m'), l' = α·l + Σ_e P; exp2 is a degree-7
//     polynomial on the fraction plus vscalefps (≈1 ulp).
//  4. P·V: o[h, :] = α[h]·o[h, :] + Σ_e P[e, h]·v[e, :] with fp32 FMAs (v = the key tile's latent
//     part, widened to fp32 one 64-dim block at a time), 4 heads × 64 dims of accumulators; the
//     task's o [≤128, 512] stays in L2.
// Measured on Zen 4 (1 thread, 128 heads, topk 2048): QK^T runs at the vdpbf16ps peak, P·V at ~90%
// of the fp32 FMA peak, gather ~5%, softmax ~1.5%. fp32 P·V is half the rate of bf16 dots, which
// caps this design near 68% of the bf16 peak; a bf16 P (as FlashMLA uses) would lift the cap.
// Every (row, head) result is the same sequence of fp32 operations whatever the head grouping,
// the micro-kernel shapes or the thread count (each head is one SIMD lane, summed in a fixed
// entry order, tiles fixed by kAttentionTileEntries), so results are bitwise reproducible across
// threads and heads_per_task and independent of the rest of the batch.
// vdpbf16ps and vcvtne2ps2bf16 treat bf16/fp32 denormals as zero; a query or key component below
// 2^-126 in magnitude therefore contributes nothing here (the reference keeps it).
// GCC 12's own intrinsics headers trip -W(maybe-)uninitialized (known false positives: the
// _mm512_undefined_* placeholders inside avx512fintrin.h); silence them for this file only.
#if defined(__x86_64__)  // x86 only: the file is empty on other ISAs (see simd_neon.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "kernels/attention_internal.h"
#include "spin/numerics.h"

#define SPIN_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace spin::detail {

namespace {

constexpr int32_t kPairs = kMlaHeadDim / 2;       // 288 bf16 pairs per key
constexpr int32_t kSubGroup = 64;                 // heads per micro-kernel pass at most (4 zmm)
constexpr int32_t kMaxTaskHeads = 128;            // heads per task at most
constexpr int32_t kTile = kAttentionTileEntries;
constexpr int32_t kPvHeads = 4;                   // P·V micro-tile: 4 heads × 4 zmm of dims (6 × 4: no gain)
constexpr int32_t kPvDims = 64;
static_assert(kTile % 24 == 0, "tiles must hold whole micro-kernel blocks (6, 8, 12, 24 entries)");

// Per-thread scratch, 64-byte aligned.
struct Workspace {
  uint32_t* qpack;  // per sub-group: [kPairs][sub-group width] bf16 pairs
  uint16_t* keys;   // [kTile][576] bf16 (rows past the tile's count zeroed up to a multiple of 24)
  float* vblock;    // [kTile][64] fp32: one 64-dim block of the tile's latents
  float* probs;     // per sub-group: [kTile][sub-group width] scores, then probabilities
  float* o;         // [task heads][512] unnormalised output
  float* m;         // [task heads] running max (log2 domain)
  float* l;         // [task heads] running Σ 2^(s - m)
  float* alpha;     // [task heads] this tile's rescale factor
  uint32_t* ppairs;  // per sub-group: [kTile / 2][sub-group width] bf16 probability pairs
  struct AlignedDelete {
    void operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<uint8_t[], AlignedDelete> block;

  Workspace() {
    const size_t bytes[] = {size_t{kPairs} * kMaxTaskHeads * 4, size_t{kTile} * kMlaHeadDim * 2,
                            size_t{kTile} * kPvDims * 4, size_t{kTile} * kMaxTaskHeads * 4,
                            size_t{kMaxTaskHeads} * kMlaLatentDim * 4, kMaxTaskHeads * 4, kMaxTaskHeads * 4,
                            kMaxTaskHeads * 4, size_t{kTile / 2} * kMaxTaskHeads * 4};
    size_t total = 0;
    for (size_t b : bytes) total += (b + 63) / 64 * 64;
    block.reset(new (std::align_val_t{64}) uint8_t[total]);
    uint8_t* p = block.get();
    void* ptrs[9];
    for (int i = 0; i < 9; ++i) {
      ptrs[i] = p;
      p += (bytes[i] + 63) / 64 * 64;
    }
    qpack = static_cast<uint32_t*>(ptrs[0]);
    keys = static_cast<uint16_t*>(ptrs[1]);
    vblock = static_cast<float*>(ptrs[2]);
    probs = static_cast<float*>(ptrs[3]);
    o = static_cast<float*>(ptrs[4]);
    m = static_cast<float*>(ptrs[5]);
    l = static_cast<float*>(ptrs[6]);
    alpha = static_cast<float*>(ptrs[7]);
    ppairs = static_cast<uint32_t*>(ptrs[8]);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

// 2^x for x ≤ 0 (x = -inf gives 0): x = n + f with n = round(x), |f| ≤ 1/2, 2^f by its Taylor
// polynomial of degree 7 (truncation error < 2e-9), then · 2^n by vscalefps.
SPIN_TARGET_AVX512BF16 inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-160.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252733804059840e-5f);  // ln2^7 / 7!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-4f));  // ln2^6 / 6!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));  // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));  // ln2^4 / 4!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));  // ln2^3 / 3!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));  // ln2^2 / 2!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));  // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 e4m3 codes → 16 fp32 values times `scale`. The code's 7 magnitude bits land in fp32 bits
// 20..26 and the sign in bit 31, which reads as |v| · 2^-120 (subnormal codes included: m·2^-9
// becomes the fp32 subnormal m·2^-129); two exact multiplications restore the value.
SPIN_TARGET_AVX512BF16 inline __m512 e4m3x16_to_ps(const uint8_t* codes, __m512 scale) {
  const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i bits = _mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(x, 24), 4),
                                        _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u)));
  const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
  return _mm512_mul_ps(v, scale);
}

// One cache entry → bf16 key [576] and fp32 value [512].
SPIN_TARGET_AVX512BF16 inline void gather_entry(LatentDtype dtype, const uint8_t* entry, uint16_t* key) {
  if (dtype == LatentDtype::kFp8) {
    for (int32_t t = 0; t < kMlaNumTiles; ++t) {
      float scale_value;
      std::memcpy(&scale_value, entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, 4);
      const __m512 scale = _mm512_set1_ps(scale_value);
      for (int32_t d = t * kMlaTileDim; d < (t + 1) * kMlaTileDim; d += 32) {
        const __m512 v0 = e4m3x16_to_ps(entry + LatentPageLayout::kFp8LatentOffset + d, scale);
        const __m512 v1 = e4m3x16_to_ps(entry + LatentPageLayout::kFp8LatentOffset + d + 16, scale);
        _mm512_store_si512(key + d, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v1, v0)));
      }
    }
    const uint8_t* rope = entry + LatentPageLayout::kFp8RopeOffset;
    _mm512_store_si512(key + kMlaLatentDim, _mm512_loadu_si512(rope));
    _mm512_store_si512(key + kMlaLatentDim + 32, _mm512_loadu_si512(rope + 64));
    return;
  }
  for (int32_t d = 0; d < kMlaHeadDim; d += 32) {
    const __m512i k = _mm512_loadu_si512(entry + 2 * d);
    _mm512_store_si512(key + d, k);
  }
}

// S[e, z·16 + lane] = scale2 · Σ_pair dot(k_e pair, q pair) for E entries and Z head vectors.
//   keys: E × 576 bf16; qpack: [pair][group] words; s: [E][group] fp32.
template <int Z, int E>
SPIN_TARGET_AVX512BF16 inline void qk_micro(const uint16_t* keys, const uint32_t* qpack, int32_t group, __m512 scale2,
                                            float* s) {
  __m512 acc[E][Z];
#pragma GCC unroll 24
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int z = 0; z < Z; ++z) acc[e][z] = _mm512_setzero_ps();
  }
  for (int32_t pair = 0; pair < kPairs; ++pair) {
    const uint32_t* qrow = qpack + pair * group;
    __m512bh q[Z];
#pragma GCC unroll 4
    for (int z = 0; z < Z; ++z) q[z] = reinterpret_cast<__m512bh>(_mm512_load_si512(qrow + 16 * z));
#pragma GCC unroll 24
    for (int e = 0; e < E; ++e) {
      int32_t kpair;
      std::memcpy(&kpair, keys + e * kMlaHeadDim + 2 * pair, sizeof(kpair));
      const __m512bh k = reinterpret_cast<__m512bh>(_mm512_set1_epi32(kpair));
#pragma GCC unroll 4
      for (int z = 0; z < Z; ++z) acc[e][z] = _mm512_dpbf16_ps(acc[e][z], k, q[z]);
    }
  }
#pragma GCC unroll 24
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int z = 0; z < Z; ++z) _mm512_store_ps(s + e * group + 16 * z, _mm512_mul_ps(acc[e][z], scale2));
  }
}

template <int Z>
SPIN_TARGET_AVX512BF16 void qk_tile(const uint16_t* keys, int32_t padded_count, const uint32_t* qpack, __m512 scale2,
                                    float* s) {
  constexpr int E = 24 / Z;
  constexpr int32_t group = 16 * Z;
  for (int32_t e = 0; e < padded_count; e += E) {
    qk_micro<Z, E>(keys + e * kMlaHeadDim, qpack, group, scale2, s + e * group);
  }
}

// Online-softmax update over `count` scored entries: probs becomes 2^(S - m'), alpha = 2^(m - m').
SPIN_TARGET_AVX512BF16 void softmax_tile(float* probs, int32_t count, int32_t group, float* m, float* l,
                                         float* alpha) {
  for (int32_t z = 0; z < group; z += 16) {
    __m512 tile_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int32_t e = 0; e < count; ++e) tile_max = _mm512_max_ps(tile_max, _mm512_load_ps(probs + e * group + z));
    const __m512 m_old = _mm512_load_ps(m + z);
    const __m512 m_new = _mm512_max_ps(m_old, tile_max);
    const __m512 a = exp2_ps(_mm512_sub_ps(m_old, m_new));
    __m512 sum = _mm512_setzero_ps();
    for (int32_t e = 0; e < count; ++e) {
      const __m512 p = exp2_ps(_mm512_sub_ps(_mm512_load_ps(probs + e * group + z), m_new));
      _mm512_store_ps(probs + e * group + z, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_store_ps(m + z, m_new);
    _mm512_store_ps(l + z, _mm512_fmadd_ps(_mm512_load_ps(l + z), a, sum));
    _mm512_store_ps(alpha + z, a);
  }
}

// H heads × 64 dims of o: acc = alpha · o, then += probs[e, h] · v[e, :] for e < count, in order.
//   v: [count][64] fp32 (this dim block); pe: probs + h0 with row stride `group`; o: o + h0·512 + d0.
template <int H>
SPIN_TARGET_AVX512BF16 inline void pv_micro(const float* v, const float* pe, int32_t group, int32_t count,
                                            const float* alpha, float* o) {
  __m512 acc[H][4];
#pragma GCC unroll 4
  for (int i = 0; i < H; ++i) {
    const __m512 a = _mm512_set1_ps(alpha[i]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_mul_ps(_mm512_load_ps(o + i * kMlaLatentDim + 16 * j), a);
  }
  for (int32_t e = 0; e < count; ++e) {
    const __m512 v0 = _mm512_load_ps(v + e * kPvDims), v1 = _mm512_load_ps(v + e * kPvDims + 16);
    const __m512 v2 = _mm512_load_ps(v + e * kPvDims + 32), v3 = _mm512_load_ps(v + e * kPvDims + 48);
#pragma GCC unroll 4
    for (int i = 0; i < H; ++i) {
      const __m512 p = _mm512_set1_ps(pe[e * group + i]);
      acc[i][0] = _mm512_fmadd_ps(p, v0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(p, v1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(p, v2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(p, v3, acc[i][3]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < H; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_store_ps(o + i * kMlaLatentDim + 16 * j, acc[i][j]);
  }
}

// o[h, :] = alpha[h] · o[h, :] + Σ_{e < count} probs[e, h] · v[e, :] for the group's heads, with
// v[e, :] the latent part of the bf16 key tile, widened to fp32 one 64-dim block at a time into
// `block` ([kTile][64], L1-resident) — cheaper than keeping a full fp32 copy of the tile.
SPIN_TARGET_AVX512BF16 void pv_tile(const float* probs, const uint16_t* keys, float* block, int32_t count,
                                    int32_t group, const float* alpha, float* o) {
  for (int32_t d0 = 0; d0 < kMlaLatentDim; d0 += kPvDims) {
    for (int32_t e = 0; e < count; ++e) {
      const __m512i k0 = _mm512_load_si512(keys + e * kMlaHeadDim + d0);
      const __m512i k1 = _mm512_load_si512(keys + e * kMlaHeadDim + d0 + 32);
      float* v = block + e * kPvDims;
      _mm512_store_si512(v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(k0)), 16));
      _mm512_store_si512(v + 16, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(k0, 1)), 16));
      _mm512_store_si512(v + 32, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(k1)), 16));
      _mm512_store_si512(v + 48, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(k1, 1)), 16));
    }
    for (int32_t h0 = 0; h0 < group; h0 += kPvHeads) {  // group is a multiple of 16
      pv_micro<kPvHeads>(block, probs + h0, group, count, alpha + h0, o + h0 * kMlaLatentDim + d0);
    }
  }
}

// bf16 P·V (FlashMLA's precision): probabilities rounded to bf16, entries taken in pairs so that
// one vdpbf16ps adds p[e]·v[e] + p[e+1]·v[e+1] — half the instructions of the fp32 FMA path.
//   vpairs [pair][64] words: word d = v[2·pair][d0 + d] | v[2·pair + 1][d0 + d] << 16
//   ppairs [pair][group] words: word h = bf16(p[2·pair][h]) | bf16(p[2·pair + 1][h]) << 16
// An odd count pairs its last entry with a zero key row and a zero probability.
template <int H>
SPIN_TARGET_AVX512BF16 inline void pv_micro_bf16(const uint32_t* vpairs, const uint32_t* pp, int32_t group,
                                                 int32_t pairs, const float* alpha, float* o) {
  __m512 acc[H][4];
#pragma GCC unroll 4
  for (int i = 0; i < H; ++i) {
    const __m512 a = _mm512_set1_ps(alpha[i]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_mul_ps(_mm512_load_ps(o + i * kMlaLatentDim + 16 * j), a);
  }
  for (int32_t pair = 0; pair < pairs; ++pair) {
    const uint32_t* vp = vpairs + pair * kPvDims;
    const __m512bh v0 = reinterpret_cast<__m512bh>(_mm512_load_si512(vp));
    const __m512bh v1 = reinterpret_cast<__m512bh>(_mm512_load_si512(vp + 16));
    const __m512bh v2 = reinterpret_cast<__m512bh>(_mm512_load_si512(vp + 32));
    const __m512bh v3 = reinterpret_cast<__m512bh>(_mm512_load_si512(vp + 48));
#pragma GCC unroll 4
    for (int i = 0; i < H; ++i) {
      const __m512bh p = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(pp[pair * group + i])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], p, v0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], p, v1);
      acc[i][2] = _mm512_dpbf16_ps(acc[i][2], p, v2);
      acc[i][3] = _mm512_dpbf16_ps(acc[i][3], p, v3);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < H; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_store_ps(o + i * kMlaLatentDim + 16 * j, acc[i][j]);
  }
}

SPIN_TARGET_AVX512BF16 void pv_tile_bf16(const float* probs, const uint16_t* keys, uint32_t* vpairs,
                                         uint32_t* ppairs, int32_t count, int32_t group, const float* alpha,
                                         float* o) {
  const int32_t pairs = (count + 1) / 2;
  const __m512 zero = _mm512_setzero_ps();
  for (int32_t pair = 0; pair < pairs; ++pair) {
    const bool odd = 2 * pair + 1 >= count;
    for (int32_t z = 0; z < group; z += 16) {
      const __m512 p0 = _mm512_load_ps(probs + (2 * pair) * group + z);
      const __m512 p1 = odd ? zero : _mm512_load_ps(probs + (2 * pair + 1) * group + z);
      const __m512i w0 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p0)));
      const __m512i w1 = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p1)));
      _mm512_store_si512(ppairs + pair * group + z, _mm512_or_si512(w0, _mm512_slli_epi32(w1, 16)));
    }
  }
  // Word k of the result takes element k of a (low half) and element k of b (high half).
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(kLo);
  const __m512i hi = _mm512_load_si512(kHi);
  for (int32_t d0 = 0; d0 < kMlaLatentDim; d0 += kPvDims) {
    for (int32_t pair = 0; pair < pairs; ++pair) {
      // Rows past `count` are zero (run_task pads the key tile), so an odd count reads zeros.
      const uint16_t* a = keys + (2 * pair) * kMlaHeadDim + d0;
      const uint16_t* b = a + kMlaHeadDim;
      const __m512i a0 = _mm512_load_si512(a), a1 = _mm512_load_si512(a + 32);
      const __m512i b0 = _mm512_load_si512(b), b1 = _mm512_load_si512(b + 32);
      uint32_t* vp = vpairs + pair * kPvDims;
      _mm512_store_si512(vp, _mm512_permutex2var_epi16(a0, lo, b0));
      _mm512_store_si512(vp + 16, _mm512_permutex2var_epi16(a0, hi, b0));
      _mm512_store_si512(vp + 32, _mm512_permutex2var_epi16(a1, lo, b1));
      _mm512_store_si512(vp + 48, _mm512_permutex2var_epi16(a1, hi, b1));
    }
    for (int32_t h0 = 0; h0 < group; h0 += kPvHeads) {  // group is a multiple of 16
      pv_micro_bf16<kPvHeads>(vpairs, ppairs + h0, group, pairs, alpha + h0, o + h0 * kMlaLatentDim + d0);
    }
  }
}

template <int Z>
SPIN_TARGET_AVX512BF16 void qk_tile_dispatch(int32_t z, const uint16_t* keys, int32_t count, const uint32_t* qpack,
                                             __m512 scale2, float* s) {
  constexpr int E = 24 / Z;
  if (z == Z) {
    qk_tile<Z>(keys, (count + E - 1) / E * E, qpack, scale2, s);
  } else if constexpr (Z > 1) {
    qk_tile_dispatch<Z - 1>(z, keys, count, qpack, scale2, s);
  }
}

// One task: row `row`, padded heads [h0, h0 + width) (width a multiple of 16, ≤ 128), computed
// as sub-groups of ≤ 64 heads (4 zmm of accumulators) that share each gathered tile.
SPIN_TARGET_AVX512BF16 void run_task(const SparseAttentionParams& p, int64_t row, int32_t h0, int32_t width,
                                     const int32_t* selected, int32_t n, bool bf16_probabilities, Workspace& ws) {
  const int32_t heads = p.num_heads;
  const int32_t b = static_cast<int32_t>(row / p.next_n);
  // Sub-group g covers task heads [64g, 64g + sub_width(g)); its packed q is [pair][sub_width]
  // words at qpack + 64g·kPairs, its scores [entry][sub_width] at probs + 64g·kTile.
  auto sub_width = [&](int32_t g) { return std::min(kSubGroup, width - g * kSubGroup); };
  const int32_t n_sub = (width + kSubGroup - 1) / kSubGroup;
  const uint16_t* q_row = p.q + row * heads * kMlaHeadDim;
  for (int32_t g = 0; g < n_sub; ++g) {
    const int32_t sw = sub_width(g);
    uint32_t* qpack = ws.qpack + g * kSubGroup * kPairs;
    for (int32_t j = 0; j < sw; ++j) {
      const int32_t h = h0 + g * kSubGroup + j;
      if (h < heads) {
        const uint16_t* qh = q_row + h * kMlaHeadDim;
        for (int32_t pair = 0; pair < kPairs; ++pair) {
          uint32_t word;
          std::memcpy(&word, qh + 2 * pair, sizeof(word));
          qpack[pair * sw + j] = word;
        }
      } else {  // padded heads: zero queries, outputs never stored
        for (int32_t pair = 0; pair < kPairs; ++pair) qpack[pair * sw + j] = 0u;
      }
    }
  }
  std::fill_n(ws.m, width, -std::numeric_limits<float>::infinity());
  std::fill_n(ws.l, width, 0.0f);
  std::fill_n(ws.o, width * kMlaLatentDim, 0.0f);
  const __m512 scale2 = _mm512_set1_ps(p.softmax_scale * 1.4426950408889634f);  // scores in log2 units
  const int64_t entry_bytes = LatentPageLayout{p.dtype, p.page_size}.entry_bytes();
  for (int32_t t0 = 0; t0 < n; t0 += kTile) {
    const int32_t count = std::min(kTile, n - t0);
    for (int32_t i = 0; i < count; ++i) {
      gather_entry(p.dtype, attention_entry(p, b, selected[t0 + i]), ws.keys + i * kMlaHeadDim);
    }
    // Fetch the next tile's entries (at random addresses: no hardware prefetcher follows them)
    // into L2 while this tile computes. Written inline on purpose: GCC deletes calls to a
    // function whose only effect is prefetching (it is "const" to its IPA analysis).
    for (int32_t i = t0 + kTile; i < std::min(n, t0 + 2 * kTile); ++i) {
      const char* entry = reinterpret_cast<const char*>(attention_entry(p, b, selected[i]));
      for (int64_t line = 0; line < entry_bytes; line += 64) _mm_prefetch(entry + line, _MM_HINT_T1);
      _mm_prefetch(entry + entry_bytes - 1, _MM_HINT_T1);
    }
    // Micro-kernel rows past `count` (up to the next multiple of 24) read zero keys; ignored.
    const int32_t padded = (count + 23) / 24 * 24;
    std::fill_n(ws.keys + count * kMlaHeadDim, (padded - count) * kMlaHeadDim, uint16_t{0});
    for (int32_t g = 0; g < n_sub; ++g) {
      const int32_t sw = sub_width(g);
      float* probs = ws.probs + g * kSubGroup * kTile;
      qk_tile_dispatch<4>(sw / 16, ws.keys, count, ws.qpack + g * kSubGroup * kPairs, scale2, probs);
      softmax_tile(probs, count, sw, ws.m + g * kSubGroup, ws.l + g * kSubGroup, ws.alpha + g * kSubGroup);
      if (bf16_probabilities) {
        pv_tile_bf16(probs, ws.keys, reinterpret_cast<uint32_t*>(ws.vblock), ws.ppairs, count, sw,
                     ws.alpha + g * kSubGroup, ws.o + g * kSubGroup * kMlaLatentDim);
      } else {
        pv_tile(probs, ws.keys, ws.vblock, count, sw, ws.alpha + g * kSubGroup, ws.o + g * kSubGroup * kMlaLatentDim);
      }
    }
  }
  const int32_t real = std::min(width, heads - h0);
  float* out = p.out + (row * heads + h0) * kMlaLatentDim;
  for (int32_t j = 0; j < real; ++j) {
    const __m512 inv = _mm512_set1_ps(1.0f / ws.l[j]);
    for (int32_t d = 0; d < kMlaLatentDim; d += 16) {
      _mm512_storeu_ps(out + j * kMlaLatentDim + d, _mm512_mul_ps(_mm512_load_ps(ws.o + j * kMlaLatentDim + d), inv));
    }
    if (p.lse != nullptr) {
      p.lse[row * heads + h0 + j] =
          static_cast<float>((double{ws.m[j]} + std::log2(double{ws.l[j]})) * 0.69314718055994531);
    }
  }
}

}  // namespace

SPIN_TARGET_AVX512BF16 void attention_run_avx512bf16(const SparseAttentionParams& p, int num_threads,
                                                     int heads_per_task, bool bf16_probabilities) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
  const int32_t padded_heads = (heads + 15) / 16 * 16;
  // Head grouping only changes which thread computes a head, never its arithmetic: pick the
  // largest group (fewest re-gathers of the same entries) that still gives every thread two tasks.
  int32_t group = heads_per_task > 0 ? heads_per_task : kMaxTaskHeads;
  if (heads_per_task == 0) {
    while (group > 16 && rows * ((padded_heads + group - 1) / group) < 2 * int64_t{num_threads}) group /= 2;
  }
  const int32_t groups = (padded_heads + group - 1) / group;
  const int64_t tasks = rows * groups;
#pragma omp parallel num_threads(num_threads)
  {
    Workspace ws;
    std::vector<int32_t> selected(static_cast<size_t>(p.topk) + p.n_extra);
    int64_t selected_row = -1;
    int32_t n = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t row = task / groups;
      const int32_t h0 = static_cast<int32_t>(task % groups) * group;
      if (row != selected_row) {
        n = attention_selected_entries(p, row, selected.data());
        selected_row = row;
      }
      if (n == 0) {
        const int32_t real = std::min(group, heads - h0);
        std::fill_n(p.out + (row * heads + h0) * kMlaLatentDim, int64_t{real} * kMlaLatentDim, 0.0f);
        if (p.lse != nullptr) std::fill_n(p.lse + row * heads + h0, real, -std::numeric_limits<float>::infinity());
        continue;
      }
      run_task(p, row, h0, std::min(group, padded_heads - h0), selected.data(), n, bf16_probabilities, ws);
    }
  }
}

}  // namespace spin::detail
#endif  // __x86_64__
