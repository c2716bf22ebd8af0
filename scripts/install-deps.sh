#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing, benchmarking and the demo need,
# plus the pinned `openai` and `@anthropic-ai/sdk` npm clients used by the e2e tests.
# Idempotent; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# `--build`: only what compiling kvroute, kvroute-sim and kvroute-bench needs (the image's
# build stage, Dockerfile); without it, everything tests, benchmarks and the demo need too.
BUILD_PKGS=(
  build-essential pkg-config
  libuv1-dev libhttp-parser-dev libcurl4-openssl-dev libjansson-dev libyaml-dev
  libzmq3-dev libmsgpack-dev libxxhash-dev libhiredis-dev
)
if [ "${1:-}" = "--build" ]; then
  missing=()
  for p in "${BUILD_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  exit 0
fi
PKGS=(
  build-essential pkg-config clang
  libuv1-dev libhttp-parser-dev libcurl4-openssl-dev libjansson-dev libyaml-dev
  libzmq3-dev libmsgpack-dev libxxhash-dev libcmocka-dev libhiredis-dev redis-server
  python3 python3-pytest python3-httpx python3-zmq python3-msgpack python3-yaml openssl
  nodejs wrk nginx-light haproxy gnuplot-nox curl procps
  chromium
  podman debootstrap
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# `kubectl kustomize` renders deploy/kubernetes in the tests: any kubectl with kustomize v5
# will do (the one already installed is kept); Debian's kubernetes-client otherwise.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
# NodeSource's nodejs bundles npm; Debian's own nodejs package does not.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The real OpenAI and Anthropic clients, pinned by tests/e2e/js/package-lock.json.
if [ -f tests/e2e/js/package-lock.json ] && { [ ! -d tests/e2e/js/node_modules/openai ] ||
  [ ! -d tests/e2e/js/node_modules/@anthropic-ai/sdk ]; }; then
  (cd tests/e2e/js && npm ci --no-audit --no-fund --loglevel=error)
fi
