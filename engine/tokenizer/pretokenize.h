// The pre-tokenizer regexes of byte-level BPE vocabularies, written out by hand over code points
// (no regex engine), following llama.cpp's unicode_regex_split_custom_* matchers:
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:   as Llama-3 with \p{N} (one digit per piece).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace thermocline {

enum class PreTokenizerKind {
  kGpt2,
  kLlama3,
  kQwen2,
};

// tokenizer.ggml.pre to the kind of pre-tokenizer llama.cpp runs for that name; nullopt for a
// name whose pre-tokenizer Thermocline does not implement (or does not know). "" (the key
// absent, as in files converted before pre-tokenizer names existed) is GPT-2's.
//   GPT-2:   "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4", "jina-es", "jina-de",
//            "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "gigachat",
//            "a.x-4.0", "mellum", "trillion"
//   Llama-3: "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
//            "lfm2", "dbrx", "smaug-bpe"
//   Qwen2:   "qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"
std::optional<PreTokenizerKind> PreTokenizerFromName(std::string_view name);

// Splits `text` into pieces whose concatenation is `text` (views into it). Invalid UTF-8 bytes
// are single code points of class "other", so no byte is lost.
std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind);

}  // namespace thermocline
