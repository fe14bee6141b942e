// GgufFile: the real test models, the v1 file refused (v2 read), and corrupt images (hand-built or
// truncated) refused with a message that names the problem.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_util.h"

namespace thermocline {
namespace {

// A GGUF image assembled field by field, so a test can put any value anywhere.
class Bytes {
 public:
  Bytes& Raw(std::string_view s) {
    b_.append(s);
    return *this;
  }
  Bytes& U8(uint8_t v) { return Put(v); }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& Str(std::string_view s) { return U64(s.size()).Raw(s); }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return Raw("GGUF").U32(version).U64(n_tensors).U64(n_kv);
  }
  Bytes& KvU32(std::string_view key, uint32_t v) { return Str(key).U32(4).U32(v); }
  Bytes& Tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  Bytes& PadTo(size_t alignment) {
    b_.resize((b_.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  Bytes& Zeros(size_t n) {
    b_.append(n, '\0');
    return *this;
  }
  const std::string& str() const { return b_; }

 private:
  template <typename T>
  Bytes& Put(T v) {
    b_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  std::string b_;
};

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ8_0 = 8;

// The error FromBytes reports for an image that must be refused.
std::string ErrorOf(const std::string& image) {
  auto f = GgufFile::FromBytes(image);
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

// One f32 tensor with the given dims and offset, and `data_bytes` of data after the header.
std::string OneTensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                      size_t data_bytes) {
  return Bytes()
      .Header(1, 0)
      .Tensor("w", std::move(dims), type, offset)
      .PadTo(32)
      .Zeros(data_bytes)
      .str();
}

TEST_CASE("GgufFile reads stories260K", "[gguf]") {
  const std::string path = testing::TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("test model not found: " + path);
  auto file = GgufFile::Open(path);
  REQUIRE(file.ok());
  const GgufFile& f = **file;
  CHECK(f.version() == 3);
  CHECK_FALSE(f.is_powerinfer());
  CHECK(f.path() == path);
  CHECK(f.alignment() == 32);
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.file_size() == std::filesystem::file_size(path));
  CHECK(*f.GetString("general.architecture") == "llama");
  CHECK(*f.GetInt("llama.embedding_length") == 64);
  CHECK(*f.GetInt("llama.block_count") == 5);
  CHECK(*f.GetFloat("llama.embedding_length") == 64.0);
  CHECK(*f.GetFloat("llama.attention.layer_norm_rms_epsilon") == Approx(1e-5).epsilon(1e-6));
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  REQUIRE(tokens != nullptr);
  CHECK(tokens->array_type() == GgufValueType::kString);
  REQUIRE(tokens->AsStringArray() != nullptr);
  CHECK(tokens->AsStringArray()->size() == 512);
  CHECK(tokens->AsStringArray()->at(1) == "<s>");
  CHECK(tokens->DebugString(3) == "[string x 512] \"<unk>\", \"<s>\", \"</s>\", ...");
  CHECK(f.Find("tokenizer.ggml.scores")->AsDoubleArray()->size() == 512);
  CHECK(f.Find("tokenizer.ggml.token_type")->AsIntArray()->size() == 512);

  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  REQUIRE(embd != nullptr);
  CHECK(embd->type == GgmlType::kF32);
  CHECK(embd->dims == std::vector<int64_t>{64, 512});
  CHECK(embd->n_elements == 64 * 512);
  CHECK(embd->size_bytes == 64 * 512 * 4);
  CHECK(f.tensors().size() == 48);
  for (const GgufTensorInfo& t : f.tensors()) {
    CHECK(t.data != nullptr);
    CHECK(t.offset % 32 == 0);
    CHECK(f.data_offset() + t.offset + t.size_bytes <= f.file_size());
  }

  // Getters: missing keys and wrong types name the key.
  absl::StatusOr<int64_t> missing = f.GetInt("llama.nope");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("'llama.nope'"));
  CHECK(*f.GetInt("llama.nope", 7) == 7);
  CHECK(*f.GetString("general.nope", "x") == "x");
  CHECK(*f.GetBool("general.nope", true));
  CHECK(*f.GetFloat("general.nope", 2.5) == 2.5);
  absl::StatusOr<int64_t> wrong = f.GetInt("general.architecture", 0);
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(wrong.status().message()),
             Catch::Contains("'general.architecture' is a string, expected an integer"));
  CHECK_THAT(std::string(f.GetString("tokenizer.ggml.tokens").status().message()),
             Catch::Contains("is an array of string"));
  CHECK_FALSE(f.GetBool("llama.block_count").ok());
  CHECK_FALSE(f.GetFloat("general.name").ok());
}

TEST_CASE("GgufFile reads relu-tiny.f16 with F16 weights and F32 norms", "[gguf]") {
  const std::string path = testing::TestModelPath("relu-tiny.f16.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("test model not found: " + path);
  auto file = GgufFile::Open(path);
  REQUIRE(file.ok());
  const GgufFile& f = **file;
  CHECK(*f.GetString("llama.feed_forward_activation") == "relu");
  CHECK(*f.GetBool("tokenizer.ggml.add_bos_token"));
  const GgufTensorInfo* up = f.FindTensor("blk.0.ffn_up.weight");
  REQUIRE(up != nullptr);
  CHECK(up->type == GgmlType::kF16);
  CHECK(up->dims == std::vector<int64_t>{128, 512});
  CHECK(up->size_bytes == 128 * 512 * 2);
  CHECK(f.FindTensor("blk.0.attn_norm.weight")->type == GgmlType::kF32);
  CHECK(f.FindTensor("output.weight")->type == GgmlType::kF16);
}

TEST_CASE("GgufFile refuses the GGUF v1 file clearly", "[gguf]") {
  const std::string path = testing::TestModelPath("stories260K.ggufv1-original.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("test model not found: " + path);
  auto file = GgufFile::Open(path);
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(file.status().message());
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("GGUF version 1 is not supported") &&
                          Catch::Contains("convert"));
}

TEST_CASE("GgufFile::Open reports missing files and non-files", "[gguf]") {
  auto missing = GgufFile::Open("/nonexistent/model.gguf");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("/nonexistent/model.gguf"));
  CHECK_FALSE(GgufFile::Open(testing::TempDir().string()).ok());
  const std::string empty = (testing::TempDir() / "empty.gguf").string();
  std::ofstream(empty).close();
  CHECK_THAT(std::string(GgufFile::Open(empty).status().message()), Catch::Contains("empty"));
}

TEST_CASE("GgufFile refuses bad magic and versions", "[gguf]") {
  CHECK_THAT(ErrorOf(""), Catch::Contains("not a GGUF file"));
  CHECK_THAT(ErrorOf("GGML\x03\0\0\0"), Catch::Contains("not a GGUF file: magic is \"GGML\""));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 0, 1).str()),
             Catch::Contains("GGUF version 1 is not supported"));
  // Version 2 is laid out as version 3 (arch_model_test loads a model from it).
  auto v2 = GgufFile::FromBytes(Bytes().Header(0, 0, 2).str());
  REQUIRE(v2.ok());
  CHECK((*v2)->version() == 2);
  CHECK_THAT(ErrorOf(Bytes().Header(0, 0, 4).str()), Catch::Contains("unsupported GGUF version 4"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 0, 99).str()), Catch::Contains("version 99"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 0, 0x03000000).str()), Catch::Contains("big-endian"));
  CHECK_THAT(ErrorOf(Bytes().Raw("GGUF").U8(3).str()), Catch::Contains("truncated: version"));

  std::string pwri = Bytes().Header(0, 1).KvU32("general.alignment", 32).str();
  std::memcpy(pwri.data(), "PWRI", 4);
  auto f = GgufFile::FromBytes(pwri);
  REQUIRE(f.ok());
  CHECK((*f)->is_powerinfer());
  CHECK((*f)->path().empty());
}

TEST_CASE("GgufFile refuses impossible counts and lengths before allocating", "[gguf]") {
  CHECK_THAT(ErrorOf(Bytes().Header(uint64_t{1} << 62, 0).Zeros(64).str()),
             Catch::Contains("tensor count 4611686018427387904 is impossible"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, ~uint64_t{0}).Zeros(64).str()),
             Catch::Contains("metadata count 18446744073709551615 is impossible"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).U64(~uint64_t{0}).Zeros(32).str()),
             Catch::Contains("key #0 at byte 24 has length 18446744073709551615"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("k").U32(8).U64(uint64_t{1} << 40).Zeros(8).str()),
             Catch::Contains("string value of key 'k'"));
  // An array of 2^60 uint32: refused by the count check, not by a failed reservation.
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("a").U32(9).U32(4).U64(uint64_t{1} << 60).str()),
             Catch::Contains("key 'a': array count 1152921504606846976 at byte 41 is impossible"));
  CHECK_THAT(
      ErrorOf(Bytes().Header(0, 1).Str("a").U32(9).U32(8).U64(3).Str("x").Str("y").U64(99).str()),
      Catch::Contains("element 2 of key 'a' at byte 67 has length 99 but only 0 bytes remain"));
}

TEST_CASE("GgufFile refuses bad metadata types and duplicates", "[gguf]") {
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("k").U32(13).U32(0).str()),
             Catch::Contains("key 'k': unknown value type 13 at byte 33"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("k").U32(9).U32(9).U64(1).U32(4).U64(0).str()),
             Catch::Contains("key 'k': nested arrays are not supported"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("k").U32(9).U32(77).U64(0).str()),
             Catch::Contains("unknown array element type 77"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 2).KvU32("k", 1).KvU32("k", 2).str()),
             Catch::Contains("duplicate metadata key 'k'"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).Str("general.alignment").U32(10).U64(32).str()),
             Catch::Contains("general.alignment must be a uint32, not uint64"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).KvU32("general.alignment", 0).str()),
             Catch::Contains("not a nonzero power of two"));
  CHECK_THAT(ErrorOf(Bytes().Header(0, 1).KvU32("general.alignment", 48).str()),
             Catch::Contains("general.alignment 48"));
  auto ok = GgufFile::FromBytes(Bytes().Header(0, 1).Str("b").U32(7).U8(2).str());
  REQUIRE(ok.ok());
  CHECK(*(*ok)->GetBool("b"));  // any nonzero byte reads as true
}

TEST_CASE("GgufFile refuses bad tensor infos", "[gguf]") {
  REQUIRE(GgufFile::FromBytes(OneTensor({4, 2}, kF32, 0, 32)).ok());
  CHECK_THAT(ErrorOf(OneTensor({4, 2}, 4, 0, 32)),
             Catch::Contains("tensor 'w': unknown ggml type 4"));
  CHECK_THAT(ErrorOf(OneTensor({4, 2}, 1000, 0, 32)), Catch::Contains("unknown ggml type 1000"));
  CHECK_THAT(ErrorOf(OneTensor({1, 1, 1, 1, 1}, kF32, 0, 32)),
             Catch::Contains("tensor 'w': n_dims 5"));
  CHECK_THAT(ErrorOf(OneTensor({}, kF32, 0, 32)), Catch::Contains("n_dims 0"));
  CHECK_THAT(ErrorOf(OneTensor({4, 0}, kF32, 0, 32)),
             Catch::Contains("tensor 'w': dimension 1 is 0 (must be positive)"));
  CHECK_THAT(ErrorOf(OneTensor({~uint64_t{0}}, kF32, 0, 32)), Catch::Contains("dimension 0 is -1"));
  CHECK_THAT(ErrorOf(OneTensor({uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 0, 32)),
             Catch::Contains("element count overflows or exceeds 2^50"));
  CHECK_THAT(ErrorOf(OneTensor({uint64_t{1} << 26, uint64_t{1} << 25}, kF32, 0, 32)),
             Catch::Contains("exceeds 2^50"));
  CHECK_THAT(ErrorOf(OneTensor({33}, kQ8_0, 0, 64)),
             Catch::Contains("row length 33 is not a multiple of the q8_0 block size 32"));
  CHECK_THAT(ErrorOf(OneTensor({4}, kF32, 16, 64)),
             Catch::Contains("tensor 'w': offset 16 is not a multiple of the alignment 32"));
  CHECK_THAT(
      ErrorOf(OneTensor({4, 2}, kF32, 0, 31)),
      Catch::Contains("tensor 'w' data [offset 0, 32 bytes] extends past the end of the file"));
  CHECK_THAT(ErrorOf(OneTensor({4}, kF32, ~uint64_t{0} - 31, 64)),
             Catch::Contains("extends past the end"));

  const std::string overlap = Bytes()
                                  .Header(2, 0)
                                  .Tensor("a", {16}, kF32, 0)
                                  .Tensor("b", {16}, kF32, 32)
                                  .PadTo(32)
                                  .Zeros(128)
                                  .str();
  CHECK_THAT(
      ErrorOf(overlap),
      Catch::Contains("tensors 'a' [offset 0, 64 bytes] and 'b' [offset 32, 64 bytes] overlap"));
  const std::string overlap_reversed = Bytes()
                                           .Header(2, 0)
                                           .Tensor("b", {16}, kF32, 32)
                                           .Tensor("a", {16}, kF32, 0)
                                           .PadTo(32)
                                           .Zeros(128)
                                           .str();
  CHECK_THAT(ErrorOf(overlap_reversed), Catch::Contains("overlap"));
  const std::string duplicate = Bytes()
                                    .Header(2, 0)
                                    .Tensor("a", {8}, kF32, 0)
                                    .Tensor("a", {8}, kF32, 32)
                                    .PadTo(32)
                                    .Zeros(64)
                                    .str();
  CHECK_THAT(ErrorOf(duplicate), Catch::Contains("duplicate tensor name 'a' (tensor #1)"));

  const std::string aligned64 = Bytes()
                                    .Header(1, 1)
                                    .KvU32("general.alignment", 64)
                                    .Tensor("w", {8}, kF32, 0)
                                    .PadTo(64)
                                    .Zeros(32)
                                    .str();
  auto f = GgufFile::FromBytes(aligned64);
  REQUIRE(f.ok());
  CHECK((*f)->data_offset() == 128);
  CHECK((*f)->tensors()[0].data != nullptr);
}

// A small file with every section, from the writer; truncating it anywhere before the end of
// the last tensor's data must fail cleanly.
std::string WriterImage() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.Set("a.tokens", GgufValue::StringArray({"<unk>", "a", "bc"}));
  w.Set("a.scores", GgufValue::FloatArray(GgufValueType::kFloat32, {0.5, 1.5}));
  w.SetUint32("u", 5);
  std::vector<uint8_t> data(34 * 2 + 40, 1);
  REQUIRE(w.AddTensor("q", GgmlType::kQ8_0, {64}, data.data(), 68).ok());
  REQUIRE(w.AddTensor("f", GgmlType::kF32, {10}, data.data(), 40).ok());
  const std::string path = (testing::TempDir() / "truncate.gguf").string();
  REQUIRE(w.Write(path).ok());
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_CASE("GgufFile refuses every truncation of a valid file", "[gguf]") {
  const std::string image = WriterImage();
  auto full = GgufFile::FromBytes(image);
  REQUIRE(full.ok());
  uint64_t data_end = 0;
  for (const GgufTensorInfo& t : (*full)->tensors()) {
    data_end = std::max(data_end, (*full)->data_offset() + t.offset + t.size_bytes);
  }
  for (size_t len = 0; len < image.size(); ++len) {
    auto f = GgufFile::FromBytes(std::string_view(image).substr(0, len));
    INFO("truncated to " << len << " of " << image.size() << " bytes");
    CHECK(f.ok() == (len >= data_end));
    if (!f.ok()) CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
  }
  auto message_at = [&](size_t len) { return ErrorOf(image.substr(0, len)); };
  CHECK_THAT(message_at(3), Catch::Contains("not a GGUF file"));
  CHECK_THAT(message_at(20), Catch::Contains("truncated: metadata count at byte 16"));
  CHECK_THAT(message_at(30), Catch::Contains("tensor count 2 is impossible"));
  CHECK_THAT(message_at(130), Catch::Contains("truncated: length of element 2 of key 'a.tokens'"));
  CHECK_THAT(message_at(250), Catch::Contains("truncated: data offset of tensor 'f'"));
  CHECK_THAT(message_at((*full)->data_offset()), Catch::Contains("extends past the end"));

  // Bytes overwritten one at a time across the header: refused or accepted, never a crash.
  for (size_t i = 0; i < (*full)->data_offset(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0xFF}}) {
      std::string damaged = image;
      damaged[i] = static_cast<char>(v);
      (void)GgufFile::FromBytes(damaged);
    }
  }
}

TEST_CASE("GgufFile refuses truncations of a real model", "[gguf]") {
  const std::string path = testing::TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("test model not found: " + path);
  std::ifstream in(path, std::ios::binary);
  const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(GgufFile::FromBytes(image).ok());
  for (size_t len :
       {size_t{24}, size_t{100}, size_t{5000}, size_t{14176}, image.size() / 2, image.size() - 1}) {
    INFO("truncated to " << len);
    CHECK_FALSE(GgufFile::FromBytes(std::string_view(image).substr(0, len)).ok());
  }
  CHECK_THAT(ErrorOf(image.substr(0, image.size() - 1)),
             Catch::Contains("'blk.4.ffn_norm.weight' data") &&
                 Catch::Contains("extends past the end of the file (1185375 bytes"));
}

}  // namespace
}  // namespace thermocline
