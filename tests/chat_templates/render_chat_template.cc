// Renders chat requests through the server's own path (the OpenAI request parser and
// ChatTemplate) for compare_with_jinja2.py. Reads JSON lines on stdin:
//   {"template": ..., "tool_use_template": ... (optional), "bos_token": ..., "eos_token": ...,
//    "request": {OpenAI chat request body}, "add_generation_prompt": bool, "now": unix seconds}
// and writes one JSON line per request: {"ok": true, "text": ...} or {"ok": false, "error": ...}.
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/openai_request.h"

namespace {

using thermocline::server::ApiKind;
using thermocline::server::ChatRenderOptions;
using thermocline::server::ChatSpecialTexts;
using thermocline::server::ChatTemplate;

nlohmann::ordered_json RenderOne(const nlohmann::ordered_json& in) {
  auto fail = [](const std::string& stage, const absl::Status& status) {
    return nlohmann::ordered_json{{"ok", false},
                                  {"error", stage + ": " + std::string(status.message())}};
  };
  ChatSpecialTexts specials;
  specials.bos = in.value("bos_token", "");
  specials.eos = in.value("eos_token", "");
  auto t = ChatTemplate::Create("", in.at("template").get<std::string>(), specials,
                                in.value("tool_use_template", ""));
  if (!t.ok()) return fail("create", t.status());
  const std::string raw = in.at("request").dump();
  auto body = thermocline::server::ParseJsonObject(raw);
  if (!body.ok()) return fail("request", body.status());
  auto spec = thermocline::server::SpecFromOpenAi(*body, ApiKind::kChat, raw);
  if (!spec.ok()) return fail("request", spec.status());
  ChatRenderOptions options;
  options.add_generation_prompt = in.value("add_generation_prompt", true);
  options.tools = spec->tools;
  options.variables = spec->chat_template_kwargs;
  options.now = in.value("now", int64_t{0});
  auto text = t->Render(spec->messages, options);
  if (!text.ok()) return fail("render", text.status());
  return nlohmann::ordered_json{{"ok", true}, {"text", *text}};
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::ordered_json out;
    auto in = nlohmann::ordered_json::parse(line, nullptr, false);
    if (in.is_discarded()) {
      out = {{"ok", false}, {"error", "input: not JSON"}};
    } else {
      try {
        out = RenderOne(in);
      } catch (const std::exception& e) {
        out = {{"ok", false}, {"error", std::string("input: ") + e.what()}};
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  }
  return 0;
}
