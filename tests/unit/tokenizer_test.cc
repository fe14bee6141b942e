// SentencePiece ("llama") tokenizer against the reference JSONs and real vocabularies, UTF-8
// streaming, and the errors FromGguf / FromVocab report. Byte-level BPE is in bpe_tokenizer_test.
#include "engine/tokenizer/tokenizer.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_util.h"

namespace thermocline {
namespace {

using ::thermocline::testing::TestModelPath;

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  REQUIRE(file.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf(**file);
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  return std::move(*tokenizer);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

// Bytes as their <0xNN> tokens in the stories260K vocabulary (ids 3..258).
int32_t ByteToken(uint8_t b) { return 3 + b; }

std::string StreamAll(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  StreamingDetokenizer stream(tokenizer);
  std::string out;
  for (int32_t id : ids) out += stream.Push(id);
  return out + stream.Flush();
}

void CheckReference(const std::string& model, const std::string& reference) {
  const std::string model_path = TestModelPath(model);
  const std::string json_path = TestModelPath(reference);
  if (!std::filesystem::exists(model_path) || !std::filesystem::exists(json_path)) {
    THERMOCLINE_SKIP("test models not found in " + testing::TestModelsDir());
  }
  const std::unique_ptr<Tokenizer> tokenizer = Load(model_path);
  const nlohmann::json ref = nlohmann::json::parse(ReadFile(json_path));
  REQUIRE(ref["prompts"].size() == 4);
  for (const auto& p : ref["prompts"]) {
    const std::string prompt = p["prompt"];
    INFO("prompt: " << prompt);
    const auto prompt_ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto greedy_ids = p["greedy_ids"].get<std::vector<int32_t>>();
    const auto pieces = p["greedy_pieces"].get<std::vector<std::string>>();

    CHECK(tokenizer->Encode(prompt, /*add_bos=*/true) == prompt_ids);
    REQUIRE(pieces.size() == greedy_ids.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      // Pieces are token texts: '▁' stands for a space, <0xNN> for a byte.
      std::string expected = ReplaceAll(pieces[i], "\u2581", " ");
      if (expected.size() == 6 && expected.rfind("<0x", 0) == 0) {
        expected = std::string(1, static_cast<char>(std::stoi(expected.substr(3, 2), nullptr, 16)));
      }
      CHECK(tokenizer->TokenToPiece(greedy_ids[i]) == expected);
    }
    CHECK(tokenizer->Decode(greedy_ids) == p["greedy_text"].get<std::string>());
    CHECK(StreamAll(*tokenizer, greedy_ids) == p["greedy_text"].get<std::string>());
    std::vector<int32_t> all = prompt_ids;
    all.insert(all.end(), greedy_ids.begin(), greedy_ids.end());
    CHECK(tokenizer->Decode(all) == p["full_text"].get<std::string>());
    CHECK(tokenizer->Decode(prompt_ids) == prompt);
  }
}

TEST_CASE("Tokenizer matches the stories260K reference", "[tokenizer]") {
  CheckReference("stories260K.gguf", "stories260K.reference.json");
}

TEST_CASE("Tokenizer matches the relu-tiny reference", "[tokenizer]") {
  CheckReference("relu-tiny.f32.gguf", "relu-tiny.reference.json");
}

TEST_CASE("Tokenizer reads the stories260K vocabulary", "[tokenizer]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const std::unique_ptr<Tokenizer> t = Load(path);
  CHECK(t->model() == "llama");
  CHECK(t->vocab_size() == 512);
  CHECK(t->bos_id() == 1);
  CHECK(t->eos_id() == 2);
  CHECK(t->unk_id() == 0);
  CHECK(t->add_bos());
  CHECK(t->add_space_prefix());
  CHECK(t->IsEndOfGeneration(2));
  CHECK_FALSE(t->IsEndOfGeneration(1));
  CHECK(t->IsControl(1));
  CHECK(t->IsControl(2));
  CHECK_FALSE(t->IsControl(0));  // <unk> is type "unknown", not control
  CHECK_FALSE(t->IsControl(-1));
  CHECK_FALSE(t->IsControl(512));
  CHECK(t->TokenToPiece(1).empty());
  CHECK(t->TokenToPiece(0).empty());  // llama.cpp prints nothing for <unk>
  CHECK(t->TokenToPiece(ByteToken('\n')) == "\n");
  CHECK(t->TokenToPiece(-5).empty());
  CHECK(t->token_text(1) == "<s>");
  CHECK(t->Encode("", true) == std::vector<int32_t>{1});
  CHECK(t->Encode("", false).empty());
}

TEST_CASE("Tokenizer round-trips text through byte fallback", "[tokenizer]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const std::unique_ptr<Tokenizer> t = Load(path);
  const std::vector<std::string> texts = {
      "Once upon a time",
      "  two leading spaces, then   three inside and trailing   ",
      " ",
      "line one\nline two\n\n\tindented\r\n",
      "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and CJK "
      "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C",
      "na\xC3\xAFve caf\xC3\xA9 \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",
      "bad utf8: \xFF\xC3 end",
  };
  for (const std::string& text : texts) {
    INFO("text: " << text);
    for (bool bos : {true, false}) {
      const std::vector<int32_t> ids = t->Encode(text, bos);
      CHECK(t->Decode(ids) == text);
      for (int32_t id : ids) CHECK(id != t->unk_id());
    }
  }
  // Emoji have no token: one byte token per byte (llama.cpp's byte fallback).
  const std::vector<int32_t> ids = t->Encode("\xF0\x9F\x98\x80", false);
  REQUIRE(ids.size() == 5);
  CHECK(t->token_text(ids[0]) == "\u2581");
  CHECK(std::vector<int32_t>(ids.begin() + 1, ids.end()) ==
        std::vector<int32_t>{ByteToken(0xF0), ByteToken(0x9F), ByteToken(0x98), ByteToken(0x80)});
}

TEST_CASE("Tokenizer encodes the profiling corpus quickly and losslessly", "[tokenizer]") {
  const std::string path = TestModelPath("stories260K.gguf");
  const std::string corpus_path = TestModelPath("tinystories-profile.txt");
  if (!std::filesystem::exists(path) || !std::filesystem::exists(corpus_path)) {
    THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  }
  const std::unique_ptr<Tokenizer> t = Load(path);
  const std::string corpus = ReadFile(corpus_path);
  REQUIRE(corpus.size() > 100000);

  const std::string head = corpus.substr(0, 4096);
  CHECK(t->Decode(t->Encode(head, true)) == head);

  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t->Encode(corpus, true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(t->Decode(ids) == corpus);
  CHECK(ids.size() < corpus.size() / 2);  // merges happened
  WARN("encoded " << corpus.size() << " bytes into " << ids.size() << " tokens in " << seconds
                  << " s");
  CHECK(seconds < 2.0);  // ~0.05 s at -O2; generous for sanitizer / debug builds
}

TEST_CASE("Tokenizer maps characters outside a vocabulary without byte fallback to unk",
          "[tokenizer]") {
  const std::string path = TestModelPath("babyllama-tok105.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("babyllama-tok105.gguf not found");
  const std::unique_ptr<Tokenizer> t = Load(path);
  REQUIRE(t->vocab_size() == 105);
  REQUIRE(t->unk_id() == 0);

  const std::string text = "Once upon a time";
  const std::vector<int32_t> ids = t->Encode(text, true);
  CHECK(ids.size() == 1 + text.size() + 1);  // BOS, '▁' prefix, one token per character
  CHECK(t->Decode(ids) == text);

  // '\n', '#' and an emoji are not in the vocabulary and there are no byte tokens: each
  // character becomes one unk (llama.cpp throws here instead).
  const std::vector<int32_t> odd = t->Encode("a\nb#\xF0\x9F\x98\x80", false);
  const std::vector<int32_t> expected = {
      t->Encode("a", false)[0], t->Encode("a", false)[1], 0, t->Encode("b", false)[1], 0, 0};
  CHECK(odd == expected);
  CHECK(t->Decode(odd) == "ab");  // unk prints as nothing, as llama.cpp
}

TEST_CASE("Tokenizer merges SentencePiece pairs by score, leftmost on ties", "[tokenizer]") {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "\u2581", "a", "b", "c", "ab", "bc", "\u2581a"};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  v.scores = {0, 0, 0, -1, -1, -1, -1, -2, -2, -3};
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromVocab(v);
  REQUIRE(t.ok());
  // "▁abc": "ab" and "bc" tie at -2 and beat "▁a" (-3): the leftmost, "ab", merges.
  CHECK((*t)->Encode("abc", false) == std::vector<int32_t>{3, 7, 6});
  v.scores[8] = -1.5;  // now "bc" first, then "▁a"
  t = Tokenizer::FromVocab(v);
  REQUIRE(t.ok());
  CHECK((*t)->Encode("abc", false) == std::vector<int32_t>{9, 8});
  // A merge is looked up by its text: "a" + "bc" makes "abc" once that is a token.
  v.tokens.push_back("abc");
  v.token_types.push_back(1);
  v.scores.push_back(-1);
  t = Tokenizer::FromVocab(v);
  REQUIRE(t.ok());
  CHECK((*t)->Encode("abc", false) == std::vector<int32_t>{3, 10});
  // No byte tokens and 'z' unknown: one unk for it; add_space_prefix = false drops the '▁'.
  v.add_space_prefix = false;
  t = Tokenizer::FromVocab(v);
  REQUIRE(t.ok());
  CHECK((*t)->Encode("zab", true) == std::vector<int32_t>{1, 0, 7});
  CHECK((*t)->Decode({1, 7, 3, 4}) == "ab a");
}

TEST_CASE("StreamingDetokenizer holds back split characters", "[tokenizer]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const std::unique_ptr<Tokenizer> t = Load(path);
  StreamingDetokenizer stream(*t);

  CHECK(stream.Push(ByteToken(0xF0)).empty());
  CHECK(stream.Push(ByteToken(0x9F)).empty());
  CHECK(stream.Push(ByteToken(0x98)).empty());
  CHECK(stream.Push(ByteToken(0x80)) == "\xF0\x9F\x98\x80");
  CHECK(stream.Flush().empty());

  // Bytes that can never start or continue a character come out as U+FFFD at once.
  stream.Reset();
  CHECK(stream.Push(ByteToken(0xFF)) == "\xEF\xBF\xBD");
  CHECK(stream.Push(ByteToken(0xE4)).empty());
  CHECK(stream.Push(ByteToken('a')) ==
        "\xEF\xBF\xBD"
        "a");  // E4 cut short by 'a'
  CHECK(stream.Push(ByteToken(0xE4)).empty());
  CHECK(stream.Push(ByteToken(0xBD)).empty());
  CHECK(stream.Flush() == "\xEF\xBF\xBD");  // a truncated character at the end: one U+FFFD
  CHECK(stream.Push(ByteToken(0xC0)) == "\xEF\xBF\xBD");  // overlong lead

  // The first piece loses its space-prefix space, as Decode; control tokens print nothing.
  const std::vector<int32_t> ids = t->Encode("Once upon", true);
  stream.Reset();
  std::string text;
  for (int32_t id : ids) text += stream.Push(id);
  CHECK(text == "Once upon");
  CHECK(stream.Push(t->eos_id()).empty());

  // A continuation (e.g. generation after a prompt) keeps the space.
  stream.Reset();
  stream.KeepLeadingSpace();
  CHECK(stream.Push(ids.back()) == " upon");
}

TEST_CASE("Tokenizer reports malformed vocabularies naming the key", "[tokenizer]") {
  TokenizerVocab good;
  good.model = "llama";
  good.tokens = {"<unk>", "<s>", "</s>", "a"};
  good.scores = {0, 0, 0, 0};
  good.token_types = {2, 3, 3, 1};
  REQUIRE(Tokenizer::FromVocab(good).ok());

  const auto error_of = [](const TokenizerVocab& v) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromVocab(v);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(t.status().message());
  };
  TokenizerVocab v = good;
  v.model = "bert";
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.model"));
  v = good;
  v.tokens.clear();
  v.scores.clear();
  v.token_types.clear();
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.tokens"));
  v = good;
  v.scores.pop_back();
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.scores"));
  v = good;
  v.token_types.push_back(1);
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.token_type"));
  v = good;
  v.bos_id = 4;
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.bos_token_id"));
  v = good;
  v.eos_id = 99;
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.eos_token_id"));
  v = good;
  v.unk_id = 4;
  CHECK_THAT(error_of(v), Catch::Contains("tokenizer.ggml.unknown_token_id"));

  // 0xFFFFFFFF is how converters write "no such token".
  v = good;
  v.eos_id = 0xFFFFFFFF;
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromVocab(v);
  REQUIRE(t.ok());
  CHECK((*t)->eos_id() == -1);
}

TEST_CASE("Tokenizer::FromGguf reads and rejects GGUF metadata", "[tokenizer]") {
  const auto write_and_load = [](const GgufWriter& writer) {
    const std::string path = (testing::TempDir() / "tokenizer_test.gguf").string();
    REQUIRE(writer.Write(path).ok());
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    REQUIRE(file.ok());
    return Tokenizer::FromGguf(**file);
  };
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = write_and_load(w);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("tokenizer.ggml.model"));

  w.SetString("tokenizer.ggml.model", "llama");
  t = write_and_load(w);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("tokenizer.ggml.tokens"));

  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray({"<unk>", "<s>", "</s>", "\u2581", "h", "i",
                                                         "\u2581h", "\u2581hi"}));
  w.Set("tokenizer.ggml.scores", GgufValue::FloatArray(GgufValueType::kFloat32, {0, 0, 0}));
  t = write_and_load(w);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("tokenizer.ggml.scores"));

  w.Set("tokenizer.ggml.scores",
        GgufValue::FloatArray(GgufValueType::kFloat32, {0, 0, 0, -1, -1, -1, -2, -3}));
  w.Set("tokenizer.ggml.token_type",
        GgufValue::IntArray(GgufValueType::kInt32, {2, 3, 3, 1, 1, 1, 1, 1}));
  w.SetUint32("tokenizer.ggml.eos_token_id", 8);
  t = write_and_load(w);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("tokenizer.ggml.eos_token_id"));

  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  t = write_and_load(w);
  REQUIRE(t.ok());
  CHECK_FALSE((*t)->add_bos());
  CHECK((*t)->Encode("hi", true) == std::vector<int32_t>{1, 7});  // the caller asked for BOS
  CHECK((*t)->Decode({1, 7, 2}) == "hi");

  w.SetString("tokenizer.ggml.model", "gpt2");  // a BPE vocabulary needs merges
  t = write_and_load(w);
  REQUIRE_FALSE(t.ok());
  CHECK_THAT(std::string(t.status().message()), Catch::Contains("tokenizer.ggml.merges"));
}

}  // namespace
}  // namespace thermocline
