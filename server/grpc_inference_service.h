// thermocline.v1.Inference (proto/thermocline/v1/inference.proto) over the callback API: Generate
// and Chat translate their request into a GenerationSpec and go through the same PrepareJob /
// BuildRequest / Scheduler path as the HTTP API, streamed by GenerateStream; Tokenize, Detokenize
// and ListModels answer at once.
#pragma once

#include "server/grpc_common.h"
#include "server/request_builder.h"
#include "thermocline/v1/inference.grpc.pb.h"

namespace thermocline::server {

class InferenceService final : public thermocline::v1::Inference::CallbackService {
 public:
  explicit InferenceService(GrpcShared* shared) : shared_(shared) {}

  grpc::ServerWriteReactor<thermocline::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const thermocline::v1::GenerateRequest* request) override;
  grpc::ServerWriteReactor<thermocline::v1::GenerateResponse>* Chat(
      grpc::CallbackServerContext* context, const thermocline::v1::ChatRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const thermocline::v1::TokenizeRequest* request,
                                     thermocline::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const thermocline::v1::DetokenizeRequest* request,
                                       thermocline::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const thermocline::v1::ListModelsRequest* request,
                                       thermocline::v1::ListModelsResponse* response) override;

 private:
  // Submits the job for `spec` with a GenerateStream; a refused call ends with its status.
  grpc::ServerWriteReactor<thermocline::v1::GenerateResponse>* StartGeneration(
      grpc::CallbackServerContext* context, const GenerationSpec& spec);

  GrpcShared* const shared_;
};

}  // namespace thermocline::server
