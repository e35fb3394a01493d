# One image of the `shield` binary; docker-compose runs it once per role.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p shield && cp target/release/shield /usr/local/bin/shield

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 shield
COPY --from=build /usr/local/bin/shield /usr/local/bin/shield
USER shield
ENTRYPOINT ["shield"]
