#include "server/grpc_inference_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/front_end_ops.h"
#include "server/grpc_generate_stream.h"

namespace thermocline::server {
namespace {

namespace pb = thermocline::v1;

// A stream refused before it started: ends with `status` and no message.
class RefusedStream final : public grpc::ServerWriteReactor<pb::GenerateResponse> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// The request fields every generation call shares; their ranges are checked by BuildRequest.
void ApplyOptions(const pb::GenerationOptions& o, GenerationSpec* spec) {
  if (o.has_max_tokens()) spec->max_tokens = o.max_tokens();
  if (o.has_temperature()) spec->temperature = o.temperature();
  if (o.has_top_p()) spec->top_p = o.top_p();
  if (o.has_top_k()) spec->top_k = o.top_k();
  if (o.has_min_p()) spec->min_p = o.min_p();
  if (o.has_seed()) spec->seed = o.seed();
  if (o.has_repeat_penalty()) spec->repeat_penalty = o.repeat_penalty();
  if (o.has_penalty_last_n()) spec->penalty_last_n = o.penalty_last_n();
  if (o.has_presence_penalty()) spec->presence_penalty = o.presence_penalty();
  if (o.has_frequency_penalty()) spec->frequency_penalty = o.frequency_penalty();
  spec->stop.assign(o.stop().begin(), o.stop().end());
  for (const auto& [id, bias] : o.logit_bias()) spec->logit_bias.emplace_back(id, bias);
  spec->logprobs = o.logprobs();
  if (o.top_logprobs() != 0) spec->top_logprobs = o.top_logprobs();
  spec->ignore_eos = o.ignore_eos();
  spec->stream = true;
}

absl::Status RequireModel(const std::string& model) {
  if (!model.empty()) return absl::OkStatus();
  return InvalidRequest("model", "missing_required_parameter",
                        "'model' is required: name a served model (ListModels)");
}

}  // namespace

grpc::ServerWriteReactor<pb::GenerateResponse>* InferenceService::StartGeneration(
    grpc::CallbackServerContext* context, const GenerationSpec& spec) {
  SubmitContext submit;
  submit.registry = shared_->registry;
  submit.config = shared_->config;
  submit.scheduler = shared_->scheduler.load();
  submit.draining = shared_->draining.load();
  submit.call_deadline = CallDeadline(*context);
  auto job = PrepareJob(spec, submit);
  if (!job.ok()) return new RefusedStream(ToGrpcStatus(job.status()));
  auto* stream = new GenerateStream(context, *job, &(*job)->model->tokenizer(), shared_,
                                    submit.call_deadline, shared_->config->access_log);
  stream->Start(submit.scheduler);
  return stream;
}

grpc::ServerWriteReactor<pb::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const pb::GenerateRequest* request) {
  if (grpc::Status s = CheckApiKey(*context, shared_->config->api_keys); !s.ok()) {
    return new RefusedStream(s);
  }
  if (absl::Status s = RequireModel(request->model()); !s.ok()) {
    return new RefusedStream(ToGrpcStatus(s));
  }
  GenerationSpec spec;
  spec.kind = ApiKind::kCompletion;
  spec.model = request->model();
  switch (request->prompt_case()) {
    case pb::GenerateRequest::kText:
      spec.prompt_text = request->text();
      break;
    case pb::GenerateRequest::kTokens:
      spec.prompt_ids.emplace(request->tokens().ids().begin(), request->tokens().ids().end());
      break;
    case pb::GenerateRequest::PROMPT_NOT_SET:
      return new RefusedStream(ToGrpcStatus(InvalidRequest(
          "prompt", "missing_required_parameter", "the prompt is required: set text or tokens")));
  }
  ApplyOptions(request->options(), &spec);
  return StartGeneration(context, spec);
}

grpc::ServerWriteReactor<pb::GenerateResponse>* InferenceService::Chat(
    grpc::CallbackServerContext* context, const pb::ChatRequest* request) {
  if (grpc::Status s = CheckApiKey(*context, shared_->config->api_keys); !s.ok()) {
    return new RefusedStream(s);
  }
  if (absl::Status s = RequireModel(request->model()); !s.ok()) {
    return new RefusedStream(ToGrpcStatus(s));
  }
  GenerationSpec spec;
  spec.kind = ApiKind::kChat;
  spec.model = request->model();
  for (int i = 0; i < request->messages_size(); ++i) {
    ChatMessage& m = spec.messages.emplace_back();
    m.role = request->messages(i).role();
    m.content = request->messages(i).content();
    if (absl::Status s = NormalizeChatRole(absl::StrCat("messages[", i, "].role"), &m.role);
        !s.ok()) {
      return new RefusedStream(ToGrpcStatus(s));
    }
  }
  ApplyOptions(request->options(), &spec);
  return StartGeneration(context, spec);
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const pb::TokenizeRequest* request,
                                                     pb::TokenizeResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, shared_->config->api_keys); !s.ok()) {
    return Reply(context, s);
  }
  if (absl::Status s = CheckTokenizeSize(request->text().size(), *shared_->config); !s.ok()) {
    return Reply(context, ToGrpcStatus(s));
  }
  auto model = ResolveModel(*shared_->registry, request->model());
  if (!model.ok()) return Reply(context, ToGrpcStatus(model.status()));
  for (int32_t id : TokenizeText(**model, request->text(), request->add_special())) {
    response->add_tokens(id);
    if (request->with_pieces())
      response->add_pieces(ProtoText((*model)->tokenizer().TokenToPiece(id)));
  }
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* context,
                                                       const pb::DetokenizeRequest* request,
                                                       pb::DetokenizeResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, shared_->config->api_keys); !s.ok()) {
    return Reply(context, s);
  }
  auto model = ResolveModel(*shared_->registry, request->model());
  if (!model.ok()) return Reply(context, ToGrpcStatus(model.status()));
  const std::vector<int64_t> ids(request->tokens().begin(), request->tokens().end());
  auto text = DetokenizeIds(**model, ids);
  if (!text.ok()) return Reply(context, ToGrpcStatus(text.status()));
  response->set_text(ProtoText(*text));
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* context,
                                                       const pb::ListModelsRequest* request,
                                                       pb::ListModelsResponse* response) {
  if (grpc::Status s = CheckApiKey(*context, shared_->config->api_keys); !s.ok()) {
    return Reply(context, s);
  }
  for (const ServedModel* m : shared_->registry->models()) {
    pb::Model* out = response->add_models();
    const std::shared_ptr<const LoadedModel> loaded = m->loaded();
    out->set_name(m->config.name);
    out->set_state(ModelStateName(m->state.load()));
    out->set_context_length(loaded ? loaded->n_ctx : 0);
    out->set_created(loaded ? loaded->created : 0);
    out->set_mode(m->mode());
  }
  return Reply(context, grpc::Status::OK);
}

}  // namespace thermocline::server
