#include "server/model_state.h"

namespace thermocline::server {
namespace {

constexpr struct {
  ModelState state;
  const char* name;
} kNames[] = {
    {ModelState::kRegistered, "registered"}, {ModelState::kProfiling, "profiling"},
    {ModelState::kLoading, "loading"},       {ModelState::kReady, "ready"},
    {ModelState::kFailed, "failed"},         {ModelState::kUnloading, "unloading"},
    {ModelState::kUnloaded, "unloaded"},
};

}  // namespace

const char* ModelStateName(ModelState s) {
  for (const auto& n : kNames) {
    if (n.state == s) return n.name;
  }
  return "?";
}

std::optional<ModelState> ParseModelState(std::string_view name) {
  for (const auto& n : kNames) {
    if (name == n.name) return n.state;
  }
  return std::nullopt;
}

}  // namespace thermocline::server
