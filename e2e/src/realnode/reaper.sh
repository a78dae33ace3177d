#!/usr/bin/env bash
# Removes by force what a cluster's real nodes leave on the host once their
# processes are stopped or dead: containerd shims and the containers they ran,
# the pods' network namespaces, mounts under the node dirs, the `KUBE-*`
# iptables chains (kube-proxy's and kubelet's) of the host, the other nodes'
# network namespaces (with their veth pairs, routes and chains) and node 0's
# bridge.
#
# Two uses, both from `mod.rs`:
# - at the end of an orderly teardown (REAPER_PARENT empty): at once;
# - as the node's watchdog, started with the node in its own process group
#   (REAPER_PARENT = the test process): it waits for the test process to die
#   without a teardown (SIGKILL, Ctrl-C, abort), then cleans and removes the
#   cluster dir. After an orderly teardown the harness kills it.
# One reaper covers every real node of the cluster.
#
# Parameters come by environment, not argv, and the script runs as `bash -c`:
# it kills whatever names the node dir on its command line, and must not be
# one of those.
#   REAPER_PARENT        pid to wait for (empty: clean now)
#   REAPER_CLUSTER       the cluster dir (the node dirs' parent)
#   REAPER_NODES         the node dirs, one per line
#   REAPER_NODE_NETNS    the nodes' own network namespaces, one per line
#   REAPER_NODE_LINKS    the host's ends of their veth pairs, one per line
#   REAPER_KUBE_PROXY    kube-proxy binary (for --cleanup)
#   REAPER_NETNS_BEFORE  file listing the /run/netns entries that predate the nodes
#   REAPER_BRIDGE        node 0's bridge
set -u
parent=${REAPER_PARENT:-}
cluster=$REAPER_CLUSTER
proxy=$REAPER_KUBE_PROXY
netns_before=$REAPER_NETNS_BEFORE
bridge=$REAPER_BRIDGE
IFS='
'
# shellcheck disable=SC2206
nodes=($REAPER_NODES)
# shellcheck disable=SC2206
node_netns=(${REAPER_NODE_NETNS:-})
# shellcheck disable=SC2206
node_links=(${REAPER_NODE_LINKS:-})

if [ -n "$parent" ]; then
  # A terminal's Ctrl-C goes to the test's process group, not ours; once the
  # wait is over, nothing may interrupt the clean-up.
  trap '' INT HUP TERM
  while kill -0 "$parent" 2>/dev/null; do sleep 1; done
fi

# Everything started for a node names its dir on its command line
# (containerd's config, kubelet's root dir, the shims' socket address).
for node in "${nodes[@]}"; do pkill -KILL -f -- "$node" 2>/dev/null; done
# Containers outlive their shim: kill them through runc's state.
for node in "${nodes[@]}"; do
  runc_root="$node/runc/k8s.io"
  [ -d "$runc_root" ] || continue
  for id in $(runc --root "$runc_root" list -q 2>/dev/null); do
    runc --root "$runc_root" kill "$id" KILL 2>/dev/null
    runc --root "$runc_root" delete -f "$id" 2>/dev/null
  done
done
# Network namespaces pinned by the nodes' sandboxes.
for ns in $(ls /run/netns 2>/dev/null); do
  case "$ns" in cni-*) ;; *) continue ;; esac
  grep -qx -- "$ns" "$netns_before" 2>/dev/null && continue
  umount -l "/run/netns/$ns" 2>/dev/null
  rm -f "/run/netns/$ns"
done
# Mounts under the node dirs, deepest first (mountinfo's 5th field).
for node in "${nodes[@]}"; do
  awk '{print $5}' /proc/self/mountinfo | grep -F -- "$node" | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
done
# The other nodes' network namespaces: their veth pairs, the host's routes
# to them and their kube-proxy's chains go with them.
for ns in "${node_netns[@]}"; do ip netns delete "$ns" 2>/dev/null; done
for link in "${node_links[@]}"; do ip link delete "$link" 2>/dev/null; done
# The host's kube-proxy chains, then whatever KUBE-* is left (kubelet's
# canaries and firewall chains): drop the jumps into them from other chains,
# flush them, delete them; one iptables-restore per table family.
"$proxy" --cleanup >/dev/null 2>&1
for family in iptables ip6tables; do
  command -v "$family-save" >/dev/null || continue
  "$family-save" | awk '
    /^\*/ { print; n = 0; next }
    /^:KUBE-/ { chains[++n] = substr($1, 2); next }
    /^-A / && $2 !~ /^KUBE-/ && /KUBE-/ { sub(/^-A /, "-D "); print; next }
    /^COMMIT/ {
      for (i = 1; i <= n; i++) print "-F " chains[i]
      for (i = 1; i <= n; i++) print "-X " chains[i]
      print; next
    }
  ' | "$family-restore" --noflush 2>/dev/null
done
ip link delete "$bridge" 2>/dev/null
# kubelet puts its device-plugin socket in /var/lib/kubelet/device-plugins
# whatever its --root-dir; remove what it created there.
if [ -e "$cluster/created-var-lib-kubelet" ]; then
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
fi

# A dead test cannot remove its cluster dir; do it once nothing is mounted
# in it.
if [ -n "$parent" ] && ! awk '{print $5}' /proc/self/mountinfo | grep -qF -- "$cluster/"; then
  rm -rf -- "$cluster"
fi
exit 0
