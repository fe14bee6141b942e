// The JSON shape of a registered model, shared by the HTTP admin API and the CLI.
#include "server/model_admin.h"

namespace thermocline::server {

nlohmann::json ModelInfoJson(const ModelInfo& info) {
  using nlohmann::json;
  json j = json::object();
  j["name"] = info.name;
  j["path"] = info.path;
  j["activation"] = info.activation.empty() ? json(nullptr) : json(info.activation);
  j["state"] = ModelStateName(info.state);
  j["stage"] = info.stage;
  j["percent"] = info.percent;
  j["eta_s"] = info.eta_s < 0 ? json(nullptr) : json(info.eta_s);
  j["last_error"] = info.last_error.empty() ? json(nullptr) : json(info.last_error);
  j["warning"] = info.warning.empty() ? json(nullptr) : json(info.warning);
  j["sidecar_path"] = info.sidecar_path.empty() ? json(nullptr) : json(info.sidecar_path);
  j["mode"] = info.mode;
  j["loaded"] = info.loaded;
  j["created_at"] = info.created_at;
  j["updated_at"] = info.updated_at;
  // A value that failed to parse (a corrupt row) is null, never written as invalid JSON.
  j["placement"] = info.placement.is_discarded() ? json(nullptr) : info.placement;
  j["report"] = info.report.is_discarded() ? json(nullptr) : info.report;
  j["runs_on"] = info.runs_on;
  j["gpu_memory"] = info.gpu_memory.empty() ? json(nullptr) : json(info.gpu_memory);
  j["gpu_layers"] = info.gpu_layers.empty() ? json(nullptr) : json(info.gpu_layers);
  j["version"] = info.version;
  return j;
}

}  // namespace thermocline::server
