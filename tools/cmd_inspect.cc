// thermocline inspect: a GGUF file's metadata and tensors (type, shape, size), and how many
// tensors of each weight type it holds (those Thermocline cannot compute with marked).
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/str_join.h"
#include "engine/gguf/gguf.h"
#include "engine/ops/type_table.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {

int RunInspect(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {}, {"--json", "--help"}, {{"-h", "--help"}});
  if (!args.ok()) return Fail("inspect", args.status(), true);
  if (args->Has("--help") || args->positionals().size() != 1) {
    std::fputs("usage: thermocline inspect MODEL.gguf [--json]\n",
               args->Has("--help") ? stdout : stderr);
    return args->Has("--help") ? 0 : 2;
  }
  auto file = GgufFile::Open(args->positionals()[0]);
  if (!file.ok()) return Fail("inspect", file.status());
  const GgufFile& f = **file;
  uint64_t total = 0;
  std::map<std::string, int64_t> per_type;  // type name -> tensors
  for (const GgufTensorInfo& t : f.tensors()) {
    total += t.size_bytes;
    ++per_type[TypeName(t.type)];
  }
  std::string types_line;
  for (const auto& [name, n] : per_type) {
    const GgmlTypeInfo* info = FindGgmlTypeByName(name);
    const bool computable = info != nullptr && FindWeightType(info->type) != nullptr;
    types_line += (types_line.empty() ? "" : ", ") + name + " x" + std::to_string(n) +
                  (computable ? "" : " (no kernels)");
  }

  if (args->Has("--json")) {
    nlohmann::json meta = nlohmann::json::object();
    for (const GgufKeyValue& kv : f.metadata()) {
      const GgufValue& v = kv.value;
      if (v.is_array()) {
        nlohmann::json a = {{"type", GgufValueTypeName(v.array_type())},
                            {"length", v.array_size()}};
        if (v.array_size() <= 64) a["value"] = v.DebugString(64);
        meta[kv.key] = a;
      } else if (const std::string* s = v.AsString()) {
        meta[kv.key] = *s;
      } else if (v.type() == GgufValueType::kBool) {
        meta[kv.key] = *v.AsBool();
      } else if (v.type() == GgufValueType::kFloat32 || v.type() == GgufValueType::kFloat64) {
        meta[kv.key] = *v.AsDouble();
      } else if (auto i = v.AsInt()) {
        meta[kv.key] = *i;
      } else {
        meta[kv.key] = v.DebugString();
      }
    }
    nlohmann::json tensors = nlohmann::json::array();
    for (const GgufTensorInfo& t : f.tensors()) {
      tensors.push_back({{"name", t.name},
                         {"type", TypeName(t.type)},
                         {"shape", t.dims},
                         {"offset", t.offset},
                         {"bytes", t.size_bytes}});
    }
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [name, n] : per_type) types[name] = n;
    nlohmann::json out = {
        {"path", f.path()},           {"version", f.version()}, {"powerinfer", f.is_powerinfer()},
        {"alignment", f.alignment()}, {"tensor_bytes", total},  {"metadata", meta},
        {"tensor_types", types},      {"tensors", tensors}};
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::printf("%s: GGUF v%u%s, %zu metadata keys, %zu tensors, %.2f MiB of tensor data\n",
              f.path().c_str(), f.version(), f.is_powerinfer() ? " (PowerInfer)" : "",
              f.metadata().size(), f.tensors().size(), total / 1048576.0);
  std::printf("tensor types: %s\n\n", types_line.c_str());
  for (const GgufKeyValue& kv : f.metadata()) {
    std::printf("  %-44s %s\n", kv.key.c_str(), kv.value.DebugString().c_str());
  }
  std::printf("\n");
  for (const GgufTensorInfo& t : f.tensors()) {
    std::printf("  %-36s %-6s [%s] %llu bytes\n", t.name.c_str(),
                std::string(TypeName(t.type)).c_str(), absl::StrJoin(t.dims, ", ").c_str(),
                static_cast<unsigned long long>(t.size_bytes));
  }
  return 0;
}

}  // namespace thermocline::cli
