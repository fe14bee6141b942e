// The gRPC front end driven by a grpc++ client against a real daemon: streamed Generate and Chat
// (the same greedy text as the HTTP API), tokenizer and model calls, cancellation and deadlines
// freeing the slot, health, reflection, graceful shutdown, and every status code (UNAUTHENTICATED,
// NOT_FOUND, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, ALREADY_EXISTS, CANCELLED,
// DEADLINE_EXCEEDED).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon_fixture.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/config.h"
#include "server/grpc_front_end.h"
#include "server/model_registry.h"
#include "thermocline/v1/admin.grpc.pb.h"
#include "thermocline/v1/inference.grpc.pb.h"

namespace thermocline::testing {
namespace {

namespace pb = thermocline::v1;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using Reply = pb::GenerateResponse;

std::shared_ptr<grpc::Channel> Channel(const DaemonProcess& d) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(d.grpc_port()),
                             grpc::InsecureChannelCredentials());
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

struct StreamResult {
  grpc::Status status;
  std::vector<Reply> messages;
  std::string text;
  std::vector<int32_t> ids;
};

StreamResult ReadStream(std::unique_ptr<grpc::ClientReader<Reply>> reader) {
  StreamResult r;
  Reply m;
  while (reader->Read(&m)) {
    r.text += m.text();
    r.ids.insert(r.ids.end(), m.token_ids().begin(), m.token_ids().end());
    r.messages.push_back(m);
  }
  r.status = reader->Finish();
  return r;
}

StreamResult Generate(pb::Inference::Stub& stub, const pb::GenerateRequest& req,
                      const std::string& key = "", double deadline_s = 60) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_s);
  if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
  return ReadStream(stub.Generate(&ctx, req));
}

StreamResult Chat(pb::Inference::Stub& stub, const pb::ChatRequest& req) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 60);
  return ReadStream(stub.Chat(&ctx, req));
}

pb::GenerateRequest TextRequest(const std::string& prompt, int max_tokens) {
  pb::GenerateRequest req;
  req.set_model(kModelName);
  req.set_text(prompt);
  req.mutable_options()->set_max_tokens(max_tokens);
  req.mutable_options()->set_temperature(0);
  return req;
}

// The last message ends the stream: stop reason, usage and timings; no other message has them.
void CheckFinal(const StreamResult& r, Reply::StopReason expected) {
  INFO(r.status.error_message());
  REQUIRE(r.status.ok());
  REQUIRE(!r.messages.empty());
  for (size_t i = 0; i + 1 < r.messages.size(); ++i) {
    CHECK(r.messages[i].stop_reason() == Reply::STOP_REASON_UNSPECIFIED);
    CHECK(!r.messages[i].has_usage());
  }
  const Reply& last = r.messages.back();
  CHECK(last.stop_reason() == expected);
  REQUIRE(last.has_usage());
  // A stop string may swallow the text of the last tokens: they are counted, not sent.
  if (expected == Reply::STOP_SEQUENCE) {
    CHECK(last.usage().completion_tokens() >= static_cast<int64_t>(r.ids.size()));
  } else {
    CHECK(last.usage().completion_tokens() == static_cast<int64_t>(r.ids.size()));
  }
  CHECK(last.usage().total_tokens() ==
        last.usage().prompt_tokens() + last.usage().completion_tokens());
  REQUIRE(last.has_timings());
  CHECK(last.timings().total_seconds() > 0);
  CHECK(last.timings().time_to_first_token_seconds() <= last.timings().total_seconds());
}

std::string MetricsText(int port) { return Http(port, "GET", "/metrics").body; }

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST_CASE("grpc: streamed Generate gives the HTTP API's greedy text", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto stub = pb::Inference::NewStub(Channel(d));
  const StreamResult r = Generate(*stub, TextRequest("Once upon a time", 32));
  CheckFinal(r, Reply::MAX_TOKENS);
  CHECK(r.ids.size() == 32);
  CHECK(r.messages.size() >= 2);  // streamed, not one block

  const json http = Json(Http(d.port(), "POST", "/v1/completions",
                              json{{"model", kModelName},
                                   {"prompt", "Once upon a time"},
                                   {"max_tokens", 32},
                                   {"temperature", 0}}
                                  .dump())
                             .body);
  CHECK(r.text == http["choices"][0]["text"].get<std::string>());
  CHECK(r.messages.back().usage().prompt_tokens() == http["usage"]["prompt_tokens"].get<int64_t>());

  // The token ids are the text's: detokenized they give it back.
  pb::DetokenizeRequest dreq;
  dreq.set_model(kModelName);
  for (int32_t id : r.ids) dreq.add_tokens(id);
  pb::DetokenizeResponse dres;
  grpc::ClientContext dctx;
  REQUIRE(stub->Detokenize(&dctx, dreq, &dres).ok());
  CHECK(dres.text() == r.text);

  // A prompt of token ids continues exactly as its text does.
  pb::TokenizeRequest treq;
  treq.set_text("Once upon a time");
  treq.set_add_special(true);
  pb::TokenizeResponse tres;
  grpc::ClientContext tctx;
  REQUIRE(stub->Tokenize(&tctx, treq, &tres).ok());
  const json http_tokens =
      Json(Http(d.port(), "POST", "/tokenize",
                json{{"content", "Once upon a time"}, {"add_special", true}}.dump())
               .body)["tokens"];
  CHECK(std::vector<int32_t>(tres.tokens().begin(), tres.tokens().end()) ==
        http_tokens.get<std::vector<int32_t>>());
  pb::GenerateRequest by_ids = TextRequest("", 32);
  by_ids.mutable_tokens()->mutable_ids()->CopyFrom(tres.tokens());
  const StreamResult r2 = Generate(*stub, by_ids);
  CheckFinal(r2, Reply::MAX_TOKENS);
  CHECK(r2.text == r.text);
}

TEST_CASE("grpc: Chat streams the HTTP API's greedy reply, stop strings and logprobs",
          "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto stub = pb::Inference::NewStub(Channel(d));
  pb::ChatRequest req;
  req.set_model(kModelName);
  auto* m = req.add_messages();
  m->set_role("user");
  m->set_content("Tell me a story about a dog");
  req.mutable_options()->set_max_tokens(24);
  req.mutable_options()->set_temperature(0);
  const StreamResult r = Chat(*stub, req);
  REQUIRE(r.status.ok());
  const Reply::StopReason reason = r.messages.back().stop_reason();
  CHECK((reason == Reply::MAX_TOKENS || reason == Reply::STOP_SEQUENCE || reason == Reply::EOS));
  CheckFinal(r, reason);

  const json http =
      Json(Http(d.port(), "POST", "/v1/chat/completions",
                json{{"model", kModelName},
                     {"messages", {{{"role", "user"}, {"content", "Tell me a story about a dog"}}}},
                     {"max_tokens", 24},
                     {"temperature", 0}}
                    .dump())
               .body);
  CHECK(r.text == http["choices"][0]["message"]["content"].get<std::string>());
  CHECK(!r.text.empty());

  // A stop string taken from inside the greedy text ends generation before it.
  pb::GenerateRequest g = TextRequest("Once upon a time", 32);
  const StreamResult full = Generate(*stub, g);
  REQUIRE(full.text.size() > 12);
  const std::string stop = full.text.substr(8, 4);
  const size_t at = full.text.find(stop);
  g.mutable_options()->add_stop(stop);
  const StreamResult cut = Generate(*stub, g);
  CheckFinal(cut, Reply::STOP_SEQUENCE);
  CHECK(cut.text == full.text.substr(0, at));

  // Logprobs: one per token id, with alternatives; the greedy token is the most likely one.
  g = TextRequest("Once upon a time", 6);
  g.mutable_options()->set_logprobs(true);
  g.mutable_options()->set_top_logprobs(3);
  const StreamResult lp = Generate(*stub, g);
  CheckFinal(lp, Reply::MAX_TOKENS);
  int n = 0;
  for (const Reply& msg : lp.messages) {
    REQUIRE(msg.logprobs_size() == msg.token_ids_size());
    for (int i = 0; i < msg.logprobs_size(); ++i, ++n) {
      const pb::TokenLogprob& t = msg.logprobs(i);
      CHECK(t.token_id() == msg.token_ids(i));
      CHECK(t.logprob() <= 0);
      REQUIRE(t.top_size() == 3);
      CHECK(t.top(0).token_id() == t.token_id());
      CHECK(t.top(0).logprob() >= t.top(1).logprob());
    }
  }
  CHECK(n == 6);
}

TEST_CASE("grpc: tokenizer and model calls, health SERVING, reflection on", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto channel = Channel(d);
  auto stub = pb::Inference::NewStub(channel);

  pb::ListModelsResponse models;
  grpc::ClientContext lctx;
  REQUIRE(stub->ListModels(&lctx, pb::ListModelsRequest(), &models).ok());
  REQUIRE(models.models_size() >= 1);
  CHECK(models.models(0).name() == kModelName);
  CHECK(models.models(0).state() == "ready");
  CHECK(models.models(0).context_length() > 0);

  pb::TokenizeRequest treq;
  treq.set_model(kModelName);
  treq.set_text("Hello world");
  treq.set_with_pieces(true);
  pb::TokenizeResponse tres;
  grpc::ClientContext tctx;
  REQUIRE(stub->Tokenize(&tctx, treq, &tres).ok());
  REQUIRE(tres.tokens_size() > 0);
  CHECK(tres.pieces_size() == tres.tokens_size());

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hres;
  grpc::ClientContext hctx;
  REQUIRE(health->Check(&hctx, hreq, &hres).ok());
  CHECK(hres.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  hreq.set_service("thermocline.v1.Inference");
  grpc::ClientContext hctx2;
  REQUIRE(health->Check(&hctx2, hreq, &hres).ok());
  CHECK(hres.status() == grpc::health::v1::HealthCheckResponse::SERVING);
  hreq.set_service("no.such.Service");
  grpc::ClientContext hctx3;
  CHECK(health->Check(&hctx3, hreq, &hres).error_code() == grpc::StatusCode::NOT_FOUND);

  // Server reflection answers on its well-known method (a raw call: a ListServices request is field
  // 7, an empty string; the reply names our services).
  grpc::GenericStub generic(channel);
  grpc::ClientContext rctx;
  SetDeadline(&rctx, 10);
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(
      &rctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  REQUIRE(cq.Next(&tag, &ok));
  REQUIRE(ok);
  const char list_services[] = {0x3a, 0x00};  // field 7 (list_services), length 0
  grpc::Slice slice(list_services, sizeof(list_services));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  REQUIRE(cq.Next(&tag, &ok));
  REQUIRE(ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  REQUIRE(cq.Next(&tag, &ok));
  REQUIRE(ok);
  std::vector<grpc::Slice> slices;
  REQUIRE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  CHECK(bytes.find("thermocline.v1.Inference") != std::string::npos);
  CHECK(bytes.find("thermocline.v1.Admin") != std::string::npos);
  CHECK(bytes.find("grpc.health.v1.Health") != std::string::npos);
  call->WritesDone(reinterpret_cast<void*>(4));
  REQUIRE(cq.Next(&tag, &ok));
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(5));
  REQUIRE(cq.Next(&tag, &ok));
  CHECK(st.ok());
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_CASE("grpc: a cancelled call stops within a token and frees the slot", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[scheduler]\nslots = 1\nqueue = 4\n[debug]\ndecode_delay_ms = 20\n");
  auto stub = pb::Inference::NewStub(Channel(d));
  {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, TextRequest("Once upon a time", 400));
    Reply m;
    int got = 0;
    while (got < 3 && reader->Read(&m)) got += m.token_ids_size();
    REQUIRE(got >= 3);
    ctx.TryCancel();  // 400 tokens would take 8 s
    while (reader->Read(&m)) {
    }
    CHECK(reader->Finish().error_code() == grpc::StatusCode::CANCELLED);
  }
  const auto start = Clock::now();
  const StreamResult next = Generate(*stub, TextRequest("The cat", 5));
  CheckFinal(next, Reply::MAX_TOKENS);
  CHECK(SecondsSince(start) < 2.0);
  const std::string m = MetricsText(d.port());
  INFO(m);
  CHECK(MetricValue(m, R"(thermocline_cancellations_total{reason="client_disconnected"})") == 1);
  CHECK(MetricValue(m, "thermocline_generated_tokens_total") < 100);
  CHECK(MetricValue(m, "thermocline_slots_busy") == 0);
}

TEST_CASE("grpc: a passed deadline is DEADLINE_EXCEEDED and frees the slot", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[scheduler]\nslots = 1\nqueue = 4\n[debug]\ndecode_delay_ms = 20\n");
  auto stub = pb::Inference::NewStub(Channel(d));
  const auto start = Clock::now();
  const StreamResult r = Generate(*stub, TextRequest("Once upon a time", 400), "", 0.5);
  CHECK(r.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(!r.ids.empty());  // it streamed until the deadline
  CHECK(SecondsSince(start) < 2.0);
  const auto next_start = Clock::now();
  CheckFinal(Generate(*stub, TextRequest("The cat", 5)), Reply::MAX_TOKENS);
  CHECK(SecondsSince(next_start) < 2.0);
  const std::string m = MetricsText(d.port());
  INFO(m);
  CHECK(MetricValue(m, R"(thermocline_cancellations_total{reason="deadline"})") == 1);
  CHECK(MetricValue(m, "thermocline_generated_tokens_total") < 100);

  // The server's own deadline (request_timeout_s) ends the stream normally, as DEADLINE.
  DaemonProcess short_deadline(
      "[scheduler]\nrequest_timeout_s = 0.4\n[debug]\ndecode_delay_ms = 20\n");
  auto stub2 = pb::Inference::NewStub(Channel(short_deadline));
  const StreamResult cut = Generate(*stub2, TextRequest("Once upon a time", 400));
  CheckFinal(cut, Reply::DEADLINE);
  CHECK(cut.ids.size() < 100);
}

TEST_CASE("grpc: status codes", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d(
      "[server]\napi_keys = [\"sekret\"]\n[scheduler]\nslots = 1\nqueue = 0\n"
      "[debug]\ndecode_delay_ms = 20\n");
  auto stub = pb::Inference::NewStub(Channel(d));

  SECTION("UNAUTHENTICATED without the key or with a wrong one") {
    const StreamResult none = Generate(*stub, TextRequest("Hi", 2));
    CHECK(none.status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(none.status.error_message().find("authorization") != std::string::npos);
    CHECK(Generate(*stub, TextRequest("Hi", 2), "wrong").status.error_code() ==
          grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext ctx;
    pb::ListModelsResponse res;
    CHECK(stub->ListModels(&ctx, pb::ListModelsRequest(), &res).error_code() ==
          grpc::StatusCode::UNAUTHENTICATED);
    CheckFinal(Generate(*stub, TextRequest("Hi", 2), "sekret"), Reply::MAX_TOKENS);
  }
  SECTION("NOT_FOUND for an unknown model") {
    pb::GenerateRequest req = TextRequest("Hi", 2);
    req.set_model("no-such-model");
    const StreamResult r = Generate(*stub, req, "sekret");
    CHECK(r.status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(r.status.error_message().find("no-such-model") != std::string::npos);
  }
  SECTION("INVALID_ARGUMENT naming the field") {
    pb::GenerateRequest req = TextRequest("Hi", 2);
    req.mutable_options()->set_temperature(5);
    StreamResult r = Generate(*stub, req, "sekret");
    CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(r.status.error_message().find("temperature") != std::string::npos);
    // Protobuf doubles carry NaN and infinities, which JSON cannot: each refused by name.
    using Options = pb::GenerationOptions;
    const std::pair<const char*, void (Options::*)(double)> fields[] = {
        {"temperature", &Options::set_temperature},
        {"top_p", &Options::set_top_p},
        {"min_p", &Options::set_min_p},
        {"repeat_penalty", &Options::set_repeat_penalty},
        {"presence_penalty", &Options::set_presence_penalty}};
    for (const auto& [name, set] : fields) {
      for (const double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
        req = TextRequest("Hi", 2);
        (req.mutable_options()->*set)(bad);
        r = Generate(*stub, req, "sekret");
        INFO(name << " = " << bad);
        CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        CHECK(r.status.error_message().find(name) != std::string::npos);
      }
    }
    req = TextRequest("Hi", 2);
    req.clear_text();
    r = Generate(*stub, req, "sekret");
    CHECK(r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(r.status.error_message().find("prompt") != std::string::npos);
    req = TextRequest("Hi", 2);
    req.mutable_tokens()->add_ids(1 << 30);
    CHECK(Generate(*stub, req, "sekret").status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    req = TextRequest("Hi", 1 << 20);  // beyond the context
    CHECK(Generate(*stub, req, "sekret").status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    pb::ChatRequest chat;
    chat.set_model(kModelName);
    auto* m = chat.add_messages();
    m->set_role("narrator");
    m->set_content("x");
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer sekret");
    auto reader = stub->Chat(&ctx, chat);
    Reply msg;
    CHECK(!reader->Read(&msg));
    const grpc::Status s = reader->Finish();
    CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(s.error_message().find("messages[0].role") != std::string::npos);
  }
  SECTION("RESOURCE_EXHAUSTED when the slot is busy and the queue full") {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer sekret");
    auto busy = stub->Generate(&ctx, TextRequest("Once upon a time", 200));
    Reply m;
    REQUIRE(busy->Read(&m));  // running in the only slot
    const StreamResult refused = Generate(*stub, TextRequest("Hi", 2), "sekret");
    CHECK(refused.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(refused.messages.empty());
    ctx.TryCancel();
    while (busy->Read(&m)) {
    }
    busy->Finish();
  }
}

TEST_CASE("grpc: while models load, health is NOT_SERVING and generation UNAVAILABLE",
          "[server][grpc]") {
  server::ServerConfig config;
  config.grpc_port = 0;
  config.access_log = false;
  config.models.push_back(server::ModelConfig{"/nonexistent.gguf", "later"});
  REQUIRE(server::FinalizeConfig(&config).ok());
  server::ModelRegistry registry(config.models);  // not loaded: every model is "loading"
  server::GrpcFrontEnd front_end(config, &registry, /*admin=*/nullptr);
  auto port = front_end.Start();
  REQUIRE(port.ok());
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(*port), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckResponse hres;
  grpc::ClientContext hctx;
  REQUIRE(health->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &hres).ok());
  CHECK(hres.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);

  auto stub = pb::Inference::NewStub(channel);
  pb::GenerateRequest req = TextRequest("Hi", 2);
  req.set_model("later");
  const StreamResult r = Generate(*stub, req);
  CHECK(r.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(r.messages.empty());

  auto admin = pb::Admin::NewStub(channel);  // this daemon has no registry
  grpc::ClientContext actx;
  pb::ListRegisteredModelsResponse list;
  CHECK(admin->ListModels(&actx, pb::ListRegisteredModelsRequest(), &list).error_code() ==
        grpc::StatusCode::UNAVAILABLE);
  front_end.Shutdown(std::chrono::steady_clock::now());
}

TEST_CASE("grpc: SIGTERM lets a stream finish, new calls are UNAVAILABLE", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[debug]\ndecode_delay_ms = 20\n");
  auto stub = pb::Inference::NewStub(Channel(d));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  auto reader = stub->Generate(&ctx, TextRequest("Once upon a time", 40));
  Reply m;
  REQUIRE(reader->Read(&m));
  d.Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const StreamResult late = Generate(*stub, TextRequest("Hi", 2));
  CHECK(late.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  std::string text = m.text();
  Reply::StopReason last = m.stop_reason();
  while (reader->Read(&m)) {
    text += m.text();
    last = m.stop_reason();
  }
  CHECK(reader->Finish().ok());
  CHECK(last == Reply::MAX_TOKENS);
  CHECK(d.Wait() == 0);
}

TEST_CASE("grpc: calls are counted in thermocline_requests_total by method and status",
          "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"k\"]\n");
  auto channel = Channel(d);
  auto stub = pb::Inference::NewStub(channel);
  CheckFinal(Generate(*stub, TextRequest("Once upon a time", 3), "k"), Reply::MAX_TOKENS);
  CheckFinal(Generate(*stub, TextRequest("The cat", 2), "k"), Reply::MAX_TOKENS);
  CHECK(Generate(*stub, TextRequest("Hi", 2)).status.error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  pb::GenerateRequest unknown = TextRequest("Hi", 2);
  unknown.set_model("nope");
  CHECK(Generate(*stub, unknown, "k").status.error_code() == grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer k");
    pb::TokenizeRequest req;
    req.set_model(kModelName);
    req.set_text("Hello");
    pb::TokenizeResponse res;
    REQUIRE(stub->Tokenize(&ctx, req, &res).ok());
  }
  {
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse res;
    REQUIRE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &res).ok());
  }
  {
    // A method no service has: counted, under "other" (clients cannot grow the label set).
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, 10);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), reply;
    grpc::Status status;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    generic.UnaryCall(&ctx, "/thermocline.v1.Inference/NoSuchMethod", grpc::StubOptions(), &request,
                      &reply, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string m = Http(d.port(), "GET", "/metrics", "", {{"Authorization", "Bearer k"}}).body;
  INFO(m);
  auto count = [&](const std::string& method, const std::string& status) {
    return MetricValue(m, "thermocline_requests_total{frontend=\"grpc\",endpoint=\"" + method +
                              "\",status=\"" + status + "\"}");
  };
  CHECK(count("/thermocline.v1.Inference/Generate", "OK") == 2);
  CHECK(count("/thermocline.v1.Inference/Generate", "UNAUTHENTICATED") == 1);
  CHECK(count("/thermocline.v1.Inference/Generate", "NOT_FOUND") == 1);
  CHECK(count("/thermocline.v1.Inference/Tokenize", "OK") == 1);
  CHECK(count("/grpc.health.v1.Health/Check", "OK") == 1);
  CHECK(count("other", "UNIMPLEMENTED") == 1);
  CHECK(m.find("NoSuchMethod") == std::string::npos);
}

TEST_CASE("grpc: stop is prompt while a client holds an idle connection", "[server][grpc]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto channel = Channel(d);
  auto stub = pb::Inference::NewStub(channel);
  CheckFinal(Generate(*stub, TextRequest("Once upon a time", 2)), Reply::MAX_TOKENS);
  REQUIRE(channel->GetState(false) == GRPC_CHANNEL_READY);  // connected, no call in flight
  const auto start = Clock::now();
  CHECK(d.Stop() == 0);
  const double seconds = SecondsSince(start);
  INFO(d.Log());
  CHECK(seconds < 2.0);
}

TEST_CASE("grpc admin: register, get, list, watch, ALREADY_EXISTS, NOT_FOUND, delete",
          "[server][grpc][admin]") {
  const std::string relu = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(relu)) THERMOCLINE_SKIP("no test model at " + relu);
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nadmin_key = \"boss\"\n");
  auto admin = pb::Admin::NewStub(Channel(d));
  auto call = [](grpc::ClientContext* ctx, const std::string& key = "boss") {
    SetDeadline(ctx, 30);
    if (!key.empty()) ctx->AddMetadata("authorization", "Bearer " + key);
  };
  pb::RegisterModelRequest reg;
  reg.set_path(relu);
  reg.set_name("relu");
  reg.set_activation("relu");
  reg.set_profile_tokens(64);
  pb::ModelInfo info;
  {
    grpc::ClientContext ctx;
    call(&ctx, "");
    CHECK(admin->RegisterModel(&ctx, reg, &info).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    const grpc::Status s = admin->RegisterModel(&ctx, reg, &info);
    INFO(s.error_message());
    REQUIRE(s.ok());
    CHECK(info.name() == "relu");
    // The daemon keeps the path as given, made absolute (symlinks are not resolved).
    CHECK(info.path() == std::filesystem::absolute(relu).lexically_normal().string());
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    const grpc::Status s = admin->RegisterModel(&ctx, reg, &info);
    CHECK(s.error_code() == grpc::StatusCode::ALREADY_EXISTS);
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    pb::GetModelRequest get;
    get.set_name("nope");
    CHECK(admin->GetModel(&ctx, get, &info).error_code() == grpc::StatusCode::NOT_FOUND);
  }
  {
    // Watch to a terminal state: progress never goes back, and the job ends ready.
    grpc::ClientContext ctx;
    call(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(100));
    pb::WatchModelRequest watch;
    watch.set_name("relu");
    auto reader = admin->WatchModel(&ctx, watch);
    std::vector<pb::ModelInfo> seen;
    while (reader->Read(&info)) seen.push_back(info);
    const grpc::Status s = reader->Finish();
    INFO(s.error_message());
    REQUIRE(s.ok());
    REQUIRE(!seen.empty());
    for (size_t i = 1; i < seen.size(); ++i) CHECK(seen[i].version() > seen[i - 1].version());
    INFO(seen.back().last_error());
    CHECK(seen.back().state() == pb::ModelInfo::READY);
    CHECK(seen.back().mode() == "sparse");
    CHECK(seen.back().has_placement());
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    pb::ListRegisteredModelsResponse list;
    REQUIRE(admin->ListModels(&ctx, pb::ListRegisteredModelsRequest(), &list).ok());
    bool found = false;
    for (const pb::ModelInfo& m : list.models()) found |= m.name() == "relu";
    CHECK(found);
  }
  {
    grpc::ClientContext ctx;
    call(&ctx);
    pb::DeleteModelRequest del;
    del.set_name("relu");
    pb::DeleteModelResponse res;
    REQUIRE(admin->DeleteModel(&ctx, del, &res).ok());
    CHECK(res.deleted());
    grpc::ClientContext again;
    call(&again);
    CHECK(admin->DeleteModel(&again, del, &res).error_code() == grpc::StatusCode::NOT_FOUND);
  }
}

}  // namespace
}  // namespace thermocline::testing
