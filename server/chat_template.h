// Chat templates: turn a list of messages into the prompt text a chat model was trained on.
// A model's GGUF tokenizer.chat_template (Jinja source) is parsed once at load by our Jinja
// engine (server/jinja/) and rendered per request the way HF transformers' apply_chat_template
// renders it. The built-in family renderers (chatml, llama-3, ...) serve files without a
// template and a config override naming a family. See docs/api.md.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/request.h"

namespace thermocline::server {

namespace jinja {
class Template;
}

struct ChatToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  std::string arguments;  // the JSON text the client sent
};

struct ChatMessage {
  std::string role;     // system, user, assistant, tool (developer is mapped to system)
  std::string content;  // the text; content parts joined
  // The text parts when the client sent content as parts; templates that iterate parts get
  // them, the others get `content`.
  std::vector<std::string> content_parts;
  bool content_is_null = false;  // content was null or absent (an assistant turn of tool calls)
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call this result answers
  std::string name;                      // optional author or tool name
};

// The tokens' text a renderer may need; taken from the model's vocabulary.
struct ChatSpecialTexts {
  std::string bos;  // e.g. "<s>", "<|begin_of_text|>", "<bos>"; "" when the model has none
  std::string eos;  // e.g. "</s>"
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // OpenAI function tools ([{"type": "function", "function": {...}}]); null: no tools.
  nlohmann::ordered_json tools;
  // More template variables (a request's chat_template_kwargs: enable_thinking, date_string,
  // tools_in_user_message, ...); an object or null. Names the renderer sets itself (messages,
  // tools, add_generation_prompt, documents) are refused.
  nlohmann::ordered_json variables;
  // What strftime_now() formats; nullopt: the current time.
  std::optional<std::time_t> now;
};

class ChatTemplate {
 public:
  struct Family;  // one row of the family table (chat_template_families.cc)
  // How messages are handed to a Jinja template: tool call arguments as an object (else the
  // JSON text), null content as None (else "").
  struct Shape {
    bool object_arguments;
    bool null_content;
  };

  // `override_name`: "" to use `template_text` (the GGUF's tokenizer.chat_template) with the
  // Jinja engine, the family fallback when it is empty; else a family name ("chatml",
  // "llama-2", ...), and an unknown name is an error listing the known ones. A template that
  // cannot be parsed, or fails on a plain one-message conversation, is InvalidArgument naming
  // the line. `tool_use_text` (tokenizer.chat_template.tool_use, may be empty) is rendered
  // instead when a request has tools, as HF does with named templates.
  static absl::StatusOr<ChatTemplate> Create(std::string_view override_name,
                                             std::string_view template_text,
                                             ChatSpecialTexts specials,
                                             std::string_view tool_use_text = "");
  // The names Create accepts as an override.
  static std::vector<std::string> FamilyNames();

  // "jinja" for a template-rendered model, else the family name.
  const std::string& name() const;
  bool is_fallback() const;
  bool is_jinja() const { return jinja_ != nullptr; }

  // The prompt for the next assistant turn (add_generation_prompt, no tools). A template
  // error gives "" (which a request turns into an error); use the overload below to get it.
  std::string Render(const std::vector<ChatMessage>& messages) const;
  // The prompt with tools and options. A template error, or raise_exception() in the
  // template, is InvalidArgument with the message. Thread-safe (const, no state).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     const ChatRenderOptions& options) const;

  // Text of the token that closes an assistant turn ("<|im_end|>", "<|eot_id|>", ...), "" when
  // turns end with EOS. The server stops generation on it.
  const std::string& end_of_turn() const;
  // Every turn-closing token text the template uses (e.g. <|eot_id|> and Llama 3.1's
  // <|eom_id|>), end_of_turn() first; empty when turns end with EOS.
  const std::vector<std::string>& end_of_turn_texts() const { return end_of_turn_texts_; }
  // Stop strings the family implies (the fallback's "\nUser:"), added to the request's own.
  const std::vector<std::string>& implied_stops() const;

  // How the model writes tool calls (server/tool_calls.h), from the template's text.
  ToolCallFormat tool_format() const { return tool_format_; }
  // The template reads `tools`; else a request's tools are described to the model in the
  // system message (WithToolPrompt).
  bool renders_tools() const { return renders_tools_; }

 private:
  ChatTemplate(const Family* family, ChatSpecialTexts specials);
  absl::StatusOr<std::string> RenderJinja(const jinja::Template& t,
                                          const std::vector<ChatMessage>& messages,
                                          const ChatRenderOptions& options,
                                          const Shape& shape) const;

  const Family* family_ = nullptr;  // null when rendered by Jinja
  ChatSpecialTexts specials_;
  std::shared_ptr<const jinja::Template> jinja_, jinja_tool_use_;
  bool parts_supported_ = false;  // the template iterates content parts itself
  std::vector<std::string> end_of_turn_texts_;
  ToolCallFormat tool_format_ = ToolCallFormat::kHermes;
  bool renders_tools_ = false;
  std::string empty_;
};

}  // namespace thermocline::server
