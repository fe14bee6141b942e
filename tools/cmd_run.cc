// thermocline run MODEL [PROMPT]: a chat in the terminal with a model served by a running daemon
// (POST /v1/chat/completions, streamed), like `ollama run`: the reply appears token by token and
// the conversation is kept; with a PROMPT it answers once and exits.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/commands.h"
#include "tools/daemon_client.h"

namespace thermocline::cli {
namespace {

using nlohmann::json;

constexpr char kUsage[] = R"(usage: thermocline run MODEL [PROMPT...] [options]
Chats with MODEL on a running daemon (`thermocline serve`). Without PROMPT it reads your lines
from stdin and streams each reply; /bye or end of input exits, /clear forgets the conversation.
With PROMPT it answers once and exits.
  --system TEXT            a system message at the start of the conversation
  --max-tokens N           at most N tokens per reply (default: the daemon's)
  --temp T                 sampling temperature, 0 = greedy (default: the daemon's)
)";

struct ChatOptions {
  std::string model, system;
  int64_t max_tokens = 0;   // 0 = the daemon's default
  double temperature = -1;  // < 0 = the daemon's default
};

class Chat {
 public:
  Chat(DaemonClient* client, ChatOptions options) : client_(client), options_(std::move(options)) {}

  // Sends `user` as the next user message and streams the reply to stdout. On failure the
  // conversation is as before the call.
  absl::Status Turn(const std::string& user) {
    history_.push_back({{"role", "user"}, {"content", user}});
    std::string reply;
    absl::Status status = StreamReply(&reply);
    if (!status.ok()) {
      if (!reply.empty()) std::fputc('\n', stdout);
      std::fflush(stdout);
      history_.pop_back();
      return status;
    }
    history_.push_back({{"role", "assistant"}, {"content", reply}});
    return absl::OkStatus();
  }

  void Clear() { history_.clear(); }

 private:
  absl::Status StreamReply(std::string* reply) {
    json messages = json::array();
    if (!options_.system.empty()) {
      messages.push_back({{"role", "system"}, {"content", options_.system}});
    }
    for (const json& m : history_) messages.push_back(m);
    json body = {{"model", options_.model}, {"messages", messages}, {"stream", true}};
    if (options_.max_tokens > 0) body["max_tokens"] = options_.max_tokens;
    if (options_.temperature >= 0) body["temperature"] = options_.temperature;

    bool done = false;
    std::string stream_error;
    absl::Status status =
        client_->Stream("POST", "/v1/chat/completions", body, [&](const std::string& data) {
          if (data == "[DONE]") {
            done = true;
            return false;
          }
          const json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
          if (chunk.is_discarded() || !chunk.is_object()) {
            stream_error = "the daemon sent a stream event that is not JSON: " + data;
            return false;
          }
          if (chunk.contains("error")) {
            const json& e = chunk["error"];
            stream_error = e.is_object() && e.value("message", json()).is_string()
                               ? e["message"].get<std::string>()
                               : e.dump();
            return false;
          }
          const json* choices = chunk.contains("choices") ? &chunk["choices"] : nullptr;
          if (choices == nullptr || !choices->is_array() || choices->empty()) return true;
          const json& choice = (*choices)[0];
          if (!choice.is_object() || !choice.contains("delta")) return true;
          const json& delta = choice["delta"];
          if (delta.is_object() && delta.contains("content") && delta["content"].is_string()) {
            const std::string& piece = delta["content"].get_ref<const std::string&>();
            if (!piece.empty()) {
              std::fwrite(piece.data(), 1, piece.size(), stdout);
              std::fflush(stdout);
              reply->append(piece);
            }
          }
          return true;
        });
    if (!status.ok()) return status;
    if (!stream_error.empty()) return absl::InternalError(stream_error);
    if (!done) {
      return absl::UnavailableError(
          "the daemon ended the stream before the reply was complete (see the daemon's log)");
    }
    std::fputs(isatty(STDOUT_FILENO) ? "\n\n" : "\n", stdout);
    std::fflush(stdout);
    return absl::OkStatus();
  }

  DaemonClient* client_;
  ChatOptions options_;
  std::vector<json> history_;  // user and assistant messages, in order
};

// Reads lines from stdin until /bye or end of input. Returns the exit code.
int Interactive(Chat* chat) {
  const bool tty = isatty(STDIN_FILENO);
  if (tty) std::fprintf(stderr, "Type /bye (or Ctrl-D) to exit, /clear to start over.\n");
  std::string line;
  while (true) {
    if (tty) {
      std::fputs(">>> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) {
      if (tty) std::fputc('\n', stdout);
      return 0;
    }
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty()) continue;
    if (text == "/bye") return 0;
    if (text == "/clear") {
      chat->Clear();
      if (tty) std::fprintf(stderr, "Cleared the conversation.\n");
      continue;
    }
    absl::Status status = chat->Turn(text);
    if (status.ok()) continue;
    ClientFail(status);
    // A person at the terminal may retry; a script gets a failing exit code. A daemon that is
    // gone ends the chat either way.
    if (!tty || absl::IsUnavailable(status)) return 1;
  }
}

}  // namespace

int RunChat(int argc, char** argv) {
  std::set<std::string> value_flags = kDaemonFlags;
  value_flags.insert({"--system", "--max-tokens", "--temp"});
  auto args = Args::Parse(argc, argv, value_flags, {"--help"}, {{"-h", "--help"}});
  if (!args.ok()) return Fail("run", args.status(), /*usage=*/true);
  if (args->Has("--help")) {
    std::printf("%s%s", kUsage, kDaemonUsage);
    return 0;
  }
  const std::vector<std::string>& pos = args->positionals();
  if (pos.empty()) {
    std::fprintf(stderr, "%s%s", kUsage, kDaemonUsage);
    return Fail("run", absl::InvalidArgumentError("MODEL is required"), /*usage=*/true);
  }
  ChatOptions options;
  options.model = pos[0];
  options.system = args->GetOr("--system", "");
  auto max_tokens = args->GetInt("--max-tokens", 0);
  if (!max_tokens.ok()) return Fail("run", max_tokens.status(), /*usage=*/true);
  if (args->Has("--max-tokens") && *max_tokens < 1) {
    return Fail("run", absl::InvalidArgumentError("--max-tokens must be at least 1"), true);
  }
  options.max_tokens = *max_tokens;
  auto temp = args->GetDouble("--temp", -1);
  if (!temp.ok()) return Fail("run", temp.status(), /*usage=*/true);
  if (args->Has("--temp") && (*temp < 0 || *temp > 2)) {
    return Fail("run", absl::InvalidArgumentError("--temp must be in [0, 2]"), true);
  }
  options.temperature = *temp;
  auto endpoint = EndpointFromArgs(*args);
  if (!endpoint.ok()) return Fail("run", endpoint.status(), /*usage=*/true);

  DaemonClient client(*endpoint);
  // Fails early (unreachable daemon, unknown model, missing key) before any prompt is shown.
  if (auto model = client.Call("GET", "/v1/models/" + PathSegment(options.model)); !model.ok()) {
    return ClientFail(model.status());
  }
  Chat chat(&client, options);
  if (pos.size() > 1) {
    const std::string prompt = absl::StrJoin(pos.begin() + 1, pos.end(), " ");
    absl::Status status = chat.Turn(prompt);
    return status.ok() ? 0 : ClientFail(status);
  }
  return Interactive(&chat);
}

}  // namespace thermocline::cli
