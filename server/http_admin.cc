// The admin endpoints of the HTTP front end: /admin/models (register, list), /admin/models/NAME
// (show, delete), /admin/models/NAME/cancel and /admin/models/NAME/events (an SSE stream of the
// model's JSON on every change, ending after a terminal state or deletion). They translate
// HTTP to the ModelAdmin contract (server/model_admin.h), which the gRPC admin service shares;
// the admin key is checked before them (server/http_policy.h), and registered files must lie in
// the allowed folders (server/path_policy.h).
#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/errors.h"
#include "server/http_connection.h"
#include "server/http_server.h"
#include "server/openai_request.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Reads an optional string field; InvalidArgument naming it when it is not a string.
absl::Status OptionalString(const json& body, const char* key, std::string* out) {
  if (!body.contains(key) || body[key].is_null()) return absl::OkStatus();
  if (!body[key].is_string()) {
    return InvalidRequest(key, "invalid_type", absl::StrCat("'", key, "' must be a string"));
  }
  *out = body[key].get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<RegisterSpec> SpecFromJson(const json& body) {
  static const char* const kKnown[] = {
      "path",           "name",       "activation", "corpus",
      "profile_tokens", "gpu_memory", "gpu_layers", "target_ppl_increase"};
  for (const auto& [key, value] : body.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) {
      return InvalidRequest(key, "unknown_parameter",
                            absl::StrCat("unknown field '", key,
                                         "'; known: path, name, activation, corpus, "
                                         "profile_tokens, gpu_memory, gpu_layers, "
                                         "target_ppl_increase"));
    }
  }
  RegisterSpec spec;
  for (auto [key, dst] : {std::pair{"path", &spec.path},
                          {"name", &spec.name},
                          {"activation", &spec.activation},
                          {"corpus", &spec.corpus},
                          {"gpu_memory", &spec.gpu_memory},
                          {"gpu_layers", &spec.gpu_layers}}) {
    if (absl::Status s = OptionalString(body, key, dst); !s.ok()) return s;
  }
  if (spec.path.empty()) {
    return InvalidRequest("path", "missing_required_parameter",
                          "'path' is required: the GGUF model file on the daemon's machine");
  }
  if (spec.name.empty()) {
    // The file name without .gguf, as for configured models.
    std::string stem = spec.path.substr(spec.path.find_last_of('/') + 1);
    if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".gguf") == 0) {
      stem.resize(stem.size() - 5);
    }
    spec.name = stem;
  }
  if (body.contains("profile_tokens") && !body["profile_tokens"].is_null()) {
    if (!body["profile_tokens"].is_number_integer()) {
      return InvalidRequest("profile_tokens", "invalid_type",
                            "'profile_tokens' must be an integer");
    }
    spec.profile_tokens = body["profile_tokens"].get<int64_t>();
  }
  if (body.contains("target_ppl_increase") && !body["target_ppl_increase"].is_null()) {
    if (!body["target_ppl_increase"].is_number()) {
      return InvalidRequest("target_ppl_increase", "invalid_type",
                            "'target_ppl_increase' must be a number (0.02 = +2%)");
    }
    spec.target_ppl_increase = body["target_ppl_increase"].get<double>();
  }
  return spec;
}

bool Terminal(const ModelInfo& info) { return IsSettled(info.state); }

}  // namespace

void HttpFrontEnd::AdminRoutes() {
  using httplib::Request;
  using httplib::Response;
  // Every admin handler needs a model admin (there is none when the state directory could not be
  // opened).
  auto admin = [this](auto handler) {
    return [this, handler](const Request& req, Response& res) {
      ModelAdmin* a = admin_.load();
      if (a == nullptr) {
        return SendError(res, Unavailable("registry_unavailable",
                                          "the model registry is not available (see the daemon's "
                                          "log: is the state directory writable?)"));
      }
      handler(*a, req, res);
    };
  };
  // Routes that may carry a body read it bounded (WithBody), even where they ignore it.
  auto with_body = [this, admin](auto handler) {
    return WithBody([admin, handler](const Request& req, Response& res, const std::string& body) {
      admin([&](ModelAdmin& a, const Request& r, Response& out) { handler(a, r, out, body); })(req,
                                                                                               res);
    });
  };
  http_->Post("/admin/models", with_body([this](ModelAdmin& a, const Request&, Response& res,
                                                const std::string& raw) {
                auto body = ParseJsonObject(raw);
                if (!body.ok()) return SendError(res, body.status());
                auto spec = SpecFromJson(*body);
                if (!spec.ok()) return SendError(res, spec.status());
                if (absl::Status s = paths_.ConfineRegistration(&*spec); !s.ok()) {
                  return SendError(res, s);
                }
                auto info = a.Register(*spec);
                if (!info.ok()) return SendError(res, info.status());
                res.status = 201;
                res.set_content(Dump(ModelInfoJson(*info)), "application/json");
              }));
  http_->Get("/admin/models", admin([](ModelAdmin& a, const Request&, Response& res) {
               json models = json::array();
               for (const ModelInfo& info : a.List()) models.push_back(ModelInfoJson(info));
               res.set_content(Dump(json{{"models", models}}), "application/json");
             }));
  http_->Get(R"(/admin/models/([^/]+))",
             admin([this](ModelAdmin& a, const Request& req, Response& res) {
               auto info = a.Get(req.matches[1].str());
               if (!info.ok()) return SendError(res, info.status());
               res.set_content(Dump(ModelInfoJson(*info)), "application/json");
             }));
  http_->Delete(
      R"(/admin/models/([^/]+))",
      with_body([this](ModelAdmin& a, const Request& req, Response& res, const std::string&) {
        const std::string name = req.matches[1].str();
        if (absl::Status s = a.Delete(name); !s.ok()) return SendError(res, s);
        res.set_content(Dump(json{{"name", name}, {"deleted", true}}), "application/json");
      }));
  http_->Post(
      R"(/admin/models/([^/]+)/cancel)",
      with_body([this](ModelAdmin& a, const Request& req, Response& res, const std::string&) {
        const std::string name = req.matches[1].str();
        if (absl::Status s = a.Cancel(name); !s.ok()) return SendError(res, s);
        auto info = a.Get(name);
        if (!info.ok()) return SendError(res, info.status());
        res.set_content(Dump(ModelInfoJson(*info)), "application/json");
      }));
  http_->Get(
      R"(/admin/models/([^/]+)/events)",
      admin([this](ModelAdmin& a, const Request& req, Response& res) {
        const std::string name = req.matches[1].str();
        auto first = a.Get(name);
        if (!first.ok()) return SendError(res, first.status());
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        ModelAdmin* admin = &a;
        res.set_chunked_content_provider(
            "text/event-stream",
            // Runs once: the whole stream. A comment line every second notices a gone client.
            [this, admin, name, info = *first](size_t, httplib::DataSink& out) mutable {
              auto send = [&](const json& j) {
                const std::string event = absl::StrCat("data: ", Dump(j), "\n\n");
                return out.write(event.data(), event.size());
              };
              if (!send(ModelInfoJson(info))) return false;
              while (!Terminal(info) && !draining_.load()) {
                auto next = admin->WaitForChange(name, info.version, std::chrono::seconds(1));
                if (!next.ok()) {  // deleted
                  send(json{{"name", name}, {"deleted", true}});
                  break;
                }
                if (next->version == info.version) {
                  if (!out.write(": keep-alive\n\n", 14)) return false;
                  continue;
                }
                info = std::move(*next);
                if (!send(ModelInfoJson(info))) return false;
              }
              out.done();
              return true;
            });
      }));
}

}  // namespace thermocline::server
