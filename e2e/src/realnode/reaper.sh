#!/usr/bin/env bash
# The real node's reaper: cleans the host after a test process that died
# without tearing its node down (SIGKILL, Ctrl-C, abort). The harness starts
# it in its own session when the node starts and kills it after an orderly
# teardown, so it only ever acts when nothing else will.
#
#   REAPER_PARENT=pid REAPER_NODE=dir REAPER_KUBE_PROXY=bin \
#   REAPER_NETNS_BEFORE=file REAPER_BRIDGE=name reaper.sh
#
# (By environment: the script kills whatever names the node dir on its
# command line, and must not be one of those.)
#
# The control-plane and node processes themselves die with the test
# (PR_SET_PDEATHSIG); what outlives them is undone here: containerd shims and
# the containers they run, pods' network namespaces, mounts under the node
# dir, kube-proxy's iptables chains and the bridge.
set -u
parent=$REAPER_PARENT node=$REAPER_NODE proxy=$REAPER_KUBE_PROXY
netns_before=$REAPER_NETNS_BEFORE bridge=$REAPER_BRIDGE

# A terminal's Ctrl-C goes to the test's process group, not ours; ignore
# hang-ups too: this must run to the end once started.
trap '' INT HUP TERM

while kill -0 "$parent" 2>/dev/null; do sleep 1; done

# Everything started for the node names its dir on its command line
# (containerd's config, kubelet's root, the shims' socket address).
pkill -KILL -f -- "$node" 2>/dev/null
# Containers outlive their shim: kill them through runc's state.
runc_root="$node/runc/k8s.io"
if [ -d "$runc_root" ]; then
  for id in $(runc --root "$runc_root" list -q 2>/dev/null); do
    runc --root "$runc_root" kill "$id" KILL 2>/dev/null
    runc --root "$runc_root" delete -f "$id" 2>/dev/null
  done
fi
# Network namespaces pinned by the node's sandboxes.
for ns in $(ls /run/netns 2>/dev/null); do
  case "$ns" in cni-*) ;; *) continue ;; esac
  grep -qx -- "$ns" "$netns_before" 2>/dev/null && continue
  umount -l "/run/netns/$ns" 2>/dev/null
  rm -f "/run/netns/$ns"
done
# Mounts under the node dir, deepest first (mountinfo's 5th field).
awk '{print $5}' /proc/self/mountinfo | grep -F -- "$node" | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null; done
"$proxy" --cleanup >/dev/null 2>&1
ip link delete "$bridge" 2>/dev/null
# The cluster dir (the node dir's parent), only once nothing is mounted in it.
if ! awk '{print $5}' /proc/self/mountinfo | grep -qF -- "$node"; then
  rm -rf -- "$(dirname "$node")"
fi
exit 0
