// Byte-level BPE (tokenizer.ggml.model = "gpt2": GPT-2, Llama-3, Qwen2), as llama.cpp's
// llm_tokenizer_bpe: a pre-tokenizer regex splits the text, each piece's bytes are spelled with
// GPT-2's bytes_to_unicode alphabet, then merges apply lowest rank first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/tokenizer.h"

namespace thermocline {

// Builds a BpeTokenizer (the "gpt2" branch of Tokenizer::FromVocab).
absl::StatusOr<std::unique_ptr<Tokenizer>> NewBpeTokenizer(TokenizerVocab vocab);

// GPT-2's bytes_to_unicode: printable bytes other than space stand for themselves; the others
// (0x00-0x20, 0x7F-0xA0, 0xAD) map to U+0100 onwards in byte order.
uint32_t BpeByteToCodepoint(uint8_t byte);
// `bytes` spelled in that alphabet (the form token texts and merges use).
std::string BpeSpellBytes(std::string_view bytes);

// Immutable after construction; safe to use from several threads.
class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(TokenizerVocab vocab);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override;
  std::string TokenToPiece(int32_t id) const override;

  PreTokenizerKind pre_tokenizer() const { return pre_; }

 private:
  BpeTokenizer() = default;
  int32_t Lookup(std::string_view text) const;
  // Rank of merging `left` and `right`, or -1. `key` is scratch space.
  int32_t MergeRank(std::string_view left, std::string_view right, std::string* key) const;
  // Encodes one pre-tokenizer piece (raw bytes).
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  PreTokenizerKind pre_ = PreTokenizerKind::kGpt2;
  bool ignore_merges_ = false;  // Llama-3: a piece that is a whole token is taken as it is
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<std::string, int32_t> merge_ranks_;  // "left right" -> rank
  std::vector<std::string> pieces_;                        // TokenToPiece of every id
};

}  // namespace thermocline
