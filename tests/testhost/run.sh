#!/usr/bin/env bash
# `make test-builtin`: runs the builtin VMM's tests that need a standard
# hardware KVM inside the test host, a QEMU TCG VM whose vCPU emulates AMD
# SVM (`-cpu max`) and whose kernel (kernels/build.sh --flavor testhost) has
# KVM and KVM_AMD built in. Our machines' own /dev/kvm is kvm_pvm, which
# cannot boot a Linux guest; the test host's can (docs/testing.md).
#
# Usage: tests/testhost/run.sh TEST_BINARY AGENTVM MICROVM_TESTS NETWORK_TESTS
#        tests/testhost/run.sh --bench BENCH AGENTVM   (part (f) of make bench:
#        see bench_main)
#   TEST_BINARY is agentvm's static unit-test executable
#   (`cargo test --release -p agentvm --lib --no-run`), AGENTVM the static
#   agentvm binary of the same build, MICROVM_TESTS and NETWORK_TESTS the
#   microvm tier's integration tests (tests/microvm.rs and
#   tests/sandbox_network.rs, `--test NAME --no-run`); the Makefile finds
#   them.
#
# The test host boots from an initramfs holding busybox, the three
# binaries, the guest kernel, the script that makes the tests' busybox
# rootfs (at the path the tests look for it), its own /init and /plan: the
# items to run, one test (or one check) each. /init runs each item and
# reports over the serial console, one line per event:
#   agentvm-testhost: begin ITEM
#   agentvm-testhost: pass ITEM SECONDS | agentvm-testhost: fail ITEM SECONDS rc=N
#   agentvm-testhost: done passed=N failed=N
# then `reboot -f` ends QEMU (-no-reboot). A test that prints `skipped:`
# inside the test host fails its item: there, nothing may be skipped.
# This script checks every item's line, the done line and QEMU's exit
# status, prints the test host's boot time, and closes with
# `test-builtin: N passed, N failed` (items, and each boot's own checks).
# Exit 0 when all passed, 1 otherwise, 77 (after `skipped: <why>`) when the
# test host cannot run here.
#
# The test host is an emulated machine whose SVM emulation fails now and
# then (docs/testing.md, "The test host"): when a boot fails, the test host
# boots again with only the items that did not pass, up to
# TESTHOST_ATTEMPTS boots, each failure printed with its console. An item
# that reports a failure three times is not tried again: a fault of ours
# fails every boot, while the emulation's faults come in spells that can
# hit the same test in two boots in a row (docs/testing.md).
#
# Environment: TESTHOST_KERNEL (the test host's vmlinux; default: what
# `kernels/build.sh --flavor testhost` prints, building it if needed),
# AGENTVM_KERNEL (the guest kernel; default: what `kernels/build.sh`
# prints), AGENTVM_TSC_KHZ (host TSC in kHz), TESTHOST_TIMEOUT (seconds
# before QEMU is killed, default 1500), TESTHOST_SILENCE (seconds of a
# silent console before QEMU is stopped, default 420), TESTHOST_LOG (a
# file to copy the console to; each boot's goes to TESTHOST_LOG.N),
# TESTHOST_ATTEMPTS (boots of the test host before a failure stands,
# default 4), TESTHOST_APPEND (more test-host kernel parameters),
# TESTHOST_ONLY (an extended regular expression: only the items whose
# names match run, for a developer's repeated runs; `make test-builtin`
# leaves it unset).
set -euo pipefail

readonly MARK=agentvm-testhost
# Failures after which an item is not tried again (see the top).
readonly MAX_FAILURES=3
# The builtin VMM's tests in agentvm's unit-test binary that need a
# hardware-style KVM (module paths; each test in them is an item).
readonly KVM_MODULE=microvm::vmm::builtin::kvm_tests
readonly LINUX_MODULE=microvm::vmm::builtin::linux_tests
# The microvm tier's own tests (tests/microvm.rs) that run with
# vmm = "builtin": a container's whole life in a microVM of the builtin
# VMM. The others drive QEMU's processes (its jail, its pid killed, its
# balloon) and say so when run under the builtin VMM.
readonly MICROVM_TESTS=(
    run_boots_its_own_kernel_and_returns_the_exit_code
    lifecycle_with_exec_inside_the_guest
    a_terminal_in_the_guest
    missing_kernel_is_a_clear_error_and_leaves_nothing
    supervisor_killed_ends_as_stopped_and_delete_cleans_up
    guest_kernel_panic_ends_the_container
    guest_cannot_reach_host_files_through_the_share
    a_pod_member_runs_in_its_sandbox_s_vm
    a_pod_member_with_a_terminal
    pause_freezes_the_workload_and_resume_lets_it_go_on
    the_builtin_vmm_s_threads_are_jailed
)
# The microvm tier's network tests (tests/sandbox_network.rs) that run
# without an egress policy (its nftables are not in the test host).
readonly NETWORK_TESTS=(
    the_guest_owns_the_address_and_gives_it_back
    the_peer_reaches_a_server_in_the_guest
)
repo=$(dirname "$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")")
timeout_s=${TESTHOST_TIMEOUT:-1500}
# Seconds an item may run inside the test host before it is killed (each
# takes seconds, a Linux guest's up to a minute; a hung one must not hold
# the whole run).
readonly ITEM_TIMEOUT=300
# Seconds the test host may print nothing before its boot is stopped: an
# item prints as it goes or is killed (and reported) after ITEM_TIMEOUT,
# so a console silent for longer is a test host that died or hung (an
# oops in a vCPU thread has hung one until the boot's own timeout).
readonly SILENCE_TIMEOUT=${TESTHOST_SILENCE:-$((ITEM_TIMEOUT + 120))}
passed=0
failed=0

log() { printf 'test-builtin: %s\n' "$*"; }
skip() {
    printf 'skipped: %s\n' "$*"
    log "0 passed, 0 failed, 1 skipped"
    exit 77
}
pass() { passed=$((passed + 1)); log "ok   $*"; }
fail() { failed=$((failed + 1)); log "FAIL $*"; }
finish() {
    log "$passed passed, $failed failed"
    [[ $failed == 0 && $passed -gt 0 ]]
}

require_tools() {
    command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (Debian package qemu-system-x86)"
    command -v cpio >/dev/null || skip "cpio not found (Debian package cpio)"
    [[ -x /bin/busybox ]] || skip "/bin/busybox not found (Debian package busybox-static)"
    if readelf -l /bin/busybox 2>/dev/null | grep -q INTERP; then
        skip "/bin/busybox is dynamically linked (install busybox-static, not busybox)"
    fi
    [[ -x /usr/sbin/ip ]] || skip "/usr/sbin/ip not found (Debian package iproute2)"
}

# copy_program PROGRAM ROOT DEST: copies PROGRAM to ROOT/DEST and the
# shared libraries it loads (as ldd finds them) to their own paths under
# ROOT: the network tests need iproute2's `ip` (netns, veth), which
# busybox's lacks.
copy_program() {
    local program=$1 root=$2 dest=$3 lib
    install -D -m 0755 "$program" "$root/$dest"
    for lib in $(ldd "$program" | grep -o '/[^ ]*'); do
        install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

# The host TSC frequency in kHz (as kernels/smoke-boot.sh finds it): under
# TCG the test host's TSC is the host's and it cannot calibrate it quickly.
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

# The start of every /init of the test host: file systems, cgroups,
# loopback, and the 'booted' line. With `switch`, /init first moves the
# whole root to a tmpfs and starts again there: the initramfs's own root
# cannot be pivoted away from (pivot_root fails with EINVAL on it), and
# QEMU's jail pivots.
init_head() {
    cat <<EOF
#!/bin/busybox sh
EOF
    if [[ ${1:-} == switch ]]; then
        cat <<EOF
if [ ! -e /.switched ]; then
    /bin/busybox mkdir -p /newroot
    /bin/busybox mount -t tmpfs -o mode=0755 tmpfs /newroot
    for d in /*; do
        [ "\$d" = /newroot ] || /bin/busybox cp -a "\$d" /newroot/
    done
    /bin/busybox touch /newroot/.switched
    exec /bin/busybox switch_root /newroot /init
fi
EOF
    fi
    cat <<EOF
/bin/busybox --install -s /bin
export PATH=/usr/local/sbin:/bin
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
# Kernel messages (KVM's notes on unhandled MSRs, links coming up) go to
# the log only: on the console they would split the tests' result lines.
dmesg -n 1
mkdir -p /run /var/lib /sys/fs/cgroup /dev/pts
mount -t tmpfs -o mode=0755 tmpfs /run
ln -s /run /var/run
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
ln -sf pts/ptmx /dev/ptmx
mkdir -p "$repo/tests/images"
cp /busybox-rootfs.sh "$repo/tests/images/"
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# The root cgroup hands every controller down, as systemd's does.
for c in \$(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+\$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
done
ip link set lo up
echo "$MARK: booted \$(cut -d' ' -f1 /proc/uptime)"
EOF
}

# The test host's /init: runs /plan, which the host writes for each boot
# (write_plan) as calls of `check` and `one`.
write_init() {
    {
        init_head
        cat <<EOF
passed=0
failed=0
# item NAME COMMAND...: runs COMMAND with its output on the console as it
# comes (if the test host dies mid-item, the log shows how far it got);
# the item fails on a non-zero status or a test's 'skipped:' (at a line's
# start or after the harness's 'test NAME ... ') in its output and, when
# \$want_one is set, unless the harness ran and passed exactly one test (a
# name that matches nothing runs nothing, successfully).
item() {
    name=\$1; shift
    echo "$MARK: begin \$name"
    t0=\$(cut -d' ' -f1 /proc/uptime)
    # A program (not a shell function) is killed after $ITEM_TIMEOUT s.
    killer=""
    [ -x "\$1" ] && killer="timeout -s KILL $ITEM_TIMEOUT"
    { \$killer "\$@"; echo \$? >/tmp/item.rc; } 2>&1 | tee /tmp/item.out
    rc=\$(cat /tmp/item.rc)
    if [ \$rc = 0 ] && grep -qE '(^|\.\.\. )skipped:' /tmp/item.out; then rc=skipped; fi
    if [ \$rc = 0 ] && [ -n "\$want_one" ] && ! grep -q '^test result: ok\. 1 passed;' /tmp/item.out; then
        rc=not-one-test
    fi
    t=\$(awk -v a="\$t0" -v b="\$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.2f", b - a }')
    if [ "\$rc" = 0 ]; then
        passed=\$((passed + 1)); echo "$MARK: pass \$name \$t"
    else
        failed=\$((failed + 1)); echo "$MARK: fail \$name \$t rc=\$rc"
    fi
}
# check NAME COMMAND...: an item that is not a test.
check() { want_one=""; item "\$@"; }
# one TEST BINARY ARGS...: the one test TEST of a test binary.
one() { want_one=1; name=\$1; bin=\$2; shift 2; item "\$name" "\$bin" "\$@" --exact "\$name"; }
kvm_amd() {
    [ -c /dev/kvm ] || { echo "no /dev/kvm"; return 1; }
    [ -d /sys/module/kvm_amd ] || { echo "kvm_amd is not loaded"; return 1; }
    npt=\$(cat /sys/module/kvm_amd/parameters/npt)
    echo "kvm_amd npt=\$npt nested=\$(cat /sys/module/kvm_amd/parameters/nested) vgif=\$(cat /sys/module/kvm_amd/parameters/vgif)"
    grep -qw svm /proc/cpuinfo || { echo "no svm flag"; return 1; }
    [ "\$npt" = Y ] || [ "\$npt" = 1 ]
}
export AGENTVM_KERNEL=/guest/vmlinux
# The microvm tier's tests put each container in a microVM of the builtin
# VMM (/init stays pid 1 in the root cgroup; the containers get theirs).
export AGENTVM_TEST_VMM=builtin AGENTVM_TEST_BINARY=/bin/agentvm
. /plan
echo "$MARK: done passed=\$passed failed=\$failed"
reboot -f
EOF
    } >"$1"
    chmod 0755 "$1"
}

# The items of a run, in order: parallel arrays of a name and the /plan line
# that runs it. Kinds: the KVM check, the builtin VMM's real-KVM and Linux
# tests (agentvm's unit-test binary, listed by module; --nocapture: a Linux
# test copies the nested guest's console as it grows), the microvm tier's
# tests (--show-output: each test's "test NAME ... ok" line stays whole and
# what it printed, a 'skipped:' among it, still reaches the console).
item_names=()
item_lines=()
add_item() {
    [[ -z ${TESTHOST_ONLY:-} || $1 =~ $TESTHOST_ONLY ]] || return 0
    item_names+=("$1")
    item_lines+=("$2")
}
list_items() {
    local tests=$1 module t found
    add_item kvm-amd-nested-paging "check kvm-amd-nested-paging kvm_amd"
    for module in "$KVM_MODULE" "$LINUX_MODULE"; do
        found=0
        while IFS= read -r t; do
            [[ -n $t ]] || continue
            add_item "$t" "one $t /bin/agentvm-tests --test-threads=1 --nocapture"
            found=1
        done < <("$tests" --list --format terse "$module" 2>/dev/null | sed -n "s/^\\($module::[A-Za-z0-9_:]*\\): test\$/\\1/p")
        [[ $found == 1 ]] || { fail "no test in $module in $tests"; finish; }
    done
    for t in "${MICROVM_TESTS[@]}"; do
        add_item "$t" "one $t /bin/microvm-tests --test-threads=1 --show-output"
    done
    for t in "${NETWORK_TESTS[@]}"; do
        add_item "$t" "one $t /bin/network-tests --test-threads=1 --show-output"
    done
}

# The /init of `--bench`: part (f) of `make bench` (benches/compare/
# testhost.rs) runs inside, with QEMU and virtiofsd beside the builtin VMM.
write_bench_init() {
    {
        init_head switch
        cat <<EOF
export AGENTVM_KERNEL=/guest/vmlinux AGENTVM_TEST_BINARY=/bin/agentvm
export PATH=/usr/local/sbin:/usr/bin:/bin
export AGENTVM_BENCH_TESTHOST_ROUNDS=${AGENTVM_BENCH_TESTHOST_ROUNDS:-5}
/bin/agentvm-bench testhost-inside
echo "$MARK: done bench rc=\$?"
reboot -f
EOF
    } >"$1"
    chmod 0755 "$1"
}

# What the boots found: for each item name, its time in the test host once
# it passed (passed_in), the failures before (history) and how many of them
# the item reported itself (failures: not counting a test host that died
# before the item's end); for the last boot, whether it reached /init and
# ended cleanly (boot_clean).
declare -A passed_in=() history=() failures=()
boot_clean=0

# boot_testhost TMP ATTEMPT QEMU...: boots the test host once with the
# plan of the items in `pending`, streams its console and checks each
# item's line and the boot's own start and end.
boot_testhost() {
    local tmp=$1 attempt=$2
    shift 2
    local t_start t_boot="" t_end line qemu_rc
    rm -f "$tmp/t_boot" "$tmp/console.log" "$tmp/qemu.err" "$tmp/qemu.pid" "$tmp/silent"
    t_start=$EPOCHREALTIME
    set +e
    # The shell records its pid and becomes timeout(1), which passes a
    # TERM on to QEMU: how a silent test host is stopped.
    sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$tmp/qemu.pid" \
        timeout --kill-after=5 "$timeout_s" "$@" </dev/null 2>"$tmp/qemu.err" |
        while :; do
            if IFS= read -r -t "$SILENCE_TIMEOUT" line; then
                line=${line%$'\r'}
                if [[ ! -e $tmp/t_boot && $line == "$MARK: booted "* ]]; then
                    printf '%s\n' "$EPOCHREALTIME" >"$tmp/t_boot"
                fi
                printf '%s\n' "$line" >>"$tmp/console.log"
                printf '  | %s\n' "$line"
            elif (($? > 128)); then
                # Silent: stopped with TERM, then KILL if it is silent
                # again; the loop reads what is left until the pipe ends.
                if [[ -e $tmp/silent ]]; then
                    # timeout(1) leads a process group of its own.
                    kill -KILL -- "-$(cat "$tmp/qemu.pid")" 2>/dev/null
                else
                    touch "$tmp/silent"
                    kill -TERM "$(cat "$tmp/qemu.pid")" 2>/dev/null
                fi
            else
                break
            fi
        done
    qemu_rc=${PIPESTATUS[0]}
    set -e
    [[ ! -e $tmp/silent ]] ||
        log "boot $attempt: FAIL the test host printed nothing for ${SILENCE_TIMEOUT} s: QEMU stopped"
    t_end=$EPOCHREALTIME
    t_boot=$(cat "$tmp/t_boot" 2>/dev/null || true)
    [[ -z ${TESTHOST_LOG:-} ]] || cp "$tmp/console.log" "$TESTHOST_LOG.$attempt"
    [[ ! -s $tmp/qemu.err ]] || { log "QEMU's stderr:"; sed 's/^/  ! /' "$tmp/qemu.err"; }

    boot_clean=1
    if [[ -n $t_boot ]]; then
        log "boot $attempt: the test host reached its /init $(awk -v a="$t_start" -v b="$t_boot" 'BEGIN { printf "%.2f", b - a }') s after QEMU start"
    else
        boot_clean=0
        log "boot $attempt: FAIL the test host's /init never reported (see the console above)"
    fi
    local i name result
    for i in "${pending[@]}"; do
        name=${item_names[i]}
        result=$(grep -m1 -E "^$MARK: (pass|fail) $name " "$tmp/console.log" || true)
        case $result in
            "$MARK: pass $name "*) passed_in[$name]=${result##* } ;;
            "") history[$name]+="boot $attempt: no result (the test host stopped early?); " ;;
            *)
                result=${result#"$MARK: fail $name "}
                history[$name]+="boot $attempt: ${result#* } after ${result%% *} s; "
                failures[$name]=$((${failures[$name]:-0} + 1))
                ;;
        esac
    done
    if [[ $qemu_rc == 0 ]] && grep -q "^$MARK: done " "$tmp/console.log"; then
        log "boot $attempt: the test host ran reboot -f; QEMU exited 0 after $(awk -v a="$t_start" -v b="$t_end" 'BEGIN { printf "%.2f", b - a }') s"
    else
        boot_clean=0
        log "boot $attempt: FAIL QEMU exit status $qemu_rc (124: killed after ${timeout_s}s); done line: $(grep -c "^$MARK: done " "$tmp/console.log" || true)"
    fi
}

# write_plan FILE: the /plan of the items in `pending`.
write_plan() {
    local i
    {
        printf '# the items of this boot\n'
        for i in "${pending[@]}"; do printf '%s\n' "${item_lines[i]}"; done
    } >"$1"
}

# static_binaries BIN...: each must exist and be static (the test host has
# no libraries beside the few copy_program brings).
static_binaries() {
    local bin
    for bin in "$@"; do
        [[ -x $bin ]] || { fail "binary $bin not found"; finish; }
        if readelf -l "$bin" 2>/dev/null | grep -q INTERP; then
            fail "binary $bin is dynamically linked (the test host has no libraries)"
            finish
        fi
    done
}

# The kernels, the TSC, the work directory with the root both modes share
# (busybox, agentvm, ip, the rootfs script, the guest kernel), and the
# QEMU command that boots the test host once /init and the initramfs are
# there. Sets host_kernel, guest_kernel, tmp, qemu.
prepare() {
    local agentvm=$1 khz
    khz=$(host_tsc_khz) || skip "cannot tell the host TSC frequency (set AGENTVM_TSC_KHZ)"
    host_kernel=${TESTHOST_KERNEL:-}
    guest_kernel=${AGENTVM_KERNEL:-}
    [[ -n $host_kernel ]] || host_kernel=$("$repo/kernels/build.sh" --flavor testhost)
    [[ -n $guest_kernel ]] || guest_kernel=$("$repo/kernels/build.sh")
    [[ -f $host_kernel ]] || { fail "test host kernel $host_kernel not found"; finish; }
    [[ -f $guest_kernel ]] || { fail "guest kernel $guest_kernel not found"; finish; }

    tmp=$(mktemp -d "${TMPDIR:-/tmp}/agentvm-testhost.XXXXXX")
    # shellcheck disable=SC2064 # expand now: the path is fixed
    trap "rm -rf -- '$tmp'" EXIT
    mkdir -p "$tmp/root/bin" "$tmp/root/guest" "$tmp/root/dev"
    cp /bin/busybox "$tmp/root/bin/busybox"
    cp "$agentvm" "$tmp/root/bin/agentvm"
    copy_program /usr/sbin/ip "$tmp/root" /usr/local/sbin/ip
    # The tests make their rootfs with this script, found by its path in
    # the source tree: /init puts it there once /tmp and /run are mounted
    # (a checkout under /tmp would be hidden by the test host's tmpfs).
    cp "$repo/tests/images/busybox-rootfs.sh" "$tmp/root/busybox-rootfs.sh"
    cp "$guest_kernel" "$tmp/root/guest/vmlinux"

    # kvm_amd.vgif=0: TCG's emulation of SVM's virtual GIF loses or
    # misplaces events under load; with it, 1 boot in 4 of the nested Linux
    # guest ended in a triple fault, an RCU stall, or an oops or reset of the
    # test host itself (docs/testing.md, "The test host").
    # oops=panic: an oops of the test host's own kernel (that emulation
    # again) panics it, and panic=-1 with -no-reboot ends QEMU at once, so
    # the items left go to the next boot; without it the oopsed test host
    # hung ("Fixing recursive fault but reboot is needed!") until the
    # boot's timeout, 25 minutes of a CI run.
    local append="console=ttyS0 reboot=t panic=-1 oops=panic no_timer_check tsc_early_khz=$khz tsc=reliable kvm_amd.vgif=0 ${TESTHOST_APPEND:-}"
    # shellcheck disable=SC2054 # the commas are QEMU's option syntax
    qemu=(qemu-system-x86_64 -M microvm,acpi=off -accel tcg -cpu max -m 2048 -smp 2
        -nographic -no-reboot -kernel "$host_kernel" -initrd "$tmp/initramfs.cpio" -append "$append")
}

pack_initramfs() {
    (cd "$tmp/root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$tmp/initramfs.cpio"
}

# --bench BENCH AGENTVM: boots the test host once to run part (f) of
# `make bench` (the benchmark binary as `testhost-inside`), with QEMU, its
# firmware and virtiofsd beside the builtin VMM, so both VMMs run on the
# test host's KVM. The console goes to stdout, the results line with it;
# exit 0 when the run inside reported rc=0.
bench_main() {
    [[ $# == 2 ]] || { echo "usage: tests/testhost/run.sh --bench BENCH AGENTVM" >&2; exit 2; }
    local bench=$1 agentvm=$2 host_kernel guest_kernel tmp qemu
    require_tools
    static_binaries "$bench" "$agentvm"
    [[ -x /usr/local/libexec/agentvm/virtiofsd ]] || skip "virtiofsd not installed (make virtiofsd)"
    prepare "$agentvm"
    cp "$bench" "$tmp/root/bin/agentvm-bench"
    copy_program "$(command -v qemu-system-x86_64)" "$tmp/root" /usr/bin/qemu-system-x86_64
    copy_program /usr/local/libexec/agentvm/virtiofsd "$tmp/root" /usr/local/libexec/agentvm/virtiofsd
    # QEMU's jail lists QEMU's libraries with ldd, a bash script.
    copy_program /bin/bash "$tmp/root" /bin/bash
    install -D -m 0755 /usr/bin/ldd "$tmp/root/usr/bin/ldd"
    mkdir -p "$tmp/root/usr/share"
    cp -rL /usr/share/qemu "$tmp/root/usr/share/qemu"
    [[ ! -d /usr/share/seabios ]] || cp -rL /usr/share/seabios "$tmp/root/usr/share/seabios"
    write_bench_init "$tmp/root/init"
    pack_initramfs
    log "bench: test host kernel $host_kernel, guest kernel $guest_kernel" >&2
    # The console goes to stderr as it comes (a hang shows how far the run
    # got), the results line to stdout too.
    local rc line
    set +e
    timeout --kill-after=5 "$timeout_s" "${qemu[@]}" </dev/null 2>"$tmp/qemu.err" |
        while IFS= read -r line; do
            line=${line%$'\r'}
            printf '%s\n' "$line" >>"$tmp/console.log"
            printf '  | %s\n' "$line" >&2
            [[ $line != agentvm-bench-testhost:* ]] || printf '%s\n' "$line"
        done
    rc=${PIPESTATUS[0]}
    set -e
    [[ ! -s $tmp/qemu.err ]] || { log "QEMU's stderr:" >&2; sed 's/^/  ! /' "$tmp/qemu.err" >&2; }
    if grep -q "^$MARK: done bench rc=0" "$tmp/console.log"; then
        log "bench: done" >&2
        return 0
    fi
    log "bench: the run inside the test host failed (QEMU status $rc; 124: killed after ${timeout_s}s)"
    return 1
}

main() {
    if [[ ${1:-} == --bench ]]; then
        shift
        bench_main "$@"
        return
    fi
    [[ $# == 4 ]] || { echo "usage: tests/testhost/run.sh TEST_BINARY AGENTVM MICROVM_TESTS NETWORK_TESTS" >&2; exit 2; }
    local tests=$1 agentvm=$2 microvm_tests=$3 network_tests=$4 host_kernel guest_kernel tmp qemu
    require_tools
    static_binaries "$tests" "$agentvm" "$microvm_tests" "$network_tests"
    prepare "$agentvm"
    cp "$tests" "$tmp/root/bin/agentvm-tests"
    cp "$microvm_tests" "$tmp/root/bin/microvm-tests"
    cp "$network_tests" "$tmp/root/bin/network-tests"
    write_init "$tmp/root/init"
    list_items "$tests"
    [[ ${#item_names[@]} != 0 ]] || { fail "no item matches TESTHOST_ONLY=${TESTHOST_ONLY:-}"; finish; }
    log "test host kernel $host_kernel, guest kernel $guest_kernel, tests $tests, items: ${#item_names[@]}"
    local attempt attempts=${TESTHOST_ATTEMPTS:-4} i
    pending=("${!item_names[@]}")
    for ((attempt = 1; attempt <= attempts; attempt++)); do
        write_plan "$tmp/root/plan"
        pack_initramfs
        log "boot $attempt of at most $attempts, items to run: ${#pending[@]}"
        boot_testhost "$tmp" "$attempt" "${qemu[@]}"
        local left=()
        for i in "${pending[@]}"; do
            name=${item_names[i]}
            # An item that failed three times on its own has had its
            # chance: a fault of ours fails every boot; the emulation's
            # spells have hit one test in two boots in a row, never yet
            # in three.
            [[ -n ${passed_in[$name]:-} || ${failures[$name]:-0} -ge $MAX_FAILURES ]] || left+=("$i")
        done
        pending=("${left[@]}")
        [[ ${#pending[@]} != 0 || $boot_clean == 0 ]] || break
        [[ $attempt -lt $attempts ]] || break
        # The emulated SVM fails now and then (see the top): the items that
        # did not pass run again in a new boot, said out loud.
        log "boot $attempt of $attempts FAILED, items that did not pass: ${#pending[@]} (see above); the test host boots again with those"
    done
    for i in "${!item_names[@]}"; do
        name=${item_names[i]}
        if [[ -n ${passed_in[$name]:-} ]]; then
            pass "$name (${passed_in[$name]} s in the test host${history[$name]:+; before: ${history[$name]%; }})"
        else
            fail "$name: ${history[$name]%; }"
        fi
    done
    if [[ $boot_clean == 1 ]]; then
        pass "the last boot started and ended cleanly"
    else
        fail "the last boot did not start or end cleanly (see above)"
    fi
    finish
}

main "$@"
