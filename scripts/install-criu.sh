#!/usr/bin/env bash
# Builds CRIU from Debian's own source package (trixie's criu 4.1.1) into a
# cache keyed by its checksum, and links it to /usr/local/sbin/criu, ahead
# of Debian 12's /usr/sbin/criu on PATH. Why: bookworm's CRIU 3.17 cannot
# start on newer kernels ("vdso: Unexpected rt vDSO area bounds" on 6.18),
# so neither runc nor agentvm could checkpoint or restore there. runc and
# agentvm both run the `criu` PATH finds. The build dependencies are in
# scripts/install-deps.sh. Idempotent.
set -euo pipefail
version=${CRIU_VERSION:-4.1.1}
sha256=${CRIU_SHA256:-f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe}
url=${CRIU_URL:-http://deb.debian.org/debian/pool/main/c/criu/criu_$version.orig.tar.xz}
cache=${AGENTVM_CACHE:-/var/cache/agentvm}/criu-$version-${sha256:0:16}
dest=/usr/local/sbin/criu

if [ ! -x "$cache/criu" ]; then
  echo "install-criu: building CRIU $version from Debian's source (under a minute)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  curl -fsSL --retry 3 -o "$tmp/criu.tar.xz" "$url"
  echo "$sha256  $tmp/criu.tar.xz" | sha256sum -c --quiet
  tar -C "$tmp" -xf "$tmp/criu.tar.xz"
  make -C "$tmp/criu-$version" -j"$(nproc)" criu >"$tmp/build.log" 2>&1 || {
    tail -30 "$tmp/build.log" >&2
    echo "install-criu: the build failed" >&2
    exit 1
  }
  mkdir -p "$cache"
  install -m 0755 "$tmp/criu-$version/criu/criu" "$cache/criu"
fi
mkdir -p "$(dirname "$dest")"
ln -sf "$cache/criu" "$dest"
"$dest" --version | head -1 | sed "s|^|install-criu: $dest -> $cache/criu: |"
