// The client verbs of the `thermocline` binary against a real daemon: `run` (one-shot and piped
// multi-turn chat, streamed, compared with the non-streamed API's greedy text), connection and
// key settings, error messages, and `models register|list|show|rm` over the admin API.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "daemon_fixture.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

// Sets an environment variable for the scope (the CLI child processes inherit it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A loopback port nothing listens on (bound once, then released).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The non-streamed greedy reply of the chat API to `messages`.
std::string ChatText(int port, const json& messages, int max_tokens) {
  const json body = {{"model", kModelName},
                     {"messages", messages},
                     {"max_tokens", max_tokens},
                     {"temperature", 0}};
  HttpResponse r = Http(port, "POST", "/v1/chat/completions", body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  return Json(r.body)["choices"][0]["message"]["content"].get<std::string>();
}

// `thermocline ARGS` with `input` on its stdin.
CliResult RunWithInput(const std::string& args, const std::string& input) {
  static int counter = 0;
  const std::string path = (TempDir() / ("cli-stdin-" + std::to_string(counter++))).string();
  std::ofstream(path, std::ios::binary) << input;
  return RunThermocline(args + " < " + path);
}

std::string PortFlag(int port) { return " --port " + std::to_string(port); }

TEST_CASE("cli run: a one-shot prompt prints the API's greedy reply", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const std::string expected =
      ChatText(d.port(), {{{"role", "user"}, {"content", "Once upon a time"}}}, 32);
  REQUIRE(!expected.empty());
  CliResult r = RunThermocline("run stories 'Once upon a time' --temp 0 --max-tokens 32" +
                               PortFlag(d.port()) + " < /dev/null");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out == expected + "\n");
  // Several words are one prompt, as with `ollama run`; --url names the same daemon.
  r = RunThermocline(
      "run stories Once upon a time --temp 0 --max-tokens 32 --url http://127.0.0.1:" +
      std::to_string(d.port()) + " < /dev/null");
  CHECK(r.exit_code == 0);
  CHECK(r.out == expected + "\n");
}

TEST_CASE("cli run: the reply is printed token by token as it is generated", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[debug]\ndecode_delay_ms = 100\n");  // a token every 100 ms
  const std::string cmd = ThermoclineBinary() + " run stories 'Once upon a time' --temp 0 " +
                          "--max-tokens 16" + PortFlag(d.port()) + " < /dev/null 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  using Clock = std::chrono::steady_clock;
  std::string out;
  std::optional<Clock::time_point> first;
  int reads = 0;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fileno(pipe), buf, sizeof(buf))) > 0) {
    if (!first) first = Clock::now();
    out.append(buf, static_cast<size_t>(n));
    ++reads;
  }
  const auto end = Clock::now();
  CHECK(pclose(pipe) == 0);
  INFO(out);
  REQUIRE(first.has_value());
  // Pieces arrive separately, and the first one long before the last (16 tokens take >= 1.6 s;
  // a client that printed the whole reply at the end would show no gap at all).
  CHECK(reads >= 4);
  CHECK(std::chrono::duration<double>(end - *first).count() > 0.8);
  CHECK(out ==
        ChatText(d.port(), {{{"role", "user"}, {"content", "Once upon a time"}}}, 16) + "\n");
}

TEST_CASE("cli run: piped lines are a multi-turn chat that keeps its history", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const std::string system = "You are a storyteller.";
  json messages = {{{"role", "system"}, {"content", system}},
                   {{"role", "user"}, {"content", "Tell me a story"}}};
  const std::string first = ChatText(d.port(), messages, 24);
  messages.push_back({{"role", "assistant"}, {"content", first}});
  messages.push_back({{"role", "user"}, {"content", "What happened next?"}});
  const std::string second = ChatText(d.port(), messages, 24);
  REQUIRE(!first.empty());
  REQUIRE(!second.empty());

  // Blank lines are skipped; end of input ends the chat.
  CliResult r = RunWithInput(
      "run stories --system '" + system + "' --temp 0 --max-tokens 24" + PortFlag(d.port()),
      "Tell me a story\n\nWhat happened next?\n");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out == first + "\n" + second + "\n");
}

TEST_CASE("cli run: /clear forgets the conversation and /bye ends it", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json hi = {{"role", "user"}, {"content", "Hi"}};
  const std::string fresh = ChatText(d.port(), json::array({hi}), 16);
  const std::string with_history =
      ChatText(d.port(), json::array({hi, {{"role", "assistant"}, {"content", fresh}}, hi}), 16);
  CliResult r = RunWithInput("run stories --temp 0 --max-tokens 16" + PortFlag(d.port()),
                             "Hi\nHi\n/clear\nHi\n/bye\nnever sent\n");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out == fresh + "\n" + with_history + "\n" + fresh + "\n");
}

TEST_CASE("cli: a daemon that is not running is named in the error", "[server][cli]") {
  const int port = FreePort();
  const std::string message =
      "thermocline: cannot reach the daemon at http://127.0.0.1:" + std::to_string(port) +
      " (is `thermocline serve` running?)";
  for (const std::string& args : {"run stories hi" + PortFlag(port), "run stories" + PortFlag(port),
                                  "models list" + PortFlag(port),
                                  "models show x --url http://127.0.0.1:" + std::to_string(port)}) {
    CliResult r = RunThermocline(args + " < /dev/null");
    INFO(args << "\n" << r.out);
    CHECK(r.exit_code == 1);
    CHECK(r.out == message + "\n");
  }
  // THERMOCLINE_HOST is the default address, like OLLAMA_HOST.
  ScopedEnv host("THERMOCLINE_HOST", "127.0.0.1:" + std::to_string(port));
  CliResult r = RunThermocline("models list < /dev/null");
  CHECK(r.exit_code == 1);
  CHECK(r.out == message + "\n");
}

TEST_CASE("cli: bad flags are usage errors", "[server][cli]") {
  for (const std::string& args :
       {std::string("run"), std::string("run stories --port 0"),
        std::string("run stories --port x"), std::string("run stories --url 127.0.0.1:8080"),
        std::string("run stories --temp 3"), std::string("run stories --max-tokens 0"),
        std::string("models"), std::string("models frobnicate"), std::string("models show"),
        std::string("models list --url http://h:1 --port 2"), std::string("run stories --bogus")}) {
    CliResult r = RunThermocline(args + " < /dev/null");
    INFO(args << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK(r.out.find("thermocline ") != std::string::npos);
  }
}

TEST_CASE("cli: the server's error message is printed, keys come from flag or environment",
          "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"sekret\"]\n");
  const std::string port = PortFlag(d.port());
  CliResult r = RunThermocline("run stories hi --max-tokens 4" + port + " < /dev/null");
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("thermocline: a valid API key is required") == 0);

  r = RunThermocline("run nope hi --api-key sekret" + port + " < /dev/null");
  CHECK(r.exit_code == 1);
  CHECK(r.out == "thermocline: model 'nope' does not exist\n");

  r = RunThermocline("run stories hi --max-tokens 4 --api-key sekret" + port + " < /dev/null");
  CHECK(r.exit_code == 0);
  CHECK(r.out.size() > 1);
  {
    ScopedEnv key("THERMOCLINE_API_KEY", "sekret");
    ScopedEnv host("THERMOCLINE_HOST", "127.0.0.1:" + std::to_string(d.port()));
    r = RunThermocline("run stories hi --temp 0 --max-tokens 4 < /dev/null");
    CHECK(r.exit_code == 0);
    CHECK(r.out.size() > 1);
    r = RunThermocline("run stories hi --max-tokens 4 --api-key wrong < /dev/null");
    CHECK(r.exit_code == 1);
    CHECK(r.out.find("API key") != std::string::npos);
  }
}

TEST_CASE("cli models: register --wait, list, show, rm", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  if (!std::filesystem::exists(TestModelPath("relu-tiny.f32.gguf"))) {
    THERMOCLINE_SKIP("no test model at " + TestModelPath("relu-tiny.f32.gguf"));
  }
  // As the daemon records it: absolute, without "..".
  const std::string relu =
      std::filesystem::weakly_canonical(TestModelPath("relu-tiny.f32.gguf")).string();
  DaemonProcess d;  // with a registry of its own (a fresh state directory)
  if (Http(d.port(), "GET", "/admin/models").status == 404) {
    THERMOCLINE_SKIP("the daemon has no admin API yet (GET /admin/models answers 404)");
  }
  const std::string port = PortFlag(d.port());

  CliResult r = RunThermocline("models register " + relu +
                               " --name relu --profile-tokens 128 --wait" + port + " < /dev/null");
  INFO(r.out << "\nlog:\n" << d.Log());
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("registered relu") == 0);
  CHECK(r.out.find("relu is ready (serving ") != std::string::npos);

  r = RunThermocline("models list" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("NAME", 0) == 0);
  bool listed = false;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("relu ", 0) == 0) {
      listed = true;
      CHECK(line.find(" ready ") != std::string::npos);
      CHECK(line.find(relu) != std::string::npos);
    }
  }
  CHECK(listed);

  r = RunThermocline("models show relu" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("  state        ready\n") != std::string::npos);
  CHECK(r.out.find("  path         " + relu + "\n") != std::string::npos);
  CHECK(r.out.find("  warning      -\n") != std::string::npos);  // served sparse, nothing to say
  r = RunThermocline("models show relu --json" + port);
  CHECK(r.exit_code == 0);
  const json shown = Json(r.out);
  CHECK(shown["name"] == "relu");
  CHECK(shown["state"] == "ready");
  CHECK(shown["path"] == relu);
  const json api = Json(Http(d.port(), "GET", "/admin/models/relu").body);
  CHECK(shown["version"] == api["version"]);

  // A duplicate name: the CLI prints the daemon's own 409 message.
  const HttpResponse dup =
      Http(d.port(), "POST", "/admin/models", json{{"path", relu}, {"name", "relu"}}.dump());
  REQUIRE(dup.status == 409);
  r = RunThermocline("models register " + relu + " --name relu" + port);
  CHECK(r.exit_code == 1);
  CHECK(r.out == "thermocline: " + Json(dup.body)["error"]["message"].get<std::string>() + "\n");

  r = RunThermocline("models rm relu" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "deleted relu\n");
  r = RunThermocline("models show relu" + port);
  CHECK(r.exit_code == 1);
  r = RunThermocline("models list" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\nrelu ") == std::string::npos);
  r = RunThermocline("models rm relu" + port);
  CHECK(r.exit_code == 1);

  // --target-ppl-increase goes to the daemon, which checks it and names the field.
  r = RunThermocline("models register " + relu + " --name relu-ppl --target-ppl-increase 20" +
                     port);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("'target_ppl_increase' must be in [0, 10)") != std::string::npos);

  // A file that is not there fails at registration or in its job: exit 1 with a reason.
  r = RunThermocline("models register " + (TempDir() / "missing.gguf").string() + " --wait" + port);
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("thermocline: ") != std::string::npos);
}

TEST_CASE("cli models: the admin key from flag or THERMOCLINE_ADMIN_KEY", "[server][cli]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nadmin_key = \"adm\"\n");
  if (Http(d.port(), "GET", "/admin/models").status == 404) {
    THERMOCLINE_SKIP("the daemon has no admin API yet (GET /admin/models answers 404)");
  }
  const std::string port = PortFlag(d.port());
  CliResult r = RunThermocline("models list" + port);
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK(r.out.rfind("thermocline: ", 0) == 0);
  r = RunThermocline("models list --api-key adm" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("NAME", 0) == 0);
  ScopedEnv api_key("THERMOCLINE_API_KEY", "not-the-admin-key");
  ScopedEnv admin_key("THERMOCLINE_ADMIN_KEY", "adm");
  r = RunThermocline("models list" + port);
  CHECK(r.exit_code == 0);
  CHECK(r.out.rfind("NAME", 0) == 0);
}

}  // namespace
}  // namespace thermocline::testing
