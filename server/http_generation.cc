// The generation endpoints of the HTTP front end (/v1/chat/completions, /v1/completions) and
// the tokenizer endpoints. A request is parsed, becomes a Job through the steps it shares with
// the gRPC front end (front_end_ops.h), gets a sink and is queued; a non-streamed response
// waits for the whole result, a streamed one drains the SSE sink into httplib's chunked writer.
// A failed write means the client left: the job is cancelled and its slot is free after the
// current token. A non-streamed request watches its connection while it waits, so a client
// that leaves cancels it too.
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"
#include "server/errors.h"
#include "server/front_end_ops.h"
#include "server/http_access.h"
#include "server/http_connection.h"
#include "server/http_server.h"
#include "server/json_text.h"
#include "server/openai_request.h"
#include "server/sinks.h"
#include "server/tool_calls.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void HttpFrontEnd::HandleGeneration(const httplib::Request& req, httplib::Response& res,
                                    const std::string& raw_body, ApiKind kind) {
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendError(res, body.status());
  auto spec = SpecFromOpenAi(*body, kind, raw_body);
  if (!spec.ok()) return SendError(res, spec.status());
  SubmitContext submit;
  submit.registry = registry_;
  submit.config = &config_;
  submit.scheduler = scheduler_.load();
  submit.draining = draining_.load();
  auto prepared = PrepareJob(*spec, submit);
  if (!prepared.ok()) return SendError(res, prepared.status());
  std::shared_ptr<Job> job = std::move(*prepared);
  Scheduler* scheduler = submit.scheduler;

  AccessRecord& access = CurrentAccess();
  access.prompt_tokens = static_cast<int64_t>(job->request.prompt.size());
  ResponseMeta meta = NewResponseMeta(job->request, job->model->tokenizer());
  const bool stream = job->request.stream;
  // context_overflow "truncate" is never silent: the client hears how many messages went.
  if (job->request.truncated_messages > 0) {
    res.set_header("X-Thermocline-Truncated-Messages",
                   std::to_string(job->request.truncated_messages));
  }

  if (!stream) {
    auto owned = std::make_unique<CollectingSink>();
    CollectingSink* sink = owned.get();
    job->sink = std::move(owned);
    if (absl::Status s = scheduler->Submit(job); !s.ok()) return SendError(res, s);
    // How often a waiting request looks whether its client is still there.
    constexpr auto kPoll = std::chrono::milliseconds(100);
    ServedConnection* connection = ServedConnection::Current();
    bool client_gone = false;
    while (!sink->WaitFor(kPoll)) {
      if (!client_gone && connection != nullptr && connection->PeerGone()) {
        client_gone = true;
        scheduler->Cancel(job, CancelReason::kClientGone);
      }
    }
    access.completion_tokens = sink->stats().completion_tokens;
    access.ttft_seconds = sink->stats().ttft_seconds;
    if (sink->reason() == StopReason::kError) {
      spdlog::error("generation failed: {}", sink->error().ToString());
      return SendError(
          res, absl::InternalError(absl::StrCat("generation failed: ", sink->error().message())));
    }
    if (sink->reason() == StopReason::kCancelled && sink->cancel() != CancelReason::kDeadline) {
      access.outcome = CancelReasonName(sink->cancel());
      return SendError(res, Unavailable("shutting_down", "the server shut down before the end"));
    }
    if (sink->reason() == StopReason::kCancelled) access.outcome = "deadline";
    if (meta.parse_tool_calls) {
      const ParsedOutput output =
          ParseToolCalls(sink->text(), meta.tool_format, meta.parallel_tool_calls);
      res.set_content(
          BuildResponseBody(meta, output, sink->logprobs(),
                            FinishReasonText(sink->reason(), static_cast<int>(output.calls.size())),
                            sink->stats()),
          "application/json");
      return;
    }
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

void HttpFrontEnd::HandleTokenize(const std::string& raw_body, httplib::Response& res) {
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendError(res, body.status());
  std::string model_name;  // "": the first model
  if (body->contains("model") && !(*body)["model"].is_null()) {
    auto m = RequestedModel(*body);
    if (!m.ok()) return SendError(res, m.status());
    model_name = *m;
  }
  auto model = ResolveModel(*registry_, model_name);
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
  const std::string& text = content.get_ref<const std::string&>();
  if (absl::Status s = CheckTokenizeSize(text.size(), config_); !s.ok()) return SendError(res, s);
  const std::vector<int32_t> ids = TokenizeText(**model, text, add_special);
  // Written as text, not as a JSON tree: a tree costs hundreds of bytes per token. Pieces may be
  // parts of a character (byte tokens): replaced as the rest of the API does.
  std::string out = "{\"tokens\":[";
  out.reserve(out.size() + ids.size() * (with_pieces ? 24 : 7));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(',');
    if (!with_pieces) {
      AppendInt(&out, ids[i]);
      continue;
    }
    out.append("{\"id\":");
    AppendInt(&out, ids[i]);
    out.append(",\"piece\":");
    AppendJsonString(&out, SanitizeUtf8(tok.TokenToPiece(ids[i])));
    out.push_back('}');
  }
  out.append("]}");
  res.set_content(std::move(out), "application/json");
}

void HttpFrontEnd::HandleDetokenize(const std::string& raw_body, httplib::Response& res) {
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendError(res, body.status());
  std::string model_name;  // "": the first model
  if (body->contains("model") && !(*body)["model"].is_null()) {
    auto m = RequestedModel(*body);
    if (!m.ok()) return SendError(res, m.status());
    model_name = *m;
  }
  auto model = ResolveModel(*registry_, model_name);
  if (!model.ok()) return SendError(res, model.status());
  const json& tokens = (*body)["tokens"];
  if (!tokens.is_array()) {
    return SendError(
        res,
        InvalidRequest("tokens", tokens.is_null() ? "missing_required_parameter" : "invalid_type",
                       "'tokens' must be an array of token ids"));
  }
  std::vector<int64_t> ids;
  for (const json& t : tokens) {
    if (!t.is_number_integer()) {
      return SendError(
          res, InvalidRequest("tokens", "invalid_type", "'tokens' must hold integer token ids"));
    }
    ids.push_back(t.get<int64_t>());
  }
  auto text = DetokenizeIds(**model, ids);
  if (!text.ok()) return SendError(res, text.status());
  res.set_content(Dump(json{{"content", *text}}), "application/json");
}

}  // namespace thermocline::server
