#!/usr/bin/env bash
# Boot agentvm's guest kernel under QEMU microvm (TCG) with a busybox
# initramfs and check, from inside the guest and from the host, that the
# devices and kernel features the microvm tier relies on are there.
#
# Usage: kernels/smoke-boot.sh [VMLINUX]
#   VMLINUX defaults to $AGENTVM_KERNEL, else to what kernels/build.sh prints
#   (which builds the kernel into its cache first if needed, ~6+ minutes).
#
# Needs: qemu-system-x86 (qemu-system-x86_64), busybox-static (a static
# /bin/busybox). If one is missing the script prints
# `skipped: <why>` and exits 77. It exits 0 when every check passed and 1
# otherwise, and closes with `smoke-boot: N passed, N failed`.
#
# It prints the time from starting QEMU to the guest init's first output line,
# and to QEMU's exit after the guest's `reboot -f`.
#
# Environment: AGENTVM_KERNEL (vmlinux to boot), AGENTVM_TSC_KHZ (the host TSC
# frequency in kHz; read from the kernel log or /proc/cpuinfo otherwise),
# SMOKE_TIMEOUT (seconds before QEMU is killed, default 180), SMOKE_APPEND
# (extra kernel command-line words, e.g. `quiet`), SMOKE_LOG (a file to copy
# the guest console to).
set -euo pipefail

readonly PORT_NAME=org.agentvm.smoke
readonly MARK=agentvm-smoke
script_dir=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
timeout_s=${SMOKE_TIMEOUT:-180}
passed=0
failed=0

log() { printf 'smoke-boot: %s\n' "$*"; }
skip() {
    printf 'skipped: %s\n' "$*"
    log "0 passed, 0 failed, 1 skipped"
    exit 77
}
pass() { passed=$((passed + 1)); log "ok   $*"; }
fail() { failed=$((failed + 1)); log "FAIL $*"; }

require_tools() {
    command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (Debian package qemu-system-x86)"
    [[ -x /bin/busybox ]] || skip "/bin/busybox not found (Debian package busybox-static)"
    if readelf -l /bin/busybox 2>/dev/null | grep -q INTERP; then
        skip "/bin/busybox is dynamically linked (install busybox-static, not busybox)"
    fi
}

# The host TSC frequency in kHz: under TCG the guest TSC is the host's, and the
# guest has no other clock to calibrate it against quickly.
host_tsc_khz() {
    if [[ -n ${AGENTVM_TSC_KHZ:-} ]]; then
        printf '%s\n' "$AGENTVM_TSC_KHZ"
        return
    fi
    local mhz
    mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Refined TSC clocksource calibration: \([0-9.]*\) MHz.*/\1/p' | tail -n1)
    [[ -n $mhz ]] || mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz processor.*/\1/p' | tail -n1)
    if [[ -z $mhz ]] && grep -qw constant_tsc /proc/cpuinfo; then
        mhz=$(awk -F': *' '/^cpu MHz/ { print $2; exit }' /proc/cpuinfo)
    fi
    [[ -n $mhz ]] || return 1
    awk -v m="$mhz" 'BEGIN { printf "%d\n", m * 1000 + 0.5 }'
}

# The guest's /init: every check prints "agentvm-smoke: ok NAME" or
# "agentvm-smoke: FAIL NAME: why"; the host compares against GUEST_CHECKS.
readonly GUEST_CHECKS=(virtio-port-name virtio-port-write smp filesystems cgroup2 namespaces
    unshare seccomp devpts wall-clock overlay virtio-net virtio-rng vsock-driver virtiofs-driver
    no-disk-filesystems)

write_init() {
    cat >"$1" <<EOF
#!/bin/sh
echo "$MARK: init started"
export PATH=/bin
mkdir -p /proc /sys /dev /tmp /mnt
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
check() {
    name=\$1; shift
    if out=\$("\$@" 2>&1); then echo "$MARK: ok \$name"
    else echo "$MARK: FAIL \$name: \$(echo "\$out" | head -n 3 | tr '\n' ' ')"; fi
}
port_dir() {
    for d in /sys/class/virtio-ports/*; do
        [ "\$(cat "\$d/name" 2>/dev/null)" = "$PORT_NAME" ] && { echo "\$d"; return 0; }
    done
    echo "no virtio port named $PORT_NAME: \$(cat /sys/class/virtio-ports/*/name 2>&1)"; return 1
}
port_write() {
    d=\$(port_dir) || { echo "\$d"; return 1; }
    echo "hello from the guest" > "/dev/\$(basename "\$d")"
}
smp() { n=\$(grep -c ^processor /proc/cpuinfo); [ "\$n" = 2 ] || { echo "\$n cpus"; return 1; }; }
filesystems() {
    for fs in overlay tmpfs fuse virtiofs devtmpfs cgroup2 proc sysfs devpts; do
        grep -qw "\$fs" /proc/filesystems || { echo "no \$fs"; return 1; }
    done
}
# The guest has no disk and no 9p share: the kernel is built without them.
no_disk_fs() {
    for fs in ext4 erofs 9p; do
        ! grep -qw "\$fs" /proc/filesystems || { echo "\$fs is built in"; return 1; }
    done
    [ ! -e /sys/bus/virtio/drivers/virtio_blk ] || { echo "virtio_blk is built in"; return 1; }
}
cgroup2() {
    mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup || return 1
    for c in cpuset cpu io memory pids; do
        grep -qw "\$c" /sys/fs/cgroup/cgroup.controllers || { echo "no \$c controller"; return 1; }
    done
    echo "+cpuset +cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control || return 1
    mkdir /sys/fs/cgroup/c1 || return 1
    for f in cpuset.cpus cpu.max cpu.weight io.max memory.max memory.swap.max pids.max cgroup.freeze; do
        [ -e "/sys/fs/cgroup/c1/\$f" ] || { echo "no \$f"; return 1; }
    done
    echo 5 > /sys/fs/cgroup/c1/pids.max && echo 50000 100000 > /sys/fs/cgroup/c1/cpu.max
}
namespaces() {
    for n in cgroup ipc mnt net pid time user uts; do
        [ -e "/proc/self/ns/\$n" ] || { echo "no \$n namespace"; return 1; }
    done
}
seccomp() { grep -q '^Seccomp:' /proc/self/status && grep -qw kill_process /proc/sys/kernel/seccomp/actions_avail; }
wallclock() {
    now=\$(date +%s); d=\$((now - $(date +%s)))
    [ "\$d" -gt -300 ] && [ "\$d" -lt 300 ] || { echo "guest clock \$now is \$d s off the host's"; return 1; }
}
devpts() { mkdir -p /dev/pts && mount -t devpts devpts /dev/pts && [ -c /dev/pts/ptmx ]; }
overlay() {
    mkdir -p /ovl && mount -t tmpfs tmpfs /ovl && mkdir /ovl/l /ovl/u /ovl/w /ovl/m &&
        echo lower > /ovl/l/f &&
        mount -t overlay overlay -o lowerdir=/ovl/l,upperdir=/ovl/u,workdir=/ovl/w /ovl/m &&
        echo upper > /ovl/m/f && grep -qx lower /ovl/l/f && grep -qx upper /ovl/u/f
}
vnet() { [ "\$(basename "\$(readlink /sys/class/net/eth0/device/driver)")" = virtio_net ]; }
vrng() { grep -q '^virtio_rng' /sys/class/misc/hw_random/rng_current; }
check virtio-port-name port_dir
check virtio-port-write port_write
check smp smp
check filesystems filesystems
check cgroup2 cgroup2
check namespaces namespaces
check unshare unshare -m -u -i -n -p -U -f true
check seccomp seccomp
check devpts devpts
check wall-clock wallclock
check overlay overlay
check virtio-net vnet
check virtio-rng vrng
check vsock-driver test -d /sys/bus/virtio/drivers/vmw_vsock_virtio_transport
check virtiofs-driver test -d /sys/bus/virtio/drivers/virtiofs
check no-disk-filesystems no_disk_fs
echo "$MARK: done"
reboot -f
EOF
    chmod 755 "$1"
}

make_initramfs() {
    local tmp=$1 root="$1/initramfs"
    mkdir -p "$root/bin"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
    done
    write_init "$root/init"
    (cd "$root" && find . | /bin/busybox cpio -o -H newc -R 0:0 2>/dev/null) >"$tmp/initramfs.cpio"
}

# Run QEMU, copying the serial console to $tmp/console.log and recording when
# the init's first line arrived. Sets qemu_rc, t_start, t_init, t_end.
run_qemu() {
    local tmp=$1 vmlinux=$2 khz=$3
    local append="console=ttyS0 reboot=t panic=-1 no_timer_check tsc_early_khz=$khz tsc=reliable ${SMOKE_APPEND:-}"
    # shellcheck disable=SC2054 # the commas are QEMU's option syntax
    local qemu=(qemu-system-x86_64 -M microvm,acpi=off -accel tcg -cpu max -m 256 -smp 2
        -nographic -no-reboot -kernel "$vmlinux" -initrd "$tmp/initramfs.cpio" -append "$append"
        -device virtio-serial-device -chardev "file,id=port0,path=$tmp/port.out"
        -device "virtserialport,chardev=port0,name=$PORT_NAME"
        -device virtio-rng-device
        -netdev hubport,id=net0,hubid=0 -device virtio-net-device,netdev=net0)
    printf '%s\n' "${qemu[*]}" >"$tmp/qemu.cmd"
    t_start=$EPOCHREALTIME
    set +e
    timeout --kill-after=5 "$timeout_s" "${qemu[@]}" </dev/null 2>"$tmp/qemu.err" |
        while IFS= read -r line; do
            line=${line%$'\r'}
            if [[ ! -e $tmp/t_init && $line == *"$MARK: init started"* ]]; then
                printf '%s\n' "$EPOCHREALTIME" >"$tmp/t_init"
            fi
            printf '%s\n' "$line" >>"$tmp/console.log"
        done
    qemu_rc=${PIPESTATUS[0]}
    set -e
    t_end=$EPOCHREALTIME
    t_init=$(cat "$tmp/t_init" 2>/dev/null || true)
}

elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

judge() {
    local tmp=$1 name line
    if [[ -n $t_init ]]; then
        pass "init first output $(elapsed "$t_start" "$t_init") s after QEMU start"
    else
        fail "no output from the guest init"
    fi
    for name in "${GUEST_CHECKS[@]}"; do
        line=$(grep -m1 -E "^$MARK: (ok|FAIL) $name(:|$)" "$tmp/console.log" || true)
        case $line in
            "$MARK: ok $name") pass "guest: $name" ;;
            "") fail "guest: $name: no result (guest stopped early?)" ;;
            *) fail "guest: ${line#"$MARK: FAIL "}" ;;
        esac
    done
    if grep -qx "hello from the guest" "$tmp/port.out" 2>/dev/null; then
        pass "host read the guest's line from virtserialport $PORT_NAME"
    else
        fail "host did not read the guest's line from virtserialport $PORT_NAME"
    fi
    if [[ $qemu_rc == 0 ]] && grep -q "^$MARK: done" "$tmp/console.log"; then
        pass "guest ran reboot -f and QEMU exited 0 after $(elapsed "$t_start" "$t_end") s"
    else
        fail "QEMU exit status $qemu_rc (124: killed after ${timeout_s}s), guest done marker $(grep -c "^$MARK: done" "$tmp/console.log" || true)"
    fi
}

main() {
    require_tools
    local vmlinux=${1:-${AGENTVM_KERNEL:-}}
    if [[ -z $vmlinux ]]; then
        vmlinux=$("$script_dir/build.sh")
    fi
    [[ -f $vmlinux ]] || { fail "kernel $vmlinux not found"; log "$passed passed, $failed failed"; exit 1; }
    local khz
    khz=$(host_tsc_khz) || skip "cannot tell the host TSC frequency (set AGENTVM_TSC_KHZ)"

    local tmp
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentvm-smoke.XXXXXX")
    # shellcheck disable=SC2064 # expand now: the path is fixed
    trap "rm -rf -- '$tmp'" EXIT
    make_initramfs "$tmp"
    log "booting $vmlinux (tsc_early_khz=$khz)"
    run_qemu "$tmp" "$vmlinux" "$khz"
    judge "$tmp"
    [[ -z ${SMOKE_LOG:-} ]] || cp "$tmp/console.log" "$SMOKE_LOG"
    if ((failed)); then
        log "QEMU command: $(cat "$tmp/qemu.cmd")"
        log "QEMU stderr:"
        sed 's/^/  /' "$tmp/qemu.err"
        log "guest console:"
        sed 's/^/  /' "$tmp/console.log"
    fi
    log "$passed passed, $failed failed"
    ((failed == 0))
}

main "$@"
