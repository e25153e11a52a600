# syntax=docker/dockerfile:1
# Multi-stage: build with the Rust toolchain, run from a slim image as non-root.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin kvgate

FROM debian:bookworm-slim
# The system's CA roots, for https:// instances (upstream.tls); the package
# follows Debian's point releases, so it is not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home kvgate
COPY --from=build /src/target/release/kvgate /usr/local/bin/kvgate
# Documentation of every key: `serve` refuses its placeholder secrets, so
# mount the real config over it (-v ./kvgate.yaml:/etc/kvgate/config.yaml).
COPY config.example.yaml /etc/kvgate/config.yaml
# The example's kv_aware endpoint names this tokenizer, relative to the config file.
COPY fixtures/smollm2 /etc/kvgate/fixtures/smollm2
USER 10001
EXPOSE 8080
# The image has no curl; the binary probes its own /health.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["kvgate", "probe", "--url", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["kvgate"]
CMD ["serve", "--config", "/etc/kvgate/config.yaml", "--listen", "0.0.0.0:8080"]
