// Tokenizers read from GGUF metadata (tokenizer.ggml.*): SentencePiece-style "llama" vocabularies
// (scores, <0xNN> byte fallback, leading-space handling as llama.cpp does) and GPT-2 byte-level
// BPE ("gpt2", with merges and the pre-tokenizer regex of Llama-3 / Qwen style models).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gguf/gguf.h"

namespace thermocline {

// Everything a tokenizer is built from, as tokenizer.ggml.* holds it. FromGguf reads one; tests
// may fill one in directly. Unset optionals take the model's defaults: for llama BOS 1, EOS 2,
// UNK 0 (when in range), add_bos and add_space_prefix true; for gpt2 no special ids, add_bos
// only for Llama-3's pre-tokenizer, no space prefix.
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;                   // tokenizer.ggml.pre (gpt2 only; "": GPT-2's regex)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores; empty -> all 0
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type; empty -> all normal
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("a b", rank = index; gpt2)
  // Special ids; a negative value means "none".
  std::optional<int64_t> bos_id, eos_id, unk_id, eot_id, eom_id;
  std::optional<bool> add_bos;           // tokenizer.ggml.add_bos_token
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix
};

// Immutable once built: every const method may be called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer that tokenizer.ggml.model names; an unknown model or inconsistent
  // arrays (tokens vs scores vs types lengths, ids out of range) is an error.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // The same from a vocabulary already in memory; errors name the GGUF key at fault.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);
  // Whether FromGguf would accept the file's tokenizer kind (tokenizer.ggml.model, and for BPE
  // tokenizer.ggml.pre), from those two keys alone: an unknown model or pre-tokenizer name is
  // an error naming it. A BPE vocabulary without a pre-tokenizer name is accepted (GPT-2's
  // regex, as such old conversions mean) with a warning appended to `warnings`.
  static absl::Status CheckSupported(const GgufFile& file, std::vector<std::string>* warnings);

  // Text to ids as llama.cpp's llama_tokenize does (parse_special = false: control tokens are
  // never produced from text; user-defined ones are): BOS prepended when add_bos is true (and
  // the vocabulary has one). Callers wanting the model's default pass add_bos().
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos) const = 0;

  // The bytes a token stands for (byte tokens as their byte, '▁' as a space, control, unknown
  // and unused tokens as empty, user-defined ones verbatim). May be an incomplete UTF-8
  // sequence. Out-of-range ids give "".
  virtual std::string TokenToPiece(int32_t id) const = 0;

  // Ids to text: the pieces concatenated, with the leading space of the first non-empty piece
  // dropped when the vocabulary adds a space prefix (whether or not BOS comes first), so that
  // Decode(Encode(text, add_bos)) == text. Out-of-range ids decode to nothing. The bytes are
  // returned as they are (they may be ill-formed UTF-8 when a character is cut).
  std::string Decode(absl::Span<const int32_t> ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 when none
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  // tokenizer.ggml.add_bos_token (default true for llama and Llama-3 BPE, false for other BPE).
  bool add_bos() const { return add_bos_; }
  // tokenizer.ggml.add_space_prefix (default true for llama, false for gpt2).
  bool add_space_prefix() const { return add_space_prefix_; }
  int32_t unk_id() const { return unk_id_; }           // -1 when none
  const std::string& model() const { return model_; }  // "llama" or "gpt2"
  // End of generation: EOS, EOT, or other end tokens the vocabulary marks.
  bool IsEndOfGeneration(int32_t id) const;
  const std::string& token_text(int32_t id) const { return tokens_[id]; }
  // Control / special tokens (type 3, and the end-of-turn tokens found by name) are not
  // emitted as text. False for out-of-range ids.
  bool IsControl(int32_t id) const;

 protected:
  // Token types as llama.cpp numbers them.
  static constexpr int32_t kTypeNormal = 1;
  static constexpr int32_t kTypeUnknown = 2;
  static constexpr int32_t kTypeControl = 3;
  static constexpr int32_t kTypeUserDefined = 4;
  static constexpr int32_t kTypeUnused = 5;
  static constexpr int32_t kTypeByte = 6;

  // A stretch of input text, or a user-defined token found in it.
  struct Fragment {
    std::string_view text;  // empty when `token` is set
    int32_t token = -1;
  };

  // Validates `vocab` and fills the members below (types, specials, EOG set).
  absl::Status InitCommon(TokenizerVocab& vocab);
  // Splits out user-defined tokens (type 4), longest text first, as llama.cpp's
  // tokenizer_st_partition does with parse_special = false (control tokens are left as text).
  std::vector<Fragment> SplitUserDefined(std::string_view text) const;

  std::string model_;
  int32_t unk_id_ = -1;
  std::vector<int32_t> user_defined_ids_;  // longest text first
  std::vector<std::string> tokens_;
  std::vector<int32_t> token_types_;  // llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user, 6 byte
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::vector<int32_t> eog_ids_;
  bool add_bos_ = true;
  bool add_space_prefix_ = true;
};

// The error for a tokenizer.ggml.pre whose pre-tokenizer is not implemented.
absl::Status UnsupportedPreTokenizer(std::string_view name);

// Turns a stream of tokens into text that is always valid UTF-8: bytes of a multi-byte
// character split across tokens are held back until the character is complete; bytes that can
// never complete one come out as U+FFFD. The first non-empty piece loses its leading space as
// in Decode, so the pushes concatenated equal Decode for well-formed text. Not thread-safe.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Text that became complete with this token (possibly empty).
  std::string Push(int32_t id);
  // Whatever is held back at the end (invalid bytes replaced by U+FFFD).
  std::string Flush();
  void Reset();
  // Treats the next token as continuing text already shown (e.g. the first generated token
  // after a prompt): its leading space is kept. Reset() undoes this.
  void KeepLeadingSpace();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  bool first_ = true;
};

}  // namespace thermocline
