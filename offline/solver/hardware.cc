// Hardware profile files and the CPU measurement.
#include "offline/solver/hardware.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/util/read_bandwidth.h"

namespace thermocline::offline {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseSimpleToml(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, section;
  for (int n = 1; std::getline(in, line); ++n) {
    // Strip comments outside strings.
    bool in_str = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '"') in_str = !in_str;
      if (line[i] == '#' && !in_str) {
        line.resize(i);
        break;
      }
    }
    line = Trim(line);
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3) {
        return absl::InvalidArgumentError(absl::StrCat("line ", n, ": bad section header"));
      }
      section = Trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("line ", n, ": expected key = value"));
    }
    const std::string key = Trim(line.substr(0, eq));
    std::string value = Trim(line.substr(eq + 1));
    if (key.empty() || value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", n, ": empty key or value"));
    }
    if (value.front() == '"') {
      if (value.size() < 2 || value.back() != '"') {
        return absl::InvalidArgumentError(absl::StrCat("line ", n, ": unterminated string"));
      }
      value = value.substr(1, value.size() - 2);
    }
    out[section.empty() ? key : section + "." + key] = value;
  }
  return out;
}

absl::StatusOr<HardwareProfile> ParseHardwareProfile(const std::string& text) {
  auto kv = ParseSimpleToml(text);
  if (!kv.ok()) return kv.status();
  HardwareProfile hw;
  const std::map<std::string, double*> numbers = {
      {"gpu.memory_bytes", &hw.gpu_memory_bytes},   {"gpu.bandwidth_gbps", &hw.gpu_bandwidth_gbps},
      {"gpu.efficiency", &hw.gpu_efficiency},       {"gpu.pcie_gbps", &hw.pcie_gbps},
      {"gpu.sync_latency_us", &hw.sync_latency_us}, {"cpu.bandwidth_gbps", &hw.cpu_bandwidth_gbps},
      {"cpu.efficiency", &hw.cpu_efficiency}};
  for (const auto& [key, value] : *kv) {
    if (key == "name") {
      hw.name = value;
      continue;
    }
    auto it = numbers.find(key);
    if (it == numbers.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown key '", key, "'"));
    }
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !(v >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", key, "': '", value, "' is not a non-negative number"));
    }
    *it->second = v;
  }
  if (hw.gpu_bandwidth_gbps <= 0 || hw.gpu_efficiency <= 0 || hw.cpu_efficiency <= 0 ||
      hw.pcie_gbps <= 0) {
    return absl::InvalidArgumentError(
        "gpu.bandwidth_gbps, gpu.efficiency, gpu.pcie_gbps and cpu.efficiency must be positive");
  }
  return hw;
}

absl::StatusOr<HardwareProfile> ReadHardwareProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open hardware profile '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  auto hw = ParseHardwareProfile(ss.str());
  if (!hw.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware profile '", path, "': ", hw.status().message()));
  }
  return hw;
}

std::string FormatHardwareProfile(const HardwareProfile& hw) {
  std::ostringstream o;
  o << "name = \"" << hw.name << "\"\n\n[gpu]\n"
    << "memory_bytes = " << static_cast<uint64_t>(hw.gpu_memory_bytes) << "\n"
    << "bandwidth_gbps = " << hw.gpu_bandwidth_gbps << "\n"
    << "efficiency = " << hw.gpu_efficiency << "\n"
    << "pcie_gbps = " << hw.pcie_gbps << "\n"
    << "sync_latency_us = " << hw.sync_latency_us << "\n\n[cpu]\n"
    << "bandwidth_gbps = " << hw.cpu_bandwidth_gbps << "\n"
    << "efficiency = " << hw.cpu_efficiency << "\n";
  return o.str();
}

void MeasureCpuIfMissing(HardwareProfile& hw, ThreadPool& pool) {
  if (hw.cpu_bandwidth_gbps > 0) return;
  hw.cpu_bandwidth_gbps = MeasureReadBandwidth(pool, size_t{256} << 20);
}

}  // namespace thermocline::offline
