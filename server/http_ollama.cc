// The HTTP front end's /v1/embeddings and Ollama's API on the same port: /api/chat,
// /api/generate (NDJSON streams by default), /api/embed, /api/embeddings, /api/tags, /api/show,
// /api/ps, /api/version. Requests become the same jobs as the OpenAI routes' (through
// server/ollama_api.h and server/embeddings.h) and run on the scheduler's slots. keep_alive
// sets the model's idle unloading in the registry; an empty prompt with keep_alive 0 unloads
// the model now, without one it loads it (Ollama's documented load and unload requests).
// Errors are Ollama's {"error": "..."} with the status the OpenAI routes give.
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/embeddings.h"
#include "server/errors.h"
#include "server/front_end_ops.h"
#include "server/http_access.h"
#include "server/http_connection.h"
#include "server/http_server.h"
#include "server/json_text.h"
#include "server/ollama_api.h"
#include "server/openai_request.h"
#include "server/sinks.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Waits for a job's sink (`done(timeout)` true once it finished), cancelling the job when the
// client of a non-streamed request goes away meanwhile.
template <typename Done>
void WaitWatchingClient(Scheduler* scheduler, const std::shared_ptr<Job>& job, Done done) {
  constexpr auto kPoll = std::chrono::milliseconds(100);
  ServedConnection* connection = ServedConnection::Current();
  bool client_gone = false;
  while (!done(kPoll)) {
    if (!client_gone && connection != nullptr && connection->PeerGone()) {
      client_gone = true;
      scheduler->Cancel(job, CancelReason::kClientGone);
    }
  }
}

}  // namespace

void HttpFrontEnd::SendOllamaError(httplib::Response& res, const absl::Status& status) const {
  const ApiError e = ToApiError(status);
  res.status = e.http_status;
  if (e.http_status == 503) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  res.set_content(OllamaErrorJson(e.message), "application/json");
}

void HttpFrontEnd::OllamaRoutes() {
  using httplib::Request;
  using httplib::Response;
  http_->Post("/v1/embeddings",
              WithBody([this](const Request& req, Response& res, const std::string& body) {
                HandleEmbeddings(req, res, body);
              }));
  for (const auto& [path, chat] : {std::pair{"/api/chat", true}, {"/api/generate", false}}) {
    const bool is_chat = chat;
    http_->Post(
        path, WithBody([this, is_chat](const Request& req, Response& res, const std::string& body) {
          HandleOllamaGeneration(req, res, body, is_chat);
        }));
  }
  for (const auto& [path, legacy] : {std::pair{"/api/embed", false}, {"/api/embeddings", true}}) {
    const bool is_legacy = legacy;
    http_->Post(path, WithBody([this, is_legacy](const Request& req, Response& res,
                                                 const std::string& body) {
                  HandleOllamaEmbedding(req, res, body, is_legacy);
                }));
  }
  http_->Post("/api/show", WithBody([this](const Request&, Response& res, const std::string& body) {
                HandleOllamaShow(res, body);
              }));
  http_->Get("/api/tags",
             [this](const Request&, Response& res) { HandleOllamaModels(res, false); });
  http_->Get("/api/ps", [this](const Request&, Response& res) { HandleOllamaModels(res, true); });
  http_->Get("/api/version", [](const Request&, Response& res) {
    res.set_content(Dump(ordered_json{{"version", kOllamaApiVersion}}), "application/json");
  });
}

void HttpFrontEnd::HandleEmbeddings(const httplib::Request&, httplib::Response& res,
                                    const std::string& raw_body) {
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendError(res, body.status());
  bool base64 = false;
  auto spec = EmbeddingSpecFromOpenAi(*body, &base64);
  if (!spec.ok()) return SendError(res, spec.status());
  SubmitContext submit{registry_, &config_, scheduler_.load(), draining_.load()};
  auto prepared = PrepareEmbeddingJob(*spec, submit);
  if (!prepared.ok()) return SendError(res, prepared.status());
  std::shared_ptr<Job> job = *std::move(prepared);
  auto owned = std::make_unique<EmbeddingSink>(job->request.inputs.size());
  EmbeddingSink* sink = owned.get();
  job->sink = std::move(owned);
  CurrentAccess().prompt_tokens = 0;
  if (absl::Status s = submit.scheduler->Submit(job); !s.ok()) return SendError(res, s);
  WaitWatchingClient(submit.scheduler, job, [sink](auto t) { return sink->WaitFor(t); });
  CurrentAccess().prompt_tokens = sink->stats().prompt_tokens;
  if (absl::Status s = EmbeddingOutcome(*sink); !s.ok()) return SendError(res, s);
  res.set_content(OpenAiEmbeddingBody(job->request.model, *sink, base64), "application/json");
}

void HttpFrontEnd::HandleOllamaGeneration(const httplib::Request&, httplib::Response& res,
                                          const std::string& raw_body, bool chat) {
  const Clock::time_point start = Clock::now();
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendOllamaError(res, body.status());
  auto parsed = OllamaGenerationRequest(*body, chat, *registry_);
  if (!parsed.ok()) return SendOllamaError(res, parsed.status());
  OllamaGeneration& g = *parsed;
  ServedModel* served = registry_->Lookup(g.spec.model);
  if (served == nullptr) {
    return SendOllamaError(res, OllamaModelName(*registry_, g.model).status());
  }
  const bool was_loaded = served->loaded() != nullptr;
  OllamaTimings timings{start, 0};
  const std::string content_type = g.spec.stream ? "application/x-ndjson" : "application/json";

  if (g.empty) {
    // Ollama's load and unload requests: a done object without generating.
    const char* reason = "load";
    if (g.keep_alive && g.keep_alive->count() == 0) {
      registry_->Unload(served, "keep_alive 0");
      reason = "unload";
    } else {
      auto lease = registry_->FindOrLoad(g.spec.model);
      if (!lease.ok()) return SendOllamaError(res, lease.status());
      if (g.keep_alive) registry_->SetKeepAlive(served, *g.keep_alive);
      timings.load_seconds = was_loaded ? 0 : SecondsSince(start);
    }
    std::string out;
    AppendOllamaChunk(g.model, chat, "", /*open=*/true, &out);
    out.append("\"done_reason\":");
    AppendJsonString(&out, reason);
    out.append("}\n");
    res.set_content(out, content_type);
    return;
  }

  SubmitContext submit{registry_, &config_, scheduler_.load(), draining_.load()};
  auto prepared = PrepareJob(g.spec, submit);
  if (!prepared.ok()) return SendOllamaError(res, prepared.status());
  std::shared_ptr<Job> job = *std::move(prepared);
  if (absl::Status s = CheckNumCtx(g.num_ctx, *job->model); !s.ok()) {
    return SendOllamaError(res, s);
  }
  if (!was_loaded) timings.load_seconds = SecondsSince(start);
  // Set while the job holds the model: its idle time starts when the job ends.
  if (g.keep_alive) registry_->SetKeepAlive(served, *g.keep_alive);
  Scheduler* scheduler = submit.scheduler;
  AccessRecord& access = CurrentAccess();
  access.prompt_tokens = static_cast<int64_t>(job->request.prompt.size());

  if (!g.spec.stream) {
    auto owned = std::make_unique<CollectingSink>();
    CollectingSink* sink = owned.get();
    job->sink = std::move(owned);
    if (absl::Status s = scheduler->Submit(job); !s.ok()) return SendOllamaError(res, s);
    WaitWatchingClient(scheduler, job, [sink](auto t) { return sink->WaitFor(t); });
    access.completion_tokens = sink->stats().completion_tokens;
    access.ttft_seconds = sink->stats().ttft_seconds;
    if (sink->reason() == StopReason::kError) {
      spdlog::error("generation failed: {}", sink->error().ToString());
      return SendOllamaError(
          res, absl::InternalError(absl::StrCat("generation failed: ", sink->error().message())));
    }
    if (sink->reason() == StopReason::kCancelled && sink->cancel() != CancelReason::kDeadline) {
      access.outcome = CancelReasonName(sink->cancel());
      return SendOllamaError(res,
                             Unavailable("shutting_down", "the server shut down before the end"));
    }
    std::string out;
    AppendOllamaChunk(g.model, chat, sink->text(), /*open=*/true, &out);
    AppendOllamaFinal(timings, sink->reason(), sink->stats(), &out);
    out.push_back('}');
    res.set_content(out, "application/json");
    return;
  }

  auto owned = std::make_unique<OllamaStreamSink>(g.model, chat, timings);
  OllamaStreamSink* sink = owned.get();
  job->sink = std::move(owned);
  if (absl::Status s = scheduler->Submit(job); !s.ok()) return SendOllamaError(res, s);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      content_type,
      [job, sink, scheduler](size_t, httplib::DataSink& out) {
        AccessRecord& access = CurrentAccess();
        std::string buffer;
        bool client_gone = false;
        while (sink->Take(&buffer)) {
          if (!client_gone && !out.write(buffer.data(), buffer.size())) {
            client_gone = true;
            scheduler->Cancel(job, CancelReason::kClientGone);
            sink->Abandon();
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
      [job, sink, scheduler](bool success) {
        if (success) return;
        scheduler->Cancel(job, CancelReason::kClientGone);
        sink->Abandon();
      });
}

void HttpFrontEnd::HandleOllamaEmbedding(const httplib::Request&, httplib::Response& res,
                                         const std::string& raw_body, bool legacy) {
  const Clock::time_point start = Clock::now();
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendOllamaError(res, body.status());
  auto parsed = OllamaEmbeddingRequest(*body, legacy, *registry_);
  if (!parsed.ok()) return SendOllamaError(res, parsed.status());
  OllamaEmbedding& e = *parsed;
  ServedModel* served = registry_->Lookup(e.spec.model);
  if (served == nullptr) {
    return SendOllamaError(res, OllamaModelName(*registry_, e.model).status());
  }
  const bool was_loaded = served->loaded() != nullptr;
  if (e.empty && e.keep_alive && e.keep_alive->count() == 0) {
    registry_->Unload(served, "keep_alive 0");
    res.set_content(legacy ? "{\"embedding\":[]}"
                           : Dump(ordered_json{{"model", e.model}, {"embeddings", json::array()}}),
                    "application/json");
    return;
  }
  auto lease = registry_->FindOrLoad(e.spec.model);  // also what an empty request is for
  if (!lease.ok()) return SendOllamaError(res, lease.status());
  if (absl::Status s = CheckNumCtx(e.num_ctx, **lease); !s.ok()) return SendOllamaError(res, s);
  const double load_seconds = was_loaded ? 0 : SecondsSince(start);
  if (e.keep_alive) registry_->SetKeepAlive(served, *e.keep_alive);
  std::string out;
  if (e.empty) {
    res.set_content(legacy ? "{\"embedding\":[]}"
                           : Dump(ordered_json{{"model", e.model}, {"embeddings", json::array()}}),
                    "application/json");
    return;
  }
  SubmitContext submit{registry_, &config_, scheduler_.load(), draining_.load()};
  auto prepared = PrepareEmbeddingJob(e.spec, submit);
  if (!prepared.ok()) return SendOllamaError(res, prepared.status());
  std::shared_ptr<Job> job = *std::move(prepared);
  lease->EndUse();  // the job holds the model now
  auto owned = std::make_unique<EmbeddingSink>(job->request.inputs.size());
  EmbeddingSink* sink = owned.get();
  job->sink = std::move(owned);
  if (absl::Status s = submit.scheduler->Submit(job); !s.ok()) return SendOllamaError(res, s);
  WaitWatchingClient(submit.scheduler, job, [sink](auto t) { return sink->WaitFor(t); });
  CurrentAccess().prompt_tokens = sink->stats().prompt_tokens;
  if (absl::Status s = EmbeddingOutcome(*sink); !s.ok()) return SendOllamaError(res, s);
  if (legacy) {
    out = "{\"embedding\":";
    AppendFloatArray(sink->vectors()[0], &out);
    out.push_back('}');
  } else {
    out = "{\"model\":";
    AppendJsonString(&out, e.model);
    out.append(",\"embeddings\":[");
    for (size_t i = 0; i < sink->vectors().size(); ++i) {
      if (i > 0) out.push_back(',');
      AppendFloatArray(sink->vectors()[i], &out);
    }
    out.append("],\"total_duration\":");
    AppendInt(&out, static_cast<int64_t>(SecondsSince(start) * 1e9));
    out.append(",\"load_duration\":");
    AppendInt(&out, static_cast<int64_t>(load_seconds * 1e9));
    out.append(",\"prompt_eval_count\":");
    AppendInt(&out, sink->stats().prompt_tokens);
    out.push_back('}');
  }
  res.set_content(out, "application/json");
}

void HttpFrontEnd::HandleOllamaShow(httplib::Response& res, const std::string& raw_body) {
  auto body = ParseJsonObject(raw_body);
  if (!body.ok()) return SendOllamaError(res, body.status());
  std::string name;
  for (const char* key : {"model", "name"}) {
    auto it = body->find(key);
    if (it != body->end() && it->is_string() && name.empty()) name = it->get<std::string>();
  }
  if (name.empty()) {
    return SendOllamaError(
        res, InvalidRequest("model", "missing_required_parameter", "'model' is required"));
  }
  auto resolved = OllamaModelName(*registry_, name);
  if (!resolved.ok()) return SendOllamaError(res, resolved.status());
  const ServedModel* m = registry_->Lookup(*resolved);
  if (m == nullptr) return SendOllamaError(res, OllamaModelName(*registry_, name).status());
  bool verbose = false;
  if (auto it = body->find("verbose"); it != body->end() && it->is_boolean()) verbose = *it;
  auto show = OllamaShow(*m, verbose);
  if (!show.ok()) return SendOllamaError(res, show.status());
  res.set_content(Dump(*show), "application/json");
}

void HttpFrontEnd::HandleOllamaModels(httplib::Response& res, bool running) {
  ordered_json models = ordered_json::array();
  for (const ServedModel* m : registry_->models()) {
    if (!running) {
      models.push_back(OllamaModelEntry(*m));
      continue;
    }
    const std::shared_ptr<const LoadedModel> l = m->loaded();
    if (l != nullptr) models.push_back(OllamaRunningEntry(*m, *l, *registry_));
  }
  res.set_content(Dump(ordered_json{{"models", models}}), "application/json");
}

}  // namespace thermocline::server
