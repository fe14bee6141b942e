// libFuzzer target for the GGUF reader: any byte string is parsed or refused, never a crash.
// On success every metadata value and tensor info is touched, including the first and last
// byte of each tensor's data, so a bounds mistake in the reader shows up under ASan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using thermocline::GgufFile;
  auto file = GgufFile::FromBytes(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  size_t sink = f.alignment() + f.data_offset();
  for (const thermocline::GgufKeyValue& kv : f.metadata()) {
    const thermocline::GgufValue& v = kv.value;
    sink += v.DebugString().size() + v.array_size();
    sink += v.AsInt().value_or(0) + v.AsUint().value_or(0) + v.AsBool().value_or(false);
    sink += static_cast<size_t>(v.AsDouble().value_or(0) != 0);
    if (const auto* s = v.AsString()) sink += s->size();
    if (const auto* a = v.AsStringArray()) sink += a->size();
    sink += f.GetInt(kv.key, 0).ok() + f.GetFloat(kv.key, 0).ok() + f.GetString(kv.key, "").ok();
    sink += f.GetBool(kv.key, false).ok() + (f.Find(kv.key) == &v);
  }
  for (const thermocline::GgufTensorInfo& t : f.tensors()) {
    sink += t.data[0] + t.data[t.size_bytes - 1];  // size_bytes > 0: every dim is positive
    sink += t.dims.size() + static_cast<size_t>(t.n_elements) + (f.FindTensor(t.name) == &t);
    sink += thermocline::TypeInfo(t.type).type_size;
  }
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}
