#!/usr/bin/env bash
# Side by side with llama.cpp: alternates `llama-bench` and `thermocline bench` on the same GGUF
# files and prints each one's median and range and the ratio, for prefill of a prompt and decode,
# at each thread count. A model with a sidecar beside it (MODEL.thermo.gguf, or NAME.thermo.gguf
# for NAME.gguf) is also run sparse by Thermocline; llama.cpp runs it dense. Not part of CI: it
# needs a llama.cpp build (docs/benchmarks.md says how to make one) and an idle machine.
#
#   scripts/compare-llama-cpp.sh LLAMA_BENCH MODEL...
#
# Environment: ROUNDS (alternated rounds, default 3), THREADS (default "1 2"), PROMPT (prompt
# tokens, default 64), GEN (generated tokens, default 64), THERMOCLINE (the binary, default
# build/tools/thermocline beside this script's checkout), LLAMA_ARGS (more llama-bench options,
# e.g. "-mmp 0": its weights read into memory instead of from the file's mapping). DEPTHS
# (e.g. "1024 4000"): also prefill that many tokens and decode GEN after them, on both sides
# (`llama-batched-bench`, found beside LLAMA_BENCH or given as LLAMA_BATCHED_BENCH, since
# llama-bench decodes from an empty context); figures prefill@N and decode@N.
set -euo pipefail

if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
llama_bench=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
thermocline=${THERMOCLINE:-$root/build/tools/thermocline}
rounds=${ROUNDS:-3}
threads=${THREADS:-"1 2"}
prompt=${PROMPT:-64}
gen=${GEN:-64}
depths=${DEPTHS:-}
llama_batched=${LLAMA_BATCHED_BENCH:-$(dirname "$llama_bench")/llama-batched-bench}
tools=("$llama_bench" "$thermocline")
[[ -n "$depths" ]] && tools+=("$llama_batched")
for tool in "${tools[@]}"; do
  [[ -x "$tool" ]] || { echo "compare-llama-cpp: $tool is not an executable" >&2; exit 1; }
done
for d in $depths; do
  [[ "$d" =~ ^[1-9][0-9]*$ ]] || { echo "compare-llama-cpp: DEPTHS: $d is not a token count" >&2; exit 1; }
done
for model in "$@"; do
  [[ -f "$model" ]] || { echo "compare-llama-cpp: $model is not a file" >&2; exit 1; }
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT

# One line per measurement: model, threads, who, figure, tokens/s.
record() { echo "$1 $2 $3 $4 $5" >>"$results"; }

# Runs a command for its standard output; if it fails, shows what it printed on standard error
# and stops the comparison (the figures so far are lost with it: they would be one-sided).
run_quiet() {
  local err out
  err=$(mktemp)
  if ! out=$("$@" 2>"$err"); then
    echo "compare-llama-cpp: failed: $*" >&2
    tail -5 "$err" >&2
    rm -f "$err"
    exit 1
  fi
  rm -f "$err"
  printf '%s\n' "$out"
}

llama_round() {  # model threads
  local json
  # shellcheck disable=SC2086  # LLAMA_ARGS: words
  json=$(run_quiet "$llama_bench" -m "$1" -t "$2" -p "$prompt" -n "$gen" -r 1 ${LLAMA_ARGS:-} -o json)
  python3 -c '
import json, sys
for r in json.loads(sys.argv[1]):
    print("prefill" if r["n_prompt"] > 0 else "decode", r["avg_ts"])
' "$json" | while read -r what ts; do record "$1" "$2" llama.cpp "$what" "$ts"; done
}

# Prefill of `depth` tokens, then decode of GEN after them, on both sides.
depth_round() {  # model threads depth
  local out
  out=$(run_quiet "$llama_batched" -m "$1" -t "$2" -c $(($3 + gen + 64)) -b 2048 -ub 512 \
    -npp "$3" -ntg "$gen" -npl 1 --output-format jsonl)
  python3 -c '
import json, sys
for line in sys.argv[1].splitlines():
    if line.startswith("{"):
        r = json.loads(line)
        print("prefill@%s" % sys.argv[2], r["speed_pp"])
        print("decode@%s" % sys.argv[2], r["speed_tg"])
' "$out" "$3" | while read -r what ts; do record "$1" "$2" llama.cpp "$what" "$ts"; done
  out=$(run_quiet "$thermocline" bench -m "$1" --threads "$2" --prompt-tokens "$3" \
    --gen-tokens "$gen" --repetitions 1 --sparse off --json)
  python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print("prefill@%s" % sys.argv[2], j["prompt_tokens_per_s"])
print("decode@%s" % sys.argv[2], j["decode_tokens_per_s"])
' "$out" "$3" | while read -r what ts; do record "$1" "$2" thermocline "$what" "$ts"; done
}

thermocline_round() {  # model threads
  local json
  json=$(run_quiet "$thermocline" bench -m "$1" --threads "$2" --prompt-tokens "$prompt" \
    --gen-tokens "$gen" --repetitions 1 --sparse off --json)
  python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print("prefill", j["prompt_tokens_per_s"])
print("decode", j["decode_tokens_per_s"])
' "$json" | while read -r what ts; do record "$1" "$2" thermocline "$what" "$ts"; done
  if [[ -f "$1.thermo.gguf" || -f "${1%.gguf}.thermo.gguf" ]]; then
    local sidecar=$1.thermo.gguf
    [[ -f "$sidecar" ]] || sidecar=${1%.gguf}.thermo.gguf
    json=$(run_quiet "$thermocline" bench -m "$1" --sidecar "$sidecar" --threads "$2" \
      --prompt-tokens 16 --gen-tokens "$gen" --repetitions 1 --json)
    python3 -c '
import json, sys
print("sparse-decode", json.loads(sys.argv[1])["sparse_decode_tokens_per_s"])
' "$json" | while read -r what ts; do record "$1" "$2" thermocline "$what" "$ts"; done
  fi
}

echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
  "$(date -u +%Y-%m-%dT%H:%MZ); $rounds rounds, llama.cpp${LLAMA_ARGS:+ ($LLAMA_ARGS)} then" \
  "Thermocline in each" >&2
for round in $(seq "$rounds"); do
  for model in "$@"; do
    for t in $threads; do
      echo "round $round/$rounds: $(basename "$model"), $t threads" >&2
      llama_round "$model" "$t"
      thermocline_round "$model" "$t"
      for d in $depths; do depth_round "$model" "$t" "$d"; done
    done
  done
done

python3 - "$results" <<'EOF'
import collections, os, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    model, threads, who, what, ts = line.split()
    runs[(model, int(threads), who, what)].append(float(ts))
def cell(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "-"
print("| model | threads | figure | llama.cpp tok/s | Thermocline tok/s | ratio |")
print("|---|---|---|---|---|---|")
for model, threads in sorted({(k[0], k[1]) for k in runs}):
    name = os.path.basename(model)
    depths = sorted({int(k[3].split("@")[1]) for k in runs if "@" in k[3]})
    figures = ["prefill", "decode", "sparse-decode"]
    figures += [f"{w}@{d}" for d in depths for w in ("prefill", "decode")]
    for what in figures:
        ours = runs.get((model, threads, "thermocline", what), [])
        if not ours:
            continue
        # Sparse decode is compared with what llama.cpp does with the same file: decode it dense.
        theirs = runs.get((model, threads, "llama.cpp", "decode" if what == "sparse-decode" else what), [])
        ratio = f"{statistics.median(ours) / statistics.median(theirs):.2f}x" if theirs else "-"
        print(f"| {name} | {threads} | {what} | {cell(theirs)} | {cell(ours)} | {ratio} |")
EOF
