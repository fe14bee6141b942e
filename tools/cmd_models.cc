// thermocline models register|list|show|rm: the daemon's model registry from the terminal, as a
// client of its admin HTTP API (/admin/models). `register --wait` follows the model's progress
// stream until it is ready or failed.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/model_state.h"
#include "tools/commands.h"
#include "tools/daemon_client.h"

namespace thermocline::cli {
namespace {

using nlohmann::json;

constexpr char kUsage[] = R"(usage: thermocline models <verb> [options]
  register PATH [--name N] [--activation relu|drelu|silu] [--corpus FILE]
           [--profile-tokens N] [--gpu-memory BYTES] [--gpu-layers N|auto]
           [--target-ppl-increase F] [--wait]
                           register a GGUF model; the daemon profiles it, trains its predictors
                           and places its neurons in the background (--wait follows the progress
                           and exits 1 if the job fails); --gpu-memory / --gpu-layers: its GPU
                           options (default: the daemon's); --target-ppl-increase: a SwiGLU
                           model's sparsity calibrated for at most F over dense (0.02 = +2%)
  list [--json]            the registered models: NAME STATE STAGE MODE PATH
  show NAME [--json]       every field of one model
  rm NAME...               delete models from the registry (their files stay)
)";

std::string Str(const json& m, const char* key) {
  if (!m.is_object() || !m.contains(key)) return "";
  const json& v = m[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

double Num(const json& m, const char* key, double fallback) {
  if (!m.is_object() || !m.contains(key) || !m[key].is_number()) return fallback;
  return m[key].get<double>();
}

// "profile 42%" while a job runs, the stage alone otherwise.
std::string StageText(const json& m) {
  std::string stage = Str(m, "stage");
  const std::optional<server::ModelState> state = server::ParseModelState(Str(m, "state"));
  if (state == server::ModelState::kProfiling || state == server::ModelState::kRegistered) {
    if (stage.empty()) stage = "queued";
    stage += absl::StrFormat(" %d%%", static_cast<int>(std::floor(Num(m, "percent", 0))));
  }
  return stage.empty() ? "-" : stage;
}

std::string ModelPath(const std::string& name) { return "/admin/models/" + PathSegment(name); }

// Where attention, the output head and the FFN neurons run (`runs_on`); "-" until it is loaded.
std::string RunsOnText(const json& m) {
  if (!m.is_object() || !m.contains("runs_on") || !m["runs_on"].is_object()) return "-";
  const json& r = m["runs_on"];
  const std::string device = Str(r, "device");
  const int64_t n_layer = static_cast<int64_t>(Num(r, "n_layer", 0));
  std::string out = absl::StrFormat(
      "%s: attention of %d/%d layers and the output head on the %s, %d of %d FFN neurons on "
      "the GPU",
      device, static_cast<int64_t>(Num(r, "attention_gpu_layers", 0)), n_layer,
      Str(r, "output_head") == "gpu" ? "GPU" : "CPU",
      static_cast<int64_t>(Num(r, "ffn_neurons_on_gpu", 0)),
      static_cast<int64_t>(Num(r, "ffn_neurons", 0)));
  if (const int64_t whole = static_cast<int64_t>(Num(r, "whole_gpu_layers", 0)); whole > 0) {
    const int64_t input_sparse = static_cast<int64_t>(Num(r, "input_sparse_gpu_layers", 0));
    const int64_t gate_first = static_cast<int64_t>(Num(r, "gate_first_gpu_layers", 0));
    absl::StrAppend(&out, absl::StrFormat(" (%d whole layers", whole));
    if (input_sparse > 0) absl::StrAppend(&out, absl::StrFormat(", %d input-sparse", input_sparse));
    if (gate_first > 0) absl::StrAppend(&out, absl::StrFormat(", %d gate-first", gate_first));
    absl::StrAppend(&out, input_sparse + gate_first < whole ? ", the rest dense FFN)" : ")");
  }
  if (const std::string note = Str(r, "note"); !note.empty()) absl::StrAppend(&out, "; ", note);
  return out;
}

// Absolute, so that a daemon with another working directory finds the file.
std::string Absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

// Follows /admin/models/NAME/events until a terminal state. On a terminal the progress line is
// redrawn in place; otherwise a line is printed per stage and per 10% of progress.
int Wait(DaemonClient* client, const std::string& name) {
  const bool tty = isatty(STDOUT_FILENO);
  std::string last_key, final_state;
  bool drawn = false;  // a progress line without its newline is on the terminal
  json final_model;
  absl::Status status =
      client->Stream("GET", ModelPath(name) + "/events", nullptr, [&](const std::string& data) {
        const json m = json::parse(data, nullptr, /*allow_exceptions=*/false);
        if (m.is_discarded() || !m.is_object()) return true;
        const std::string state = Str(m, "state");
        if (const auto parsed = server::ParseModelState(state);
            parsed && server::IsSettled(*parsed)) {
          final_state = state;
          final_model = m;
          return false;
        }
        const double percent = Num(m, "percent", 0);
        const std::string key = absl::StrCat(state, "/", Str(m, "stage"), "/",
                                             static_cast<int>(percent / (tty ? 1 : 10)));
        std::string line = absl::StrCat(name, ": ", state, " ", StageText(m));
        if (double eta = Num(m, "eta_s", -1); eta >= 0) {
          line += absl::StrFormat(" (about %.0fs left)", eta);
        }
        if (tty) {
          std::printf("\r%s\x1b[K", line.c_str());
          drawn = true;
        } else if (key != last_key) {
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
        last_key = key;
        return true;
      });
  if (drawn) std::fputc('\n', stdout);
  if (!status.ok()) return ClientFail(status);
  if (final_state.empty()) {  // the stream ended without a terminal event: ask once more
    auto m = client->Call("GET", ModelPath(name));
    if (!m.ok()) return ClientFail(m.status());
    final_state = Str(*m, "state");
    final_model = *m;
  }
  const std::optional<server::ModelState> settled = server::ParseModelState(final_state);
  if (settled == server::ModelState::kReady) {
    std::printf("%s is ready (serving %s)\n", name.c_str(), Str(final_model, "mode").c_str());
    return 0;
  }
  if (settled == server::ModelState::kFailed) {
    std::string error = Str(final_model, "last_error");
    return ClientFail(absl::InternalError(
        absl::StrCat("model ", name, " failed: ", error.empty() ? "no reason given" : error)));
  }
  return ClientFail(absl::NotFoundError(absl::StrCat(
      "the progress stream of ", name, " ended before it was ready or failed (was it deleted?)")));
}

int Register(DaemonClient* client, const Args& args) {
  const auto& pos = args.positionals();
  if (pos.size() != 2) {
    return Fail("models register", absl::InvalidArgumentError("give exactly one model PATH"),
                /*usage=*/true);
  }
  const std::string path = Absolute(pos[1]);
  std::string name = args.GetOr("--name", std::filesystem::path(path).stem().string());
  json body = {{"path", path}, {"name", name}};
  if (auto act = args.Get("--activation")) body["activation"] = *act;
  if (auto corpus = args.Get("--corpus")) body["corpus"] = Absolute(*corpus);
  if (auto bytes = args.Get("--gpu-memory")) body["gpu_memory"] = *bytes;
  if (auto layers = args.Get("--gpu-layers")) body["gpu_layers"] = *layers;
  if (args.Has("--profile-tokens")) {
    auto n = args.GetInt("--profile-tokens", 0);
    if (!n.ok()) return Fail("models register", n.status(), /*usage=*/true);
    if (*n < 1) {
      return Fail("models register",
                  absl::InvalidArgumentError("--profile-tokens must be at least 1"), true);
    }
    body["profile_tokens"] = *n;
  }
  if (args.Has("--target-ppl-increase")) {
    auto f = args.GetDouble("--target-ppl-increase", 0);
    if (!f.ok()) return Fail("models register", f.status(), /*usage=*/true);
    body["target_ppl_increase"] = *f;  // the daemon checks the range
  }
  auto model = client->Call("POST", "/admin/models", body);
  if (!model.ok()) return ClientFail(model.status());
  name = Str(*model, "name").empty() ? name : Str(*model, "name");
  std::printf("registered %s (%s)\n", name.c_str(), Str(*model, "state").c_str());
  std::fflush(stdout);
  return args.Has("--wait") ? Wait(client, name) : 0;
}

int List(DaemonClient* client, const Args& args) {
  auto answer = client->Call("GET", "/admin/models");
  if (!answer.ok()) return ClientFail(answer.status());
  if (!answer->is_object() || !(*answer)["models"].is_array()) {
    return ClientFail(absl::InternalError("the daemon's /admin/models answer has no models list"));
  }
  const json& models = (*answer)["models"];
  if (args.Has("--json")) {
    std::printf("%s\n", models.dump(2).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "STATE", "STAGE", "MODE", "PATH"}};
  for (const json& m : models) {
    rows.push_back({Str(m, "name"), Str(m, "state"), StageText(m),
                    Str(m, "mode").empty() ? "-" : Str(m, "mode"), Str(m, "path")});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 3, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

std::string TimeText(const json& m, const char* key) {
  const double t = Num(m, key, 0);
  if (t <= 0) return "-";
  const time_t secs = static_cast<time_t>(t);
  struct tm tm_utc;
  gmtime_r(&secs, &tm_utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm_utc);
  return buf;
}

int Show(DaemonClient* client, const Args& args) {
  const auto& pos = args.positionals();
  if (pos.size() != 2) {
    return Fail("models show", absl::InvalidArgumentError("give exactly one model NAME"), true);
  }
  auto m = client->Call("GET", ModelPath(pos[1]));
  if (!m.ok()) return ClientFail(m.status());
  if (args.Has("--json")) {
    std::printf("%s\n", m->dump(2).c_str());
    return 0;
  }
  const auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  const double eta = Num(*m, "eta_s", -1);
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"name", Str(*m, "name")},
      {"path", Str(*m, "path")},
      {"activation", or_dash(Str(*m, "activation"))},
      {"state", Str(*m, "state")},
      {"stage", or_dash(Str(*m, "stage"))},
      {"percent", absl::StrFormat("%.1f", Num(*m, "percent", 0))},
      {"eta", eta < 0 ? "-" : absl::StrFormat("%.0fs", eta)},
      {"mode", or_dash(Str(*m, "mode"))},
      {"warning", or_dash(Str(*m, "warning"))},  // e.g. why it is served dense
      {"loaded", Str(*m, "loaded")},
      {"last error", or_dash(Str(*m, "last_error"))},
      {"sidecar", or_dash(Str(*m, "sidecar_path"))},
      {"placement", or_dash(Str(*m, "placement"))},
      {"runs on", RunsOnText(*m)},
      {"report", or_dash(Str(*m, "report"))},
      {"created", TimeText(*m, "created_at")},
      {"updated", TimeText(*m, "updated_at")},
  };
  for (const auto& [key, value] : fields) {
    std::printf("  %-12s %s\n", key.c_str(), value.c_str());
  }
  return 0;
}

int Remove(DaemonClient* client, const Args& args) {
  const auto& pos = args.positionals();
  if (pos.size() < 2) {
    return Fail("models rm", absl::InvalidArgumentError("give the NAME of a model to delete"),
                true);
  }
  int rc = 0;
  for (size_t i = 1; i < pos.size(); ++i) {
    auto answer = client->Call("DELETE", ModelPath(pos[i]));
    if (!answer.ok()) {
      rc = ClientFail(answer.status());
      continue;
    }
    std::printf("deleted %s\n", pos[i].c_str());
  }
  return rc;
}

}  // namespace

int RunModels(int argc, char** argv) {
  std::set<std::string> value_flags = kDaemonFlags;
  value_flags.insert({"--name", "--activation", "--corpus", "--profile-tokens", "--gpu-memory",
                      "--gpu-layers", "--target-ppl-increase"});
  auto args = Args::Parse(argc, argv, value_flags, {"--help", "--wait", "--json"},
                          {{"-h", "--help"}, {"-n", "--name"}});
  if (!args.ok()) return Fail("models", args.status(), /*usage=*/true);
  if (args->Has("--help")) {
    std::printf("%s%s", kUsage, kDaemonUsage);
    return 0;
  }
  const auto& pos = args->positionals();
  const std::string verb = pos.empty() ? "" : pos[0];
  using Verb = int (*)(DaemonClient*, const Args&);
  Verb run = verb == "register"                 ? Register
             : verb == "list" || verb == "ls"   ? List
             : verb == "show"                   ? Show
             : verb == "rm" || verb == "delete" ? Remove
                                                : nullptr;
  if (run == nullptr) {
    std::fprintf(stderr, "%s%s", kUsage, kDaemonUsage);
    return Fail("models",
                absl::InvalidArgumentError(verb.empty() ? "a verb is required"
                                                        : "unknown verb '" + verb + "'"),
                /*usage=*/true);
  }
  auto endpoint = EndpointFromArgs(*args, /*admin=*/true);
  if (!endpoint.ok()) return Fail("models", endpoint.status(), /*usage=*/true);
  DaemonClient client(*endpoint);
  return run(&client, *args);
}

}  // namespace thermocline::cli
