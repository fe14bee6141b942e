#!/usr/bin/env bash
# Runs the end-to-end tests of the official OpenAI Node client and Ollama JavaScript client
# against `thermocline serve`.
# usage: tests/e2e/run.sh PATH/TO/thermocline
# Exit 77 (ctest: skipped) when node or npm is missing; otherwise node --test's status.
# Installs the clients (npm ci from package-lock.json) when one is missing.
set -euo pipefail
BIN=$(realpath "${1:?usage: run.sh PATH/TO/thermocline}")
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIPPED: node/npm not installed"
  exit 77
fi
MODELS=${THERMOCLINE_TEST_MODELS:-$(cd ../../.. && pwd)/shared/models}
if [ ! -f "$MODELS/stories260K.gguf" ]; then
  echo "e2e: no test model at $MODELS/stories260K.gguf (set THERMOCLINE_TEST_MODELS)" >&2
  exit 1
fi
if [ ! -d node_modules/openai ] || [ ! -d node_modules/ollama ] || [ ! -d node_modules/ajv ]; then
  if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  else
    npm install --no-audit --no-fund --loglevel=error
  fi
fi
export THERMOCLINE_BIN="$BIN" THERMOCLINE_TEST_MODELS="$MODELS"
exec node --test --test-reporter=spec openai.test.mjs ollama.test.mjs
