#!/usr/bin/env bash
# Build agentvm's x86_64 guest kernel (an ELF vmlinux with a PVH entry point)
# from Debian's linux-source-6.1 package, cached outside the repository; or,
# with --flavor testhost, the test host's kernel (the guest's options plus
# config-testhost-x86_64.fragment: KVM and KVM_AMD built in), which
# `make test-builtin` boots under QEMU TCG to get a hardware-style KVM.
#
# Needs these Debian packages (this script installs nothing):
#   linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev xz-utils
#
# Usage: kernels/build.sh [--flavor guest|testhost] [--print-key | --config-only]
#   Prints progress and the cache key on stderr and the path of the cached
#   vmlinux on stdout (nothing else). --print-key only prints the key;
#   --config-only stops after the checked .config, prints it on stdout and
#   caches nothing (for iterating on the fragment in about a minute).
#
# Cache: $AGENTVM_KERNEL_CACHE (default /var/cache/agentvm/kernels)/<key>/
#   vmlinux, config (the final .config), key-inputs (what the key hashes),
#   build.log, build-info (durations). <key> is the first 16 hex digits of the sha256 of key-inputs:
#   the flavor, the sha256 of each config fragment applied, of each patch and of this script, the version of the
#   linux-source-6.1 package, and the gcc and ld versions. A cache hit does no
#   work beyond hashing; a miss builds in a temporary directory (under $TMPDIR,
#   default /tmp) that is removed on exit, and concurrent runs for the same key
#   wait on a lock instead of building twice.
#
# Environment: AGENTVM_KERNEL_CACHE (cache root), AGENTVM_KERNEL_JOBS (make -j,
# default: the number of CPUs).
set -euo pipefail

readonly SRC_PKG=linux-source-6.1
readonly SRC_TARBALL=/usr/src/linux-source-6.1.tar.xz
readonly KARCH=x86_64
readonly REQUIRED_PKGS=(linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev xz-utils)

script_path=$(readlink -f "${BASH_SOURCE[0]}")
script_dir=$(dirname "$script_path")
flavor=guest
# The fragments of the flavor, applied in this order (set by set_flavor).
fragments=("$script_dir/config-x86_64.fragment")
# Source patches (patch -p1), applied in name order to both flavors.
shopt -s nullglob
patches=("$script_dir"/patches/*.patch)
shopt -u nullglob
cache_root=${AGENTVM_KERNEL_CACHE:-/var/cache/agentvm/kernels}
jobs=${AGENTVM_KERNEL_JOBS:-$(nproc)}
config_only=0

log() { printf 'kernels/build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Fail naming every missing package, with the command that installs them.
check_packages() {
    local missing=() pkg status
    for pkg in "${REQUIRED_PKGS[@]}"; do
        status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
        [[ $status == installed ]] || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        die "missing Debian packages: ${missing[*]} (install: apt-get install -y ${missing[*]})"
    fi
    [[ -r $SRC_TARBALL ]] || die "$SRC_TARBALL not found although $SRC_PKG is installed"
}

set_flavor() {
    case $1 in
        guest) fragments=("$script_dir/config-x86_64.fragment") ;;
        testhost) fragments=("$script_dir/config-x86_64.fragment" "$script_dir/config-testhost-x86_64.fragment") ;;
        *) die "unknown flavor: $1 (guest or testhost)" ;;
    esac
    flavor=$1
}

# The text whose hash is the cache key; also stored beside the vmlinux.
key_inputs() {
    local src_version
    src_version=$(dpkg-query -W -f='${Version}' "$SRC_PKG" 2>/dev/null) ||
        die "Debian package $SRC_PKG is not installed (install: apt-get install -y ${REQUIRED_PKGS[*]})"
    [[ -n $src_version ]] || die "Debian package $SRC_PKG has no version (not installed?)"
    printf 'arch %s\n' "$KARCH"
    # The guest's key-inputs stay as they were before flavors existed.
    [[ $flavor == guest ]] || printf 'flavor %s\n' "$flavor"
    local fragment
    for fragment in "${fragments[@]}"; do
        printf 'fragment-sha256 %s\n' "$(sha256sum <"$fragment" | cut -d' ' -f1)"
    done
    local patch
    for patch in "${patches[@]}"; do
        printf 'patch %s sha256 %s\n' "$(basename "$patch")" "$(sha256sum <"$patch" | cut -d' ' -f1)"
    done
    printf 'build-script-sha256 %s\n' "$(sha256sum <"$script_path" | cut -d' ' -f1)"
    printf '%s %s\n' "$SRC_PKG" "$src_version"
    printf 'gcc %s\n' "$(gcc -dumpfullversion 2>/dev/null || echo none)"
    printf 'ld %s\n' "$(ld --version 2>/dev/null | head -n1 || echo none)"
}

# Parse the fragment into lines "NAME<TAB>VALUE" where VALUE is y, n, a
# number, or a double-quoted string. Unknown syntax is an error.
fragment_options() {
    local fragment
    for fragment in "${fragments[@]}"; do
        fragment_file_options "$fragment"
    done
}

fragment_file_options() {
    local fragment=$1 line lineno=0
    while IFS= read -r line || [[ -n $line ]]; do
        lineno=$((lineno + 1))
        if [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set[[:space:]]*$ ]]; then
            printf '%s\tn\n' "${BASH_REMATCH[1]}"
        elif [[ $line =~ ^[[:space:]]*(#.*)?$ ]]; then
            continue
        elif [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(y|-?[0-9]+|0x[0-9a-fA-F]+|\"[^\"]*\")[[:space:]]*$ ]]; then
            printf '%s\t%s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
        else
            die "$fragment:$lineno: cannot parse: $line"
        fi
    done <"$fragment"
}

apply_fragment() {
    local name value
    local args=()
    while IFS=$'\t' read -r name value; do
        case $value in
            y) args+=(--enable "$name") ;;
            n) args+=(--disable "$name") ;;
            \"*) value=${value#\"}; args+=(--set-str "$name" "${value%\"}") ;;
            *) args+=(--set-val "$name" "$value") ;;
        esac
    done < <(fragment_options)
    ./scripts/config --file .config "${args[@]}"
}

# Every option of the fragment must have its requested value in .config.
verify_config() {
    local name value actual failed=()
    while IFS=$'\t' read -r name value; do
        actual=$(grep -E "^(# )?${name}[= ]" .config | head -n1 || true)
        case $value in
            n) [[ -z $actual || $actual == "# $name is not set" ]] || failed+=("$name (wanted n, got: $actual)") ;;
            *) [[ $actual == "$name=$value" ]] || failed+=("$name (wanted $value, got: ${actual:-absent})") ;;
        esac
    done < <(fragment_options)
    if ((${#failed[@]})); then
        log "options that did not end up as requested after olddefconfig:"
        printf '  %s\n' "${failed[@]}" >&2
        die "${#failed[@]} option(s) of ${fragments[*]} not honoured (unmet dependency or wrong name)"
    fi
}

# Run a make step with its output in the log; show the log's end on failure.
run_logged() {
    local logfile=$1
    shift
    if ! "$@" >>"$logfile" 2>&1; then
        tail -n 60 "$logfile" >&2
        die "command failed: $* (above: the last 60 lines of its output)"
    fi
}

build_into() {
    local dest=$1 work=$2 srcdir logfile start compile_start
    logfile="$work/build.log"
    start=$(date +%s)
    log "extracting $SRC_TARBALL into $work"
    tar -xf "$SRC_TARBALL" -C "$work"
    srcdir="$work/${SRC_PKG}"
    [[ -d $srcdir ]] || die "$SRC_TARBALL did not contain ${SRC_PKG}/"
    cd "$srcdir"
    local patch
    for patch in "${patches[@]}"; do
        log "applying $(basename "$patch")"
        run_logged "$logfile" patch -p1 --forward --no-backup-if-mismatch -i "$patch"
    done
    log "configuring ($flavor): make tinyconfig + ${fragments[*]} + olddefconfig (x2)"
    run_logged "$logfile" make ARCH="$KARCH" tinyconfig
    apply_fragment
    run_logged "$logfile" make ARCH="$KARCH" olddefconfig
    run_logged "$logfile" make ARCH="$KARCH" olddefconfig
    verify_config
    if [[ $config_only == 1 ]]; then
        cp .config "$dest/config"
        return
    fi
    log "building vmlinux with make -j$jobs"
    compile_start=$(date +%s)
    run_logged "$logfile" make ARCH="$KARCH" -j"$jobs" vmlinux
    # QEMU and linux-loader boot the ELF through its PVH note
    # (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12, owner "Xen").
    readelf -n vmlinux | awk '$1 == "Xen" && /0x0*12\)|PHYS32_ENTRY/ { found = 1 } END { exit !found }' ||
        die "built vmlinux has no PVH entry note (Xen note 0x12)"
    cp vmlinux "$dest/vmlinux"
    cp .config "$dest/config"
    cp "$logfile" "$dest/build.log"
    printf 'total-seconds %s\nmake-vmlinux-seconds %s\njobs %s\nfinished %s\n' \
        "$(($(date +%s) - start))" "$(($(date +%s) - compile_start))" "$jobs" "$(date -u +%FT%TZ)" \
        >"$dest/build-info"
    log "built in $(($(date +%s) - start)) s (make vmlinux: $(($(date +%s) - compile_start)) s)"
}

main() {
    if [[ ${1:-} == --flavor ]]; then
        [[ $# -ge 2 ]] || die "--flavor needs a value (guest or testhost)"
        set_flavor "$2"
        shift 2
    fi
    local fragment
    for fragment in "${fragments[@]}"; do
        [[ -r $fragment ]] || die "config fragment $fragment not found"
    done
    local patch
    for patch in "${patches[@]}"; do
        [[ -r $patch ]] || die "kernel patch $patch not found"
    done
    local inputs key final
    inputs=$(key_inputs)
    key=$(printf '%s\n' "$inputs" | sha256sum | cut -c1-16)
    case ${1:-} in
        --print-key)
            printf '%s\n' "$key"
            return
            ;;
        --config-only)
            config_only=1
            ;;
        "") ;;
        *) die "unknown argument: $1 (usage: build.sh [--flavor guest|testhost] [--print-key | --config-only])" ;;
    esac
    [[ $# -le 1 ]] || die "too many arguments (usage: build.sh [--flavor guest|testhost] [--print-key | --config-only])"
    if [[ $config_only == 1 ]]; then
        check_packages
        local work
        work=$(mktemp -d "${TMPDIR:-/tmp}/agentvm-kernel.XXXXXX")
        # shellcheck disable=SC2064 # expand now: the path is fixed
        trap "rm -rf -- '$work'" EXIT
        (build_into "$work" "$work")
        cat "$work/config"
        return
    fi
    final="$cache_root/$key"
    log "cache key $key ($final)"
    if [[ -f $final/vmlinux && $(cat "$final/key-inputs" 2>/dev/null) == "$inputs" ]]; then
        log "cache hit"
        printf '%s\n' "$final/vmlinux"
        return
    fi

    check_packages
    mkdir -p "$cache_root"
    exec 9>"$cache_root/.lock-$key"
    flock 9
    # Another run may have finished the build while this one waited.
    if [[ -f $final/vmlinux && $(cat "$final/key-inputs" 2>/dev/null) == "$inputs" ]]; then
        log "cache hit (built by a concurrent run)"
        printf '%s\n' "$final/vmlinux"
        return
    fi

    local work staging
    work=$(mktemp -d "${TMPDIR:-/tmp}/agentvm-kernel.XXXXXX")
    staging="$cache_root/.staging-$key-$$"
    # shellcheck disable=SC2064 # expand now: the paths are fixed
    trap "rm -rf -- '$work' '$staging'" EXIT
    mkdir -p "$staging"
    printf '%s\n' "$inputs" >"$staging/key-inputs"
    (build_into "$staging" "$work")
    rm -rf -- "$final"
    mv -T -- "$staging" "$final"
    log "cached $final/vmlinux"
    printf '%s\n' "$final/vmlinux"
}

main "$@"
