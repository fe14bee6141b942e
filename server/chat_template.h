// Chat templates: turns a list of messages into the prompt text a chat model was trained on.
// The family is recognised from the GGUF's tokenizer.chat_template (Jinja source) by the
// markers it uses, or named in the config; each family is a small renderer written in C++.
// Models without a template get the documented fallback (docs/api.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::server {

struct ChatMessage {
  std::string role;  // system, user, assistant, tool (developer is mapped to system)
  std::string content;
};

// The tokens' text a renderer may need; taken from the model's vocabulary.
struct ChatSpecialTexts {
  std::string bos;  // e.g. "<s>", "<|begin_of_text|>", "<bos>"; "" when the model has none
  std::string eos;  // e.g. "</s>"
};

class ChatTemplate {
 public:
  struct Family;  // one row of the family table (chat_template.cc)

  // `override_name`: "" to detect from `template_text`, else a family name ("chatml",
  // "llama-2", ...). An unknown name is an error listing the known ones.
  static absl::StatusOr<ChatTemplate> Create(std::string_view override_name,
                                             std::string_view template_text,
                                             ChatSpecialTexts specials);
  // The names Create accepts, in the order detection tries them.
  static std::vector<std::string> FamilyNames();

  const std::string& name() const;
  bool is_fallback() const;
  // The prompt for the next assistant turn. Thread-safe (const, no state).
  std::string Render(const std::vector<ChatMessage>& messages) const;
  // Text of the token that closes an assistant turn in this family ("<|im_end|>", "<|eot_id|>",
  // ...), "" when the family closes turns with EOS. The server stops generation on it.
  const std::string& end_of_turn() const;
  // Stop strings the family implies (the fallback's "\nUser:"), added to the request's own.
  const std::vector<std::string>& implied_stops() const;

 private:
  ChatTemplate(const Family* family, ChatSpecialTexts specials);
  const Family* family_;
  ChatSpecialTexts specials_;
};

}  // namespace thermocline::server
