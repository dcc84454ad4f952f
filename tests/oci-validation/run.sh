#!/usr/bin/env bash
# Builds agentvm and the conformance suite (debug profile; PROFILE=release for
# an optimised build) and runs every case against runc,
# `agentvm --isolation=container` and, when this host can boot a microVM,
# `agentvm --isolation=microvm` in the same run.
#
#   tests/oci-validation/run.sh                       # runc, container, microvm
#   tests/oci-validation/run.sh --case lifecycle      # only matching cases
#   OCI_VALIDATE_MICROVM=0 tests/oci-validation/run.sh   # without the microvm column
#
# The microvm column uses the guest kernel that kernels/build.sh caches
# (/var/cache/agentvm/kernels/<key>/vmlinux), virtiofsd from
# scripts/install-virtiofsd.sh and qemu-system-x86_64, through a config file
# written to a temporary directory; when one of them is missing the run says
# `microvm column: skipped: <why>` and goes on without it. A `--runtime
# microvm=...` on the command line replaces the automatic column.
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
runtimes=(--runtime runc="$runc" --runtime container="$bin/agentvm --isolation=container")

# The microvm column: added when the tier can run here, else skipped aloud.
microvm_skip=""
for arg in "$@"; do
    case "$arg" in
    microvm=* | --runtime=microvm=*) microvm_skip="a microvm runtime was given on the command line" ;;
    esac
done
cfg_dir=""
cleanup() { if [ -n "$cfg_dir" ]; then rm -rf "$cfg_dir"; fi; }
trap cleanup EXIT
if [ -z "$microvm_skip" ] && [ "${OCI_VALIDATE_MICROVM:-1}" = 0 ]; then
    microvm_skip="OCI_VALIDATE_MICROVM=0"
fi
if [ -z "$microvm_skip" ]; then
    virtiofsd=/usr/local/libexec/agentvm/virtiofsd
    kernel_cache="${AGENTVM_KERNEL_CACHE:-/var/cache/agentvm/kernels}"
    if ! key="$(kernels/build.sh --print-key 2>/dev/null)" || [ -z "$key" ]; then
        microvm_skip="kernels/build.sh --print-key failed (are the kernel build packages installed?)"
    elif [ ! -f "$kernel_cache/$key/vmlinux" ]; then
        microvm_skip="no guest kernel at $kernel_cache/$key/vmlinux (build it with \`make kernel\`)"
    elif [ ! -x "$virtiofsd" ]; then
        microvm_skip="no $virtiofsd (install it with \`make virtiofsd\`)"
    else
        cfg_dir="$(mktemp -d "${TMPDIR:-/tmp}/oci-validate-microvm.XXXXXX")"
        cfg="$cfg_dir/config.toml"
        # A ceiling lets `update` raise a memory limit past what the VM
        # booted for (the balloon gives the guest the RAM), as an operator
        # who wants `docker update --memory` to work would configure it.
        printf '[microvm]\nkernel = "%s"\nvirtiofsd = "%s"\nmemory_ceiling_mib = 1024\n' \
            "$kernel_cache/$key/vmlinux" "$virtiofsd" >"$cfg"
        # `agentvm check` finds QEMU and the rest exactly as `create` will.
        if why="$("$bin/agentvm" --config "$cfg" check 2>&1)"; then
            runtimes+=(--runtime microvm="$bin/agentvm --isolation=microvm --config $cfg")
            echo "microvm column: $kernel_cache/$key/vmlinux, $virtiofsd" >&2
        else
            microvm_skip="$(printf '%s\n' "$why" | sed -n 's/^microvm tier: not available: //p' | head -n 1)"
            microvm_skip="${microvm_skip:-agentvm check failed: $why}"
        fi
    fi
fi
if [ -n "$microvm_skip" ]; then
    echo "microvm column: skipped: $microvm_skip" >&2
fi

rc=0
"$bin/oci-validate" "${runtimes[@]}" --known "$here/known-differences.toml" "$@" || rc=$?
if [ -n "$microvm_skip" ]; then
    # Repeated after the table (on stderr: the tally stays stdout's last line).
    echo "microvm column: skipped: $microvm_skip" >&2
fi
exit "$rc"
