#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, its driver and the CUDA toolkit (plus the
# packages of scripts/setup.sh): builds Thermocline with the CUDA backend for this GPU only
# (build-gpu/), runs every [cuda] test (none may skip) and the CUDA kernel benchmark, and prints
# a summary. Exits non-zero on any failure. Budget: under 8 minutes on a 16-core machine.
#   tests/gpu/run.sh            # everything
#   BUILD=dir JOBS=n tests/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
LOG=${LOG:-$BUILD/gpu-run}
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }
fail() { echo "GPU CHECK FAILED: $*" >&2; exit 1; }

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ||
  fail "nvidia-smi found no GPU"

step "configure ($BUILD, CUDA on, this GPU's architecture only)"
mkdir -p "$LOG"
cmake -S . -B "$BUILD" -DTHERMOCLINE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native \
  -DCMAKE_BUILD_TYPE=Release >"$LOG/configure.log" 2>&1 ||
  { tail -30 "$LOG/configure.log"; fail "configure"; }
grep -q "CUDA backend: ON" "$LOG/configure.log" || fail "the CUDA backend is not enabled"

step "build (-j$JOBS)"
timeout 300 cmake --build "$BUILD" -j"$JOBS" --target thermocline_cuda_tests thermocline_cuda_bench \
  >"$LOG/build.log" 2>&1 || { grep -E "error|Error" "$LOG/build.log" | head -30; fail "build"; }

step "[cuda] and [gpu] tests"
set +e
timeout 180 "$BUILD/tests/thermocline_cuda_tests" "[cuda],[gpu]" --durations yes >"$LOG/tests.log" 2>&1
rc=$?
set -e
tail -40 "$LOG/tests.log"
[ $rc -eq 0 ] || fail "[cuda] tests (exit $rc), see $LOG/tests.log"
if grep -q "SKIPPED: no CUDA device" "$LOG/tests.log"; then
  fail "a [cuda] case found no CUDA device on a GPU machine"
fi
if grep -q "SKIPPED:" "$LOG/tests.log"; then
  echo "warning: skipped (set THERMOCLINE_TEST_MODELS to the test models):"
  grep "SKIPPED:" "$LOG/tests.log"
fi
passed=$(grep -Eo "All tests passed \([0-9]+ assertions in [0-9]+ test cases\)" "$LOG/tests.log" || true)
[ -n "$passed" ] || fail "no test summary in $LOG/tests.log"

step "CUDA kernel benchmark"
timeout 180 "$BUILD/tests/thermocline_cuda_bench" | tee "$LOG/bench.txt" ||
  fail "benchmark (exit ${PIPESTATUS[0]})"

step "summary"
echo "tests:     $passed"
echo "benchmark: $LOG/bench.txt"
echo "hybrid decode tok/s: not measured (the executor is not wired into SparseFfn yet)"
echo "total:     $(( $(date +%s) - t0 )) s"
echo "GPU CHECK PASSED"
