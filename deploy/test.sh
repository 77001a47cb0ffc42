#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs Chromium, Xvfb and PostgreSQL,
# starts PostgreSQL, builds, runs the Rust tests (store contract on SQLite and
# PostgreSQL) and the end-to-end tests (official kernel SDK + Playwright, real browsers).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it starts, for keeping the suite's time in check.
step() { echo "== $* ($(date -u +%H:%M:%S), ${SECONDS} s in)"; }

step "dependencies"
deploy/install-deps.sh --tests

# --- PostgreSQL: a local server and a role/database the tests own -----------------------
cluster=$(pg_lsclusters --no-header | head -n 1)
if [[ -z "$cluster" ]]; then
  echo "no PostgreSQL cluster found (pg_lsclusters)" >&2
  exit 1
fi
read -r pg_version pg_cluster pg_port _ <<<"$cluster"
pg_ctlcluster "$pg_version" "$pg_cluster" start 2>/dev/null || true
as_postgres() { runuser -u postgres -- psql -p "$pg_port" -v ON_ERROR_STOP=1 -qtAc "$1"; }
for _ in $(seq 50); do as_postgres "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
if [[ "$(as_postgres "SELECT 1 FROM pg_roles WHERE rolname = 'browser_test'")" != "1" ]]; then
  as_postgres "CREATE ROLE browser_test LOGIN PASSWORD 'browser_test'"
fi
if [[ "$(as_postgres "SELECT 1 FROM pg_database WHERE datname = 'browser_test'")" != "1" ]]; then
  as_postgres "CREATE DATABASE browser_test OWNER browser_test"
fi
export TEST_DATABASE_URL="postgres://browser_test:browser_test@127.0.0.1:${pg_port}/browser_test"

# --- Rust: build everything once, then unit, contract and integration tests -------------
# One build of the binaries and every test target (their compiles run side by side).
step "Rust build"
cargo build --workspace --all-targets
step "Rust tests"
cargo test --workspace

# --- Documentation: docs/ built into a site with mdBook; a broken link fails the build -----
step "documentation"
"${CARGO_HOME:-$HOME/.cargo}/bin/mdbook" build docs
python3 tests/docs/check_book_links.py target/book

# --- End to end: the official SDK and Playwright against the real binaries --------------
# The suite runs once per generation of the official Python SDK: the seed-era 0.40.0 and
# today's 0.131.0 (tests/e2e/sdk.py). Each lives in a venv of its own.
e2e_venv() {
  local venv=$1 requirements=$2
  if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q -r "tests/e2e/$requirements"
}
step "end-to-end environments"
e2e_venv .venv requirements.txt
e2e_venv .venv-sdk131 requirements-sdk131.txt
# schemathesis, which tests/e2e/test_schema_fuzz.py runs against /openapi.json.
e2e_venv .venv-schema ../schema-requirements.txt
npm ci --prefix tests/e2e/node-clients --no-audit --no-fund --loglevel=error
cd tests/e2e
# Two modules at a time (pytest-xdist, each module whole on one worker with its control
# plane): a third less time on a 2-core machine, which one module alone leaves half idle.
# E2E_WORKERS=0 runs everything in one process.
# --durations: the slowest tests, for keeping the suite's time in check.
pytest_args=(-q --durations=15 -n "${E2E_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
# Modules that measure time or shares of the CPU (a recording's A/V sync, a VM's CPU
# weight, the live view's latency) run alone, after the others: beside another module
# they would measure its load too. (Their busy variants make the load they measure under
# themselves.)
alone=(test_audio.py test_kernel_limits.py test_live_view.py)
for venv in .venv .venv-sdk131; do
  step "end-to-end suite with $("../../$venv/bin/python" -c 'import kernel; print("kernel", kernel.__version__)')"
  if [[ $# -eq 0 ]]; then
    "../../$venv/bin/python" -m pytest "${pytest_args[@]}" --ignore=test_replicas.py "${alone[@]/#/--ignore=}"
    "../../$venv/bin/python" -m pytest -q --durations=5 "${alone[@]}"
  else
    "../../$venv/bin/python" -m pytest "${pytest_args[@]}" --ignore=test_replicas.py "$@"
  fi
done
# A third of the suite again, through two control-plane replicas on PostgreSQL behind a
# load balancer that alternates requests (E2E_REPLICAS=2), and the replicas' own tests:
# kill -9 of one during a CDP connection, pool filling and a login flow.
if [[ $# -eq 0 ]]; then
  step "a third of the end-to-end suite through two replicas behind a load balancer"
  E2E_REPLICAS=2 ../../.venv-sdk131/bin/python -m pytest "${pytest_args[@]}" test_replicas.py \
    test_browsers.py test_computer.py test_pools.py test_filesystem.py test_playwright.py \
    test_replays.py test_managed_auth.py test_apps.py test_names_and_tags.py \
    test_paging.py test_webdriver.py test_viewport.py test_profiles.py test_telemetry.py
  E2E_REPLICAS=2 ../../.venv-sdk131/bin/python -m pytest -q --durations=5 test_live_view.py
fi
step "done"
