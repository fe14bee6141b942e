// GgufWriter: every value and array type and several tensor types survive a write/read round
// trip, the byte layout matches llama.cpp's, and bad input is refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_util.h"

namespace thermocline {
namespace {

using T = GgufValueType;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string TempPath(const std::string& name) { return (testing::TempDir() / name).string(); }

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST_CASE("GgufWriter round-trips every metadata type", "[gguf]") {
  GgufWriter w;
  w.Set("u8", GgufValue::Uint(T::kUint8, 255));
  w.Set("i8", GgufValue::Int(T::kInt8, -128));
  w.Set("u16", GgufValue::Uint(T::kUint16, 65535));
  w.Set("i16", GgufValue::Int(T::kInt16, -32768));
  w.SetUint32("u32", 4000000000u);
  w.SetInt32("i32", -2000000000);
  w.SetFloat32("f32", 1e-5f);
  w.SetBool("bool", true);
  w.SetString("str", std::string("h\xC3\xA9llo\0world", 12));
  w.SetUint64("u64", std::numeric_limits<uint64_t>::max());
  w.Set("i64", GgufValue::Int(T::kInt64, std::numeric_limits<int64_t>::min()));
  w.Set("f64", GgufValue::Float(T::kFloat64, 3.141592653589793));
  w.Set("a.str", GgufValue::StringArray({"<unk>", "", "\xE2\x96\x81the"}));
  w.Set("a.u8", GgufValue::UintArray(T::kUint8, {0, 1, 255}));
  w.Set("a.u16", GgufValue::UintArray(T::kUint16, {65535}));
  w.Set("a.u32", GgufValue::UintArray(T::kUint32, {7, 4294967295u}));
  w.Set("a.u64", GgufValue::UintArray(T::kUint64, {std::numeric_limits<uint64_t>::max()}));
  w.Set("a.i8", GgufValue::IntArray(T::kInt8, {-128, 127}));
  w.Set("a.i16", GgufValue::IntArray(T::kInt16, {-32768, 32767}));
  w.Set("a.i32", GgufValue::IntArray(T::kInt32, {2, 3, -6}));
  w.Set("a.i64", GgufValue::IntArray(T::kInt64, {std::numeric_limits<int64_t>::min()}));
  w.Set("a.bool", GgufValue::IntArray(T::kBool, {1, 0, 1}));
  w.Set("a.f32", GgufValue::FloatArray(T::kFloat32, {0.5, -1.25, 1e-5f}));
  w.Set("a.f64", GgufValue::FloatArray(T::kFloat64, {1e300, -0.1}));
  w.Set("a.empty", GgufValue::FloatArray(T::kFloat32, {}));
  const std::string path = TempPath("all_types.gguf");
  REQUIRE(w.Write(path).ok());
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  auto file = GgufFile::Open(path);
  REQUIRE(file.ok());
  const GgufFile& f = **file;
  CHECK(f.version() == 3);
  CHECK_FALSE(f.is_powerinfer());
  REQUIRE(f.metadata().size() == 25);
  CHECK(f.metadata()[0].key == "u8");  // insertion order
  CHECK(f.metadata()[24].key == "a.empty");
  CHECK(f.Find("u8")->type() == T::kUint8);
  CHECK(*f.GetInt("u8") == 255);
  CHECK(*f.GetInt("i8") == -128);
  CHECK(*f.GetInt("u16") == 65535);
  CHECK(*f.GetInt("i16") == -32768);
  CHECK(*f.GetInt("u32") == 4000000000);
  CHECK(*f.GetInt("i32") == -2000000000);
  CHECK(*f.GetFloat("f32") == 1e-5f);
  CHECK(*f.GetBool("bool"));
  CHECK(*f.GetString("str") == std::string("h\xC3\xA9llo\0world", 12));
  CHECK(*f.Find("u64")->AsUint() == std::numeric_limits<uint64_t>::max());
  CHECK(*f.GetInt("i64") == std::numeric_limits<int64_t>::min());
  CHECK(*f.GetFloat("f64") == 3.141592653589793);
  CHECK(*f.Find("a.str")->AsStringArray() ==
        std::vector<std::string>{"<unk>", "", "\xE2\x96\x81the"});
  CHECK(*f.Find("a.u8")->AsUintArray() == std::vector<uint64_t>{0, 1, 255});
  CHECK(*f.Find("a.u16")->AsUintArray() == std::vector<uint64_t>{65535});
  CHECK(*f.Find("a.u32")->AsUintArray() == std::vector<uint64_t>{7, 4294967295u});
  CHECK(f.Find("a.u64")->AsUintArray()->at(0) == std::numeric_limits<uint64_t>::max());
  CHECK(*f.Find("a.i8")->AsIntArray() == std::vector<int64_t>{-128, 127});
  CHECK(*f.Find("a.i16")->AsIntArray() == std::vector<int64_t>{-32768, 32767});
  CHECK(*f.Find("a.i32")->AsIntArray() == std::vector<int64_t>{2, 3, -6});
  CHECK(f.Find("a.i64")->AsIntArray()->at(0) == std::numeric_limits<int64_t>::min());
  CHECK(*f.Find("a.bool")->AsIntArray() == std::vector<int64_t>{1, 0, 1});
  CHECK(f.Find("a.bool")->array_type() == T::kBool);
  CHECK(*f.Find("a.f32")->AsDoubleArray() == std::vector<double>{0.5, -1.25, 1e-5f});
  CHECK(*f.Find("a.f64")->AsDoubleArray() == std::vector<double>{1e300, -0.1});
  CHECK(f.Find("a.empty")->is_array());
  CHECK(f.Find("a.empty")->array_size() == 0);
  CHECK(f.tensors().empty());
}

TEST_CASE("GgufWriter round-trips tensors of several types", "[gguf]") {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  const auto f32 = Pattern(4 * 3 * 4, 1);
  const auto f16 = Pattern(8 * 2, 2);
  const auto q8 = Pattern(2 * 2 * 34, 3);  // 64 x 2 in q8_0: 2 blocks per row
  const auto q4 = Pattern(18, 4);          // 32 in q4_0: one block
  const auto q4k = Pattern(144 * 3, 5);    // 256 x 3 in q4_K
  const auto i32 = Pattern(5 * 4, 6);      // odd size: padding follows
  REQUIRE(w.AddTensor("a.f32", GgmlType::kF32, {4, 3}, f32.data(), f32.size()).ok());
  REQUIRE(w.AddTensor("b.f16", GgmlType::kF16, {8}, f16.data(), f16.size()).ok());
  REQUIRE(w.AddTensorCopy("c.q8_0", GgmlType::kQ8_0, {64, 2}, q8).ok());
  REQUIRE(w.AddTensor("d.q4_0", GgmlType::kQ4_0, {32, 1, 1, 1}, q4.data(), q4.size()).ok());
  REQUIRE(w.AddTensorCopy("e.q4_K", GgmlType::kQ4_K, {256, 3}, q4k).ok());
  REQUIRE(w.AddTensor("f.i32", GgmlType::kI32, {5}, i32.data(), i32.size()).ok());
  const std::vector<const std::vector<uint8_t>*> data = {&f32, &f16, &q8, &q4, &q4k, &i32};

  for (uint32_t alignment : {0u, 64u}) {
    if (alignment != 0) w.SetUint32("general.alignment", alignment);
    const std::string path = TempPath("tensors.gguf");
    REQUIRE(w.Write(path).ok());
    auto file = GgufFile::Open(path);
    REQUIRE(file.ok());
    const GgufFile& f = **file;
    const uint64_t align = alignment == 0 ? 32 : alignment;
    CHECK(f.alignment() == align);
    CHECK(f.data_offset() % align == 0);
    REQUIRE(f.tensors().size() == 6);
    const std::vector<std::string> names = {"a.f32",  "b.f16",  "c.q8_0",
                                            "d.q4_0", "e.q4_K", "f.i32"};
    uint64_t expected_offset = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      CHECK(t.name == names[i]);
      CHECK(t.offset == expected_offset);
      REQUIRE(t.size_bytes == data[i]->size());
      CHECK(std::memcmp(t.data, data[i]->data(), t.size_bytes) == 0);
      expected_offset += (t.size_bytes + align - 1) / align * align;
    }
    // llama.cpp pads the last tensor too.
    CHECK(f.file_size() == f.data_offset() + expected_offset);
    const GgufTensorInfo* q8t = f.FindTensor("c.q8_0");
    REQUIRE(q8t != nullptr);
    CHECK(q8t->type == GgmlType::kQ8_0);
    CHECK(q8t->dims == std::vector<int64_t>{64, 2});
    CHECK(q8t->n_elements == 128);
    CHECK(f.FindTensor("d.q4_0")->dims == std::vector<int64_t>{32, 1, 1, 1});
    CHECK(f.FindTensor("missing") == nullptr);
  }
}

TEST_CASE("GgufWriter writes the header bytes llama.cpp expects", "[gguf]") {
  GgufWriter w;
  w.SetUint32("k", 7);
  const float x[2] = {1.0f, 2.0f};
  REQUIRE(w.AddTensor("t", GgmlType::kF32, {2}, x, sizeof(x)).ok());
  const std::string path = TempPath("layout.gguf");
  REQUIRE(w.Write(path).ok());
  const std::string bytes = ReadWholeFile(path);
  std::string expected("GGUF\x03\0\0\0", 8);
  expected += std::string("\x01\0\0\0\0\0\0\0", 8);             // tensor count
  expected += std::string("\x01\0\0\0\0\0\0\0", 8);             // kv count
  expected += std::string("\x01\0\0\0\0\0\0\0k", 9);            // key
  expected += std::string("\x04\0\0\0\x07\0\0\0", 8);           // uint32 7
  expected += std::string("\x01\0\0\0\0\0\0\0t", 9);            // tensor name
  expected += std::string("\x01\0\0\0\x02\0\0\0\0\0\0\0", 12);  // n_dims 1, ne[0] 2
  expected += std::string("\0\0\0\0\0\0\0\0\0\0\0\0", 12);      // f32, offset 0
  expected.resize(96, '\0');                                    // 74 bytes padded to 32
  expected.append(reinterpret_cast<const char*>(x), sizeof(x));
  expected.resize(128, '\0');  // data padded to 32
  CHECK(bytes == expected);
}

TEST_CASE("GgufWriter reproduces a llama.cpp-written file byte for byte", "[gguf]") {
  const std::string source = testing::TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(source)) THERMOCLINE_SKIP("test models not found: " + source);
  auto in = GgufFile::Open(source);
  REQUIRE(in.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*in)->metadata()) w.Set(kv.key, kv.value);
  for (const GgufTensorInfo& t : (*in)->tensors()) {
    REQUIRE(w.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes).ok());
  }
  const std::string path = TempPath("stories_copy.gguf");
  REQUIRE(w.Write(path).ok());
  CHECK(ReadWholeFile(path) == ReadWholeFile(source));
}

TEST_CASE("GgufWriter Set replaces in place and Remove deletes", "[gguf]") {
  GgufWriter w;
  w.SetString("a", "1");
  w.SetString("b", "2");
  w.SetInt32("a", 3);
  w.Remove("b");
  w.Remove("not-there");
  const std::string path = TempPath("set_remove.gguf");
  REQUIRE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  REQUIRE(f.ok());
  REQUIRE((*f)->metadata().size() == 1);
  CHECK((*f)->metadata()[0].key == "a");
  CHECK(*(*f)->GetInt("a") == 3);
}

TEST_CASE("GgufWriter refuses inconsistent tensors", "[gguf]") {
  GgufWriter w;
  const std::vector<uint8_t> buf(1024);
  auto add = [&](std::string name, GgmlType type, std::vector<int64_t> dims, uint64_t bytes) {
    return w.AddTensor(std::move(name), type, std::move(dims), buf.data(), bytes);
  };
  REQUIRE(add("ok", GgmlType::kF32, {4, 2}, 32).ok());
  absl::Status s = add("size", GgmlType::kF32, {4, 2}, 31);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("31 bytes given") && Catch::Contains("32"));
  CHECK_THAT(std::string(add("ok", GgmlType::kF32, {8}, 32).message()),
             Catch::Contains("duplicate"));
  CHECK_THAT(std::string(add("blk", GgmlType::kQ8_0, {33}, 34).message()),
             Catch::Contains("not a multiple of the q8_0 block size 32"));
  CHECK_THAT(std::string(add("zero", GgmlType::kF32, {0}, 0).message()),
             Catch::Contains("not positive"));
  CHECK_THAT(std::string(add("five", GgmlType::kF32, {1, 1, 1, 1, 1}, 4).message()),
             Catch::Contains("1..4 dimensions"));
  CHECK_THAT(std::string(add(std::string(64, 'n'), GgmlType::kF32, {1}, 4).message()),
             Catch::Contains("name must be"));
  CHECK_THAT(std::string(add("type", static_cast<GgmlType>(4), {1}, 4).message()),
             Catch::Contains("unknown ggml type"));
  CHECK_THAT(std::string(w.AddTensorCopy("copy", GgmlType::kF16, {3}, {1, 2}).message()),
             Catch::Contains("2 bytes given"));
}

TEST_CASE("GgufWriter refuses values that do not fit their type", "[gguf]") {
  const std::string path = TempPath("bad_value.gguf");
  auto write_one = [&](GgufValue v) {
    GgufWriter w;
    w.Set("key", std::move(v));
    return w.Write(path);
  };
  CHECK_THAT(std::string(write_one(GgufValue::Uint(T::kUint8, 256)).message()),
             Catch::Contains("key 'key'") && Catch::Contains("out of range"));
  CHECK_THAT(std::string(write_one(GgufValue::IntArray(T::kInt8, {1, 200})).message()),
             Catch::Contains("out of range"));
  CHECK_THAT(std::string(write_one(GgufValue::IntArray(T::kArray, {})).message()),
             Catch::Contains("scalars or strings"));
  CHECK(write_one(GgufValue::StringArray({"a"})).ok());
  CHECK(write_one(GgufValue::IntArray(T::kUint8, {1, 2})).ok());  // either vector, range-checked
  CHECK_THAT(std::string(write_one(GgufValue::Uint(T::kString, 1)).message()),
             Catch::Contains("string value missing"));
  GgufWriter w;
  w.Set("general.alignment", GgufValue::Uint(T::kUint32, 48));
  CHECK_THAT(std::string(w.Write(path).message()), Catch::Contains("power of two"));
  absl::Status s = GgufWriter().Write(TempPath("no/such/dir/x.gguf"));
  CHECK_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains("cannot create"));
}

TEST_CASE("GgufValue::DebugString renders scalars, strings and arrays", "[gguf]") {
  CHECK(GgufValue::Uint(T::kUint32, 64).DebugString() == "64");
  CHECK(GgufValue::Int(T::kInt32, -3).DebugString() == "-3");
  CHECK(GgufValue::Float(T::kFloat32, 1e-5f).DebugString() == "1e-05");
  CHECK(GgufValue::Float(T::kFloat64, 0.1).DebugString() == "0.1");
  CHECK(GgufValue::Bool(false).DebugString() == "false");
  CHECK(GgufValue::String("a\"b\n").DebugString() == "\"a\\\"b\\n\"");
  const std::string long_string = GgufValue::String(std::string(100, 'x')).DebugString();
  CHECK_THAT(long_string, Catch::StartsWith("\"" + std::string(60, 'x') + "\"...") &&
                              Catch::EndsWith("(100 bytes)"));
  CHECK(GgufValue::StringArray({"a", "b", "c"}).DebugString(2) == "[string x 3] \"a\", \"b\", ...");
  CHECK(GgufValue::IntArray(T::kBool, {1, 0}).DebugString() == "[bool x 2] true, false");
  CHECK(GgufValue::UintArray(T::kUint8, {}).DebugString() == "[uint8 x 0]");
  CHECK(GgufValue::FloatArray(T::kFloat32, {0.5}).DebugString() == "[float32 x 1] 0.5");
  CHECK(GgufValueTypeName(static_cast<T>(99)) == "unknown");
}

TEST_CASE("GgufValue scalar accessors convert only where lossless", "[gguf]") {
  const GgufValue big = GgufValue::Uint(T::kUint64, std::numeric_limits<uint64_t>::max());
  CHECK_FALSE(big.AsInt().has_value());
  CHECK(big.AsUint().value() == std::numeric_limits<uint64_t>::max());
  const GgufValue neg = GgufValue::Int(T::kInt32, -1);
  CHECK_FALSE(neg.AsUint().has_value());
  CHECK(neg.AsDouble().value() == -1.0);
  CHECK(GgufValue::Bool(true).AsInt().value() == 1);
  CHECK_FALSE(GgufValue::Float(T::kFloat32, 1.5).AsInt().has_value());
  CHECK_FALSE(GgufValue::String("x").AsDouble().has_value());
  CHECK(GgufValue::String("x").AsStringArray() == nullptr);
  CHECK(GgufValue::StringArray({"x"}).AsString() == nullptr);
  CHECK(GgufValue().array_size() == 0);
}

}  // namespace
}  // namespace thermocline
