# The viewtape server as a small image: the release binary on distroless (glibc and nothing
# else: no shell, no package manager), running as an unprivileged user.
#
#   docker build -t viewtape .        (or: podman build -t viewtape .)
#   docker run -p 8080:8080 -v viewtape-data:/data viewtape
#
# The embedded guests are checked in under server/guests/, so the build needs no wasm target.
FROM docker.io/library/rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p viewtape-server --bin viewtape \
 && mkdir -p /out/data \
 && cp target/release/viewtape /out/viewtape

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/viewtape /usr/local/bin/viewtape
# The data directory (snapshots, log, deployed modules), owned by the image's user (65532).
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME /data
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/viewtape", "serve", "--listen", "0.0.0.0:8080", "--data-dir", "/data"]
