#!/bin/sh
# Runs test_grpc.py against the daemon binary $1: generates the Python stubs of proto/ into a
# temporary directory with protoc and grpc_python_plugin, then runs the test with
# /usr/bin/python3 (Debian's python3-grpcio and python3-protobuf). Exit 77 (skipped) only when
# that Python has no grpc module.
set -eu
BIN="$1"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3
if ! "$PY" -c 'import grpc, google.protobuf' 2>/dev/null; then
  echo "SKIPPED: $PY has no grpc module (apt-get install python3-grpcio python3-protobuf)"
  exit 77
fi
for tool in protoc grpc_python_plugin; do
  if ! command -v "$tool" >/dev/null; then
    echo "$tool is missing: apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
    exit 1
  fi
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PLUGIN="--plugin=protoc-gen-grpc=$(command -v grpc_python_plugin)"
protoc -I "$ROOT/proto" -I /usr/include --python_out "$OUT" --grpc_out "$OUT" "$PLUGIN" \
  thermocline/v1/inference.proto thermocline/v1/admin.proto
# grpc/health/v1/health_pb2.py would be shadowed by the installed grpc package: generate the
# health stubs as top-level modules (the proto package, grpc.health.v1, stays the same).
cp "$ROOT/proto/grpc/health/v1/health.proto" "$OUT/health.proto"
protoc -I "$OUT" --python_out "$OUT" --grpc_out "$OUT" "$PLUGIN" "$OUT/health.proto"
PYTHONPATH="$OUT" "$PY" "$HERE/test_grpc.py" "$BIN"
