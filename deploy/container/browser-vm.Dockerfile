# The browser VM image of the Kubernetes runtime (deploy/kubernetes/browser-pod.yaml):
# the agent, Chromium, Xvfb, PulseAudio, ffmpeg and Node.js with playwright-core, run
# as user 1000 with a read-only root filesystem. Build from the repository's root:
#   docker build -f deploy/container/browser-vm.Dockerfile -t browser-service/browser-vm:dev .
# The protobuf compiler is pure Rust (proto/build.rs): nothing to install.
FROM rust:1.95-trixie AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p browser-agent

# Debian 13: its Node.js (20) runs the playwright-core of browser-agent/node.
FROM debian:trixie-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        chromium chromium-l10n xvfb pulseaudio ffmpeg nodejs npm fonts-liberation \
        ca-certificates tzdata procps \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 kernel \
    && useradd --uid 1000 --gid 1000 --home-dir /home/kernel --no-create-home kernel
COPY --from=build /src/target/release/browser-agent /opt/browser-agent/browser-agent
COPY browser-agent/node/package.json browser-agent/node/package-lock.json /opt/browser-agent/node/
RUN cd /opt/browser-agent/node && npm ci --omit=dev && npm cache clean --force
COPY browser-agent/node/*.mjs /opt/browser-agent/node/
# The pod mounts emptyDirs on these (the root filesystem is read-only).
RUN mkdir -p /home/kernel /var/lib/browser-agent/scratch /var/lib/browser-agent/recordings \
    && chown -R 1000:1000 /home/kernel /var/lib/browser-agent
USER 1000:1000
ENV HOME=/home/kernel LANG=C.UTF-8
EXPOSE 50051
ENTRYPOINT ["/opt/browser-agent/browser-agent"]
