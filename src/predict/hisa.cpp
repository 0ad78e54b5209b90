// HisaKeys (see hisa.h): incremental mean-pooled block keys and their scoring.
#include "predict/hisa.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cstring>

#include "core/errors.h"
#include "spin/geometry.h"
#include "spin/indexer.h"
#include "spin/numerics.h"

namespace spin {
namespace {

constexpr int64_t kDim = kIndexerHeadDim;  // 128 e4m3 values per entry

const std::array<float, 256>& e4m3_lut() {
  static const std::array<float, 256> lut = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = e4m3_to_float(static_cast<uint8_t>(c));
    return t;
  }();
  return lut;
}

}  // namespace

Status check_hisa_view(const PredictorConfig& config, const HisaView& v, int64_t num_entries,
                       int32_t next_n) {
  (void)next_n;
  if (v.page_size != config.page_size)
    return invalid_argument("hisa: view page_size {} differs from the config's page_size {}",
                            v.page_size, config.page_size);
  if (v.num_entries != num_entries)
    return invalid_argument("hisa: view num_entries {} differs from StepInput::num_entries {}",
                            v.num_entries, num_entries);
  if (v.num_heads < 1 || v.num_heads > 1024)
    return invalid_argument("hisa: num_heads {} is outside the supported 1..1024", v.num_heads);
  if (v.q == nullptr || v.w == nullptr) return invalid_argument("hisa: the view's q or w is null");
  if (num_entries > 0 && (v.key_cache == nullptr || v.block_table == nullptr))
    return invalid_argument("hisa: the view's key_cache or block_table is null");
  return ok_status();
}

Status HisaKeys::update(const HisaView& v, int64_t committed_entries) {
  const int64_t e = pool_;
  const int64_t ps = v.page_size;
  const int64_t nb = committed_entries <= 0 ? 0 : (committed_entries + e - 1) / e;
  if (static_cast<int64_t>(count_.size()) < nb) {
    count_.resize(static_cast<size_t>(nb), 0);
    sum_.resize(static_cast<size_t>(nb * kDim), 0.0f);
  }
  const int64_t first =
      complete_ < nb ? complete_ * e + count_[static_cast<size_t>(complete_)] : committed_entries;
  if (first >= committed_entries) return ok_status();
  // Check every page about to be read before touching a sum, so an error leaves them consistent.
  for (int64_t page = first / ps; page <= (committed_entries - 1) / ps; ++page) {
    const int32_t phys = v.block_table[page];
    if (phys < 0 || (v.num_cache_pages >= 0 && phys >= v.num_cache_pages))
      return out_of_range("hisa: block_table[{}] = {} is outside the cache's {} pages", page, phys,
                          v.num_cache_pages);
  }
  const std::array<float, 256>& lut = e4m3_lut();
  const IndexerPageLayout layout{v.page_size};
  for (int64_t b = complete_; b < nb; ++b) {
    int32_t& count = count_[static_cast<size_t>(b)];
    const int64_t end = std::min((b + 1) * e, committed_entries);
    float* sum = &sum_[static_cast<size_t>(b * kDim)];
    for (int64_t pos = b * e + count; pos < end; ++pos) {
      const uint8_t* page = v.key_cache + v.block_table[pos / ps] * layout.page_bytes();
      const auto o = static_cast<int32_t>(pos % ps);
      float scale;
      std::memcpy(&scale, page + layout.scale_offset(o), sizeof scale);
      const uint8_t* codes = page + layout.value_offset(o);
      for (int64_t d = 0; d < kDim; ++d) sum[d] += lut[codes[d]] * scale;
    }
    count = static_cast<int32_t>(std::max<int64_t>(count, end - b * e));
    if (count == e) complete_ = b + 1;
  }
  return ok_status();
}

Status HisaKeys::score(const HisaView& v, int32_t row, int64_t n_blocks, int32_t block_entries, float* p,
                       int64_t* scored, std::vector<float>* scratch) const {
  const int64_t heads = v.num_heads;
  const int64_t per_block = block_entries / pool_;
  const int64_t pools = std::min(static_cast<int64_t>(count_.size()), n_blocks * per_block);
  scratch->resize(static_cast<size_t>(heads * kDim + pools));
  float* q = scratch->data();
  float* pool_scores = q + heads * kDim;
  const std::array<float, 256>& lut = e4m3_lut();
  const uint8_t* qrow = v.q + static_cast<int64_t>(row) * heads * kDim;
  for (int64_t i = 0; i < heads * kDim; ++i) q[i] = lut[qrow[i]];
  const float* w = v.w + static_cast<int64_t>(row) * heads;
  SPIN_RETURN_IF_ERROR(score_fp32_keys(sum_.data(), pools, q, w, static_cast<int32_t>(heads), pool_scores));
  *scored = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float best = -FLT_MAX;
    bool any = false;
    for (int64_t g = b * per_block; g < std::min((b + 1) * per_block, pools); ++g) {
      const int32_t count = count_[static_cast<size_t>(g)];
      if (count == 0) continue;
      // ReLU(q·(sum/c)) = ReLU(q·sum)/c for c > 0: divide once per pool.
      best = std::max(best, pool_scores[g] / static_cast<float>(count));
      any = true;
      ++*scored;
    }
    p[b] = any ? best : FLT_MAX;
  }
  return ok_status();
}

void HisaKeys::reset() {
  sum_.clear();
  count_.clear();
  complete_ = 0;
}

void HisaKeys::truncate(int64_t shared_entries) {
  const int64_t full = shared_entries / pool_;
  if (static_cast<int64_t>(count_.size()) > full) {
    count_.resize(static_cast<size_t>(full));
    sum_.resize(static_cast<size_t>(full * kDim));
  }
  complete_ = std::min(complete_, full);
}

}  // namespace spin
