// Turns a sidecar (offline/sidecar/sidecar.h) into the engine's sparse FFN plan: predictors as
// F16 weights (what the sidecar stores), thresholds, and the placement's device neuron tables.
// The offline side depends on the engine, never the reverse: this is the one bridge.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/sparse/sparse_ffn.h"
#include "offline/sidecar/sidecar.h"

namespace thermocline::offline {

struct SparseLoadOptions {
  // > 0: recalibrate every layer's magnitude threshold to drop this fraction of activations
  // (from the profile's |act| quantiles; SwiGLU). 0: the sidecar's thresholds.
  double target_sparsity = 0;
};

// The plan of a sidecar that belongs to `model` (CheckSidecarMatches); else its error.
absl::StatusOr<std::vector<SparseLayerPlan>> SparsePlanFromSidecar(
    const Sidecar& sidecar, const LlamaModel& model, const SparseLoadOptions& options = {});

// LoadSidecarFor + SparsePlanFromSidecar + SparseFfn::Create.
absl::StatusOr<std::unique_ptr<SparseFfn>> LoadSparseFfn(const std::string& sidecar_path,
                                                         const LlamaModel& model, ThreadPool* pool,
                                                         const SparseFfnOptions& ffn_options,
                                                         const SparseLoadOptions& options = {});

}  // namespace thermocline::offline
