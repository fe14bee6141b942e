// PowerInfer's own GGUF: magic "PWRI", blk.N.ffn_down_t instead of ffn_down, and predictors
// blk.N.fc1 / blk.N.fc2 (no biases, threshold powerinfer.sparse_threshold). The file is built
// here from relu-tiny with an exact predictor: fc1 = [gate; -gate], fc2 = [I, -I] gives the
// logit relu(g) - relu(-g) = g, the gate's own pre-activation, so with threshold 0 the predicted
// set is exactly the firing set and sparse generation must equal dense.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/gguf/gguf.h"
#include "engine/model/session.h"
#include "engine/sparse/sparse_ffn.h"
#include "model_fixtures.h"
#include "offline/sparse_source.h"
#include "powerinfer_fixture.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::LoadReference;
using testing::TempDir;
using testing::TestModelPath;
using testing::WritePowerInferFile;

TEST_CASE("a PowerInfer file loads and runs sparse on its own predictors", "[sparse][powerinfer]") {
  const std::string source = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(source)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const std::string path = WritePowerInferFile(source);
  auto model = LlamaModel::Load(path);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  const LlamaModel& pwri = **model;
  CHECK(pwri.gguf().is_powerinfer());
  CHECK(pwri.hparams().activation == FfnActivation::kRelu);  // PowerInfer files are ReLU
  REQUIRE(pwri.carries_predictors());
  CHECK(pwri.layers()[0].ffn_down_t.data != nullptr);
  CHECK(pwri.layers()[0].ffn_down.data != nullptr);  // rebuilt for the dense path
  CHECK_FALSE(CachedModel(source).carries_predictors());
  CHECK_FALSE(SparsePlanFromModel(CachedModel(source)).ok());

  ThreadPool pool(2);
  const nlohmann::json ref = LoadReference("relu-tiny.reference.json");
  auto dense_engine = testing::NewEngineSession(pwri, std::nullopt, pool);
  // The file's own predictors are what the one sparse-source resolution picks with no sidecar.
  offline::SparseRequest request;
  request.model_path = path;
  auto resolved = offline::ResolveSparsePlan(pwri, request);
  REQUIRE(resolved.ok());
  REQUIRE(resolved->plan.has_value());
  CHECK(resolved->plan->source == SparsePlan::Source::kModelPredictors);
  CHECK(resolved->plan->layers[0].rank == 2 * pwri.hparams().n_ff);
  auto sparse_engine = testing::NewEngineSession(pwri, std::move(resolved->plan), pool);
  Session* const dense = &dense_engine->session();
  Session* const sparse_session = &sparse_engine->session();
  const SparseFfn* const sparse = sparse_engine->sparse();
  REQUIRE(sparse != nullptr);

  for (const auto& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = p["greedy_ids"].get<std::vector<int32_t>>();
    INFO(p["prompt"].get<std::string>());
    // Dense on the rebuilt down equals the independent reference; sparse equals dense.
    const std::vector<int32_t> d = testing::GreedyIds(*dense, prompt, 32);
    CHECK(d == std::vector<int32_t>(want.begin(), want.begin() + 32));
    CHECK(testing::GreedyIds(*sparse_session, prompt, 32) == d);
  }
  // The exact predictor fires only the neurons that fire: relu-tiny is ~84% sparse.
  const SparseFfnStats& st = sparse->stats();
  REQUIRE(st.layer_tokens > 0);
  const double predicted = st.predicted / st.layer_tokens / pwri.hparams().n_ff;
  CHECK(predicted < 0.4);
  CHECK(st.fired <= st.predicted);
}

}  // namespace
}  // namespace thermocline
