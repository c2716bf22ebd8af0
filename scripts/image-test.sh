#!/usr/bin/env bash
# Builds the container image (Dockerfile) and proves it, on a machine without registry access
# (issue 20; run by `make check`):
#  1. base images debian:bookworm and debian:bookworm-slim: used when present, else pulled,
#     else made with debootstrap (minbase) from this machine's configured Debian mirror and
#     imported (the rootfs tarball is cached in $KVR_IMAGE_CACHE for the next run);
#  2. `podman build --isolation chroot --pull=never`;
#  3. the image mounted; its kvroute-sim and its kvroute run from it (chroot, as the image's
#     user, on 127.0.0.1), a chat request through kvroute gets the sim's answer;
#  4. the runtime image has no compiler and runs as a non-root user; its size is printed.
# Needs root (podman image mount, chroot), podman and debootstrap (scripts/install-deps.sh).
# Processes it starts are stopped by pid; the mount is undone on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
TAG=${KVR_IMAGE_TAG:-localhost/kvroute:test}
CACHE=${KVR_IMAGE_CACHE:-/var/tmp/kvroute-image-cache}
SUITE=bookworm
say() { printf 'image-test: %s\n' "$*"; }
die() { printf 'image-test: FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (podman image mount, chroot)"
command -v podman >/dev/null || die "podman is not installed (scripts/install-deps.sh)"

PIDS=()
MNT=""
WORK=$(mktemp -d /tmp/kvroute-image-test.XXXXXX)
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  if [ -n "$MNT" ]; then podman image unmount "$TAG" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- 1. base images
mirror() {
  local u=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    u=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$u" ] && [ -f /etc/apt/sources.list ]; then
    u=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "${u:-http://deb.debian.org/debian}"
}

make_base() {
  local tar="$CACHE/$SUITE-minbase-slim1.tar"
  if [ ! -s "$tar" ]; then
    command -v debootstrap >/dev/null || die "debootstrap is not installed (scripts/install-deps.sh)"
    local m root="$WORK/rootfs"
    m=$(mirror)
    say "debootstrap $SUITE (minbase) from $m"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase "$SUITE" "$root" "$m" > "$WORK/debootstrap.log" 2>&1 ||
      { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
    # as the official slim images (debuerreotype --slimify): no docs, man pages, locales or
    # apt lists, and dpkg told to leave them out of later installs too
    mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
      'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
      'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \
      > "$root/etc/dpkg/dpkg.cfg.d/docker"
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias \
      -exec rm -rf {} +
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/lib/apt/lists/* \
      "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin
    tar -C "$root" --numeric-owner -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
    rm -rf "$root"
  fi
  for t in "debian:$SUITE" "debian:$SUITE-slim"; do
    podman image exists "docker.io/library/$t" ||
      podman import --quiet --change 'CMD ["bash"]' "$tar" "docker.io/library/$t" >/dev/null
  done
}

need_base=0
for t in "debian:$SUITE" "debian:$SUITE-slim"; do
  podman image exists "docker.io/library/$t" || need_base=1
done
if [ "$need_base" = 1 ]; then
  if timeout 30 podman pull -q "docker.io/library/debian:$SUITE" >/dev/null 2>&1 &&
     timeout 30 podman pull -q "docker.io/library/debian:$SUITE-slim" >/dev/null 2>&1; then
    say "base images pulled"
  else
    make_base
  fi
fi
say "base images ready ($(( $(date +%s) - T0 )) s)"

# ---- 2. build
T1=$(date +%s)
podman build --isolation chroot --pull=never -t "$TAG" . > "$WORK/build.log" 2>&1 ||
  { tail -40 "$WORK/build.log" >&2; die "podman build failed"; }
say "built $TAG in $(( $(date +%s) - T1 )) s"

# ---- 4a. what the image says about itself
USER_CFG=$(podman image inspect --format '{{.Config.User}}' "$TAG")
ENTRY=$(podman image inspect --format '{{json .Config.Entrypoint}}' "$TAG")
SIZE=$(podman image inspect --format '{{.Size}}' "$TAG")
[ "$ENTRY" = '["kvroute"]' ] || die "entrypoint is $ENTRY, want [\"kvroute\"]"
uid=${USER_CFG%%:*}
[ -n "$uid" ] && [ "$uid" != 0 ] && [ "$uid" != root ] || die "runs as '$USER_CFG' (want a non-root user)"

# ---- 3. run it
MNT=$(podman image mount "$TAG")
[ -x "$MNT/usr/local/bin/kvroute" ] && [ -x "$MNT/usr/local/bin/kvroute-sim" ] ||
  die "kvroute or kvroute-sim missing from /usr/local/bin"
grep -q "^[^:]*:[^:]*:$uid:" "$MNT/etc/passwd" || die "user $uid is not in the image's /etc/passwd"
for c in gcc cc c++ g++ clang ld as make; do
  for d in usr/bin usr/local/bin bin; do
    [ ! -e "$MNT/$d/$c" ] || die "the runtime image has a toolchain: /$d/$c"
  done
done
if grep -qE '^Package: (gcc|gcc-12|clang|binutils|libc6-dev)$' "$MNT/var/lib/dpkg/status"; then
  die "the runtime image has compiler packages installed"
fi

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SIM_PORT=$(free_port)
KV_PORT=$(free_port)
run_in_image() { exec chroot --userspec="${USER_CFG/:*/}:${USER_CFG#*:}" "$MNT" "$@"; }
case "$USER_CFG" in *:*) ;; *) USER_CFG="$USER_CFG:$USER_CFG" ;; esac
run_in_image /usr/local/bin/kvroute-sim --host 127.0.0.1 --port "$SIM_PORT" --model sim-model \
  --time-scale 0 > "$WORK/sim.log" 2>&1 &
PIDS+=($!)
run_in_image /usr/local/bin/kvroute --host 127.0.0.1 --port "$KV_PORT" \
  --worker "http://127.0.0.1:$SIM_PORT" --model sim-model --health-interval-ms 500 \
  --shutdown-delay-ms 0 > "$WORK/kvroute.log" 2>&1 &
PIDS+=($!)
ready=0
for _ in $(seq 100); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$KV_PORT/readyz" 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[ "$ready" = 1 ] || { tail -20 "$WORK/kvroute.log" "$WORK/sim.log" >&2; die "kvroute from the image never got ready"; }
curl -sS -D "$WORK/headers" -o "$WORK/answer.json" -H 'content-type: application/json' \
  -d '{"model":"sim-model","messages":[{"role":"user","content":"hello from the image test"}],"max_tokens":8}' \
  "http://127.0.0.1:$KV_PORT/v1/chat/completions" || die "chat request failed"
head -1 "$WORK/headers" | grep -q ' 200' || { cat "$WORK/headers" "$WORK/answer.json" >&2; die "chat answer not 200"; }
grep -qi "^x-kvroute-worker: http://127.0.0.1:$SIM_PORT" "$WORK/headers" || die "answer not routed to the image's sim"
/usr/bin/python3 - "$WORK/answer.json" <<'PY' || die "unexpected chat answer: $(head -c 400 "$WORK/answer.json")"
import json, sys
a = json.load(open(sys.argv[1]))
c = a["choices"][0]["message"]["content"]
assert a["object"] == "chat.completion" and isinstance(c, str) and c, a
assert a["usage"]["completion_tokens"] > 0, a
PY
# both run as the image's user
for p in "${PIDS[@]}"; do
  u=$(awk '/^Uid:/ {print $2}' "/proc/$p/status")
  [ "$u" = "$uid" ] || die "pid $p runs as uid $u, want $uid"
done
# and exit cleanly
kill -TERM "${PIDS[1]}"
for _ in $(seq 50); do kill -0 "${PIDS[1]}" 2>/dev/null || break; sleep 0.1; done
! kill -0 "${PIDS[1]}" 2>/dev/null || die "kvroute did not exit on SIGTERM"

say "image size: $SIZE bytes ($(( SIZE / 1024 / 1024 )) MiB), user $USER_CFG"
say "PASS in $(( $(date +%s) - T0 )) s"
