// The gRPC front end under hostile or careless clients: proto3 strings that are always valid UTF-8
// (byte tokens cut characters), requests that do not parse (INVALID_ARGUMENT, not UNIMPLEMENTED),
// health watchers that cost no thread, the tokenize bound, and path confinement of RegisterModel.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "daemon_fixture.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "thermocline/v1/admin.grpc.pb.h"
#include "thermocline/v1/inference.grpc.pb.h"

namespace thermocline::testing {
namespace {

namespace pb = thermocline::v1;
namespace health = grpc::health::v1;

std::shared_ptr<grpc::Channel> Channel(const DaemonProcess& d) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(d.grpc_port()),
                             grpc::InsecureChannelCredentials());
}

void Deadline(grpc::ClientContext* ctx, int seconds = 10) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// Strict UTF-8 (what protobuf and Python clients demand of a string field).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += n;
  }
  return true;
}

int Threads(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

TEST_CASE("grpc: strings are valid UTF-8 although byte tokens cut characters",
          "[server][grpc][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto stub = pb::Inference::NewStub(Channel(d));
  // Characters the small vocabulary has no token for: each becomes byte tokens, whose pieces
  // are parts of a character.
  pb::TokenizeRequest treq;
  treq.set_text("snow \xE4\xB8\x96\xE7\x95\x8C");  // "snow 世界"
  treq.set_with_pieces(true);
  pb::TokenizeResponse tres;
  grpc::ClientContext tctx;
  Deadline(&tctx);
  const grpc::Status ts = stub->Tokenize(&tctx, treq, &tres);
  INFO(ts.error_message());
  REQUIRE(ts.ok());
  REQUIRE(tres.pieces_size() == tres.tokens_size());
  for (const std::string& piece : tres.pieces()) CHECK(ValidUtf8(piece));
  // One byte token alone: its text is no character.
  pb::DetokenizeRequest dreq;
  dreq.add_tokens(tres.tokens(tres.tokens_size() - 1));
  pb::DetokenizeResponse dres;
  grpc::ClientContext dctx;
  Deadline(&dctx);
  const grpc::Status ds = stub->Detokenize(&dctx, dreq, &dres);
  INFO(ds.error_message());
  REQUIRE(ds.ok());
  CHECK(ValidUtf8(dres.text()));
  CHECK(dres.text() == "\xEF\xBF\xBD");  // U+FFFD, as the HTTP API writes it
  // All of them: the whole text.
  pb::DetokenizeRequest all;
  for (int32_t id : tres.tokens()) all.add_tokens(id);
  grpc::ClientContext actx;
  Deadline(&actx);
  REQUIRE(stub->Detokenize(&actx, all, &dres).ok());
  CHECK(dres.text().find("\xE4\xB8\x96\xE7\x95\x8C") != std::string::npos);
}

TEST_CASE("grpc: a request that does not parse is INVALID_ARGUMENT", "[server][grpc][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  grpc::GenericStub generic(Channel(d));
  grpc::CompletionQueue cq;
  // Field 1 with wire type 7 (there is none): no message parses from it.
  const char garbage[] = {static_cast<char>(0x0f), static_cast<char>(0xff),
                          static_cast<char>(0xff)};
  for (const char* method :
       {"/thermocline.v1.Inference/Tokenize", "/thermocline.v1.Inference/Generate",
        "/thermocline.v1.Admin/GetModel", "/grpc.health.v1.Health/Check"}) {
    INFO(method);
    grpc::ClientContext ctx;
    Deadline(&ctx);
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer request(&slice, 1);
    auto call = generic.PrepareUnaryCall(&ctx, method, request, &cq);
    call->StartCall();
    grpc::ByteBuffer reply;
    grpc::Status status;
    call->Finish(&reply, &status, reinterpret_cast<void*>(1));
    void* tag;
    bool ok;
    REQUIRE(cq.Next(&tag, &ok));
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  // An unknown method stays UNIMPLEMENTED.
  grpc::ClientContext ctx;
  Deadline(&ctx);
  grpc::ByteBuffer empty;
  auto call = generic.PrepareUnaryCall(&ctx, "/thermocline.v1.Inference/NoSuch", empty, &cq);
  call->StartCall();
  grpc::ByteBuffer reply;
  grpc::Status status;
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  REQUIRE(cq.Next(&tag, &ok));
  CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_CASE("grpc: health watchers cost no thread each", "[server][grpc][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto stub = health::Health::NewStub(Channel(d));
  const int before = Threads(d.pid());
  constexpr int kWatchers = 64;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<health::HealthCheckResponse>>> readers;
  for (int i = 0; i < kWatchers; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    health::HealthCheckRequest req;
    readers.push_back(stub->Watch(contexts.back().get(), req));
    health::HealthCheckResponse first;
    REQUIRE(readers.back()->Read(&first));
    CHECK(first.status() == health::HealthCheckResponse::SERVING);
  }
  const int during = Threads(d.pid());
  INFO("threads before " << before << ", with " << kWatchers << " watchers " << during);
  // gRPC's own pollers may add a few; a thread per watcher would add 64.
  CHECK(during - before < 16);
  for (auto& c : contexts) c->TryCancel();
  for (auto& r : readers) r->Finish().IgnoreError();
  // SIGTERM: a watcher hears NOT_SERVING and the call ends.
  grpc::ClientContext ctx;
  health::HealthCheckRequest req;
  auto watch = stub->Watch(&ctx, req);
  health::HealthCheckResponse m;
  REQUIRE(watch->Read(&m));
  d.Signal(SIGTERM);
  std::vector<health::HealthCheckResponse::ServingStatus> seen;
  while (watch->Read(&m)) seen.push_back(m.status());
  const grpc::Status end = watch->Finish();
  INFO("watch ended with " << end.error_code() << " " << end.error_message());
  REQUIRE(!seen.empty());
  CHECK(seen.back() == health::HealthCheckResponse::NOT_SERVING);
  CHECK(d.Wait() == 0);
}

TEST_CASE("grpc: Tokenize is bounded; RegisterModel is confined", "[server][grpc][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto channel = Channel(d);
  auto stub = pb::Inference::NewStub(channel);
  pb::TokenizeRequest treq;
  treq.set_text(std::string((1 << 20) + 1, 'a'));
  pb::TokenizeResponse tres;
  grpc::ClientContext tctx;
  Deadline(&tctx);
  CHECK(stub->Tokenize(&tctx, treq, &tres).error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  auto admin = pb::Admin::NewStub(channel);
  pb::RegisterModelRequest rreq;
  rreq.set_path("/etc/passwd");
  rreq.set_name("passwd");
  pb::ModelInfo info;
  grpc::ClientContext rctx;
  Deadline(&rctx);
  const grpc::Status s = admin->RegisterModel(&rctx, rreq, &info);
  CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(s.error_message().find("allowed_paths") != std::string::npos);
  // A NaN calibration target (a protobuf double can carry one) is refused, not recorded.
  rreq.set_path(StoriesModel());
  rreq.set_name("nan-target");
  rreq.set_target_ppl_increase(std::nan(""));
  grpc::ClientContext nctx;
  Deadline(&nctx);
  const grpc::Status n = admin->RegisterModel(&nctx, rreq, &info);
  CHECK(n.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(n.error_message().find("target_ppl_increase") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
