// What every tokenizer shares: reading tokenizer.ggml.* from a GGUF file, validating it,
// special and end-of-generation ids, user-defined token splitting, and Decode.
#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/spm_tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

constexpr char kModelKey[] = "tokenizer.ggml.model";
constexpr char kPreKey[] = "tokenizer.ggml.pre";
constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kScoresKey[] = "tokenizer.ggml.scores";
constexpr char kTypesKey[] = "tokenizer.ggml.token_type";
constexpr char kMergesKey[] = "tokenizer.ggml.merges";
constexpr char kBosKey[] = "tokenizer.ggml.bos_token_id";
constexpr char kEosKey[] = "tokenizer.ggml.eos_token_id";
constexpr char kUnkKey[] = "tokenizer.ggml.unknown_token_id";
constexpr char kEotKey[] = "tokenizer.ggml.eot_token_id";
constexpr char kEomKey[] = "tokenizer.ggml.eom_token_id";
constexpr char kAddBosKey[] = "tokenizer.ggml.add_bos_token";
constexpr char kAddSpacePrefixKey[] = "tokenizer.ggml.add_space_prefix";

// Token texts llama.cpp treats as end of generation whatever the metadata says.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",      "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<end_of_utterance>",
};

absl::Status WrongType(std::string_view key, const GgufValue& value, std::string_view wanted) {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(key), " must be ", AbslView(wanted),
                                                 ", but it is ", value.DebugString(4)));
}

absl::StatusOr<std::optional<std::string>> ReadString(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return std::nullopt;
  if (const std::string* s = v->AsString()) return *s;
  return WrongType(key, *v, "a string");
}

absl::StatusOr<std::optional<int64_t>> ReadId(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr || v->is_array()) {
    if (v != nullptr) return WrongType(key, *v, "an integer token id");
    return std::nullopt;
  }
  if (std::optional<int64_t> i = v->AsInt()) return *i;
  if (v->AsUint()) return int64_t{-1};  // above INT64_MAX: a "none" sentinel
  return WrongType(key, *v, "an integer token id");
}

absl::StatusOr<std::optional<bool>> ReadBool(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return std::nullopt;
  if (std::optional<bool> b = v->AsBool()) return *b;
  return WrongType(key, *v, "a bool");
}

// Reads every tokenizer.ggml.* key a tokenizer uses into `vocab`.
absl::Status ReadVocab(const GgufFile& file, TokenizerVocab& vocab) {
  absl::StatusOr<std::optional<std::string>> model = ReadString(file, kModelKey);
  if (!model.ok()) return model.status();
  if (!model->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kModelKey, " is missing: the file has no tokenizer"));
  }
  vocab.model = **model;
  absl::StatusOr<std::optional<std::string>> pre = ReadString(file, kPreKey);
  if (!pre.ok()) return pre.status();
  vocab.pre = pre->value_or("");

  const GgufValue* tokens = file.Find(kTokensKey);
  if (tokens == nullptr) return absl::InvalidArgumentError(absl::StrCat(kTokensKey, " is missing"));
  if (tokens->AsStringArray() == nullptr) return WrongType(kTokensKey, *tokens, "string array");
  vocab.tokens = *tokens->AsStringArray();

  if (const GgufValue* scores = file.Find(kScoresKey)) {
    const std::vector<double>* s = scores->AsDoubleArray();
    if (s == nullptr) return WrongType(kScoresKey, *scores, "a float array");
    vocab.scores.assign(s->begin(), s->end());
  }
  if (const GgufValue* types = file.Find(kTypesKey)) {
    if (const std::vector<int64_t>* t = types->AsIntArray()) {
      vocab.token_types.assign(t->begin(), t->end());
    } else if (const std::vector<uint64_t>* u = types->AsUintArray()) {
      vocab.token_types.assign(u->begin(), u->end());
    } else {
      return WrongType(kTypesKey, *types, "an integer array");
    }
  }
  if (const GgufValue* merges = file.Find(kMergesKey)) {
    if (merges->AsStringArray() == nullptr) return WrongType(kMergesKey, *merges, "string array");
    vocab.merges = *merges->AsStringArray();
  } else if (vocab.model == "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat(kMergesKey, " is missing; a gpt2 (BPE) vocabulary needs its merges"));
  }

  const std::pair<const char*, std::optional<int64_t>*> ids[] = {
      {kBosKey, &vocab.bos_id}, {kEosKey, &vocab.eos_id}, {kUnkKey, &vocab.unk_id},
      {kEotKey, &vocab.eot_id}, {kEomKey, &vocab.eom_id},
  };
  for (const auto& [key, out] : ids) {
    absl::StatusOr<std::optional<int64_t>> id = ReadId(file, key);
    if (!id.ok()) return id.status();
    *out = *id;
  }
  absl::StatusOr<std::optional<bool>> add_bos = ReadBool(file, kAddBosKey);
  if (!add_bos.ok()) return add_bos.status();
  vocab.add_bos = *add_bos;
  absl::StatusOr<std::optional<bool>> add_space = ReadBool(file, kAddSpacePrefixKey);
  if (!add_space.ok()) return add_space.status();
  vocab.add_space_prefix = *add_space;
  return absl::OkStatus();
}

// A special id from its key, or the model's default when the key is absent. A negative value or
// 0xFFFFFFFF (what converters write for "none") means none.
absl::StatusOr<int32_t> ResolveId(const std::optional<int64_t>& value, const char* key,
                                  int64_t fallback, size_t n_tokens) {
  const int64_t n = static_cast<int64_t>(n_tokens);
  if (!value.has_value())
    return fallback >= 0 && fallback < n ? static_cast<int32_t>(fallback) : -1;
  const int64_t v = *value;
  if (v < 0 || v == 0xFFFFFFFF) return -1;
  if (v >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " = ", v, " is out of range: the vocabulary has ", n, " tokens"));
  }
  return static_cast<int32_t>(v);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  TokenizerVocab vocab;
  if (absl::Status s = ReadVocab(file, vocab); !s.ok()) return s;
  return FromVocab(std::move(vocab));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  if (vocab.model == "llama") return NewSpmTokenizer(std::move(vocab));
  if (vocab.model == "gpt2") return NewBpeTokenizer(std::move(vocab));
  return absl::InvalidArgumentError(
      absl::StrCat(kModelKey, " = \"", vocab.model,
                   "\" is not supported; supported: \"llama\" (SentencePiece), \"gpt2\" (BPE)"));
}

absl::Status UnsupportedPreTokenizer(std::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat(
      kPreKey, " = \"", AbslView(name), "\" names a pre-tokenizer that Thermocline does not ",
      "implement; supported: GPT-2's (\"gpt-2\", \"phi-2\", \"olmo\", ...), Llama 3's ",
      "(\"llama-bpe\", \"smaug-bpe\", ...) and Qwen2's (\"qwen2\", \"deepseek-r1-qwen\", ...)"));
}

absl::Status Tokenizer::CheckSupported(const GgufFile& file, std::vector<std::string>* warnings) {
  absl::StatusOr<std::optional<std::string>> model = ReadString(file, kModelKey);
  if (!model.ok()) return model.status();
  if (!model->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kModelKey, " is missing: the file has no tokenizer"));
  }
  if (**model == "llama") return absl::OkStatus();
  if (**model != "gpt2") {
    return absl::InvalidArgumentError(
        absl::StrCat(kModelKey, " = \"", **model,
                     "\" is not supported; supported: \"llama\" (SentencePiece), \"gpt2\" (BPE)"));
  }
  absl::StatusOr<std::optional<std::string>> pre = ReadString(file, kPreKey);
  if (!pre.ok()) return pre.status();
  const std::string name = pre->value_or("");
  if (!PreTokenizerFromName(name)) return UnsupportedPreTokenizer(name);
  if (name.empty() && warnings != nullptr) {
    warnings->push_back(absl::StrCat(
        kPreKey,
        " is missing: the BPE vocabulary is split with GPT-2's pre-tokenizer; a model "
        "converted for another one tokenizes some text differently (reconvert it with a current "
        "llama.cpp to be sure)"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::InitCommon(TokenizerVocab& vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat(kTokensKey, " is empty"));
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(kTokensKey, " has too many tokens: ", n));
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(kScoresKey, " has ", vocab.scores.size(),
                                                   " entries but ", kTokensKey, " has ", n));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(kTypesKey, " has ", vocab.token_types.size(),
                                                   " entries but ", kTokensKey, " has ", n));
  }
  if (vocab.scores.empty()) vocab.scores.assign(n, 0.0f);
  if (vocab.token_types.empty()) vocab.token_types.assign(n, kTypeNormal);
  for (size_t i = 0; i < n; ++i) {
    // As llama.cpp: an empty text would be unreachable and ambiguous in the lookup map.
    if (vocab.tokens[i].empty()) vocab.tokens[i] = absl::StrCat("[EMPTY_", i, "]");
  }

  const bool is_spm = vocab.model == "llama";
  absl::StatusOr<int32_t> bos = ResolveId(vocab.bos_id, kBosKey, is_spm ? 1 : -1, n);
  absl::StatusOr<int32_t> eos = ResolveId(vocab.eos_id, kEosKey, is_spm ? 2 : -1, n);
  absl::StatusOr<int32_t> unk = ResolveId(vocab.unk_id, kUnkKey, is_spm ? 0 : -1, n);
  absl::StatusOr<int32_t> eot = ResolveId(vocab.eot_id, kEotKey, -1, n);
  absl::StatusOr<int32_t> eom = ResolveId(vocab.eom_id, kEomKey, -1, n);
  for (const auto* s : {&bos, &eos, &unk, &eot, &eom}) {
    if (!s->ok()) return s->status();
  }
  model_ = vocab.model;
  bos_id_ = *bos;
  eos_id_ = *eos;
  unk_id_ = *unk;
  const bool llama3_pre = !is_spm && PreTokenizerFromName(vocab.pre) == PreTokenizerKind::kLlama3;
  add_bos_ = vocab.add_bos.value_or(is_spm || llama3_pre);
  add_space_prefix_ = vocab.add_space_prefix.value_or(is_spm);

  tokens_ = vocab.tokens;
  token_types_ = vocab.token_types;
  eog_ids_.clear();
  for (int32_t id : {*eos, *eot, *eom}) {
    if (id >= 0) eog_ids_.push_back(id);
  }
  for (size_t i = 0; i < n; ++i) {
    if (std::find(std::begin(kEogTexts), std::end(kEogTexts), tokens_[i]) == std::end(kEogTexts)) {
      continue;
    }
    eog_ids_.push_back(static_cast<int32_t>(i));
    token_types_[i] = kTypeControl;  // llama.cpp overrides the type of such tokens likewise
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  user_defined_ids_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (token_types_[i] == kTypeUserDefined) user_defined_ids_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(user_defined_ids_.begin(), user_defined_ids_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  return absl::OkStatus();
}

std::vector<Tokenizer::Fragment> Tokenizer::SplitUserDefined(std::string_view text) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text, -1});
  std::vector<Fragment> next;
  for (int32_t id : user_defined_ids_) {
    const std::string& needle = tokens_[id];
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at = rest.find(needle); at != std::string_view::npos; at = rest.find(needle)) {
        if (at > 0) next.push_back({rest.substr(0, at), -1});
        next.push_back({{}, id});
        rest.remove_prefix(at + needle.size());
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    fragments.swap(next);
  }
  return fragments;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string text;
  bool strip_space = add_space_prefix_;
  for (int32_t id : ids) {
    const std::string piece = TokenToPiece(id);
    if (piece.empty()) continue;
    std::string_view view = piece;
    if (strip_space && view.front() == ' ') view.remove_prefix(1);
    strip_space = false;
    text.append(view);
  }
  return text;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_types_[id] == kTypeControl;
}

}  // namespace thermocline
