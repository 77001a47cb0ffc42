#!/usr/bin/env bash
# Installs what is missing, builds, and starts the service with embedded defaults
# (SQLite and browser roots in ./data, http://127.0.0.1:8080). Extra arguments go to
# `control-plane serve` (see docs/configuration.md).
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
# BUILD_PROFILE=dev builds and serves the debug binaries instead (the tests start this
# script so, having built those already).
profile="${BUILD_PROFILE:-release}"
cargo build --profile "$profile" --workspace
binaries="target/$([[ $profile == dev ]] && echo debug || echo "$profile")"

data_dir="${CONTROL_PLANE_DATA_DIR:-./data}"
if [[ -f "$data_dir/bootstrap-api-key" ]]; then
  echo "API key (organization default): $(cat "$data_dir/bootstrap-api-key")"
fi
exec "$binaries/control-plane" serve "$@"
