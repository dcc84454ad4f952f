#!/usr/bin/env bash
# Builds agentvm and the conformance suite (debug profile; PROFILE=release for
# an optimised build) and runs every case against runc and
# `agentvm --isolation=container` in the same run.
#
#   tests/oci-validation/run.sh                       # runc vs container tier
#   tests/oci-validation/run.sh --case lifecycle      # only matching cases
#   tests/oci-validation/run.sh --runtime microvm="$PWD/target/x86_64-unknown-linux-gnu/debug/agentvm --isolation=microvm"
#
# Extra arguments go to oci-validate (see --help). Needs root, runc and
# Debian's busybox-static (/bin/busybox). Exits non-zero when agentvm fails a
# check that runc passes (unless listed in known-differences.toml).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
profile="${PROFILE:-debug}"

if [ "$(id -u)" != 0 ]; then
    echo "run.sh: must run as root (runtimes create namespaces and cgroups)" >&2
    exit 1
fi
runc="${RUNC:-$(command -v runc || true)}"
if [ -z "$runc" ] && [ -x /usr/sbin/runc ]; then
    runc=/usr/sbin/runc
fi
if [ -z "$runc" ]; then
    echo "run.sh: runc not found (apt-get install runc)" >&2
    exit 1
fi
if [ ! -x /bin/busybox ]; then
    echo "run.sh: /bin/busybox not found (apt-get install busybox-static)" >&2
    exit 1
fi

cd "$repo"
build_flags=()
if [ "$profile" = release ]; then
    build_flags+=(--release)
elif [ "$profile" != debug ]; then
    echo "run.sh: PROFILE must be debug or release" >&2
    exit 1
fi
cargo build "${build_flags[@]}" -p agentvm -p oci-validation --bins

bin="${CARGO_TARGET_DIR:-$repo/target}/x86_64-unknown-linux-gnu/$profile"
exec "$bin/oci-validate" \
    --runtime runc="$runc" \
    --runtime container="$bin/agentvm --isolation=container" \
    --known "$here/known-differences.toml" \
    "$@"
