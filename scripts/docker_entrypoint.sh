#!/usr/bin/env bash
# The image's entry point: one image for every node of a cluster.
#   head [ray start options]                  a Ray head node (dashboard and job API on port 8265)
#   worker HEAD_IP:PORT [ray start options]   a worker node joining that head
#   anything else                             roll-train's arguments (a run on this node alone)
# A node runs in the foreground (--block), so the container lives as long as it does. Token
# authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) comes from the
# container's environment; docs/gpus-and-clusters.md has the commands.
set -euo pipefail
case "${1:-}" in
  head)
    shift
    exec ray start --head --block --port="${RAY_PORT:-6379}" --dashboard-host=0.0.0.0 --disable-usage-stats "$@"
    ;;
  worker)
    address="${2:?usage: worker HEAD_IP:PORT [ray start options]}"
    shift 2
    exec ray start --block --address="$address" --disable-usage-stats "$@"
    ;;
  *)
    exec roll-train "$@"
    ;;
esac
