// The hardware profile the placement solver models time with: GPU memory bandwidth, PCIe and
// synchronisation cost, and CPU read bandwidth. GPU figures come from a small TOML file
// (configs/hardware/*.toml) when no GPU can be measured; the CPU bandwidth is measured on this
// machine unless the file sets it.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/util/thread_pool.h"

namespace thermocline::offline {

struct HardwareProfile {
  std::string name = "rtx3060-12gb";
  // GPU. Defaults: NVIDIA GeForce RTX 3060 12GB (spec-sheet figures).
  double gpu_memory_bytes = 12884901888.0;
  double gpu_bandwidth_gbps = 360.0;  // 1e9 bytes/s, peak
  double gpu_efficiency = 0.6;        // share of peak a sparse mat-vec reaches
  double pcie_gbps = 24.0;            // host<->device, achieved
  double sync_latency_us = 20.0;      // launch + stream sync per hybrid layer
  // CPU. bandwidth 0: measure with MeasureReadBandwidth.
  double cpu_bandwidth_gbps = 0.0;
  double cpu_efficiency = 0.8;  // share of streaming bandwidth sparse row reads reach

  double GpuBytesPerSecond() const { return gpu_bandwidth_gbps * 1e9 * gpu_efficiency; }
  double CpuBytesPerSecond() const { return cpu_bandwidth_gbps * 1e9 * cpu_efficiency; }
};

// A tiny TOML subset: `[section]`, `key = number | "string" | true | false`, `#` comments.
// Keys come back as "section.key". Errors name the line.
absl::StatusOr<std::map<std::string, std::string>> ParseSimpleToml(const std::string& text);

// Reads a hardware file: name, [gpu] memory_bytes bandwidth_gbps efficiency pcie_gbps
// sync_latency_us, [cpu] bandwidth_gbps efficiency. Unknown keys are errors (typos).
absl::StatusOr<HardwareProfile> ReadHardwareProfile(const std::string& path);
absl::StatusOr<HardwareProfile> ParseHardwareProfile(const std::string& text);
// The same format, for `thermocline bench --hardware` to save what it measured.
std::string FormatHardwareProfile(const HardwareProfile& hw);

// Fills cpu_bandwidth_gbps by measurement when it is 0.
void MeasureCpuIfMissing(HardwareProfile& hw, ThreadPool& pool);

}  // namespace thermocline::offline
