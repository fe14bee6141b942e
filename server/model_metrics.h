// The model lines of GET /metrics, derived from the registry when scraped: how many models are
// ready and in memory against the memory budget, and per model whether it is loaded, how it is
// served (sparse or dense) and its placement.
#pragma once

#include <string>

#include "server/model_registry.h"

namespace thermocline::server {

// Prometheus text exposition lines. Thread-safe (snapshots of the registry).
std::string RenderModelMetrics(const ModelRegistry& registry);

}  // namespace thermocline::server
