#!/usr/bin/env bash
# Installs the Debian 12 packages Thermocline builds and tests with (needs root or sudo).
set -euo pipefail
PACKAGES=(
  build-essential cmake ccache pkg-config clang
  libabsl-dev nlohmann-json3-dev libspdlog-dev catch2 libbenchmark-dev coinor-libcbc-dev
  libcpp-httplib-dev libtomlplusplus-dev libsqlite3-dev
  protobuf-compiler protobuf-compiler-grpc libgrpc++-dev libprotobuf-dev python3-grpcio
  python3-protobuf python3-jinja2
  # tests/deploy: YAML lint and parsing of the manifests; ss for the listen-backlog test
  yamllint python3-yaml iproute2
)
# Node.js and npm drive the end-to-end test with the official OpenAI client. A machine that
# already has them (from any source) keeps its own; Debian's packages conflict with others.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
# Another apt run (unattended upgrades on a fresh machine) may hold the lock: wait for it.
apt_get() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"
}
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
