#!/usr/bin/env bash
# Sets up, builds, and runs Thermocline on the bundled test model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target thermocline
MODELS=${THERMOCLINE_TEST_MODELS:-$(cd .. && pwd)/shared/models}
exec ./build/tools/thermocline generate -m "$MODELS/stories260K.gguf" \
  -p "${PROMPT:-Once upon a time}" -n "${N:-128}" "$@"
