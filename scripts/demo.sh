#!/usr/bin/env bash
# The README's first command ends here: build a tiny busybox bundle and run
# a container in it with agentvm in a microVM (the default tier), showing the
# guest's own kernel, then the same bundle in the container tier, which
# shares the host's kernel.
set -euo pipefail
bin=${1:-/usr/local/bin/agentvm}
work=$(mktemp -d /tmp/agentvm-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs/bin"
cp /bin/busybox "$work/rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ -e "$work/rootfs/bin/$applet" ] || ln -s busybox "$work/rootfs/bin/$applet"
done
cd "$work"
"$bin" spec
jq '.process.terminal = false
  | .process.args = ["sh", "-c", "echo \"hello from $(hostname): kernel $(uname -r), pid $$, $(ls /proc | grep -c ^[0-9]) processes visible\""]' \
  config.json >config.json.new && mv config.json.new config.json

echo "host kernel: $(uname -r)"
echo "--- agentvm run (microvm: its own kernel, booted for this container)"
"$bin" run "agentvm-demo-$$"
echo "--- agentvm --isolation=container run (namespaces on the host kernel)"
"$bin" --isolation=container run "agentvm-demo-$$"
