#!/usr/bin/env bash
# Installs what the service needs on a Debian/Ubuntu machine, skipping what is present.
#   deploy/install-deps.sh          runtime + build: Chromium, Xvfb, ffmpeg, pkg-config
#   deploy/install-deps.sh --tests  also PostgreSQL, Python venv and Node.js for the tests,
#                                   and the benchmarks' references
set -euo pipefail

# ffmpeg encodes screen recordings (agents) and salvages those of crashed agents.
packages=(chromium xvfb ffmpeg pkg-config ca-certificates procps
  # xcap (screenshots) always compiles its Wayland/PipeWire code, so it needs these to build.
  libwayland-dev libpipewire-0.3-dev libgbm-dev libclang-dev libxcb1-dev libegl-dev)
if [[ "${1:-}" == "--tests" ]]; then
  # xdotool and unzip are references the benchmarks measure against.
  packages+=(postgresql python3-venv xdotool unzip)
  # Puppeteer runs on Node.js; any Node >= 18 will do, so keep one that is already there.
  command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null; then
  echo "cargo is missing: install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi
