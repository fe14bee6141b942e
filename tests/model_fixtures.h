// Shared by the model tests: load a test model once per process, read its reference JSON.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/llama_model.h"
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

}  // namespace thermocline::testing
