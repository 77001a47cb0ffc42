#!/usr/bin/env bash
# Installs what the service needs on a Debian/Ubuntu machine, skipping what is present.
#   deploy/install-deps.sh          runtime + build: Chromium, Xvfb, ffmpeg, pkg-config
#   deploy/install-deps.sh --tests  also PostgreSQL, Python venv and Node.js for the tests,
#                                   and the benchmarks' references
set -euo pipefail

# ffmpeg encodes screen recordings (agents) and salvages those of crashed agents.
# bubblewrap puts every browser in a sandbox of its own. chromium-l10n holds Chromium's
# translations: without them a browser's `location.locale` cannot reach Intl.
# tzdata: the timezones a browser's `location.timezone` may name.
# chromium-driver: WebDriver BiDi (`webdriver_ws_url`), the same build as chromium.
# libturbojpeg0-dev: the live view's JPEG encoder (libjpeg-turbo), linked by the agent.
# pulseaudio: each headful VM's own sound server (a null sink), for live audio and
# recordings with `record_audio`.
# python3-venv and git: apps' builds (a virtual environment per Python app; sources
# fetched from git repositories), in their sandboxes.
packages=(chromium chromium-l10n chromium-driver tzdata xvfb ffmpeg bubblewrap pkg-config ca-certificates procps
  libturbojpeg0-dev pulseaudio python3-venv git)
if [[ "${1:-}" == "--tests" ]]; then
  # xdotool, unzip, x11vnc and novnc are references the benchmarks measure against.
  # iproute2 builds the tests' "public internet" host and their test kubelets' pod networks in
  # network namespaces.
  # openssl and kubectl: the Kubernetes page's certificate and Secret commands, which the
  # Kubernetes tests run as printed (any kubectl from 1.18, for --dry-run=client: keep one
  # that is already there; Debian 12 packages one as kubernetes-client).
  packages+=(postgresql xdotool unzip iproute2 x11vnc novnc openssl)
  if ! command -v kubectl >/dev/null && apt-cache show kubernetes-client >/dev/null 2>&1; then
    packages+=(kubernetes-client)
  fi
fi
# Playwright code runs in each VM on Node.js (and the tests' Puppeteer), as do JavaScript
# and TypeScript apps: any Node.js >= 20 will do (playwright-core needs it, and apps'
# module hooks), so keep one that is already there.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The host users browser sandboxes run as when the service runs as root: the VM's agent
# (--vm-user) and, apart from it, the code a tenant runs in the VM (--vm-tenant-user).
for vm_user in browser-vm browser-tenant; do
  if ! id -u "$vm_user" >/dev/null 2>&1; then
    echo "creating the system user $vm_user (browser sandboxes run as it)" >&2
    $sudo useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$vm_user"
  fi
done

if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi

# mdBook builds the documentation (docs/) in the tests, which check the built site's links.
# Debian has no package of it: cargo builds it once (about a minute) into cargo's own bin.
mdbook_version=0.4.52
mdbook="${CARGO_HOME:-$HOME/.cargo}/bin/mdbook"
if [[ "${1:-}" == "--tests" ]] && [[ "$("$mdbook" --version 2>/dev/null)" != "mdbook v$mdbook_version" ]]; then
  echo "installing mdBook $mdbook_version (cargo install)" >&2
  cargo install mdbook --version "$mdbook_version" --locked --no-default-features --quiet \
    --root "${CARGO_HOME:-$HOME/.cargo}"
fi

# The Node.js runtime of the VMs' Playwright executors: playwright-core and TypeScript at
# the versions pinned by browser-agent/node/package-lock.json.
node_runtime="$(dirname "$0")/../browser-agent/node"
if ! cmp -s "$node_runtime/package-lock.json" "$node_runtime/node_modules/.installed-lock.json" 2>/dev/null; then
  echo "installing the VMs' Node.js runtime (browser-agent/node)" >&2
  npm ci --prefix "$node_runtime" --omit=dev --no-audit --no-fund --loglevel=error
  cp "$node_runtime/package-lock.json" "$node_runtime/node_modules/.installed-lock.json"
fi
