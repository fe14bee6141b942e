#include "server/model_metrics.h"

#include "absl/strings/str_cat.h"

namespace thermocline::server {
namespace {

void Header(std::string* out, const char* name, const char* help, const char* type) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Scalar(std::string* out, const char* name, const char* help, const char* type, int64_t v) {
  Header(out, name, help, type);
  absl::StrAppend(out, name, " ", v, "\n");
}

}  // namespace

std::string RenderModelMetrics(const ModelRegistry& registry) {
  const std::vector<ServedModel*> models = registry.models();
  const ResidentMemory& resident = registry.resident();
  std::string out;
  int64_t ready = 0;
  for (const ServedModel* m : models) ready += m->ready();
  Scalar(&out, "thermocline_models_ready", "Models loaded and serving.", "gauge", ready);
  Scalar(&out, "thermocline_models_loaded",
         "Models whose weights are in memory (an unloaded one stays until its requests end).",
         "gauge", resident.models.load());
  Scalar(&out, "thermocline_model_memory_bytes",
         "Bytes of the models in memory (GGUF file sizes), as charged to the budget.", "gauge",
         resident.bytes.load());
  Scalar(&out, "thermocline_model_memory_budget_bytes",
         "registry.model_memory_budget: bytes of models loaded at once; 0 = unlimited.", "gauge",
         registry.memory_budget());
  Scalar(&out, "thermocline_model_unloads_total",
         "Models unloaded (least recently used under the memory budget, or deleted).", "counter",
         resident.unloads.load());

  std::string loaded, sparse, gpu, cpu;
  Header(&loaded, "thermocline_model_loaded", "1 when the model is loaded, 0 when not.", "gauge");
  Header(&sparse, "thermocline_model_sparse", "1 when the model is served sparse, 0 when dense.",
         "gauge");
  Header(&gpu, "thermocline_model_gpu_neurons",
         "FFN neurons the model's placement puts on the GPU.", "gauge");
  Header(&cpu, "thermocline_model_cpu_neurons",
         "FFN neurons the model's placement leaves on the CPU.", "gauge");
  for (const ServedModel* m : models) {
    const auto source = m->sparse_source();
    const std::string label = absl::StrCat("{model=\"", m->config.name, "\"}");
    absl::StrAppend(&loaded, "thermocline_model_loaded", label, " ", m->loaded() != nullptr ? 1 : 0,
                    "\n");
    absl::StrAppend(&sparse, "thermocline_model_sparse", label, " ", source != nullptr ? 1 : 0,
                    "\n");
    if (source != nullptr) {
      absl::StrAppend(&gpu, "thermocline_model_gpu_neurons", label, " ",
                      source->placement.value("gpu_neurons", int64_t{0}), "\n");
      absl::StrAppend(&cpu, "thermocline_model_cpu_neurons", label, " ",
                      source->placement.value("cpu_neurons", int64_t{0}), "\n");
    }
  }
  return out + loaded + sparse + gpu + cpu;
}

}  // namespace thermocline::server
