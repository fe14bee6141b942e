#!/usr/bin/env bash
# Lints the deployment files: YAML (Debian's yamllint) of deploy/ and docker/, the Dockerfiles
# (dockerfile_lint.py), and the shell scripts of the images. Exit 77 (skipped) without yamllint.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
if ! command -v yamllint >/dev/null 2>&1; then
  echo "SKIPPED: yamllint is not installed (scripts/setup.sh installs it)"
  exit 77
fi
mapfile -t yaml < <(find deploy docker -name '*.yaml' -o -name '*.yml' | sort)
yamllint --strict -c tests/deploy/yamllint.yaml "${yaml[@]}"
echo "yamllint: ${#yaml[@]} file(s) clean"
python3 tests/deploy/dockerfile_lint.py "$root" docker/Dockerfile.*
bash -n docker/healthcheck.sh
