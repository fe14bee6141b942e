// A model's lifecycle, one vocabulary for the whole daemon (Triton's model_lifecycle.h): the
// registered model's job (registered → profiling → ready | failed, unloading while a delete is
// finished) and the served model's memory (unloaded → loading → ready | failed, unloading while
// requests still run on an unloaded instance). Stored (registry.db), compared, and shown (HTTP,
// gRPC, CLI) through the functions here only.
#pragma once

#include <optional>
#include <string_view>

namespace thermocline::server {

enum class ModelState {
  kRegistered,  // recorded; its profiling job is queued
  kProfiling,   // its job runs (profile, predictors, placement, sidecar)
  kLoading,     // its weights are being loaded
  kReady,       // served (its job finished, or it is loaded)
  kFailed,      // its job or its load failed (the error says why)
  kUnloading,   // being removed, or unloaded while requests still run on it
  kUnloaded,    // known, weights not in memory
};

// "registered", "profiling", "loading", "ready", "failed", "unloading", "unloaded".
const char* ModelStateName(ModelState s);
// The inverse of ModelStateName; nullopt for any other text.
std::optional<ModelState> ParseModelState(std::string_view name);
// A job that will not change by itself any more: ready or failed.
inline bool IsSettled(ModelState s) { return s == ModelState::kReady || s == ModelState::kFailed; }

}  // namespace thermocline::server
