#!/usr/bin/env bash
# Builds release binaries and runs the benchmarks (all, or the scenarios named).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh --tests
cargo build --release --workspace --bins --examples
if [[ ! -x .venv/bin/python ]]; then python3 -m venv .venv; fi
.venv/bin/pip install -q -r tests/e2e/requirements.txt
# The TypeScript SDK and playwright-core of the `lifecycle` scenario's loop.
npm ci --prefix tests/e2e/node-clients --no-audit --no-fund --loglevel=error
E2E_BIN_DIR="$PWD/target/release" exec .venv/bin/python bench/run.py "$@"
