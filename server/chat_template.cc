// ChatTemplate: the GGUF's Jinja template through server/jinja, or a built-in family. The
// template variables are what HF transformers' apply_chat_template passes: messages (role,
// content, name, tool_calls with parsed arguments, tool_call_id), tools, documents (none),
// add_generation_prompt, bos_token / eos_token, plus the request's chat_template_kwargs.
#include "server/chat_template.h"

#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/chat_template_families.h"
#include "server/jinja/json.h"
#include "server/jinja/template.h"
#include "server/tool_calls.h"

namespace thermocline::server {
namespace {

using jinja::Dict;
using jinja::Value;

// Tokens that close a turn, in the order end_of_turn() prefers them.
constexpr std::string_view kTurnEnds[] = {
    "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|END_OF_TURN_TOKEN|>", "<|eom_id|>"};

constexpr std::string_view kReservedVariables[] = {"messages", "tools", "documents",
                                                   "add_generation_prompt"};

// What the probe conversations send; found in the output when the template printed it.
constexpr char kProbe[] = "thermocline-probe-7f3a";

Value Str(std::string_view s) { return Value(std::string(s)); }

Value ToolCallValue(const ChatToolCall& c, bool object_arguments) {
  Value arguments = Str(c.arguments);
  if (object_arguments) {
    auto parsed = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) arguments = jinja::FromJson(parsed);
  }
  Dict function;
  function.Set(Str("name"), Str(c.name));
  function.Set(Str("arguments"), std::move(arguments));
  Dict call;
  call.Set(Str("id"), Str(c.id));
  call.Set(Str("type"), Str(c.type));
  call.Set(Str("function"), Value::MakeDict(std::move(function)));
  return Value::MakeDict(std::move(call));
}

Value MessageValue(const ChatMessage& m, bool parts, const ChatTemplate::Shape& shape) {
  const bool object_arguments = shape.object_arguments;
  Dict d;
  d.Set(Str("role"), Str(m.role));
  if (m.content_is_null && shape.null_content) {
    d.Set(Str("content"), Value::None());
  } else if (parts && !m.content_parts.empty()) {
    jinja::ValueList items;
    for (const std::string& text : m.content_parts) {
      Dict part;
      part.Set(Str("type"), Str("text"));
      part.Set(Str("text"), Str(text));
      items.push_back(Value::MakeDict(std::move(part)));
    }
    d.Set(Str("content"), Value::List(std::move(items)));
  } else {
    d.Set(Str("content"), Str(m.content));
  }
  if (!m.name.empty()) d.Set(Str("name"), Str(m.name));
  if (!m.tool_calls.empty()) {
    jinja::ValueList calls;
    for (const ChatToolCall& c : m.tool_calls) calls.push_back(ToolCallValue(c, object_arguments));
    d.Set(Str("tool_calls"), Value::List(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.Set(Str("tool_call_id"), Str(m.tool_call_id));
  return Value::MakeDict(std::move(d));
}

bool HasToolCalls(const std::vector<ChatMessage>& messages) {
  for (const ChatMessage& m : messages) {
    if (!m.tool_calls.empty()) return true;
  }
  return false;
}

bool HasNullContent(const std::vector<ChatMessage>& messages) {
  for (const ChatMessage& m : messages) {
    if (m.content_is_null) return true;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<const jinja::Template>> ParseOne(std::string_view text,
                                                                std::string_view key) {
  auto t = jinja::Template::Parse(text);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(key), " cannot be read: ", t.status().message(),
                     "; fix the template, or set chat_template to a built-in format (",
                     absl::StrJoin(ChatTemplate::FamilyNames(), ", "), ") in the model's config"));
  }
  return std::make_shared<const jinja::Template>(std::move(*t));
}

}  // namespace

ChatTemplate::ChatTemplate(const Family* family, ChatSpecialTexts specials)
    : family_(family), specials_(std::move(specials)) {
  if (family_ != nullptr && !family_->end_of_turn.empty()) {
    end_of_turn_texts_.push_back(family_->end_of_turn);
  }
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view override_name,
                                                  std::string_view template_text,
                                                  ChatSpecialTexts specials,
                                                  std::string_view tool_use_text) {
  const auto& families = ChatFamilies();
  if (!override_name.empty()) {
    for (const Family& f : families) {
      if (f.name == override_name) return ChatTemplate(&f, std::move(specials));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unknown chat template '", std::string(override_name),
                     "'; known: ", absl::StrJoin(FamilyNames(), ", ")));
  }
  if (template_text.empty()) return ChatTemplate(&families.back(), std::move(specials));

  ChatTemplate t(nullptr, std::move(specials));
  auto main = ParseOne(template_text, "tokenizer.chat_template");
  if (!main.ok()) return main.status();
  t.jinja_ = std::move(*main);
  if (!tool_use_text.empty()) {
    auto tool_use = ParseOne(tool_use_text, "tokenizer.chat_template.tool_use");
    if (!tool_use.ok()) return tool_use.status();
    t.jinja_tool_use_ = std::move(*tool_use);
  }
  t.tool_format_ = DetectToolCallFormat(std::string(template_text) + std::string(tool_use_text));
  t.renders_tools_ = template_text.find("tools") != std::string_view::npos ||
                     tool_use_text.find("tools") != std::string_view::npos;
  for (std::string_view marker : kTurnEnds) {
    const bool used = template_text.find(marker) != std::string_view::npos ||
                      tool_use_text.find(marker) != std::string_view::npos;
    if (used) t.end_of_turn_texts_.emplace_back(marker);
  }

  // A plain one-message conversation must render: what fails here would fail every request.
  ChatMessage probe;
  probe.role = "user";
  probe.content = kProbe;
  ChatRenderOptions options;
  options.now = 0;
  auto plain = t.RenderJinja(*t.jinja_, {probe}, options, Shape{true, true});
  if (!plain.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.chat_template fails on a one-message conversation: ", plain.status().message()));
  }
  if (t.jinja_tool_use_) {
    options.tools = nlohmann::ordered_json::array();
    auto with_tools = t.RenderJinja(*t.jinja_tool_use_, {probe}, options, Shape{true, true});
    if (!with_tools.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.chat_template.tool_use fails on a one-message conversation: ",
                       with_tools.status().message()));
    }
    options.tools = nullptr;
  }
  // Does the template read OpenAI content parts itself? Then it gets them as sent.
  probe.content_parts = {kProbe};
  t.parts_supported_ = true;
  auto parts = t.RenderJinja(*t.jinja_, {probe}, options, Shape{true, true});
  t.parts_supported_ = parts.ok() && parts->find(kProbe) != std::string::npos &&
                       parts->find("'type': 'text'") == std::string::npos;
  return t;
}

std::vector<std::string> ChatTemplate::FamilyNames() {
  std::vector<std::string> names;
  for (const Family& f : ChatFamilies()) names.push_back(f.name);
  return names;
}

const std::string& ChatTemplate::name() const {
  static const std::string kJinja = "jinja";
  return family_ != nullptr ? family_->name : kJinja;
}

bool ChatTemplate::is_fallback() const { return family_ != nullptr && family_->detect == nullptr; }

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  auto r = Render(messages, ChatRenderOptions());
  return r.ok() ? *std::move(r) : std::string();
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 const ChatRenderOptions& options) const {
  if (family_ != nullptr) return family_->render(messages, specials_);
  if (!options.variables.is_null() && !options.variables.is_object()) {
    return absl::InvalidArgumentError("chat template variables must be an object");
  }
  const jinja::Template& t =
      !options.tools.is_null() && jinja_tool_use_ ? *jinja_tool_use_ : *jinja_;
  // HF's convention, which most templates follow: tool call arguments as an object, a turn
  // of tool calls with content None. Templates that build calls by string concatenation want
  // the arguments' JSON text, and many concatenate or search the content, wanting "".
  auto r = RenderJinja(t, messages, options, Shape{true, true});
  if (r.ok()) return r;
  const bool calls = HasToolCalls(messages);
  const bool nulls = HasNullContent(messages);
  for (const Shape shape : {Shape{false, true}, Shape{true, false}, Shape{false, false}}) {
    if ((!shape.object_arguments && !calls) || (!shape.null_content && !nulls)) continue;
    auto retry = RenderJinja(t, messages, options, shape);
    if (retry.ok()) return retry;
  }
  return r;
}

absl::StatusOr<std::string> ChatTemplate::RenderJinja(const jinja::Template& t,
                                                      const std::vector<ChatMessage>& messages,
                                                      const ChatRenderOptions& options,
                                                      const Shape& shape) const {
  jinja::ValueList list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    list.push_back(MessageValue(m, parts_supported_, shape));
  }
  jinja::Template::Variables vars;
  vars.emplace_back("messages", Value::List(std::move(list)));
  vars.emplace_back("tools",
                    options.tools.is_null() ? Value::None() : jinja::FromJson(options.tools));
  vars.emplace_back("documents", Value::None());
  vars.emplace_back("add_generation_prompt", Value(options.add_generation_prompt));
  if (!specials_.bos.empty()) vars.emplace_back("bos_token", Str(specials_.bos));
  if (!specials_.eos.empty()) vars.emplace_back("eos_token", Str(specials_.eos));
  if (options.variables.is_object()) {
    for (const auto& [key, value] : options.variables.items()) {
      for (std::string_view reserved : kReservedVariables) {
        if (key == reserved) {
          return absl::InvalidArgumentError(
              absl::StrCat("chat template variable '", key, "' is set by the server"));
        }
      }
      vars.emplace_back(key, jinja::FromJson(value));
    }
  }
  auto out = t.Render(vars, options.now.value_or(std::time(nullptr)));
  if (!out.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", out.status().message()));
  }
  return out;
}

const std::string& ChatTemplate::end_of_turn() const {
  return end_of_turn_texts_.empty() ? empty_ : end_of_turn_texts_.front();
}

const std::vector<std::string>& ChatTemplate::implied_stops() const {
  static const std::vector<std::string> kNone;
  return family_ != nullptr ? family_->implied_stops : kNone;
}

}  // namespace thermocline::server
