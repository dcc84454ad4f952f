#!/usr/bin/env bash
# Registers agentvm's runtimes in Docker's daemon.json, keeping every other
# setting that is already there:
#   agentvm            -> microvm tier (the default isolation)
#   agentvm-container  -> container tier (--isolation=container)
#   agentvm-offline    -> microvm tier with no egress at all (--egress deny)
# Usage: register-docker-runtimes.sh [BINARY] [DAEMON_JSON]
set -euo pipefail
bin=${1:-/usr/local/bin/agentvm}
conf=${2:-/etc/docker/daemon.json}

mkdir -p "$(dirname "$conf")"
current='{}'
if [ -s "$conf" ]; then
  current=$(cat "$conf")
  if ! jq -e 'type == "object"' >/dev/null 2>&1 <<<"$current"; then
    echo "register-docker-runtimes: $conf is not a JSON object; not touching it" >&2
    exit 1
  fi
fi
tmp=$(mktemp "$conf.XXXXXX")
jq --arg bin "$bin" '
  .runtimes = (.runtimes // {})
  | .runtimes.agentvm = {path: $bin}
  | .runtimes["agentvm-container"] = {path: $bin, runtimeArgs: ["--isolation=container"]}
  | .runtimes["agentvm-offline"] = {path: $bin, runtimeArgs: ["--egress", "deny"]}
' <<<"$current" >"$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$conf"
echo "registered runtimes agentvm, agentvm-container and agentvm-offline ($bin) in $conf"
