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
         "FFN neurons the model computes on the GPU (0 when no device runs it).", "gauge");
  Header(&cpu, "thermocline_model_cpu_neurons", "FFN neurons the model computes on the CPU.",
         "gauge");
  for (const ServedModel* m : models) {
    const std::shared_ptr<const LoadedModel> l = m->loaded();
    const std::shared_ptr<const Engine> engine = l ? l->engine() : nullptr;
    const SparsePlan* plan = engine ? engine->sparse_plan() : nullptr;
    const std::string label = absl::StrCat("{model=\"", m->config.name, "\"}");
    absl::StrAppend(&loaded, "thermocline_model_loaded", label, " ", m->loaded() != nullptr ? 1 : 0,
                    "\n");
    absl::StrAppend(&sparse, "thermocline_model_sparse", label, " ", plan != nullptr ? 1 : 0, "\n");
    if (plan != nullptr) {
      // Where the neurons run now: the solved placement as this machine realised it.
      const EnginePlacement p = engine->placement();
      absl::StrAppend(&gpu, "thermocline_model_gpu_neurons", label, " ", p.gpu_neurons, "\n");
      absl::StrAppend(&cpu, "thermocline_model_cpu_neurons", label, " ",
                      p.ffn_neurons - p.gpu_neurons, "\n");
    }
  }
  return out + loaded + sparse + gpu + cpu;
}

}  // namespace thermocline::server
