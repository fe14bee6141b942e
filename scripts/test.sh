#!/usr/bin/env bash
# Sets up, builds and runs every test: the Catch2 suites through ctest and a short fuzz run of
# the GGUF reader. Test models come from THERMOCLINE_TEST_MODELS (default ../shared/models).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BUILD=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j"$JOBS"
export THERMOCLINE_TEST_MODELS=${THERMOCLINE_TEST_MODELS:-$(cd .. && pwd)/shared/models}
if [ -x tests/fuzz/run_fuzz.sh ]; then
  tests/fuzz/run_fuzz.sh "${BUILD}-fuzz" "${FUZZ_SECONDS:-30}"
fi
cd "$BUILD"
ctest --output-on-failure -j"$JOBS" --timeout 900
