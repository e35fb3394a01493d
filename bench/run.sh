#!/usr/bin/env bash
# Builds the release binary and runs the overhead benchmark (see README.md in this folder).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null && command -v nginx >/dev/null || {
  echo "installing wrk and nginx-light" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
}
cargo build --release --locked -p shield
exec python3 bench/run.py "$@"
