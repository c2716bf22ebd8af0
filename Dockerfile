# kvroute and kvroute-sim on Debian 12 (docs/operations.md, "Kubernetes").
#   make image                      (docker or podman, whichever is present)
#   scripts/image-test.sh           (builds it without a registry and proves it)
# Build stage: the project's own install script (--build: compilers and -dev packages only)
# and make. Runtime stage: bookworm-slim with only the shared libraries the two programs link
# against, no compiler, running as an unprivileged user.
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --build
COPY . .
RUN make -j"$(nproc)" build/kvroute build/kvroute-sim \
 && strip build/kvroute build/kvroute-sim

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libuv1 libhttp-parser2.9 libcurl4 libjansson4 libyaml-0-2 libzmq5 libmsgpackc2 \
      libxxhash0 libhiredis0.14 ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && groupadd --system --gid 10001 kvroute \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvroute
COPY --from=build /src/build/kvroute /src/build/kvroute-sim /usr/local/bin/
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["kvroute"]
CMD ["--help"]
