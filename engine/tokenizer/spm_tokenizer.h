// SentencePiece-style BPE over a scored vocabulary (tokenizer.ggml.model = "llama"), as
// llama.cpp's llm_tokenizer_spm: spaces escaped to U+2581, an optional leading space, bigram
// merges by score, and <0xNN> byte fallback for characters outside the vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace thermocline {

// Builds an SpmTokenizer (the "llama" branch of Tokenizer::FromVocab).
absl::StatusOr<std::unique_ptr<Tokenizer>> NewSpmTokenizer(TokenizerVocab vocab);

// Immutable after construction; safe to use from several threads.
class SpmTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<SpmTokenizer>> Create(TokenizerVocab vocab);

  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const override;
  std::string TokenToPiece(int32_t id) const override;

 private:
  SpmTokenizer() = default;
  int32_t Lookup(std::string_view text) const;
  // Tokenizes text whose spaces are already escaped to U+2581.
  void EncodeEscaped(std::string_view text, std::vector<int32_t>* out) const;
  // Output for a symbol that is not in the vocabulary: its bytes as byte tokens, or one unknown
  // token when a byte has no token (vocabularies without byte fallback).
  void EmitFallback(std::string_view symbol, std::vector<int32_t>* out) const;

  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<float> scores_;
  // (character, next character) pairs found inside some token, as PairKey codes.
  absl::flat_hash_set<uint64_t> inner_pairs_;
  std::array<int32_t, 256> byte_ids_{};  // -1 where the byte has no token
  std::vector<std::string> pieces_;      // TokenToPiece of every id
};

}  // namespace thermocline
