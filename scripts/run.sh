#!/usr/bin/env bash
# Sets up, builds, and runs the Thermocline daemon on the bundled test model:
# an OpenAI-compatible API on http://127.0.0.1:${PORT:-8080} serving model "stories260K".
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target thermocline
MODELS=${THERMOCLINE_TEST_MODELS:-$(cd .. && pwd)/shared/models}
exec ./build/tools/thermocline serve --model "$MODELS/stories260K.gguf=stories260K" \
  --port "${PORT:-8080}" "$@"
