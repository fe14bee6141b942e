// Shared by the model tests: load a test model once per process, read its reference JSON.
#pragma once

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/runtime/engine.h"
#include "test_util.h"

namespace thermocline::testing {

inline const LlamaModel& CachedModel(const std::string& path) {
  static std::map<std::string, std::unique_ptr<LlamaModel>> cache;
  auto it = cache.find(path);
  if (it == cache.end()) {
    auto model = LlamaModel::Load(path);
    INFO(path << ": " << model.status().ToString());
    REQUIRE(model.ok());
    it = cache.emplace(path, std::move(*model)).first;
  }
  return *it->second;
}

inline nlohmann::json LoadReference(const std::string& name) {
  std::ifstream in(TestModelPath(name));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Greedy continuation by argmax over the session's logits from an empty cache, no stopping at
// BOS/EOS (as the reference files were made).
inline std::vector<int32_t> GreedyIds(Session& session, const std::vector<int32_t>& prompt, int n) {
  session.Reset();
  absl::Status st = session.Eval(prompt);
  if (!st.ok()) FAIL(st.ToString());
  std::vector<int32_t> out;
  const int64_t n_vocab = session.model().hparams().n_vocab;
  for (int i = 0; i < n; ++i) {
    const float* l = session.logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    out.push_back(next);
    if (i + 1 < n) {
      st = session.Eval({&next, 1});
      if (!st.ok()) FAIL(st.ToString());
    }
  }
  return out;
}

// A session of `model` through the engine's front door (engine/runtime/engine.h), as the
// daemon and the tools build theirs. The session keeps its engine alive.
inline std::unique_ptr<EngineSession> NewEngineSession(const LlamaModel& model,
                                                       std::optional<SparsePlan> plan,
                                                       ThreadPool& pool,
                                                       const EngineOptions& options = {}) {
  auto engine = Engine::Create(model, std::move(plan), options, pool);
  INFO(engine.status().ToString());
  REQUIRE(engine.ok());
  auto session = (*engine)->NewSession(&pool);
  INFO(session.status().ToString());
  REQUIRE(session.ok());
  return *std::move(session);
}

}  // namespace thermocline::testing
