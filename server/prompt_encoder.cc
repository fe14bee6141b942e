#include "server/prompt_encoder.h"

#include <algorithm>

namespace thermocline::server {

PromptEncoder::PromptEncoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.IsControl(id)) continue;
    const std::string& text = tokenizer.token_text(id);
    if (text.empty()) continue;
    controls_.emplace_back(text, id);
    first_byte_[static_cast<unsigned char>(text[0])] = true;
  }
  std::stable_sort(controls_.begin(), controls_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

int32_t PromptEncoder::FindControl(std::string_view text) const {
  for (const auto& [t, id] : controls_) {
    if (t == text) return id;
  }
  return -1;
}

std::vector<int32_t> PromptEncoder::Encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  const int32_t bos = tokenizer_.bos_id();
  if (add_bos && bos >= 0) out.push_back(bos);
  size_t raw_begin = 0;
  auto flush_raw = [&](size_t end) {
    if (end > raw_begin) {
      std::vector<int32_t> ids = tokenizer_.Encode(text.substr(raw_begin, end - raw_begin), false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
  };
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t found = -1;
    size_t len = 0;
    for (const auto& [t, id] : controls_) {
      if (text.compare(i, t.size(), t) == 0) {
        found = id;
        len = t.size();
        break;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    flush_raw(i);
    // A template that writes BOS itself must not get a second one.
    if (!(found == bos && out.size() == 1 && out[0] == bos && i == 0)) out.push_back(found);
    i += len;
    raw_begin = i;
  }
  flush_raw(text.size());
  return out;
}

}  // namespace thermocline::server
