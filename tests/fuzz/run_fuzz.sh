#!/usr/bin/env bash
# Builds the GGUF libFuzzer target with clang and runs it on the seed corpus for a while.
# Exits nonzero when the build fails or the fuzzer finds a crash, leak or timeout; the input
# that triggered it is left in BUILD_DIR/gguf_fuzz_artifacts/.
#
# usage: tests/fuzz/run_fuzz.sh [BUILD_DIR] [SECONDS]   (defaults: build-fuzz, 60)
set -euo pipefail

src_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="$(realpath -m "${1:-${src_dir}/build-fuzz}")"
seconds="${2:-60}"

CC="${CC:-clang}" CXX="${CXX:-clang++}" cmake -S "${src_dir}" -B "${build_dir}" \
  -DTHERMOCLINE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "${build_dir}" --target gguf_fuzz -j "$(nproc)"

# New inputs go to a scratch corpus so the checked-in seeds stay small.
corpus="${build_dir}/gguf_fuzz_corpus"
artifacts="${build_dir}/gguf_fuzz_artifacts"
mkdir -p "${corpus}" "${artifacts}"
exec "${build_dir}/tests/gguf_fuzz" "${corpus}" "${src_dir}/tests/fuzz/corpus" \
  -dict="${src_dir}/tests/fuzz/gguf.dict" -max_total_time="${seconds}" -max_len=16384 \
  -rss_limit_mb=2048 -artifact_prefix="${artifacts}/" -print_final_stats=1
