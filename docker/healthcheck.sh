#!/bin/bash
# The image's health check: GET /health on the daemon's port must answer 200 (503 while models
# load or while stopping). Plain bash (/dev/tcp): the slim image has no curl.
set -euo pipefail
port="${THERMOCLINE_PORT:-8080}"
exec 3<>"/dev/tcp/127.0.0.1/${port}"
printf 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
IFS= read -r -t 2 status <&3
[[ "${status}" == "HTTP/1.1 200 "* ]]
