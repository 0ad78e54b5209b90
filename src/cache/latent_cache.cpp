// MLA latent cache (spin/cache.h): entry encoding in both layouts of spin/geometry.h, and paged
// writes and reads through the request page tables the indexer cache uses too.
#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "spin/cache.h"

namespace spin {

// ---------------------------------------------------------------------------------------------
// Entry encoding

void encode_latent_entry(LatentDtype dtype, const float* values, uint8_t* entry) {
  if (dtype == LatentDtype::kBf16) {
    for (int32_t d = 0; d < kMlaHeadDim; ++d) {
      const uint16_t bits = bf16_from_float(values[d]);
      std::memcpy(entry + 2 * d, &bits, 2);
    }
    return;
  }
  for (int32_t t = 0; t < kMlaNumTiles; ++t) {
    const float scale = quantize_e4m3_block128(values + t * kMlaTileDim,
                                               entry + LatentPageLayout::kFp8LatentOffset + t * kMlaTileDim);
    std::memcpy(entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, &scale, 4);
  }
  for (int32_t j = 0; j < kMlaRopeDim; ++j) {
    const uint16_t bits = bf16_from_float(values[kMlaLatentDim + j]);
    std::memcpy(entry + LatentPageLayout::kFp8RopeOffset + 2 * j, &bits, 2);
  }
}

void decode_latent_entry(LatentDtype dtype, const uint8_t* entry, float* values) {
  if (dtype == LatentDtype::kBf16) {
    for (int32_t d = 0; d < kMlaHeadDim; ++d) {
      uint16_t bits;
      std::memcpy(&bits, entry + 2 * d, 2);
      values[d] = bf16_to_float(bits);
    }
    return;
  }
  for (int32_t t = 0; t < kMlaNumTiles; ++t) {
    float scale;
    std::memcpy(&scale, entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, 4);
    for (int32_t d = t * kMlaTileDim; d < (t + 1) * kMlaTileDim; ++d) {
      values[d] = e4m3_to_float(entry[LatentPageLayout::kFp8LatentOffset + d]) * scale;
    }
  }
  for (int32_t j = 0; j < kMlaRopeDim; ++j) {
    uint16_t bits;
    std::memcpy(&bits, entry + LatentPageLayout::kFp8RopeOffset + 2 * j, 2);
    values[kMlaLatentDim + j] = bf16_to_float(bits);
  }
}

// ---------------------------------------------------------------------------------------------
// LatentCache

Result<LatentCache> LatentCache::create(LatentDtype dtype, int32_t page_size, int32_t num_pages) {
  if (dtype != LatentDtype::kBf16 && dtype != LatentDtype::kFp8) {
    return invalid_argument("latent dtype {} is not supported (bf16 = 0, fp8 = 1)", static_cast<int32_t>(dtype));
  }
  const std::string what = std::string("latent ") + latent_dtype_name(dtype);
  auto buffer = allocate(what.c_str(), page_size, LatentPageLayout{dtype, page_size}.page_bytes(), num_pages);
  if (!buffer.ok()) return buffer.status();
  return LatentCache(std::move(buffer).value(), dtype);
}

Status LatentCache::write(const int32_t* pages, int64_t num_pages_in_table, int64_t first_position,
                          const float* entries, int64_t count) {
  SPIN_RETURN_IF_ERROR(check_span(pages, num_pages_in_table, first_position, count));
  if (count > 0 && entries == nullptr) return invalid_argument("entries is null");
  for (int64_t i = 0; i < count * kMlaHeadDim; ++i) {
    if (!std::isfinite(entries[i])) {
      return invalid_argument("entry {} dim {} is {}; latent and rope values must be finite", i / kMlaHeadDim,
                              i % kMlaHeadDim, entries[i]);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t pos = first_position + i;
    encode_latent_entry(dtype_, entries + i * kMlaHeadDim, page_of(pages, pos) + layout().entry_offset(offset_in_page(pos)));
  }
  return ok_status();
}

Status LatentCache::read_entry(const int32_t* pages, int64_t num_pages_in_table, int64_t position,
                               float* values) const {
  SPIN_RETURN_IF_ERROR(check_span(pages, num_pages_in_table, position, 1));
  if (values == nullptr) return invalid_argument("values is null");
  decode_latent_entry(dtype_, page_of(pages, position) + layout().entry_offset(offset_in_page(position)), values);
  return ok_status();
}

}  // namespace spin
