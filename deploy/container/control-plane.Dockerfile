# The control plane image (deploy/kubernetes/control-plane.yaml). Build from the
# repository's root:
#   docker build -f deploy/container/control-plane.Dockerfile -t browser-service/control-plane:dev .
# The protobuf compiler is pure Rust (proto/build.rs): nothing to install.
FROM rust:1.95-trixie AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p control-plane -p browser-agent

FROM debian:trixie-slim
# ffmpeg remuxes recordings; bubblewrap sandboxes apps' actions where the cluster allows
# user namespaces (otherwise apps are off and /readyz says so).
RUN apt-get update && apt-get install -y --no-install-recommends \
        ca-certificates ffmpeg bubblewrap nodejs \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --home-dir /var/lib/browser-service --no-create-home browser-service
COPY --from=build /src/target/release/control-plane /usr/local/bin/control-plane
COPY --from=build /src/target/release/browser-agent /usr/local/bin/browser-agent
USER 10001:10001
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/control-plane"]
CMD ["serve"]
