// `thermocline serve`: wires the model registry, the scheduler and the HTTP front end, and owns
// the process lifecycle: bind, load the models in the background (health says "loading"),
// serve, and on SIGINT/SIGTERM stop accepting, let requests in flight finish within
// shutdown_timeout_s (then cancel them), and return.
#pragma once

#include "absl/status/status.h"
#include "server/config.h"

namespace thermocline::server {

// Runs the daemon until SIGINT or SIGTERM. OK after a graceful stop; an error when it cannot
// bind or a model fails to load. Prints "thermocline: listening on http://HOST:PORT" on stdout
// once bound (tests read the port from it when port = 0).
absl::Status RunDaemon(const ServerConfig& config);

}  // namespace thermocline::server
