// The family table behind ChatTemplate's built-in formats (chat_template_families.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/chat_template.h"

namespace thermocline::server {

using Messages = std::vector<ChatMessage>;

struct ChatTemplate::Family {
  std::string name;
  // Recognises the family in a tokenizer.chat_template text; null for the fallback.
  bool (*detect)(std::string_view t);
  std::string (*render)(const Messages& m, const ChatSpecialTexts& s);
  std::string end_of_turn;
  std::vector<std::string> implied_stops;
};

// The families, in the order detection tries them; the fallback last.
const std::vector<ChatTemplate::Family>& ChatFamilies();

}  // namespace thermocline::server
