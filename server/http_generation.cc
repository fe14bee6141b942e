// The generation endpoints of the HTTP front end (/v1/chat/completions, /v1/completions) and
// the tokenizer endpoints. A request is parsed and validated, becomes a Job with a sink, and
// is queued; a non-streamed response waits for the whole result, a streamed one drains the
// SSE sink into httplib's chunked writer. A failed write means the client left: the job is
// cancelled and its slot is free after the current token.
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/errors.h"
#include "server/http_access.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/sinks.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void HttpFrontEnd::HandleGeneration(const httplib::Request& req, httplib::Response& res,
                                    ApiKind kind) {
  auto body = ParseJsonObject(req.body);
  if (!body.ok()) return SendError(res, body.status());
  auto spec = SpecFromOpenAi(*body, kind);
  if (!spec.ok()) return SendError(res, spec.status());
  auto model = registry_->Find(spec->model);
  if (!model.ok()) return SendError(res, model.status());
  if (draining_.load())
    return SendError(res, Unavailable("shutting_down", "the server is shutting down"));
  Scheduler* scheduler = scheduler_.load();
  if (scheduler == nullptr) {
    return SendError(res, Unavailable("model_loading", "the server is starting; retry shortly"));
  }
  auto request = BuildRequest(*spec, **model, config_);
  if (!request.ok()) return SendError(res, request.status());

  AccessRecord& access = CurrentAccess();
  access.prompt_tokens = static_cast<int64_t>(request->prompt.size());
  auto job = std::make_shared<Job>();
  job->model = *model;
  if (config_.request_timeout_s > 0) {
    job->deadline = job->arrival + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(config_.request_timeout_s));
  }
  ResponseMeta meta = NewResponseMeta(*request, (*model)->tokenizer());
  const bool stream = request->stream;
  job->request = std::move(*request);

  if (!stream) {
    auto owned = std::make_unique<CollectingSink>();
    CollectingSink* sink = owned.get();
    job->sink = std::move(owned);
    if (absl::Status s = scheduler->Submit(job); !s.ok()) return SendError(res, s);
    sink->Wait();
    access.completion_tokens = sink->stats().completion_tokens;
    access.ttft_seconds = sink->stats().ttft_seconds;
    if (sink->reason() == FinishReason::kError) {
      spdlog::error("generation failed: {}", sink->error().ToString());
      return SendError(
          res, absl::InternalError(absl::StrCat("generation failed: ", sink->error().message())));
    }
    if (sink->reason() == FinishReason::kCancelled && sink->cancel() != CancelReason::kDeadline) {
      access.outcome = CancelReasonName(sink->cancel());
      return SendError(res, Unavailable("shutting_down", "the server shut down before the end"));
    }
    if (sink->reason() == FinishReason::kCancelled) access.outcome = "deadline";
    res.set_content(BuildResponseBody(meta, sink->text(), sink->logprobs(),
                                      FinishReasonText(sink->reason()), sink->stats()),
                    "application/json");
    return;
  }

  auto owned = std::make_unique<SseSink>(std::move(meta));
  SseSink* sink = owned.get();
  job->sink = std::move(owned);
  if (absl::Status s = scheduler->Submit(job); !s.ok()) return SendError(res, s);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      // Runs once: writes the whole stream, so a server stop() does not cut it short.
      [job, sink, scheduler](size_t, httplib::DataSink& out) {
        AccessRecord& access = CurrentAccess();
        std::string buffer;
        bool client_gone = false;
        while (sink->Take(&buffer)) {
          if (!client_gone && !out.write(buffer.data(), buffer.size())) {
            client_gone = true;
            scheduler->Cancel(job, CancelReason::kClientGone);
            sink->Abandon();  // keep taking until the job has finished: its slot is free then
          }
        }
        access.completion_tokens = sink->stats().completion_tokens;
        access.ttft_seconds = sink->stats().ttft_seconds;
        if (client_gone) {
          access.outcome = CancelReasonName(CancelReason::kClientGone);
          return false;
        }
        out.done();
        return true;
      },
      // Also runs when the provider never did (the client left before the headers went out).
      [job, sink, scheduler](bool success) {
        if (success) return;
        scheduler->Cancel(job, CancelReason::kClientGone);
        sink->Abandon();
      });
}

void HttpFrontEnd::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = ParseJsonObject(req.body);
  if (!body.ok()) return SendError(res, body.status());
  std::string model_name = registry_->models().front()->config.name;
  if (body->contains("model") && !(*body)["model"].is_null()) {
    auto m = RequestedModel(*body);
    if (!m.ok()) return SendError(res, m.status());
    model_name = *m;
  }
  auto model = registry_->Find(model_name);
  if (!model.ok()) return SendError(res, model.status());
  const json& content = (*body)["content"];
  if (!content.is_string()) {
    return SendError(
        res,
        InvalidRequest("content", content.is_null() ? "missing_required_parameter" : "invalid_type",
                       "'content' must be a string"));
  }
  bool add_special = false, with_pieces = false;
  for (auto [key, dst] : {std::pair{"add_special", &add_special}, {"with_pieces", &with_pieces}}) {
    if (!body->contains(key) || (*body)[key].is_null()) continue;
    if (!(*body)[key].is_boolean()) {
      return SendError(
          res, InvalidRequest(key, "invalid_type", absl::StrCat("'", key, "' must be a boolean")));
    }
    *dst = (*body)[key].get<bool>();
  }
  const Tokenizer& tok = (*model)->tokenizer();
  const std::vector<int32_t> ids =
      (*model)->encoder->Encode(content.get<std::string>(), add_special && tok.add_bos());
  json tokens = json::array();
  for (int32_t id : ids) {
    if (with_pieces) {
      tokens.push_back({{"id", id}, {"piece", tok.TokenToPiece(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  res.set_content(Dump(json{{"tokens", tokens}}), "application/json");
}

void HttpFrontEnd::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  auto body = ParseJsonObject(req.body);
  if (!body.ok()) return SendError(res, body.status());
  std::string model_name = registry_->models().front()->config.name;
  if (body->contains("model") && !(*body)["model"].is_null()) {
    auto m = RequestedModel(*body);
    if (!m.ok()) return SendError(res, m.status());
    model_name = *m;
  }
  auto model = registry_->Find(model_name);
  if (!model.ok()) return SendError(res, model.status());
  const json& tokens = (*body)["tokens"];
  if (!tokens.is_array()) {
    return SendError(
        res,
        InvalidRequest("tokens", tokens.is_null() ? "missing_required_parameter" : "invalid_type",
                       "'tokens' must be an array of token ids"));
  }
  const Tokenizer& tok = (*model)->tokenizer();
  std::vector<int32_t> ids;
  for (const json& t : tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
      return SendError(res, InvalidRequest("tokens", "invalid_value",
                                           absl::StrCat("'tokens' must hold ids in [0, ",
                                                        tok.vocab_size(), ")")));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  res.set_content(Dump(json{{"content", tok.Decode(ids)}}), "application/json");
}

}  // namespace thermocline::server
