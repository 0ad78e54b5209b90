// The register tile both fp32-FMA kernels share (indexer_fp32_simd.h, attention_fp32_simd.h):
// acc[e][j] = Σ_d keys[e, d] · qt[d, j-th head vector], dims summed in order with one FMA each;
// kHeadVectors query loads and E key broadcasts (from L1) feed E·kHeadVectors FMAs per dim.
//   keys: E × Dim floats; qt: [Dim][padded] floats starting at the head chunk.
// (Include only from a target-specific .cpp, inside its namespace, before the kernels.)

template <class V, int E, int Dim>
inline void dot_tile(const float* keys, const float* qt, int32_t padded, typename V::Reg (&acc)[E][V::kHeadVectors]) {
  constexpr int H = V::kHeadVectors;
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) acc[e][j] = V::zero();
  }
  for (int d = 0; d < Dim; ++d) {
    typename V::Reg q[H];
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) q[j] = V::load(qt + d * padded + j * V::kLanes);
#pragma GCC unroll 8
    for (int e = 0; e < E; ++e) {
      const typename V::Reg k = V::broadcast(keys + e * Dim + d);
#pragma GCC unroll 4
      for (int j = 0; j < H; ++j) acc[e][j] = V::fma(k, q[j], acc[e][j]);
    }
  }
}
