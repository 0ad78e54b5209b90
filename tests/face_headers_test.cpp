// The engine's face stands alone: every public header outside include/spin/lab/ compiles together
// and links against spin::spin only (tests/CMakeLists.txt links this file with spin_face and
// nothing of the lab), and none of them reaches a lab header (SPIN_FACE_ONLY makes one an error).
#define SPIN_FACE_ONLY 1
#include "spin/attention.h"
#include "spin/cache.h"
#include "spin/cpu.h"
#include "spin/files.h"
#include "spin/geometry.h"
#include "spin/indexer.h"
#include "spin/memory.h"
#include "spin/numerics.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"
#include "spin/rng.h"
#include "spin/selection_tables.h"
#include "spin/serving.h"
#include "spin/settings.h"
#include "spin/status.h"
#include "spin/topk.h"
#include "spin/trace.h"

#include <gtest/gtest.h>

namespace spin {
namespace {

// What an engine does with the face: a serving object for its batch, and its predictor's rows.
TEST(Face, AnEngineServesSpinFromTheFaceAlone) {
  ServingOptions o;
  o.max_requests = 2;
  o.num_layers = 2;
  o.max_entries = 4096;
  auto serving = ServingPredictor::create(o);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  const PredictorInfo* info = find_predictor(o.predictor);
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->can_serve);
  EXPECT_EQ(info->reads, PredictorReads::kOwnState);  // so it needs no PredictorInputs
}

// A mirror of the predictor on another device takes its per-block-count rules from the face.
TEST(Face, SelectionTablesLinkFromTheFaceAlone) {
  auto tables = selection_tables(PredictorConfig{}, 8);
  ASSERT_TRUE(tables.ok()) << tables.status().to_string();
  EXPECT_EQ(tables.value().budget.size(), 9u);
  EXPECT_GT(selection_constants().offset_mean_scale, 0.0);
}

}  // namespace
}  // namespace spin
