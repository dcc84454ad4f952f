#!/usr/bin/env bash
# Builds virtiofsd (the Rust vhost-user file server the qemu backend uses)
# from crates.io into a cache keyed by its version, and links it to
# /usr/local/libexec/agentvm/virtiofsd. Debian 12 does not package it.
set -euo pipefail
version=${VIRTIOFSD_VERSION:-1.14.0}
cache=${AGENTVM_CACHE:-/var/cache/agentvm}/virtiofsd-$version
dest=/usr/local/libexec/agentvm/virtiofsd

if [ ! -x "$cache/bin/virtiofsd" ]; then
  echo "install-virtiofsd: building virtiofsd $version (about a minute)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  CARGO_TARGET_DIR="$tmp/target" cargo install --locked --quiet \
    --root "$tmp/root" --version "$version" virtiofsd
  mkdir -p "$cache/bin"
  install -m 0755 "$tmp/root/bin/virtiofsd" "$cache/bin/virtiofsd"
fi
mkdir -p "$(dirname "$dest")"
ln -sf "$cache/bin/virtiofsd" "$dest"
echo "install-virtiofsd: $dest -> $cache/bin/virtiofsd"
