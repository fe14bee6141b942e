// The engine's front door: plans where a model's parts run, builds the shared sparse copies once
// and wires each session's Session, SparseFfn and GpuLayers together.
#include "engine/runtime/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace thermocline {
namespace {

// Stands in for the sparse FFN while the device memory of hybrid layers is computed (which only
// asks whether the FFN runs on the host).
class HostFfnPlaceholder : public FfnBackend {
 public:
  void Forward(int, const float*, const float*, int64_t, float*) override {}
};

std::string MiB(uint64_t bytes) { return absl::StrCat(bytes >> 20, " MiB"); }

int64_t CountOn(const std::vector<uint8_t>& v) { return std::count(v.begin(), v.end(), 1); }

}  // namespace

absl::StatusOr<std::shared_ptr<const Engine>> Engine::Create(const LlamaModel& model,
                                                             std::optional<SparsePlan> plan,
                                                             const EngineOptions& options,
                                                             ThreadPool& build_pool) {
  const LlamaHparams& h = model.hparams();
  if (options.n_ctx < 0) {
    return absl::InvalidArgumentError(absl::StrCat("context length ", options.n_ctx,
                                                   ": it must be positive (0: the model's own)"));
  }
  int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : h.n_ctx_train;
  if (n_ctx <= 0) n_ctx = 2048;  // a file that does not say
  if (options.max_batch < 1 || options.max_batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", options.max_batch, " must be in [1, 4096]"));
  }
  if (options.gpu_layers != kNoGpuLayers && options.gpu_layers != gpu::kAutoLayers &&
      options.gpu_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-layers ", options.gpu_layers));
  }
  std::vector<SparseLayerPlan> layers;
  if (plan.has_value()) {
    if (static_cast<int64_t>(plan->layers.size()) != h.n_layer) {
      return absl::InvalidArgumentError(absl::StrCat("the sparse plan has ", plan->layers.size(),
                                                     " layers, the model ", h.n_layer));
    }
    if (!plan->attention_gpu.empty() &&
        static_cast<int64_t>(plan->attention_gpu.size()) != h.n_layer) {
      return absl::InvalidArgumentError(
          "the sparse plan's attention placement has the wrong "
          "number of layers");
    }
    if (plan->source == SparsePlan::Source::kOracle) plan->oracle = true;
    layers = std::move(plan->layers);
    plan->layers.clear();
  }
  std::shared_ptr<Engine> engine(new Engine(model, std::move(plan), options, n_ctx));
  if (engine->plan_.has_value() && h.is_moe()) {
    absl::StatusOr<std::shared_ptr<const ExpertWeights>> experts =
        ExpertWeights::Build(model, std::move(layers), build_pool,
                             /*sparse_host=*/!options.moe_all_experts);
    if (!experts.ok()) return experts.status();
    engine->experts_ = *std::move(experts);
  } else if (engine->plan_.has_value()) {
    absl::StatusOr<std::shared_ptr<const SparseWeights>> weights =
        SparseWeights::Build(model, std::move(layers), build_pool);
    if (!weights.ok()) return weights.status();
    engine->weights_ = *std::move(weights);
  }
  if (absl::Status s = engine->PlanDevice(); !s.ok()) return s;
  if (options.repack) {
    engine->packed_ = PackedWeights::Build(model, engine->DenseCpuScope(), build_pool);
  }
  return std::shared_ptr<const Engine>(std::move(engine));
}

PackScope Engine::DenseCpuScope() const {
  const int64_t n_layer = model_.hparams().n_layer;
  PackScope scope;
  scope.attention.assign(n_layer, 1);
  // The sparse FFN and the placed experts have their own copies, and with dense_prefill read
  // the file's FFN rows for prompts: their layers' FFN stays as the file has it. An
  // input-sparse layer's prompts are the session's dense FFN: re-laid like a dense layer's.
  scope.ffn.assign(n_layer, weights_ == nullptr && experts_ == nullptr ? 1 : 0);
  for (int64_t l = 0; weights_ != nullptr && l < n_layer; ++l) {
    if (weights_->input_sparse(static_cast<int>(l))) scope.ffn[l] = 1;
  }
  scope.output = true;
  if (use_device_) {
    // Device layers upload the file's rows for every session (and a session that finds the
    // budget spent runs them here from the same rows).
    for (int64_t l = 0; l < n_layer && l < static_cast<int64_t>(layers_spec_.layers.size()); ++l) {
      if (!layers_spec_.layers[l]) continue;
      scope.attention[l] = 0;
      if (whole_layers_) scope.ffn[l] = 0;
    }
    scope.output = !layers_spec_.output;
  }
  return scope;
}

Engine::Engine(const LlamaModel& model, std::optional<SparsePlan> plan,
               const EngineOptions& options, int64_t n_ctx)
    : model_(model), plan_(std::move(plan)), options_(options), n_ctx_(n_ctx) {
  const LlamaHparams& h = model.hparams();
  placement_.gpu_requested = options.gpu_requested();
  placement_.n_layer = h.n_layer;
  placement_.ffn_neurons = h.is_moe() ? 0 : h.n_layer * h.n_ff;
  placement_.experts = h.n_layer * h.n_expert;
  placement_.sparse = plan_.has_value();
  if (plan_.has_value()) {
    placement_.oracle = plan_->oracle;
    placement_.sparse_source = plan_->source;
    placement_.sparse_method = SparseMethodsOf(plan_->layers);
  }
}

Engine::~Engine() = default;

const gpu::Device& Engine::device() const {
  return options_.device != nullptr ? *options_.device : gpu::CudaDevice();
}

absl::Status Engine::PlanDevice() {
  if (!options_.gpu_requested()) return absl::OkStatus();
  absl::StatusOr<gpu::DeviceInfo> info = device().Probe(options_.device_index);
  if (!info.ok()) {
    if (!absl::IsUnavailable(info.status()) && !absl::IsNotFound(info.status())) {
      return info.status();
    }
    placement_.note = std::string(info.status().message());
    return absl::OkStatus();
  }
  const uint64_t free =
      info->free_bytes > kDeviceReserveBytes ? info->free_bytes - kDeviceReserveBytes : 0;
  uint64_t cap = free;
  if (options_.gpu_memory > 0) {
    cap = std::min(options_.gpu_memory, free);
    if (cap < options_.gpu_memory) {
      placement_.note =
          absl::StrCat("--gpu-memory ", MiB(options_.gpu_memory), " is more than ", info->name,
                       " has free (", MiB(info->free_bytes), ", less ", MiB(kDeviceReserveBytes),
                       " for the CUDA context and cuBLAS): capped at ", MiB(cap));
    }
  }
  budget_ = std::make_unique<gpu::MemoryBudget>(cap);
  placement_.gpu_cap = cap;
  const LlamaHparams& h = model_.hparams();

  // An input-sparse or gate-first plan has no neurons to place unless a placement was solved for
  // it: its layers go whole, input-sparse or gate-first there too.
  std::vector<gpu::InputSparseLayer> input_sparse =
      weights_ != nullptr ? DeviceInputSparse(*weights_) : std::vector<gpu::InputSparseLayer>();
  std::vector<gpu::GateFirstLayer> gate_first =
      weights_ != nullptr ? DeviceGateFirst(*weights_) : std::vector<gpu::GateFirstLayer>();
  // (An input-sparse layer has no device neurons: a placement solved into the sidecar places
  // nothing of a plan whose every layer is input-sparse.)
  bool placed = experts_ != nullptr;
  if (plan_.has_value() && weights_ != nullptr) {
    const std::vector<SparseLayerPlan>& layers = weights_->plan();
    const bool all_input_sparse = std::all_of(
        layers.begin(), layers.end(),
        [](const SparseLayerPlan& p) { return p.method == SparseMethod::kInputSparse; });
    placed = (!plan_->attention_gpu.empty() && !all_input_sparse) ||
             std::any_of(layers.begin(), layers.end(), [](const SparseLayerPlan& p) {
               return p.method != SparseMethod::kInputSparse && !p.device_neurons.empty();
             });
  }
  if (options_.gpu_layers != kNoGpuLayers || !plan_.has_value() ||
      ((!input_sparse.empty() || !gate_first.empty()) && !placed)) {
    // Whole layers, the first ones (-ngl), dense or input-sparse as the plan's layers are; the
    // sparse FFN (if any) runs the CPU layers.
    const int64_t requested =
        options_.gpu_layers == kNoGpuLayers ? gpu::kAutoLayers : options_.gpu_layers;
    if (requested == 0) return absl::OkStatus();
    absl::StatusOr<gpu::GpuLayersSpec> spec =
        gpu::PlanWholeLayers(model_, requested, n_ctx_, options_.max_batch, cap, options_.kv_type,
                             std::move(input_sparse), std::move(gate_first));
    if (!spec.ok()) return spec.status();
    spec->dense_prefill = options_.dense_prefill;
    const int64_t n = CountOn(spec->layers);
    if (n == 0) {
      if (placement_.note.empty()) {
        placement_.note = absl::StrCat("no whole layer fits in ", MiB(cap), " of device memory");
      }
      return absl::OkStatus();
    }
    layers_spec_ = *std::move(spec);
    whole_layers_ = true;
    use_device_ = true;
    placement_.device = info->name;
    placement_.gpu_layers = n;
    for (int64_t l = 0; l < h.n_layer; ++l) {
      if (!layers_spec_.layers[l]) continue;
      if (layers_spec_.input_sparse_on(l)) ++placement_.gpu_input_sparse_layers;
      if (layers_spec_.gate_first_on(l)) ++placement_.gpu_gate_first_layers;
    }
    placement_.output_gpu = layers_spec_.output;
    placement_.gpu_bytes = gpu::ComputeGpuLayersMemory(layers_spec_).Total(layers_spec_);
    return absl::OkStatus();
  }

  if (experts_ != nullptr) {  // the placement's experts on the device, all else on the CPU
    const int64_t n = experts_->n_device_experts();
    if (n == 0) {
      placement_.note =
          "the expert placement puts no expert on the GPU (solve it for this machine: "
          "thermocline solve --gpu-memory BYTES)";
      return absl::OkStatus();
    }
    use_device_ = true;
    placement_.device = info->name;
    placement_.gpu_experts = n;
    return absl::OkStatus();
  }

  // The hybrid placement: the plan's attention layers (and head) on the device, its device
  // neurons there too.
  layers_spec_.model = &model_;
  layers_spec_.layers.assign(h.n_layer, 0);
  if (!plan_->attention_gpu.empty()) layers_spec_.layers = plan_->attention_gpu;
  // An input-sparse layer stays on the CPU whole, as the CPU engine runs it: its q/k/v read
  // column-sparse (SparseFfn::ProjectQkv) and a prompt's FFN dense, neither of which the
  // hybrid device layer (dense attention, the FFN through SparseFfn::Forward) does.
  for (int64_t l = 0; l < h.n_layer; ++l) {
    if (weights_->input_sparse(static_cast<int>(l))) layers_spec_.layers[l] = 0;
  }
  layers_spec_.output = plan_->output_gpu && h.n_layer > 0 && layers_spec_.layers[h.n_layer - 1];
  layers_spec_.n_ctx = n_ctx_;
  layers_spec_.max_batch = options_.max_batch;
  layers_spec_.kv_type = options_.kv_type;
  int64_t neurons = 0;
  for (const SparseLayerPlan& p : weights_->plan()) {
    neurons += static_cast<int64_t>(p.device_neurons.size());
  }
  const int64_t n_attn = CountOn(layers_spec_.layers);
  if (neurons == 0 && n_attn == 0) {
    placement_.note =
        "the sparse plan places nothing on the GPU (solve its placement for this machine: "
        "thermocline solve --gpu-memory BYTES)";
    return absl::OkStatus();
  }
  use_device_ = true;
  placement_.device = info->name;
  placement_.attention_gpu_layers = n_attn;
  placement_.output_gpu = layers_spec_.output;
  placement_.gpu_neurons = neurons;
  return absl::OkStatus();
}

SparseFfnOptions Engine::FfnOptions(bool on_device, gpu::Queue* queue) const {
  SparseFfnOptions o;
  o.oracle = plan_->oracle;
  o.dense_prefill = options_.dense_prefill;
  o.max_batch = options_.max_batch;
  if (on_device) {
    o.gpu = true;
    o.gpu_budget = budget_.get();
    o.gpu_memory = budget_->cap();
    o.device = &device();
    o.gpu_queue = queue;
  }
  return o;
}

MoeFfnOptions Engine::ExpertOptions(bool on_device, gpu::Queue* queue) const {
  MoeFfnOptions o;
  o.dense_prefill = options_.dense_prefill;
  o.all_experts = options_.moe_all_experts;
  o.max_batch = options_.max_batch;
  if (on_device) {
    o.device = &device();
    o.budget = budget_.get();
    o.gpu_memory = budget_->cap();
    o.queue = queue;
    o.device_index = options_.device_index;
  }
  return o;
}

absl::Status Engine::AttachExperts(EngineSession* s, ThreadPool* pool) const {
  EnginePlacement& p = s->placement_;
  absl::StatusOr<std::unique_ptr<MoeFfn>> moe =
      MoeFfn::Create(experts_, pool, ExpertOptions(/*on_device=*/true, s->queue_.get()));
  if (!moe.ok()) {
    if (!absl::IsResourceExhausted(moe.status())) return moe.status();
    p.note = absl::StrCat("the device experts do not fit (", moe.status().message(),
                          "); this session runs on the CPU");
    return absl::OkStatus();
  }
  if (!(*moe)->on_device()) {
    p.note = absl::StrCat((*moe)->device_status().message(), "; this session runs on the CPU");
    return absl::OkStatus();
  }
  s->session_->set_ffn_backend(nullptr);
  s->moe_ = *std::move(moe);
  s->session_->set_ffn_backend(s->moe_.get());
  p.device = placement_.device;
  p.gpu_experts = placement_.gpu_experts;
  p.gpu_bytes = s->device_bytes();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EngineSession>> Engine::NewSession(ThreadPool* pool) const {
  std::unique_ptr<EngineSession> s(new EngineSession());
  s->engine_ = shared_from_this();
  SessionOptions so;
  so.n_ctx = n_ctx_;
  so.max_batch = options_.max_batch;
  so.kv_type = options_.kv_type;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(model_, pool, so);
  if (!session.ok()) return session.status();
  s->session_ = *std::move(session);
  s->session_->set_packed_weights(packed_.get());
  EnginePlacement& p = s->placement_;
  p.gpu_requested = placement_.gpu_requested;
  p.n_layer = placement_.n_layer;
  p.ffn_neurons = placement_.ffn_neurons;
  p.experts = placement_.experts;
  p.sparse = placement_.sparse;
  p.oracle = placement_.oracle;
  p.sparse_source = placement_.sparse_source;
  p.sparse_method = placement_.sparse_method;
  p.gpu_cap = placement_.gpu_cap;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p.note = placement_.note;  // why the plan itself left parts off the device
  }
  if (weights_ != nullptr) {
    absl::StatusOr<std::unique_ptr<SparseFfn>> ffn =
        SparseFfn::Create(weights_, pool, FfnOptions(/*on_device=*/false, nullptr));
    if (!ffn.ok()) return ffn.status();
    s->sparse_ = *std::move(ffn);
    s->session_->set_ffn_backend(s->sparse_.get());
  }
  if (experts_ != nullptr) {
    absl::StatusOr<std::unique_ptr<MoeFfn>> moe =
        MoeFfn::Create(experts_, pool, ExpertOptions(/*on_device=*/false, nullptr));
    if (!moe.ok()) return moe.status();
    s->moe_ = *std::move(moe);
    s->session_->set_ffn_backend(s->moe_.get());
  }
  if (use_device_) {
    if (absl::Status st = AttachDevice(s.get(), pool); !st.ok()) return st;
  }
  Realized(p);
  return s;
}

absl::Status Engine::AttachDevice(EngineSession* s, ThreadPool* pool) const {
  EnginePlacement& p = s->placement_;
  // One queue for the session's device work: its layers and its FFN executor.
  absl::StatusOr<std::unique_ptr<gpu::Queue>> queue = device().CreateQueue(options_.device_index);
  if (!queue.ok()) {
    p.note = absl::StrCat("no device queue: ", queue.status().message(),
                          "; this session runs on the CPU");
    return absl::OkStatus();
  }
  s->queue_ = *std::move(queue);
  if (experts_ != nullptr) return AttachExperts(s, pool);
  if (whole_layers_) {
    gpu::GpuLayersSpec spec = layers_spec_;
    spec.budget = budget_.get();
    spec.queue = s->queue_.get();
    absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> layers = device().CreateLayers(spec);
    if (!layers.ok()) {
      if (!absl::IsResourceExhausted(layers.status()) && !absl::IsUnavailable(layers.status())) {
        return layers.status();
      }
      p.note = absl::StrCat("whole layers on the device: ", layers.status().message(),
                            "; this session runs on the CPU");
      return absl::OkStatus();
    }
    s->layers_ = *std::move(layers);
    s->session_->set_layer_backend(s->layers_.get());
    p.device = placement_.device;
    p.gpu_layers = s->layers_->n_gpu_layers();
    p.gpu_input_sparse_layers = placement_.gpu_input_sparse_layers;
    p.gpu_gate_first_layers = placement_.gpu_gate_first_layers;
    p.output_gpu = s->layers_->output_on_gpu();
    p.gpu_bytes = s->layers_->device_bytes();
    return absl::OkStatus();
  }

  const int64_t n_attn = CountOn(layers_spec_.layers);
  const bool neurons_on_device = placement_.gpu_neurons > 0;
  std::string why;
  for (bool with_attention : {true, false}) {
    if (with_attention && n_attn == 0) continue;
    if (!with_attention && !neurons_on_device) break;
    gpu::GpuLayersSpec spec = layers_spec_;
    spec.budget = budget_.get();
    spec.queue = s->queue_.get();
    HostFfnPlaceholder placeholder;
    spec.host_ffn = &placeholder;
    const uint64_t layer_bytes = with_attention ? gpu::ComputeGpuLayersMemory(spec).Total(spec) : 0;
    // The layers' memory is held while the FFN's device part is uploaded, so that the hot
    // neurons take only what the layers leave.
    if (layer_bytes > 0) {
      if (absl::Status r = budget_->Reserve(layer_bytes, "the hybrid layers"); !r.ok()) {
        why = std::string(r.message());
        continue;
      }
    }
    absl::StatusOr<std::unique_ptr<SparseFfn>> ffn =
        SparseFfn::Create(weights_, pool, FfnOptions(neurons_on_device, s->queue_.get()));
    if (layer_bytes > 0) budget_->Release(layer_bytes);
    if (!ffn.ok()) {
      if (!absl::IsResourceExhausted(ffn.status())) return ffn.status();
      why = std::string(ffn.status().message());
      continue;
    }
    if (neurons_on_device && !(*ffn)->gpu_status().ok()) {
      why = std::string((*ffn)->gpu_status().message());
      break;
    }
    std::unique_ptr<gpu::GpuLayers> layers;
    if (with_attention) {
      spec.host_ffn = ffn->get();
      // Resident: the layers drive the FFN's device part on the same queue.
      spec.device_ffn = (*ffn)->gpu_executor();
      absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> l = device().CreateLayers(spec);
      if (!l.ok()) {
        if (!absl::IsResourceExhausted(l.status()) && !absl::IsInvalidArgument(l.status())) {
          return l.status();
        }
        why = std::string(l.status().message());
        continue;
      }
      layers = *std::move(l);
    }
    s->session_->set_ffn_backend(nullptr);
    s->sparse_ = *std::move(ffn);
    s->session_->set_ffn_backend(s->sparse_.get());
    s->layers_ = std::move(layers);
    s->session_->set_layer_backend(s->layers_.get());
    p.device = placement_.device;
    p.attention_gpu_layers = with_attention ? n_attn : 0;
    p.output_gpu = with_attention && layers_spec_.output;
    p.gpu_neurons = neurons_on_device ? placement_.gpu_neurons : 0;
    p.gpu_bytes = s->device_bytes();
    if (!with_attention && n_attn > 0) {
      p.note = absl::StrCat("the placement's ", n_attn, " attention layers do not fit beside its ",
                            "hot neurons (", why, "): hot neurons only");
    }
    return absl::OkStatus();
  }
  p.note = absl::StrCat("the hybrid placement does not fit on the device (", why,
                        "); this session runs on the CPU");
  return absl::OkStatus();
}

void Engine::Realized(const EnginePlacement& p) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The first session decides what the model reports, unless it missed the device and a later
  // one reached it.
  if (!realized_ || (p.gpu_bytes > 0 && placement_.gpu_bytes == 0)) {
    placement_ = p;
    realized_ = true;
  }
}

EnginePlacement Engine::placement() const {
  std::lock_guard<std::mutex> lock(mu_);
  return placement_;
}

std::string DescribePlacement(const EnginePlacement& p) {
  std::string out;
  if (p.device.empty()) {
    out = "all on the CPU";
  } else if (p.gpu_experts > 0) {
    out = absl::StrCat("experts on ", p.device, ": ", p.gpu_experts, " of ", p.experts,
                       " experts (the rest, the router and attention on the CPU)");
  } else if (p.gpu_layers > 0) {
    std::vector<std::string> sparse;
    if (p.gpu_input_sparse_layers > 0) {
      sparse.push_back(absl::StrCat(p.gpu_input_sparse_layers, " input-sparse"));
    }
    if (p.gpu_gate_first_layers > 0) {
      sparse.push_back(absl::StrCat(p.gpu_gate_first_layers, " gate-first"));
    }
    out = absl::StrCat(p.gpu_layers, "/", p.n_layer, " whole layers",
                       sparse.empty() ? "" : absl::StrCat(" (", absl::StrJoin(sparse, ", "), ")"),
                       p.output_gpu ? " and the output head" : "", " on ", p.device);
  } else {
    out = absl::StrCat("hybrid on ", p.device, ": ", p.attention_gpu_layers, "/", p.n_layer,
                       " attention layers", p.output_gpu ? " and the output head" : "", ", ",
                       p.gpu_neurons, " of ", p.ffn_neurons, " FFN neurons");
  }
  if (p.gpu_bytes > 0) absl::StrAppend(&out, " (", p.gpu_bytes >> 20, " MiB of device memory)");
  if (!p.note.empty()) absl::StrAppend(&out, "; ", p.note);
  return out;
}

EngineSession::~EngineSession() = default;

uint64_t EngineSession::device_bytes() const {
  return (layers_ != nullptr ? layers_->device_bytes() : 0) +
         (sparse_ != nullptr ? sparse_->gpu_device_bytes() : 0) +
         (moe_ != nullptr ? moe_->device_bytes() : 0);
}

}  // namespace thermocline
