#!/usr/bin/env bash
# Installs the Debian 12 packages Thermocline builds and tests with (needs root or sudo).
set -euo pipefail
PACKAGES=(
  build-essential cmake ccache pkg-config clang
  libabsl-dev nlohmann-json3-dev libspdlog-dev catch2 libbenchmark-dev coinor-libcbc-dev
  libcpp-httplib-dev libtomlplusplus-dev nodejs npm
)
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
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
