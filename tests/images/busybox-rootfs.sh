#!/bin/sh
# Builds a minimal root filesystem tarball from Debian's busybox-static, for
# `docker import` / `podman import` / `ctr images import`-free use.
#
#   busybox-rootfs.sh OUT.tar
#
# The rootfs holds /bin/busybox and one symlink per applet, /etc/passwd and
# /etc/group with root and an unprivileged user 1000 ("user"), and the empty
# directories a container runtime mounts over (/proc, /sys, /dev, /tmp, ...).
set -eu

out=${1:?usage: busybox-rootfs.sh OUT.tar}
busybox=${BUSYBOX:-/bin/busybox}

if ! "$busybox" --list >/dev/null 2>&1; then
    echo "busybox-rootfs.sh: $busybox is not a working busybox (apt-get install busybox-static)" >&2
    exit 1
fi
# A dynamically linked busybox would not run in a rootfs without libc.
if command -v file >/dev/null && file "$busybox" 2>/dev/null | grep -q dynamic; then
    echo "busybox-rootfs.sh: $busybox is dynamically linked; need busybox-static" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" \
    "$root/etc" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" \
    "$root/root" "$root/home/user" "$root/var/tmp" "$root/run"
chmod 1777 "$root/tmp" "$root/var/tmp"
cp "$busybox" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
# --install -s uses absolute paths of the running busybox; run it under
# chroot so the links land inside the rootfs and point at /bin/busybox.
chroot "$root" /bin/busybox --install -s

cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat > "$root/etc/group" <<'GROUP'
root:x:0:
user:x:1000:
nogroup:x:65534:
GROUP
chown 1000:1000 "$root/home/user"
: > "$root/etc/hosts"
: > "$root/etc/resolv.conf"

tar --numeric-owner -C "$root" -cf "$out.tmp" .
mv "$out.tmp" "$out"
