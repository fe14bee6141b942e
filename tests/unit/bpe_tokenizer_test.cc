// Byte-level BPE ("gpt2") on a small synthetic vocabulary, and the hand-written pre-tokenizer
// regexes (GPT-2, Llama-3, Qwen2) on contractions, numbers, punctuation, newlines and scripts.
#include "engine/tokenizer/bpe_tokenizer.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_util.h"

namespace thermocline {
namespace {

using Pieces = std::vector<std::string_view>;

// 256 byte tokens (id = byte), then merged tokens, then special tokens.
struct SyntheticVocab {
  TokenizerVocab vocab;
  int32_t Id(const std::string& spelled) const {
    for (size_t i = 0; i < vocab.tokens.size(); ++i) {
      if (vocab.tokens[i] == spelled) return static_cast<int32_t>(i);
    }
    FAIL("no token " << spelled);
    return -1;
  }
};

SyntheticVocab MakeVocab(const std::string& pre, const std::vector<std::string>& merges) {
  SyntheticVocab s;
  s.vocab.model = "gpt2";
  s.vocab.pre = pre;
  for (int b = 0; b < 256; ++b) s.vocab.tokens.push_back(BpeSpellBytes(std::string(1, char(b))));
  s.vocab.merges = merges;
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    s.vocab.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
  }
  s.vocab.tokens.push_back("<|begin_of_text|>");
  s.vocab.tokens.push_back("<|eot_id|>");
  s.vocab.tokens.push_back("<tool>");
  s.vocab.token_types.assign(s.vocab.tokens.size(), 1);
  s.vocab.token_types[s.vocab.tokens.size() - 3] = 3;
  s.vocab.token_types[s.vocab.tokens.size() - 2] = 3;
  s.vocab.token_types[s.vocab.tokens.size() - 1] = 4;
  s.vocab.bos_id = static_cast<int64_t>(s.vocab.tokens.size()) - 3;
  return s;
}

const std::vector<std::string> kMerges = {
    "H e",          "l l", "He ll", "Hell o", "\u0120 w",      "o r", "\u0120w or", "l d",
    "\u0120wor ld", "' s", "1 2",   "12 3",   "\u010A \u010A", "! !", "\u0120 !!",
};

std::unique_ptr<Tokenizer> Build(const TokenizerVocab& vocab) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromVocab(vocab);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return std::move(*t);
}

TEST_CASE("Pre-tokenizers split as the Llama-3, Qwen2 and GPT-2 regexes", "[tokenizer]") {
  const std::string text = "Hello world's 12345 !!\n\n";
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*` takes the newlines after "!!" into the same piece.
  CHECK(PreTokenize(text, PreTokenizerKind::kLlama3) ==
        Pieces{"Hello", " world", "'s", " ", "123", "45", " !!\n\n"});
  CHECK(PreTokenize(text, PreTokenizerKind::kQwen2) ==
        Pieces{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", " !!\n\n"});
  CHECK(PreTokenize(text, PreTokenizerKind::kGpt2) ==
        Pieces{"Hello", " world", "'s", " 12345", " !!", "\n\n"});

  // Contractions: case-insensitive for Llama-3 only.
  CHECK(PreTokenize("I'M don't we'LL", PreTokenizerKind::kLlama3) ==
        Pieces{"I", "'M", " don", "'t", " we", "'LL"});
  CHECK(PreTokenize("I'M don't", PreTokenizerKind::kGpt2) == Pieces{"I", "'", "M", " don", "'t"});
  // Whitespace: a run before a word leaves its last space to the word; newlines gather.
  CHECK(PreTokenize("a  b\t\tc", PreTokenizerKind::kLlama3) == Pieces{"a", " ", " b", "\t", "\tc"});
  CHECK(PreTokenize("x\n\n  y   ", PreTokenizerKind::kLlama3) ==
        Pieces{"x", "\n\n", " ", " y", "   "});
  CHECK(PreTokenize("x\n\n  y   ", PreTokenizerKind::kGpt2) == Pieces{"x", "\n\n ", " y", "   "});
  // Punctuation glued to a word: [^\r\n\p{L}\p{N}]?\p{L}+ takes one leading symbol.
  CHECK(PreTokenize("(hello) \"quoted\"...", PreTokenizerKind::kLlama3) ==
        Pieces{"(hello", ")", " \"", "quoted", "\"..."});
  // Letters and numbers beyond ASCII: Cyrillic, CJK, accents, Arabic-Indic digits.
  CHECK(PreTokenize("\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xE4\xBD\xA0\xE5\xA5\xBD "
                    "caf\xC3\xA9 \xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6",
                    PreTokenizerKind::kLlama3) ==
        Pieces{"\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", " \xE4\xBD\xA0\xE5\xA5\xBD",
               " caf\xC3\xA9", " ", "\xD9\xA3\xD9\xA4\xD9\xA5", "\xD9\xA6"});
  // Emoji are symbols; invalid bytes survive as their own code points.
  CHECK(PreTokenize("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80!", PreTokenizerKind::kGpt2) ==
        Pieces{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"});
  CHECK(PreTokenize("a\xFF"
                    "b",
                    PreTokenizerKind::kLlama3) == Pieces{"a",
                                                         "\xFF"
                                                         "b"});
  CHECK(PreTokenize("", PreTokenizerKind::kLlama3).empty());

  CHECK(PreTokenizerFromName("llama-bpe") == PreTokenizerKind::kLlama3);
  CHECK(PreTokenizerFromName("qwen2") == PreTokenizerKind::kQwen2);
  CHECK(PreTokenizerFromName("gpt2") == PreTokenizerKind::kGpt2);
  CHECK(PreTokenizerFromName("") == PreTokenizerKind::kGpt2);
}

TEST_CASE("BPE spells bytes with GPT-2's bytes_to_unicode", "[tokenizer]") {
  CHECK(BpeByteToCodepoint('A') == 'A');
  CHECK(BpeByteToCodepoint('!') == '!');
  CHECK(BpeByteToCodepoint(0xA1) == 0xA1);
  CHECK(BpeByteToCodepoint(0x00) == 0x100);
  CHECK(BpeByteToCodepoint(' ') == 0x120);   // 'Ġ'
  CHECK(BpeByteToCodepoint('\n') == 0x10A);  // 'Ċ'
  CHECK(BpeByteToCodepoint(0x7F) == 0x121);
  CHECK(BpeByteToCodepoint(0xA0) == 0x142);
  CHECK(BpeByteToCodepoint(0xAD) == 0x143);
  CHECK(BpeSpellBytes(" hi\n") == "\u0120hi\u010A");
}

TEST_CASE("BPE encodes with merges in rank order", "[tokenizer]") {
  const SyntheticVocab s = MakeVocab("llama-bpe", kMerges);
  const std::unique_ptr<Tokenizer> t = Build(s.vocab);
  CHECK(t->model() == "gpt2");
  CHECK(t->add_bos());  // Llama-3's default, as llama.cpp
  CHECK_FALSE(t->add_space_prefix());

  const std::vector<int32_t> ids = t->Encode("Hello world's 12345 !!\n\n", true);
  CHECK(ids == std::vector<int32_t>{s.Id("<|begin_of_text|>"), s.Id("Hello"), s.Id("\u0120world"),
                                    s.Id("'s"), s.Id("\u0120"), s.Id("123"), '4', '5',
                                    s.Id("\u0120!!"), s.Id("\u010A\u010A")});
  CHECK(t->Decode(ids) == "Hello world's 12345 !!\n\n");
  CHECK(t->TokenToPiece(s.Id("\u0120world")) == " world");

  // Which of two overlapping merges applies depends only on their order.
  SyntheticVocab ab = MakeVocab("gpt2", {"a b", "b c"});
  CHECK(Build(ab.vocab)->Encode("abc", false) == std::vector<int32_t>{ab.Id("ab"), 'c'});
  SyntheticVocab bc = MakeVocab("gpt2", {"b c", "a b"});
  CHECK(Build(bc.vocab)->Encode("abc", false) == std::vector<int32_t>{'a', bc.Id("bc")});
}

TEST_CASE("BPE takes whole-word tokens directly for Llama-3 (ignore_merges)", "[tokenizer]") {
  SyntheticVocab s = MakeVocab("llama-bpe", {});
  s.vocab.tokens.push_back("xyz");  // a token no merge can build
  s.vocab.token_types.push_back(1);
  CHECK(Build(s.vocab)->Encode("xyz", false) == std::vector<int32_t>{s.Id("xyz")});
  s.vocab.pre = "gpt2";
  CHECK(Build(s.vocab)->Encode("xyz", false) == std::vector<int32_t>{'x', 'y', 'z'});
}

TEST_CASE("BPE round-trips arbitrary bytes and handles special tokens", "[tokenizer]") {
  const SyntheticVocab s = MakeVocab("qwen2", kMerges);
  const std::unique_ptr<Tokenizer> t = Build(s.vocab);
  CHECK_FALSE(t->add_bos());
  for (const std::string text :
       {"  Hello   world  ", "\n\n\nx\r\n", "\xF0\x9F\x98\x80 \xE4\xBD\xA0\xE5\xA5\xBD 42",
        "bad \xFF\xC3", ""}) {
    INFO("text: " << text);
    CHECK(t->Decode(t->Encode(text, false)) == text);
  }
  // Control tokens are not parsed from text (parse_special = false) and print nothing.
  const int32_t eot = s.Id("<|eot_id|>");
  const std::vector<int32_t> ids = t->Encode("<|eot_id|>", false);
  CHECK(ids.size() == std::string("<|eot_id|>").size());
  CHECK(t->Decode(ids) == "<|eot_id|>");
  CHECK(t->Decode({s.Id("Hello"), eot}) == "Hello");
  CHECK(t->IsEndOfGeneration(eot));
  CHECK(t->IsControl(eot));
  CHECK_FALSE(t->IsEndOfGeneration(s.Id("Hello")));
  // User-defined tokens are split out of text and print verbatim.
  const int32_t tool = s.Id("<tool>");
  CHECK(t->Encode("a<tool>b", false) == std::vector<int32_t>{'a', tool, 'b'});
  CHECK(t->Decode({'a', tool, 'b'}) == "a<tool>b");
}

TEST_CASE("BPE refuses a pre-tokenizer name it does not implement", "[tokenizer]") {
  // Never silently GPT-2's regex for a vocabulary trained with another split.
  for (const std::string pre : {"deepseek-llm", "tekken", "chatglm-bpe", "no-such-pre"}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromVocab(MakeVocab(pre, {}).vocab);
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(std::string(t.status().message()),
               Catch::Contains("tokenizer.ggml.pre = \"" + pre + "\""));
  }
  CHECK(PreTokenizerFromName("gpt-2") == PreTokenizerKind::kGpt2);
  CHECK(PreTokenizerFromName("") == PreTokenizerKind::kGpt2);
  CHECK(PreTokenizerFromName("llama-bpe") == PreTokenizerKind::kLlama3);
  CHECK(PreTokenizerFromName("qwen2") == PreTokenizerKind::kQwen2);
  CHECK_FALSE(PreTokenizerFromName("deepseek-v3").has_value());
}

TEST_CASE("Tokenizer::FromGguf reads a gpt2 vocabulary", "[tokenizer]") {
  const SyntheticVocab s = MakeVocab("llama-bpe", kMerges);
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "llama-bpe");
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(s.vocab.tokens));
  w.Set("tokenizer.ggml.merges", GgufValue::StringArray(s.vocab.merges));
  w.Set(
      "tokenizer.ggml.token_type",
      GgufValue::IntArray(GgufValueType::kInt32, std::vector<int64_t>(s.vocab.token_types.begin(),
                                                                      s.vocab.token_types.end())));
  w.SetUint32("tokenizer.ggml.bos_token_id", s.Id("<|begin_of_text|>"));
  w.SetUint32("tokenizer.ggml.eos_token_id", s.Id("<|eot_id|>"));
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  const std::string path = (testing::TempDir() / "bpe_tokenizer_test.gguf").string();
  REQUIRE(w.Write(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  REQUIRE(file.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromGguf(**file);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  CHECK_FALSE((*t)->add_bos());
  CHECK((*t)->eos_id() == s.Id("<|eot_id|>"));
  CHECK((*t)->Encode("Hello world", false) ==
        std::vector<int32_t>{s.Id("Hello"), s.Id("\u0120world")});
}

}  // namespace
}  // namespace thermocline
