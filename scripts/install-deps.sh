#!/usr/bin/env bash
# Installs the Debian packages agentvm needs to build and to run its tests.
# Idempotent; safe to run on a fresh Debian 12 machine as root.
set -euo pipefail

PACKAGES=(
  # build
  build-essential pkg-config libseccomp-dev
  # libcontainer's cgroup v2 device filter (libbpf-sys, linked statically)
  libelf-dev zlib1g-dev
  # the peers and clients the tests drive
  runc crun docker.io containerd podman
  # containerd's CRI plugin in the pod tests: the pods' networks (bridge,
  # host-local, portmap), and protoc for the CRI client (k8s-cri's build)
  containernetworking-plugins protobuf-compiler
  # images and test tools
  busybox-static iproute2 iptables nftables dnsmasq-base socat jq procps util-linux psmisc
  # the microvm tier: QEMU, and what virtiofsd builds against
  qemu-system-x86 libcap-ng-dev cpio
  # checkpoint and restore in the container tier, as runc's: Debian's
  # criu, and what scripts/install-criu.sh builds CRIU 4.1 from Debian's
  # source with (bookworm's 3.17 cannot start on newer kernels)
  criu curl libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler python3-protobuf
  libnl-3-dev libnl-route-3-dev libcap-dev libnet1-dev libbsd-dev libnftables-dev libaio-dev
  # the benchmark's network part (make bench)
  iperf3 wrk
  # the guest kernel (kernels/build.sh)
  linux-source-6.1 bc bison flex libelf-dev libssl-dev xz-utils
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q "${missing[@]}"
