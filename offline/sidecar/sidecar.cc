// Model identity and the model/sidecar match check.
#include "offline/sidecar/sidecar.h"

#include "absl/strings/str_cat.h"
#include "offline/util/hash.h"

namespace thermocline::offline {

std::string ModelIdentity(const GgufFile& model_file) {
  Fnv1a64 h;
  h.UpdateU64(model_file.tensors().size());
  for (const GgufTensorInfo& t : model_file.tensors()) {
    h.Update(t.name);
    h.UpdateU64(static_cast<uint64_t>(t.type));
    h.UpdateU64(t.dims.size());
    for (int64_t d : t.dims) h.UpdateU64(static_cast<uint64_t>(d));
    h.UpdateU64(t.size_bytes);
  }
  return h.Hex();
}

absl::Status CheckSidecarMatches(const Sidecar& s, const LlamaModel& model) {
  const LlamaHparams& hp = model.hparams();
  const std::string redo = "; run `thermocline profile` for this model to make a new sidecar";
  if (s.n_layer != hp.n_layer || s.n_embd != hp.n_embd || s.n_ff != hp.n_ff) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sidecar belongs to another model: it was made for ", s.n_layer, " layers, n_embd ",
        s.n_embd, ", n_ff ", s.n_ff, " ('", s.model_name, "'), this model has ", hp.n_layer,
        " layers, n_embd ", hp.n_embd, ", n_ff ", hp.n_ff, redo));
  }
  if (s.n_expert != hp.n_expert || s.n_expert_used != hp.n_expert_used) {
    return absl::FailedPreconditionError(
        absl::StrCat("sidecar belongs to another model: it was made for ", s.n_expert, " experts (",
                     s.n_expert_used, " used), this model has ", hp.n_expert, " (",
                     hp.n_expert_used, " used)", redo));
  }
  const std::string identity = ModelIdentity(model.gguf());
  if (s.model_identity != identity) {
    return absl::FailedPreconditionError(
        absl::StrCat("sidecar belongs to another model: its model identity is ", s.model_identity,
                     " ('", s.model_name, "'), this model's is ", identity,
                     " (same shapes, but other tensors, types or sizes)", redo));
  }
  if (s.activation != ActivationName(hp.activation)) {
    return absl::FailedPreconditionError(absl::StrCat("sidecar was profiled with activation '",
                                                      s.activation, "' but the model runs '",
                                                      ActivationName(hp.activation), "'", redo));
  }
  return absl::OkStatus();
}

absl::StatusOr<Sidecar> LoadSidecarFor(const std::string& path, const LlamaModel& model) {
  auto s = ReadSidecar(path);
  if (!s.ok()) return s.status();
  if (absl::Status st = CheckSidecarMatches(*s, model); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", st.message()));
  }
  return s;
}

}  // namespace thermocline::offline
