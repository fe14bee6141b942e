// The pre-tokenizer regexes of byte-level BPE vocabularies, written out by hand over code points
// (no regex engine), following llama.cpp's unicode_regex_split_custom_* matchers:
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:   as Llama-3 with \p{N} (one digit per piece).
#pragma once

#include <string_view>
#include <vector>

namespace thermocline {

enum class PreTokenizerKind {
  kGpt2,
  kLlama3,
  kQwen2,
};

// tokenizer.ggml.pre to a kind: "llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3",
// "pixtral" -> Llama-3; "qwen2", "deepseek-r1-qwen" -> Qwen2; anything else -> GPT-2.
PreTokenizerKind PreTokenizerFromName(std::string_view name);

// Splits `text` into pieces whose concatenation is `text` (views into it). Invalid UTF-8 bytes
// are single code points of class "other", so no byte is lost.
std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind);

}  // namespace thermocline
