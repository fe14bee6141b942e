// Prompt text to token ids with the model's control tokens recognised by their text ("<s>",
// "<|im_start|>", ...), as llama.cpp tokenizes with parse_special = true: the chat templates
// write control tokens as text. The text between them goes through the tokenizer's Encode.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace thermocline::server {

class PromptEncoder {
 public:
  explicit PromptEncoder(const Tokenizer& tokenizer);

  // BOS first when `add_bos` and the model has one, unless the text already starts with it.
  // Thread-safe (const).
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  // The id of a control token by its text, -1 when none.
  int32_t FindControl(std::string_view text) const;

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::pair<std::string, int32_t>> controls_;  // longest text first
  bool first_byte_[256] = {};                              // a control text starts with it
};

}  // namespace thermocline::server
